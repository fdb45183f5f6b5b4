//! Bearer tokens of tenants and admins. The controller keeps only SHA-256 digests of the
//! tokens (the tokens file), so the file does not hand out credentials when read.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::Context;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::Principal;

/// The tokens file (TOML):
///
/// ```toml
/// [tenants]
/// acme = "<sha256 hex of acme's token>"
/// [admins]
/// ops = "<sha256 hex of the ops token>"
/// ```
///
/// and, at the top, `revoked_certificates = ["<serial hex>", ...]`: client certificates
/// the CA signed that are no longer accepted (a node taken out of the fleet, a leaked
/// admin key). A token is withdrawn by removing its line. Read at start.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    revoked_certificates: Vec<String>,
    #[serde(default)]
    tenants: BTreeMap<String, String>,
    #[serde(default)]
    admins: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default)]
pub struct Tokens {
    by_digest: HashMap<[u8; 32], Principal>,
    /// Serials of revoked client certificates, as `identity::serial_hex` spells them.
    revoked: std::collections::HashSet<String>,
}

/// A serial as written in the tokens file (hex, any case, optional `0x`, `:` separators
/// and leading zeros) in `identity::serial_hex`'s spelling; `None` if it is no hex.
fn normalise_serial(text: &str) -> Option<String> {
    let hex: String = text.trim().trim_start_matches("0x").chars().filter(|c| *c != ':').collect::<String>().to_ascii_lowercase();
    if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let digits = hex.trim_start_matches('0');
    // Whole bytes, as the DER integer holds them.
    Some(if digits.is_empty() {
        "00".into()
    } else if digits.len() % 2 == 1 {
        format!("0{digits}")
    } else {
        digits.to_string()
    })
}

/// Lower-case hex SHA-256 of a token, as written in the tokens file.
pub fn hash_token(token: &str) -> String {
    Sha256::digest(token.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_digest(field: &str, hex: &str) -> anyhow::Result<[u8; 32]> {
    let hex = hex.trim();
    anyhow::ensure!(
        hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
        "{field}: expected the SHA-256 of the token as 64 hex digits (gpuctl token prints it)"
    );
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("checked hex");
    }
    Ok(out)
}

impl Tokens {
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("tokens file {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("tokens file {}", path.display()))
    }

    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let file: TokensFile = toml::from_str(text)?;
        let mut tokens = Tokens::default();
        for (i, serial) in file.revoked_certificates.iter().enumerate() {
            let normal = normalise_serial(serial)
                .with_context(|| format!("revoked_certificates[{i}]: {serial:?} is not a certificate serial in hex"))?;
            tokens.revoked.insert(normal);
        }
        let entries = file
            .tenants
            .iter()
            .map(|(n, h)| (format!("tenants.{n}"), h, Principal::Tenant(n.clone())))
            .chain(file.admins.iter().map(|(n, h)| (format!("admins.{n}"), h, Principal::Admin(n.clone()))));
        for (field, hex, principal) in entries {
            if tokens.by_digest.insert(parse_digest(&field, hex)?, principal).is_some() {
                anyhow::bail!("{field}: the same token is given to another principal");
            }
        }
        Ok(tokens)
    }

    /// Adds a principal's token (tests and in-process clusters).
    pub fn with(mut self, principal: Principal, token: &str) -> Self {
        self.by_digest.insert(Sha256::digest(token.as_bytes()).into(), principal);
        self
    }

    pub fn lookup(&self, token: &str) -> Option<&Principal> {
        self.by_digest.get(&<[u8; 32]>::from(Sha256::digest(token.as_bytes())))
    }

    /// Whether the certificate of this serial (`identity::serial_hex`) is revoked.
    pub fn is_revoked(&self, serial: &str) -> bool {
        !self.revoked.is_empty() && self.revoked.contains(serial)
    }

    /// Revokes a certificate by serial (tests and in-process clusters).
    pub fn revoking(mut self, serial: &str) -> Self {
        self.revoked.insert(normalise_serial(serial).expect("a hex serial"));
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_file_maps_digests_to_principals_and_names_bad_entries() {
        let text = format!("[tenants]\nacme = \"{}\"\n[admins]\nops = \"{}\"\n", hash_token("t-acme"), hash_token("t-ops"));
        let tokens = Tokens::parse(&text).unwrap();
        assert_eq!(tokens.lookup("t-acme"), Some(&Principal::Tenant("acme".into())));
        assert_eq!(tokens.lookup("t-ops"), Some(&Principal::Admin("ops".into())));
        assert_eq!(tokens.lookup("t-other"), None);
        let err = Tokens::parse("[tenants]\nacme = \"abc\"\n").unwrap_err();
        assert!(err.to_string().contains("tenants.acme"), "{err}");
        assert!(Tokens::parse("[tenant]\n").is_err());
    }

    #[test]
    fn revoked_serials_are_read_in_any_usual_spelling() {
        let tokens = Tokens::parse("revoked_certificates = [\"0A:1B\", \"0x00ff\", \"abc\"]\n").unwrap();
        for serial in ["0a1b", "ff", "0abc"] {
            assert!(tokens.is_revoked(serial), "{serial}");
        }
        assert!(!tokens.is_revoked("0a1c"));
        assert_eq!(super::super::identity::serial_hex(&[0, 0x0a, 0x1b]), "0a1b");
        let err = Tokens::parse("revoked_certificates = [\"xyz\"]\n").unwrap_err();
        assert!(format!("{err:#}").contains("revoked_certificates[0]"), "{err:#}");
    }
}
