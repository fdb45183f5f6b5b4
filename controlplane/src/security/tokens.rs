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
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    tenants: BTreeMap<String, String>,
    #[serde(default)]
    admins: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default)]
pub struct Tokens {
    by_digest: HashMap<[u8; 32], Principal>,
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
}
