//! PEM files for rustls through tonic: the cluster CA and this process's certificate.

use std::path::Path;

use anyhow::Context;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

#[derive(Clone, Debug)]
pub struct TlsMaterial {
    /// The cluster CA: peers must present certificates it signed.
    pub ca_pem: Vec<u8>,
    /// This process's certificate and key (PEM); a tenant client may go without one and
    /// authenticate with a token.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

fn read(setting: &str, path: &Path) -> anyhow::Result<Vec<u8>> {
    let bytes = std::fs::read(path).with_context(|| format!("{setting}: cannot read {}", path.display()))?;
    anyhow::ensure!(bytes.windows(11).any(|w| w == b"-----BEGIN "), "{setting}: {} is not a PEM file", path.display());
    Ok(bytes)
}

impl TlsMaterial {
    /// Reads the PEM files; errors name the setting (`ca`, `cert`, `key`) and the file.
    pub fn load(ca: &Path, cert: Option<&Path>, key: Option<&Path>) -> anyhow::Result<Self> {
        let ca_pem = read("ca", ca)?;
        let identity = match (cert, key) {
            (Some(c), Some(k)) => Some((read("cert", c)?, read("key", k)?)),
            (None, None) => None,
            (Some(_), None) => anyhow::bail!("key: required with cert"),
            (None, Some(_)) => anyhow::bail!("cert: required with key"),
        };
        Ok(Self { ca_pem, identity })
    }

    /// The server side: this certificate, and client certificates verified against the CA.
    /// A client certificate is optional at the TLS level so that tenants can come with a
    /// token only; each service then decides which identities it accepts.
    pub fn server_config(&self) -> anyhow::Result<ServerTlsConfig> {
        let (cert, key) = self.identity.as_ref().context("cert: a controller needs its own certificate and key")?;
        Ok(ServerTlsConfig::new()
            .identity(Identity::from_pem(cert, key))
            .client_ca_root(Certificate::from_pem(&self.ca_pem))
            .client_auth_optional(true))
    }

    pub fn client_config(&self) -> ClientTlsConfig {
        let config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca_pem));
        match &self.identity {
            Some((cert, key)) => config.identity(Identity::from_pem(cert, key)),
            None => config,
        }
    }
}
