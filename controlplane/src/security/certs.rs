//! A development CA and leaf certificates (`gpuctl certs`, the demo, tests): every leaf
//! carries its identity as a URI SAN (`spiffe://gpuplane/<role>/<name>`); controllers also
//! carry the DNS names and IP addresses clients dial.

use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};

use super::Principal;

/// What to generate.
#[derive(Clone, Debug)]
pub struct CertPlan {
    pub controllers: Vec<u64>,
    pub nodes: Vec<String>,
    pub admins: Vec<String>,
    /// DNS names and IP addresses of the controllers (server names clients verify).
    pub hosts: Vec<String>,
    /// Replace an existing CA (and every certificate) in the directory.
    pub force: bool,
}

pub const CA_CERT: &str = "ca.pem";
pub const CA_KEY: &str = "ca.key";

/// The file names of a principal's certificate and key in the output directory.
pub fn leaf_files(dir: &Path, principal: &Principal) -> (PathBuf, PathBuf) {
    let stem = principal.to_meta().replace(':', "-");
    (dir.join(format!("{stem}.pem")), dir.join(format!("{stem}.key")))
}

/// Writes a file readable by its owner only (keys).
fn write_private(path: &Path, contents: &str) -> anyhow::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path).with_context(|| format!("cannot write {}", path.display()))?;
    file.write_all(contents.as_bytes()).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

fn write_public(path: &Path, contents: &str) -> anyhow::Result<()> {
    std::fs::write(path, contents).with_context(|| format!("cannot write {}", path.display()))
}

fn san(field: &str, value: &str) -> anyhow::Result<SanType> {
    Ok(match value.parse::<IpAddr>() {
        Ok(ip) => SanType::IpAddress(ip),
        Err(_) => SanType::DnsName(value.try_into().with_context(|| format!("{field}: {value:?} is not a DNS name"))?),
    })
}

/// Generates the CA and the leaves into `dir` (created if missing); returns the files written.
/// Refuses to replace an existing CA unless `plan.force`.
pub fn generate(dir: &Path, plan: &CertPlan) -> anyhow::Result<Vec<PathBuf>> {
    let ca_path = dir.join(CA_CERT);
    if ca_path.exists() && !plan.force {
        anyhow::bail!("{} already exists; pass --force to replace the CA and every certificate", ca_path.display());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut ca_params = CertificateParams::default();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "gpuplane development CA");
    ca_params.distinguished_name = dn;
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
    let mut written = Vec::new();
    write_public(&ca_path, &ca.pem())?;
    write_private(&dir.join(CA_KEY), &ca.key().serialize_pem())?;
    written.extend([ca_path, dir.join(CA_KEY)]);

    let server_sans: Vec<SanType> = plan.hosts.iter().map(|h| san("hosts", h)).collect::<anyhow::Result<_>>()?;
    let leaves = plan
        .controllers
        .iter()
        .map(|id| Principal::Controller(*id))
        .chain(plan.nodes.iter().map(|n| Principal::Node(n.clone())))
        .chain(plan.admins.iter().map(|n| Principal::Admin(n.clone())));
    for principal in leaves {
        if let Principal::Node(name) | Principal::Admin(name) = &principal {
            anyhow::ensure!(
                !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.'),
                "{name:?}: names may contain letters, digits, '-', '_' and '.' only"
            );
        }
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, principal.to_meta());
        params.distinguished_name = dn;
        params.subject_alt_names.push(SanType::URI(principal.spiffe_uri().as_str().try_into()?));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        if let Principal::Controller(_) = principal {
            // Controllers serve (clients, agents, peers) and call peers.
            params.subject_alt_names.extend(server_sans.iter().cloned());
            params.extended_key_usages.push(ExtendedKeyUsagePurpose::ServerAuth);
        }
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &ca)?;
        let (cert_path, key_path) = leaf_files(dir, &principal);
        write_public(&cert_path, &cert.pem())?;
        write_private(&key_path, &key.serialize_pem())?;
        written.extend([cert_path, key_path]);
    }
    Ok(written)
}
