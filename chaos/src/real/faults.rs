//! The faults, each injected on the real processes and files, and what the runner saw
//! happen: the storage faults record what the node printed and whether it came back.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use controlplane::client::Client;

use super::cluster::Cluster;
use super::net::Host;
use super::observe;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// SIGKILL of a controller, restarted from its data dir.
    Kill9,
    /// SIGSTOP, then SIGCONT after longer than an election timeout.
    Pause,
    /// The leader cut off from its followers (both ways) but still reachable by clients.
    LeaderIsolated,
    /// The followers stop hearing the leader, which still hears them.
    OneWayPartition,
    /// One follower cut off from everyone, clients included.
    FollowerIsolated,
    /// A controller's disk fills up.
    FullDisk,
    /// A stopped follower's database files are damaged before its restart.
    CorruptFiles,
    /// The node agents lose the controllers while the plan changes.
    AgentsCutOff,
}

impl FaultKind {
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill9 => "kill -9",
            FaultKind::Pause => "SIGSTOP/SIGCONT",
            FaultKind::LeaderIsolated => "leader cut off from followers",
            FaultKind::OneWayPartition => "one-way partition (leader not heard)",
            FaultKind::FollowerIsolated => "follower isolated",
            FaultKind::FullDisk => "full disk",
            FaultKind::CorruptFiles => "corrupted files before restart",
            FaultKind::AgentsCutOff => "agents cut off from controllers",
        }
    }
}

/// One injected fault: what, on which node, and when (for the unavailability after it).
#[derive(Clone, Debug)]
pub struct Injection {
    pub kind: FaultKind,
    pub node: u64,
    pub at: Instant,
}

/// What a process printed when it stopped: its own last words (`controlplane: ...`), or
/// its panic message, or its last error lines; without terminal colours.
pub fn stop_message(log: &str) -> String {
    let plain = devcluster::process::strip_ansi(log);
    let lines: Vec<&str> = plain.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    if let Some(own) = lines.iter().rev().find(|l| l.starts_with("controlplane: ")) {
        return own.to_string();
    }
    if let Some(i) = lines.iter().position(|l| l.contains("panicked at")) {
        return lines[i..lines.len().min(i + 2)].join(" ");
    }
    let errors: Vec<&str> = lines.iter().copied().filter(|l| l.contains("ERROR")).collect();
    let pick = if errors.is_empty() { &lines[lines.len().saturating_sub(2)..] } else { &errors[errors.len().saturating_sub(2)..] };
    pick.join(" | ")
}

