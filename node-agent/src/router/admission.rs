//! Who may call a service's endpoint, and how much of it each caller may hold: the tokens
//! its Service lists (`spec.inference_tokens`, SHA-256 digests; none: the endpoint is
//! open), a bound on the requests in flight through the router, and within it an equal
//! share per token. A request past either is refused at once with RESOURCE_EXHAUSTED
//! instead of queueing behind the others: one caller's flood costs the others their share,
//! never their latency. Pure: counts in, verdicts out.
//!
//! Shares are per listed token, fixed (the bound over the tokens), not per caller seen:
//! a share that followed the callers in flight could be held whole by the first caller and
//! never freed for a second one refused before it counted. An open endpoint has only the
//! total bound: with no identity there is no one to be fair to (its Service should list
//! tokens).

use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use tonic::metadata::MetadataMap;
use tonic::Status;

/// Batches of its max batch that may wait for one backend: past 4 batches queued a request
/// is unlikely to meet an SLO the plan sized for one or two, and the router sheds instead.
pub const IN_FLIGHT_BATCHES_PER_BACKEND: u32 = 4;

/// The callers a service's endpoint accepts: SHA-256 digests of their bearer tokens.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Callers {
    digests: BTreeSet<[u8; 32]>,
}

/// Who holds a request in flight: a listed token's digest, or nobody (an open endpoint).
type CallerKey = Option<[u8; 32]>;

impl Callers {
    /// From lower-case hex digests, as the desired state carries them (checked there).
    pub fn from_hex<'a>(digests: impl IntoIterator<Item = &'a str>) -> Self {
        let digests = digests.into_iter().filter_map(parse_digest).collect();
        Callers { digests }
    }

    pub fn is_open(&self) -> bool {
        self.digests.is_empty()
    }

    /// The caller of a request with `metadata`: its token's digest if the service lists
    /// tokens and the request carries one of them, else UNAUTHENTICATED naming why.
    fn authenticate(&self, service: &str, metadata: &MetadataMap) -> Result<CallerKey, Status> {
        if self.is_open() {
            return Ok(None);
        }
        let Some(value) = metadata.get(proto::meta::AUTHORIZATION) else {
            return Err(Status::unauthenticated(format!("service `{service}` needs `authorization: Bearer <token>`")));
        };
        let token =
            proto::meta::bearer_token(value).ok_or_else(|| Status::unauthenticated("authorization: expected \"Bearer <token>\""))?;
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if !self.digests.contains(&digest) {
            return Err(Status::unauthenticated(format!("service `{service}` does not accept this token")));
        }
        Ok(Some(digest))
    }
}

/// `hex` as 32 bytes, if it is 64 hex digits.
pub fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Requests in flight through one router, in all and per caller.
#[derive(Debug, Default)]
struct Counts {
    total: u32,
    by_caller: BTreeMap<CallerKey, u32>,
}

/// A router's admission: the callers it accepts and what each holds now.
#[derive(Debug, Default)]
pub struct Admission {
    counts: Mutex<Counts>,
}

/// A request admitted: counted in flight until dropped.
#[derive(Debug)]
pub struct Admitted {
    admission: Arc<Admission>,
    caller: CallerKey,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut c = self.admission.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.by_caller.get_mut(&self.caller) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.by_caller.remove(&self.caller);
            }
        }
    }
}

impl Admission {
    /// Admits a request of `metadata` to `service`, whose router may hold `bound` requests
    /// in flight in all (at least 1), or refuses it: UNAUTHENTICATED without a listed token,
    /// RESOURCE_EXHAUSTED past the bound or past the caller's share of it.
    pub fn admit(self: &Arc<Self>, service: &str, callers: &Callers, bound: u32, metadata: &MetadataMap) -> Result<Admitted, Status> {
        let caller = callers.authenticate(service, metadata)?;
        let bound = bound.max(1);
        let tokens = u32::try_from(callers.digests.len()).unwrap_or(u32::MAX).max(1);
        let share = bound.div_ceil(tokens);
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if c.total >= bound {
            return Err(Status::resource_exhausted(format!(
                "service `{service}` has {bound} requests in flight, its bound ({IN_FLIGHT_BATCHES_PER_BACKEND} batches per process); retry later"
            )));
        }
        let mine = c.by_caller.get(&caller).copied().unwrap_or(0);
        if caller.is_some() && mine >= share {
            return Err(Status::resource_exhausted(format!(
                "this token has {mine} requests in flight on service `{service}`, its share ({bound} over the {tokens} tokens the service lists); retry later"
            )));
        }
        c.total += 1;
        *c.by_caller.entry(caller).or_default() += 1;
        Ok(Admitted { admission: Arc::clone(self), caller })
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> u32 {
        self.counts.lock().unwrap_or_else(|p| p.into_inner()).total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(token: &str) -> String {
        Sha256::digest(token.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
    }

    fn bearer(token: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert("authorization", format!("Bearer {token}").parse().unwrap());
        m
    }

    #[test]
    fn only_listed_tokens_are_admitted_and_an_open_endpoint_admits_anyone() {
        let (a, b) = (hex("token-a"), hex("token-b"));
        let callers = Callers::from_hex([a.as_str(), b.as_str()]);
        let admission = Arc::new(Admission::default());
        assert!(admission.admit("svc", &callers, 10, &bearer("token-a")).is_ok());
        for metadata in [MetadataMap::new(), bearer("token-c"), bearer("")] {
            let err = admission.admit("svc", &callers, 10, &metadata).unwrap_err();
            assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err}");
        }
        let mut basic = MetadataMap::new();
        basic.insert("authorization", "Basic abc".parse().unwrap());
        assert_eq!(admission.admit("svc", &callers, 10, &basic).unwrap_err().code(), tonic::Code::Unauthenticated);
        assert!(admission.admit("svc", &Callers::default(), 10, &MetadataMap::new()).is_ok());
        assert!(Callers::from_hex(["not hex"]).is_open());
    }

    #[test]
    fn a_flooding_token_keeps_to_its_share_and_the_others_keep_theirs() {
        let (a, b) = (hex("token-a"), hex("token-b"));
        let callers = Callers::from_hex([a.as_str(), b.as_str()]);
        let admission = Arc::new(Admission::default());
        let mut held: Vec<Admitted> = (0..5).map(|_| admission.admit("svc", &callers, 10, &bearer("token-a")).unwrap()).collect();
        let err = admission.admit("svc", &callers, 10, &bearer("token-a")).unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(err.message().contains("its share"), "{err}");
        // The other token's half is there for it.
        held.extend((0..5).map(|_| admission.admit("svc", &callers, 10, &bearer("token-b")).unwrap()));
        assert_eq!(admission.in_flight(), 10);
        // One answered: a slot of its caller's share comes back.
        held.remove(0);
        assert!(admission.admit("svc", &callers, 10, &bearer("token-a")).is_ok());
        drop(held);
        assert_eq!(admission.in_flight(), 0);
    }

    #[test]
    fn an_open_endpoint_sheds_past_its_bound() {
        let admission = Arc::new(Admission::default());
        let open = Callers::default();
        let held: Vec<Admitted> = (0..3).map(|_| admission.admit("svc", &open, 3, &MetadataMap::new()).unwrap()).collect();
        let err = admission.admit("svc", &open, 3, &MetadataMap::new()).unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(err.message().contains("its bound"), "{err}");
        drop(held);
        assert!(admission.admit("svc", &open, 3, &MetadataMap::new()).is_ok());
    }
}
