//! The operating system's limits that decide how large a fleet one controller can serve.

/// Open files a controller should be allowed at the design point: every agent keeps a
/// connection to every controller (10,000 hosts: 10,000 sockets on each), beside its peers,
/// its storage and the clients.
pub const RECOMMENDED_OPEN_FILES: u64 = 16_384;

/// Raises this process's soft limit of open files to its hard limit (processes it starts
/// inherit it), as Go's runtime does for every Go server: the soft limit many systems give
/// a service by default (1,024) would refuse agents' connections past a thousand hosts.
/// Returns the limit in force after it; `None` when it cannot be read.
pub fn raise_open_files_to_hard() -> Option<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes only into the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
        // SAFETY: setrlimit reads only the struct it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return Some(raised.rlim_cur);
        }
    }
    Some(limit.rlim_cur)
}

/// Logs the open-file limit at start, with a warning when it is below
/// [`RECOMMENDED_OPEN_FILES`].
pub fn raise_and_report_open_files() {
    match raise_open_files_to_hard() {
        Some(limit) if limit < RECOMMENDED_OPEN_FILES => tracing::warn!(
            limit,
            recommended = RECOMMENDED_OPEN_FILES,
            "the open-file limit is low for a large fleet: every agent keeps a connection to every controller, so this \
             controller serves fewer agents than the limit; raise it (systemd LimitNOFILE, ulimit -Hn)"
        ),
        Some(limit) => tracing::info!(limit, "open-file limit"),
        None => tracing::warn!("the open-file limit could not be read"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_open_file_limit_is_raised_to_the_hard_one() {
        let mut before = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes only into the struct it is given.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut before) }, 0);
        assert_eq!(raise_open_files_to_hard(), Some(before.rlim_max));
        let mut after = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut after) }, 0);
        assert_eq!((after.rlim_cur, after.rlim_max), (before.rlim_max, before.rlim_max));
        assert_eq!(raise_open_files_to_hard(), Some(before.rlim_max), "again: nothing to raise");
    }
}
