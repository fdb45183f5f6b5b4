//! What the membership records of each controller: where clients and agents reach it and,
//! when it has a listener of its own for them, where its peers send Raft's RPCs.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One member's addresses, as stored in the log's membership entries and in snapshots.
///
/// `peer_addr` is optional and left out of the stored form when unset, so a membership
/// written before it existed reads the same, and a member without one is sent Raft's RPCs
/// at `addr`, which serves them too.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The API address (`host:port`): clients, agents and forwarded requests.
    pub addr: String,
    /// The peer address (`host:port`) served on Raft's own runtime (`peer_listen`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_addr: Option<String>,
}

impl Member {
    /// A member that serves its peers at its API address.
    pub fn new(addr: impl Into<String>) -> Self {
        Self { addr: addr.into(), peer_addr: None }
    }

    pub fn with_peer_addr(addr: impl Into<String>, peer_addr: Option<String>) -> Self {
        Self { addr: addr.into(), peer_addr }
    }

    /// Where Raft's RPCs to this member go.
    pub fn raft_addr(&self) -> &str {
        self.peer_addr.as_deref().unwrap_or(&self.addr)
    }
}

/// Longest address a member may have: a DNS name's 253 characters, a colon and a port.
pub const MAX_ADDRESS_LEN: usize = 253 + 1 + 5;

/// Checks that `addr` is `host:port` (the form both of a member's addresses take), with
/// its length bounded: it is stored in every membership entry and snapshot.
pub fn check_host_port(addr: &str) -> Result<(), String> {
    if addr.len() > MAX_ADDRESS_LEN {
        return Err(format!("{} characters is longer than an address can be ({MAX_ADDRESS_LEN})", addr.len()));
    }
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(()),
        _ => Err(format!("{addr:?} is not host:port")),
    }
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.peer_addr {
            Some(peer) => write!(f, "{} (peers: {peer})", self.addr),
            None => f.write_str(&self.addr),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_without_a_peer_address_is_stored_as_before_and_reached_at_its_api_address() {
        // The stored form of openraft's BasicNode, which memberships used before.
        let before = serde_json::to_string(&openraft::BasicNode::new("10.0.0.1:7400")).unwrap();
        assert_eq!(serde_json::to_string(&Member::new("10.0.0.1:7400")).unwrap(), before);
        let read: Member = serde_json::from_str(&before).unwrap();
        assert_eq!(read, Member::new("10.0.0.1:7400"));
        assert_eq!(read.raft_addr(), "10.0.0.1:7400");
    }

    #[test]
    fn addresses_are_host_and_port_of_bounded_length() {
        assert!(check_host_port("c-0.c.ns.svc:7400").is_ok());
        assert!(check_host_port("[::1]:7400").is_ok());
        for bad in ["c-0", ":7400", "c-0:", "c-0:70000", "c-0:port"] {
            assert_eq!(check_host_port(bad).unwrap_err(), format!("{bad:?} is not host:port"));
        }
        // At the bound and one past it.
        let longest = format!("{}:7400", "a".repeat(MAX_ADDRESS_LEN - 5));
        assert_eq!(longest.len(), MAX_ADDRESS_LEN);
        assert!(check_host_port(&longest).is_ok());
        let too_long = format!("a{longest}");
        assert!(check_host_port(&too_long).unwrap_err().contains("longer than an address can be"));
    }

    #[test]
    fn a_member_with_a_peer_address_is_sent_raft_rpcs_there() {
        let m = Member::with_peer_addr("10.0.0.1:7400", Some("10.0.0.1:7410".into()));
        let stored = serde_json::to_string(&m).unwrap();
        assert_eq!(stored, r#"{"addr":"10.0.0.1:7400","peer_addr":"10.0.0.1:7410"}"#);
        assert_eq!(serde_json::from_str::<Member>(&stored).unwrap(), m);
        assert_eq!(m.raft_addr(), "10.0.0.1:7410");
    }
}
