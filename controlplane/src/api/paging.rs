//! Paged listings (README, "Paging"): the page size limit, the byte budget of a page and
//! the continue token that resumes a listing after the last name returned.
//!
//! The token is opaque to clients: the hex form of a small versioned JSON object naming the
//! kind, the tenant filter and the last name returned. It grants nothing: every page is
//! filtered by the caller's access rules again, so a forged token can only start a listing
//! the caller may read anyway at another name.

use serde::{Deserialize, Serialize};

use super::convert::resource_to_proto;
use crate::resources::{validate_name, FieldError, Kind, StoredResource};

/// Page size when the request leaves `limit` at 0.
pub const DEFAULT_LIMIT: u32 = 500;
/// Largest page size a request may ask for.
pub const MAX_LIMIT: u32 = 1000;
/// Largest encoded size of a page (a `ListResponse`), well below tonic's 4 MiB limit.
pub const PAGE_BYTES: usize = 2 * 1024 * 1024;
/// What the revision and the continue token may take of `PAGE_BYTES` (a token is at most
/// `2 * MAX_TOKEN_JSON` hex digits).
const PAGE_OVERHEAD: usize = 1024;
/// Budget of the resources of one page.
pub const RESOURCE_BYTES: usize = PAGE_BYTES - PAGE_OVERHEAD;
/// Longest JSON a token may carry: version, kind, two names of at most 128 characters.
const MAX_TOKEN_JSON: usize = 400;
const TOKEN_VERSION: u32 = 1;

/// The page size of a request: `limit`, or the default for 0.
pub fn page_limit(limit: u32) -> Result<usize, FieldError> {
    match limit {
        0 => Ok(DEFAULT_LIMIT as usize),
        l if l > MAX_LIMIT => Err(FieldError::invalid("limit", format!("{l} is above the maximum page size of {MAX_LIMIT}"))),
        l => Ok(l as usize),
    }
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Token {
    v: u32,
    kind: String,
    tenant: String,
    after: String,
}

/// The token that resumes a listing of `kind` filtered by `tenant` after the name `after`.
pub fn encode_token(kind: Kind, tenant: &str, after: &str) -> String {
    let token = Token { v: TOKEN_VERSION, kind: kind.as_str().to_string(), tenant: tenant.to_string(), after: after.to_string() };
    let json = serde_json::to_vec(&token).expect("a token is plain data");
    json.iter().map(|b| format!("{b:02x}")).collect()
}

/// The name to resume after, for a request of `kind` filtered by `tenant`: `None` for an
/// empty token (the first page).
pub fn decode_token(token: &str, kind: Kind, tenant: &str) -> Result<Option<String>, FieldError> {
    if token.is_empty() {
        return Ok(None);
    }
    let shown: String = token.chars().take(40).collect();
    let shown = if shown.len() < token.len() { format!("{shown:?}...") } else { format!("{shown:?}") };
    let malformed = |why: &str| FieldError::invalid("continue_token", format!("{shown} is not a continue token of this server ({why})"));
    if token.len() > 2 * MAX_TOKEN_JSON {
        return Err(malformed("too long"));
    }
    let bytes = from_hex(token).ok_or_else(|| malformed("not hexadecimal"))?;
    let parsed: Token = serde_json::from_slice(&bytes).map_err(|_| malformed("undecodable"))?;
    if parsed.v != TOKEN_VERSION {
        return Err(malformed(&format!("unknown version {}", parsed.v)));
    }
    validate_name("after", &parsed.after).map_err(|_| malformed("bad name"))?;
    if parsed.kind != kind.as_str() || parsed.tenant != tenant {
        return Err(FieldError::invalid(
            "continue_token",
            format!(
                "issued for a listing of {} with tenant filter {:?}, not of {kind} with tenant filter {tenant:?}; start again without a token",
                parsed.kind, parsed.tenant
            ),
        ));
    }
    Ok(Some(parsed.after))
}

fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok()).collect()
}

