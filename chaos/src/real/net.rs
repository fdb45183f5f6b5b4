//! A private network for one chaos run: every controller and agent in its own network
//! namespace, all joined by a bridge in a "switch" namespace, and the runner (the clients)
//! on the host side of one more veth pair. Partitions are iptables DROP rules in the
//! receiving node's namespace, so they never touch the host's own firewall, and deleting
//! the namespaces removes them with everything else.
//!
//! Names carry the runner's pid (`gpc<pid>...`), so concurrent runs do not collide, and a
//! run that died without cleaning up is swept by the next one.

use std::collections::BTreeSet;
use std::fmt;
use std::process::Command;

/// A participant in the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Host {
    /// The runner and its clients, in the host's own namespace.
    Runner,
    Controller(u64),
    Agent(u8),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Runner => write!(f, "runner"),
            Host::Controller(id) => write!(f, "controller {id}"),
            Host::Agent(i) => write!(f, "agent {i}"),
        }
    }
}

pub struct Network {
    prefix: String,
    /// The third octet of 10.213.X.0/24.
    subnet: u8,
    namespaces: Vec<String>,
    /// (from, to): packets from `from` are dropped on arrival at `to`.
    blocked: BTreeSet<(Host, Host)>,
}

fn run(args: &[&str]) -> Result<String, String> {
    let out = Command::new(args[0]).args(&args[1..]).output().map_err(|e| format!("{}: {e}", args[0]))?;
    if !out.status.success() {
        return Err(format!("`{}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn in_ns(ns: &str, args: &[&str]) -> Result<String, String> {
    let mut full = vec!["ip", "netns", "exec", ns];
    full.extend_from_slice(args);
    run(&full)
}

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// The pid in a name of ours (`gpc<pid>...`), if it is one.
fn owner_pid(name: &str) -> Option<u32> {
    let digits: String = name.strip_prefix("gpc")?.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Deletes namespaces and host links left by runs whose process is gone.
fn sweep_stale() {
    let names = run(&["ip", "netns", "list"]).unwrap_or_default();
    for ns in names.lines().filter_map(|l| l.split_whitespace().next()) {
        if owner_pid(ns).is_some_and(|p| !pid_alive(p)) {
            let _ = run(&["ip", "netns", "del", ns]);
        }
    }
    let links = run(&["ip", "-o", "link", "show"]).unwrap_or_default();
    for link in links.lines().filter_map(|l| l.split(':').nth(1)).map(|n| n.trim().split('@').next().unwrap_or("").to_string()) {
        if owner_pid(&link).is_some_and(|p| !pid_alive(p)) {
            let _ = run(&["ip", "link", "del", &link]);
        }
    }
}

/// Whether this process may create network namespaces (root with iproute2 and iptables).
pub fn available() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("network namespaces need root".into());
    }
    run(&["ip", "-V"]).map_err(|e| format!("iproute2 is needed: {e}"))?;
    run(&["iptables", "--version"]).map_err(|e| format!("iptables is needed: {e}"))?;
    Ok(())
}

impl Network {
    /// Creates the switch, the runner's link and one namespace per controller and agent.
    pub fn create(controllers: &[u64], agents: u8) -> Result<Network, String> {
        available()?;
        sweep_stale();
        let pid = std::process::id();
        let used = run(&["ip", "-4", "addr"])? + &run(&["ip", "-4", "route"])?;
        let subnet = (0..=255u16)
            .map(|i| ((pid as u16).wrapping_add(i) % 256) as u8)
            .find(|s| !used.contains(&format!("10.213.{s}.")))
            .ok_or("no free 10.213.X.0/24 subnet")?;
        let mut net = Network { prefix: format!("gpc{pid}"), subnet, namespaces: Vec::new(), blocked: BTreeSet::new() };
        net.build(controllers, agents).inspect_err(|_| net.destroy())?;
        Ok(net)
    }

    fn build(&mut self, controllers: &[u64], agents: u8) -> Result<(), String> {
        let p = self.prefix.clone();
        let switch = format!("{p}sw");
        run(&["ip", "netns", "add", &switch])?;
        self.namespaces.push(switch.clone());
        in_ns(&switch, &["ip", "link", "add", "br0", "type", "bridge"])?;
        in_ns(&switch, &["ip", "link", "set", "br0", "up"])?;
        // The runner's side: a veth whose far end is a port of the bridge.
        let (host, host_port) = (format!("{p}h"), format!("{p}hs"));
        run(&["ip", "link", "add", &host, "type", "veth", "peer", "name", &host_port, "netns", &switch])?;
        in_ns(&switch, &["ip", "link", "set", &host_port, "master", "br0", "up"])?;
        run(&["ip", "addr", "add", &format!("{}/24", self.ip(Host::Runner)), "dev", &host])?;
        run(&["ip", "link", "set", &host, "up"])?;
        let hosts = controllers.iter().map(|&id| Host::Controller(id)).chain((1..=agents).map(Host::Agent));
        for h in hosts {
            let ns = self.namespace(h).expect("a node's namespace");
            run(&["ip", "netns", "add", &ns])?;
            self.namespaces.push(ns.clone());
            let port = format!("{ns}p");
            run(&["ip", "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns])?;
            run(&["ip", "link", "set", &port, "netns", &switch])?;
            in_ns(&switch, &["ip", "link", "set", &port, "master", "br0", "up"])?;
            in_ns(&ns, &["ip", "addr", "add", &format!("{}/24", self.ip(h)), "dev", "eth0"])?;
            in_ns(&ns, &["ip", "link", "set", "eth0", "up"])?;
            in_ns(&ns, &["ip", "link", "set", "lo", "up"])?;
        }
        Ok(())
    }

    pub fn ip(&self, h: Host) -> String {
        let last = match h {
            Host::Runner => 254,
            Host::Controller(id) => id as u8,
            Host::Agent(i) => 100 + i,
        };
        format!("10.213.{}.{last}", self.subnet)
    }

    /// The namespace `h` runs in (`None` for the runner: the host's own).
    pub fn namespace(&self, h: Host) -> Option<String> {
        match h {
            Host::Runner => None,
            Host::Controller(id) => Some(format!("{}n{id}", self.prefix)),
            Host::Agent(i) => Some(format!("{}a{i}", self.prefix)),
        }
    }

    /// Drops every packet from `from` to `to` (one way), established connections included.
    pub fn block(&mut self, from: Host, to: Host) -> Result<(), String> {
        if !self.blocked.insert((from, to)) {
            return Ok(());
        }
        let src = self.ip(from);
        match self.namespace(to) {
            Some(ns) => in_ns(&ns, &["iptables", "-A", "INPUT", "-s", &src, "-j", "DROP"]).map(drop),
            // Into the runner: drop it where it leaves the sender instead, so the host's
            // firewall is never touched.
            None => {
                let ns = self.namespace(from).ok_or("the runner cannot be cut off from itself")?;
                in_ns(&ns, &["iptables", "-A", "OUTPUT", "-d", &self.ip(to), "-j", "DROP"]).map(drop)
            }
        }
    }

    /// Both directions between `a` and `b`.
    pub fn cut(&mut self, a: Host, b: Host) -> Result<(), String> {
        self.block(a, b)?;
        self.block(b, a)
    }

    /// Removes every partition.
    pub fn heal(&mut self) -> Result<(), String> {
        for ns in self.namespaces.iter().skip(1) {
            in_ns(ns, &["iptables", "-F", "INPUT"])?;
            in_ns(ns, &["iptables", "-F", "OUTPUT"])?;
        }
        self.blocked.clear();
        Ok(())
    }

    pub fn partitioned(&self) -> bool {
        !self.blocked.is_empty()
    }

    fn destroy(&mut self) {
        // Node namespaces first: their veths go with them; the switch takes the bridge and
        // the runner's veth.
        for ns in self.namespaces.drain(..).rev() {
            let _ = run(&["ip", "netns", "del", &ns]);
        }
        let _ = run(&["ip", "link", "del", &format!("{}h", self.prefix)]);
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        self.destroy();
    }
}