pub fn signal(pid: u32, sig: libc::c_int) -> Result<(), String> {
    // SAFETY: kill has no memory-safety preconditions; the pid is our own child's.
    if unsafe { libc::kill(pid as libc::pid_t, sig) } != 0 {
        return Err(format!("signal {sig} to {pid}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// SIGSTOP of controller `id` for `pause`, then SIGCONT.
pub async fn pause(cluster: &Cluster, id: u64, pause: Duration) -> Result<Injection, String> {
    let pid = cluster.pid(id).ok_or(format!("controller {id} is not running"))?;
    let at = Instant::now();
    signal(pid, libc::SIGSTOP)?;
    tokio::time::sleep(pause).await;
    signal(pid, libc::SIGCONT)?;
    Ok(Injection { kind: FaultKind::Pause, node: id, at })
}

/// Applies a partition for `hold`, then heals it.
pub async fn partition(cluster: &mut Cluster, kind: FaultKind, leader: u64, hold: Duration) -> Result<Injection, String> {
    let others: Vec<u64> = cluster.controllers.members.keys().copied().filter(|&i| i != leader).collect();
    let at = Instant::now();
    let node = match kind {
        FaultKind::LeaderIsolated => {
            for &o in &others {
                cluster.net.cut(Host::Controller(leader), Host::Controller(o))?;
            }
            leader
        }
        FaultKind::OneWayPartition => {
            for &o in &others {
                cluster.net.block(Host::Controller(leader), Host::Controller(o))?;
            }
            leader
        }
        FaultKind::FollowerIsolated => {
            let f = others[0];
            for h in cluster.controllers.members.keys().copied().filter(|&i| i != f).map(Host::Controller).chain([Host::Runner]) {
                cluster.net.cut(Host::Controller(f), h)?;
            }
            f
        }
        other => return Err(format!("{} is not a partition", other.name())),
    };
    tokio::time::sleep(hold).await;
    cluster.net.heal()?;
    Ok(Injection { kind, node, at })
}

/// What a storage fault did to a controller and whether it came back.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct StorageOutcome {
    pub node: u64,
    pub how: String,
    /// The node stopped by itself (exit code) after the fault or at its restart.
    pub stopped: bool,
    pub exit_code: Option<i32>,
    /// What it printed when it stopped.
    pub message: String,
    /// It stopped by panicking (exit code 101) instead of with a clear message.
    pub panicked: bool,
    /// The node started on damaged files without noticing and lost log entries it had
    /// stored (a bug: it must refuse).
    pub served_reset_state: bool,
    /// Back in the cluster and caught up with the leader.
    pub rejoined: bool,
    /// How it was brought back.
    pub recovery: String,
    pub notes: Vec<String>,
}

fn fill(dir: &Path) -> Result<u64, String> {
    let path = dir.join("ballast");
    let mut f = std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let chunk = vec![0u8; 1 << 20];
    let mut written = 0u64;
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => return Err(format!("{}: {e}", path.display())),
        }
    }
    let _ = f.sync_all();
    Ok(written)
}

/// Fills controller `id`'s disk (a small tmpfs) while clients write; the node must stop or
/// refuse with a clear error and the cluster keep serving. Then frees the space and
/// restarts it; it must rejoin.
pub async fn full_disk(cluster: &mut Cluster, id: u64, client: &Client, within: Duration) -> Result<(Injection, StorageOutcome), String> {
    let addrs = addrs(cluster);
    let dir = cluster.controllers.members[&id].data_dir.clone();
    let at = Instant::now();
    let written = fill(&dir)?;
    let mut out = StorageOutcome { node: id, how: format!("tmpfs filled with a {} MiB ballast file", written >> 20), ..Default::default() };
    match cluster.wait_exit(id, within).await {
        Some((status, log)) => {
            out.stopped = true;
            out.exit_code = status.code();
            out.panicked = status.code() == Some(101);
            out.message = stop_message(&log);
        }
        None => {
            let status = client.node_status(&cluster.controllers.members[&id].addr).await.ok();
            out.notes.push(format!(
                "still running {within:?} after the disk filled (applied index {:?}); stopped by the runner",
                status.map(|s| s.applied_index)
            ));
            cluster.kill9(id);
        }
    }
    std::fs::remove_file(dir.join("ballast")).map_err(|e| format!("removing the ballast: {e}"))?;
    let log = cluster.start_controller(id, false)?;
    match observe::wait_caught_up(client, &addrs, id, within).await {
        Ok(t) => {
            out.rejoined = true;
            out.recovery = format!("restarted on its data dir after the space was freed; caught up in {:.1}s", t.as_secs_f64());
        }
        Err(e) => {
            let printed = cluster.wait_exit(id, Duration::from_millis(100)).await.map(|(_, l)| stop_message(&l));
            out.notes.push(format!("restart after freeing space: {e}; {}", printed.unwrap_or_else(|| log.display().to_string())));
            replace_member(cluster, id, client, within, &mut out).await?;
        }
    }
    Ok((Injection { kind: FaultKind::FullDisk, node: id, at }, out))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Corruption {
    /// The file's written part cut to half its length.
    Truncate,
    /// 4 KiB in the middle of the file's written part inverted.
    FlipMiddle,
}

/// The length of a file's written part: up to its last byte that is not zero. A log segment
/// is allocated whole when created (zeros past its records), and damage there would hit
/// nothing the controller reads.
fn written_len(f: &mut std::fs::File, len: u64) -> std::io::Result<u64> {
    let mut end = len;
    let mut buf = vec![0u8; 64 * 1024];
    while end > 0 {
        let from = end.saturating_sub(buf.len() as u64);
        let chunk = &mut buf[..(end - from) as usize];
        f.seek(SeekFrom::Start(from))?;
        f.read_exact(chunk)?;
        if let Some(i) = chunk.iter().rposition(|&b| b != 0) {
            return Ok(from + i as u64 + 1);
        }
        end = from;
    }
    Ok(0)
}

fn corrupt_file(path: &Path, how: Corruption) -> Result<String, String> {
    let err = |e: std::io::Error| format!("{}: {e}", path.display());
    let mut f = std::fs::OpenOptions::new().read(true).write(true).open(path).map_err(err)?;
    let len = f.metadata().map_err(err)?.len();
    let written = written_len(&mut f, len).map_err(err)?;
    match how {
        Corruption::Truncate => {
            f.set_len(written / 2).map_err(err)?;
            Ok(format!("{} truncated from {len} to {} bytes ({written} written)", path.display(), written / 2))
        }
        Corruption::FlipMiddle => {
            let mut buf = vec![0u8; 4096.min(len as usize)];
            let at = written / 2;
            f.seek(SeekFrom::Start(at)).map_err(err)?;
            let n = f.read(&mut buf).map_err(err)?;
            buf.truncate(n);
            buf.iter_mut().for_each(|b| *b = !*b);
            f.seek(SeekFrom::Start(at)).map_err(err)?;
            f.write_all(&buf).map_err(err)?;
            f.sync_all().map_err(err)?;
            Ok(format!("{} bytes inverted at offset {at} of {} ({len} bytes, {written} written)", buf.len(), path.display()))
        }
    }
}

/// The newest of a controller's Raft log segment files (`raft-log/<first index>.seg`, named
/// so that the newest sorts last): the file every append writes.
fn newest_log_segment(data_dir: &Path) -> Result<std::path::PathBuf, String> {
    let dir = data_dir.join("raft-log");
    let mut segments: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    segments.sort();
    segments.pop().ok_or_else(|| format!("{} holds no log segment", dir.display()))
}

/// Stops follower `id`, damages its newest Raft log file, and restarts it cut off from its peers (so
/// a node that accepted the damage could not be repaired before it is looked at). It must
/// stop with a clear message; as an operator would, the runner then removes it from the
/// cluster, wipes its data dir and adds it back empty.
pub async fn corrupt(
    cluster: &mut Cluster,
    id: u64,
    how: Corruption,
    client: &Client,
    within: Duration,
) -> Result<(Injection, StorageOutcome), String> {
    let addr = cluster.controllers.members[&id].addr.clone();
    let before = client.node_status(&addr).await.map_err(|e| format!("status of controller {id}: {e}"))?;
    let at = Instant::now();
    cluster.kill9(id);
    let what = corrupt_file(&newest_log_segment(&cluster.controllers.members[&id].data_dir)?, how)?;
    let mut out = StorageOutcome { node: id, how: what, ..Default::default() };
    let peers: Vec<u64> = cluster.controllers.members.keys().copied().filter(|&i| i != id).collect();
    for p in peers {
        cluster.net.cut(Host::Controller(id), Host::Controller(p))?;
    }
    cluster.start_controller(id, false)?;
    match cluster.wait_exit(id, Duration::from_secs(15)).await {
        Some((status, log)) => {
            out.stopped = !status.success();
            out.exit_code = status.code();
            out.panicked = status.code() == Some(101);
            out.message = stop_message(&log);
        }
        None => match client.node_status(&addr).await {
            Ok(now) if now.last_log_index < before.last_log_index => {
                out.served_reset_state = true;
                out.notes.push(format!(
                    "started on the damaged files and serves a shorter log: last log index {} before, {} after",
                    before.last_log_index, now.last_log_index
                ));
            }
            Ok(now) => out.notes.push(format!(
                "started and its log is intact (last log index {} before, {} after): the damage hit no live data",
                before.last_log_index, now.last_log_index
            )),
            Err(e) => out.notes.push(format!("running but not answering: {e}")),
        },
    }
    cluster.net.heal()?;
    replace_member(cluster, id, client, within, &mut out).await?;
    Ok((Injection { kind: FaultKind::CorruptFiles, node: id, at }, out))
}

/// The operator's repair of a node whose data is gone: remove it from the membership, wipe
/// its data dir, start it empty and add it back (it catches up from the leader).
async fn replace_member(cluster: &mut Cluster, id: u64, client: &Client, within: Duration, out: &mut StorageOutcome) -> Result<(), String> {
    let addrs = addrs(cluster);
    cluster.kill9(id);
    client.remove_member(id).await.map_err(|e| format!("removing controller {id}: {e}"))?;
    let dir = cluster.controllers.members[&id].data_dir.clone();
    for entry in std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?.flatten() {
        let p = entry.path();
        let r = if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
        r.map_err(|e| format!("wiping {}: {e}", p.display()))?;
    }
    cluster.start_controller(id, false)?;
    let member = &cluster.controllers.members[&id];
    let (addr, peer_addr) = (member.addr.clone(), member.peer_addr.clone());
    client
        .add_member_with_peer_address(id, &addr, peer_addr.as_deref(), true)
        .await
        .map_err(|e| format!("adding controller {id} back: {e}"))?;
    let t = observe::wait_caught_up(client, &addrs, id, within).await?;
    out.rejoined = true;
    out.recovery = format!("removed from the cluster, data dir wiped, added back empty; caught up in {:.1}s", t.as_secs_f64());
    Ok(())
}

pub fn addrs(cluster: &Cluster) -> Vec<(u64, String)> {
    cluster.controllers.members.values().map(|c| (c.id, c.addr.clone())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_message_prefers_the_programs_last_words_over_later_errors_and_drops_colours() {
        let log = "\u{1b}[2m2026\u{1b}[0m INFO serving\n\
                   controlplane: node 3 stopped: raft stopped: No space left on device (os error 28)\n\
                   \u{1b}[31mERROR\u{1b}[0m failure receiving rx from RaftCore\n";
        assert_eq!(stop_message(log), "controlplane: node 3 stopped: raft stopped: No space left on device (os error 28)");
    }

    #[test]
    fn stop_message_names_a_panic_and_otherwise_the_last_errors() {
        let panic = "INFO a\n\nthread 'main' panicked at src/x.rs:1:2:\ntried to serialize Uninitialized\nstack backtrace:\n";
        assert_eq!(stop_message(panic), "thread 'main' panicked at src/x.rs:1:2: tried to serialize Uninitialized");
        let errors = "INFO a\nERROR one\nINFO b\nERROR two\nERROR three\nINFO c\n";
        assert_eq!(stop_message(errors), "ERROR two | ERROR three");
    }

    #[test]
    fn corruption_changes_the_file_as_described() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        // 10,000 bytes written, then 200,000 allocated zeros (as a log segment's end).
        let mut contents = vec![0x0fu8; 10_000];
        contents.resize(210_000, 0);
        std::fs::write(&path, contents).unwrap();
        corrupt_file(&path, Corruption::FlipMiddle).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len(), 210_000);
        assert!(bytes[5000..9096].iter().all(|&b| b == 0xf0) && bytes[..5000].iter().all(|&b| b == 0x0f));
        corrupt_file(&path, Corruption::Truncate).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 5_000);
    }
}