/// Size of `r` as an element of `ListResponse.resources` (field key, length, message).
fn encoded_len_in_list(r: &proto::Resource) -> usize {
    let len = prost::Message::encoded_len(r);
    1 + prost::length_delimiter_len(len) + len
}

/// One page of `candidates` (in name order): at most `limit` resources whose encoded size
/// stays within `budget` bytes, but at least one. Returns the page and whether more
/// candidates follow.
pub fn page<'a>(candidates: impl Iterator<Item = &'a StoredResource>, limit: usize, budget: usize) -> (Vec<proto::Resource>, bool) {
    let mut candidates = candidates.peekable();
    let mut page = Vec::new();
    let mut used = 0;
    while let Some(r) = candidates.peek() {
        if page.len() >= limit {
            return (page, true);
        }
        let p = resource_to_proto(r);
        let size = encoded_len_in_list(&p);
        if !page.is_empty() && used + size > budget {
            return (page, true);
        }
        used += size;
        page.push(p);
        candidates.next();
    }
    (page, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Spec;

    fn tenant(name: &str, display_len: usize) -> StoredResource {
        StoredResource {
            name: name.into(),
            tenant: String::new(),
            resource_version: 1,
            spec: Spec::from_json(Kind::Tenant, &serde_json::json!({"display_name": "x".repeat(display_len)}).to_string()).unwrap(),
            status: Default::default(),
            create_revision: 1,
            mod_revision: 1,
        }
    }

    #[test]
    fn limits() {
        assert_eq!(page_limit(0).unwrap(), DEFAULT_LIMIT as usize);
        assert_eq!(page_limit(7).unwrap(), 7);
        assert_eq!(page_limit(MAX_LIMIT).unwrap(), MAX_LIMIT as usize);
        let e = page_limit(MAX_LIMIT + 1).unwrap_err();
        assert_eq!(e.field, "limit");
        assert!(e.reason.contains("1001") && e.reason.contains("1000"), "{e}");
    }

    #[test]
    fn tokens_round_trip_and_bind_kind_and_tenant() {
        let t = encode_token(Kind::Service, "acme", "svc-9");
        assert!(2 * MAX_TOKEN_JSON >= encode_token(Kind::ModelProfile, &"t".repeat(128), &"n".repeat(128)).len());
        assert_eq!(decode_token(&t, Kind::Service, "acme").unwrap().as_deref(), Some("svc-9"));
        assert_eq!(decode_token("", Kind::Service, "acme").unwrap(), None);
        for (kind, tenant) in [(Kind::Node, "acme"), (Kind::Service, ""), (Kind::Service, "globex")] {
            assert_eq!(decode_token(&t, kind, tenant).unwrap_err().field, "continue_token");
        }
        let forged = encode_token(Kind::Service, "acme", "../etc");
        for bad in ["zz", "abc", "7b7d", forged.as_str(), &"a".repeat(10_000)] {
            let e = decode_token(bad, Kind::Service, "acme").unwrap_err();
            assert_eq!(e.field, "continue_token", "{bad}");
        }
    }

    #[test]
    fn a_page_stops_at_the_limit_or_the_budget_but_holds_one() {
        let small: Vec<_> = (0..10).map(|i| tenant(&format!("t{i}"), 10)).collect();
        let (p, more) = page(small.iter(), 3, RESOURCE_BYTES);
        assert_eq!((p.len(), more), (3, true));
        let (p, more) = page(small.iter(), 10, RESOURCE_BYTES);
        assert_eq!((p.len(), more), (10, false));
        let big: Vec<_> = (0..10).map(|i| tenant(&format!("t{i}"), 1000)).collect();
        let (p, more) = page(big.iter(), 10, 2500);
        assert_eq!((p.len(), more), (2, true));
        assert!(p.iter().map(encoded_len_in_list).sum::<usize>() <= 2500);
        let (p, more) = page(big.iter(), 10, 10);
        assert_eq!((p.len(), more), (1, true));
        let (p, more) = page(std::iter::empty(), 10, 10);
        assert_eq!((p.len(), more), (0, false));
    }
}
