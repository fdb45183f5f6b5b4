//! Who is calling: identities from certificate URI SANs (`spiffe://gpuplane/<role>/<name>`),
//! from tokens, or passed along by a forwarding controller.

use std::fmt;

/// The URI SAN prefix of every gpuplane identity.
pub const SPIFFE_PREFIX: &str = "spiffe://gpuplane/";

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Principal {
    /// A controller (Raft peer), by node id.
    Controller(u64),
    /// A node agent, by node name: reads and reports only its own node.
    Node(String),
    /// An operator: every operation.
    Admin(String),
    /// A tenant: only its own services.
    Tenant(String),
}

impl Principal {
    /// Controllers act for the cluster and may do everything an admin may.
    pub fn is_admin(&self) -> bool {
        matches!(self, Principal::Admin(_) | Principal::Controller(_))
    }

    /// `role:name`, as carried in forwarded requests' metadata.
    pub fn to_meta(&self) -> String {
        match self {
            Principal::Controller(id) => format!("controller:{id}"),
            Principal::Node(n) => format!("node:{n}"),
            Principal::Admin(n) => format!("admin:{n}"),
            Principal::Tenant(n) => format!("tenant:{n}"),
        }
    }

    pub fn from_meta(value: &str) -> Option<Self> {
        let (role, name) = value.split_once(':')?;
        Self::from_role(role, name)
    }

    /// Parses `spiffe://gpuplane/<role>/<name>`; other URIs are not gpuplane identities.
    pub fn from_spiffe_uri(uri: &str) -> Option<Self> {
        let (role, name) = uri.strip_prefix(SPIFFE_PREFIX)?.split_once('/')?;
        Self::from_role(role, name)
    }

    pub fn spiffe_uri(&self) -> String {
        let meta = self.to_meta();
        let (role, name) = meta.split_once(':').expect("role:name");
        format!("{SPIFFE_PREFIX}{role}/{name}")
    }

    fn from_role(role: &str, name: &str) -> Option<Self> {
        if name.is_empty() || name.contains('/') {
            return None;
        }
        match role {
            "controller" => name.parse().ok().map(Principal::Controller),
            "node" => Some(Principal::Node(name.into())),
            "admin" => Some(Principal::Admin(name.into())),
            "tenant" => Some(Principal::Tenant(name.into())),
            _ => None,
        }
    }

    /// The identity in a DER certificate's URI SANs, if it names one, with the
    /// certificate's serial number.
    pub fn from_certificate(der: &[u8]) -> Option<CertificateIdentity> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let san = cert.subject_alternative_name().ok()??;
        let principal = san.value.general_names.iter().find_map(|name| match name {
            x509_parser::extensions::GeneralName::URI(uri) => Self::from_spiffe_uri(uri),
            _ => None,
        })?;
        Some(CertificateIdentity { principal, serial: serial_hex(cert.raw_serial()) })
    }
}

/// Who a client certificate says it is, and its serial number (lower-case hex, no leading
/// zero bytes: `openssl x509 -noout -serial` prints the same digits in upper case).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateIdentity {
    pub principal: Principal,
    pub serial: String,
}

/// A certificate serial as lower-case hex without leading zero bytes.
pub fn serial_hex(raw: &[u8]) -> String {
    let start = raw.iter().position(|&b| b != 0).unwrap_or(raw.len().saturating_sub(1));
    raw[start..].iter().map(|b| format!("{b:02x}")).collect()
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_meta())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spiffe_uris_round_trip_and_foreign_uris_are_not_identities() {
        for p in [Principal::Controller(3), Principal::Node("a100-host-1".into()), Principal::Admin("ops".into())] {
            assert_eq!(Principal::from_spiffe_uri(&p.spiffe_uri()), Some(p.clone()));
            assert_eq!(Principal::from_meta(&p.to_meta()), Some(p));
        }
        assert_eq!(Principal::from_spiffe_uri("spiffe://other/node/x"), None);
        assert_eq!(Principal::from_spiffe_uri("spiffe://gpuplane/controller/abc"), None);
        assert_eq!(Principal::from_spiffe_uri("spiffe://gpuplane/root/x"), None);
        assert_eq!(Principal::from_meta("node:"), None);
    }
}
