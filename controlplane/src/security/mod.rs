//! Transport security and access control (README, "Security"): mutually authenticated TLS
//! with identities in the certificates' URI SANs, bearer tokens for tenants and admins,
//! per-tenant and per-node rate limits, and the development CA of `gpuctl certs`.

pub mod certs;
mod gate;
mod identity;
mod limits;
mod tls;
mod tokens;

pub use gate::{caller, Api, Gate, Gatekeeper};
pub use identity::Principal;
pub use limits::RateLimits;
pub use tls::TlsMaterial;
pub use tokens::{hash_token, Tokens};

/// A controller's security settings.
#[derive(Clone, Debug)]
pub struct Security {
    /// CA, certificate and key of this controller; `None` only in insecure (plaintext,
    /// development) mode, where every caller is treated as an admin.
    pub tls: Option<TlsMaterial>,
    /// Bearer tokens of tenants and admins.
    pub tokens: Tokens,
    pub limits: RateLimits,
}

impl Security {
    /// Plaintext, no identities enforced (tests and `--insecure` development runs).
    pub fn insecure() -> Self {
        Self { tls: None, tokens: Tokens::default(), limits: RateLimits::default() }
    }

    pub fn is_insecure(&self) -> bool {
        self.tls.is_none()
    }
}

/// What a client presents: the CA to trust (and its own certificate, if any) and a token.
#[derive(Clone, Debug, Default)]
pub struct ClientCredentials {
    /// `None`: plaintext (only against an `--insecure` controller).
    pub tls: Option<TlsMaterial>,
    pub token: Option<String>,
}

/// The loud warning every insecure process logs at start.
pub fn warn_insecure(what: &str) {
    tracing::warn!(
        "{what} runs with --insecure: PLAINTEXT, NO AUTHENTICATION, every caller is an admin. Development only; never expose it."
    );
}
