//! Loopback ports for local clusters.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU16, Ordering};

/// `count` consecutive loopback ports that are free now, from a base above `from`.
pub fn free_port_block(from: u16, count: u16) -> Result<u16, String> {
    let mut base = from;
    while base.checked_add(count).is_some() {
        if (0..count).step_by(10).chain([count - 1]).all(|i| TcpListener::bind(("127.0.0.1", base + i)).is_ok()) {
            return Ok(base);
        }
        base += count;
    }
    Err(format!("no block of {count} free loopback ports above {from}"))
}

/// A loopback address with a port that was free a moment ago. Below the kernel's ephemeral
/// range (32768 and up): a port the kernel picked for `:0` is one it also hands to outgoing
/// connections, which other tests' processes open by the hundred, so it could be taken
/// before the controller binds it (a cluster once came up without its bootstrap node under
/// a full test run's load). Ports come from a counter shared by this process's threads, in
/// a block of 10,000-16,999 chosen by process id.
pub fn free_loopback_addr() -> String {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 10_000 + (std::process::id() % 35) as u16 * 200;
    for _ in 0..200 {
        let port = base + NEXT.fetch_add(1, Ordering::Relaxed) % 200;
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
            return l.local_addr().expect("a bound listener's address").to_string();
        }
    }
    panic!("no free loopback port in {base}..{}", base + 200);
}
