//! Certificates for a job (feature `certs`): a fresh authority and the
//! certificates it issues, written as the PEM files the `SNCL_TLS_*`
//! settings name. `commbench tls-certs DIR` writes a job's set; tests use
//! the same code to make broken sets (expired, from another authority,
//! a key that does not match).

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use comm_core::config::TlsFiles;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};

/// A certificate authority made for one job; its key stays in memory and
/// is gone when it is dropped, so nothing can issue more certificates for
/// the job later.
pub struct Authority {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority").finish_non_exhaustive()
    }
}

/// A certificate and its private key, PEM.
#[derive(Clone, Debug)]
pub struct Issued {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
}

fn err(e: rcgen::Error) -> std::io::Error {
    std::io::Error::other(format!("making a certificate: {e}"))
}

impl Authority {
    /// A new authority (ECDSA P-256) named `name`, valid for ten years.
    pub fn new(name: &str) -> std::io::Result<Authority> {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = params.not_before + ten_years();
        let key = KeyPair::generate().map_err(err)?;
        Ok(Authority {
            issuer: CertifiedIssuer::self_signed(params, key).map_err(err)?,
        })
    }

    /// The authority's certificate (what `SNCL_TLS_CA` names).
    pub fn ca_pem(&self) -> String {
        self.issuer.pem()
    }

    /// A certificate for both sides of a connection (server and client
    /// authentication) with `names` as its subject names, valid from 2020
    /// for ten years, or already expired when `expired`.
    pub fn issue(&self, names: &[String], expired: bool) -> std::io::Result<Issued> {
        let mut params = CertificateParams::new(names.to_vec()).map_err(err)?;
        let mut dn = DistinguishedName::new();
        dn.push(
            DnType::CommonName,
            names.first().map_or("sncl", String::as_str),
        );
        params.distinguished_name = dn;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = if expired {
            rcgen::date_time_ymd(2021, 1, 1)
        } else {
            params.not_before + ten_years()
        };
        let key = KeyPair::generate().map_err(err)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(err)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

fn ten_years() -> std::time::Duration {
    std::time::Duration::from_secs(10 * 365 * 24 * 3600)
}

/// Writes `text` to `path`, created with `mode` (an existing file is
/// replaced).
fn write_file(path: &Path, text: &str, mode: u32) -> std::io::Result<()> {
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)?;
    f.write_all(text.as_bytes())
}

/// Writes `ca.pem`, `cert.pem` and `key.pem` (mode 0600) into `dir` and
/// returns them as the settings' files.
pub fn write_files(dir: &Path, ca_pem: &str, issued: &Issued) -> std::io::Result<TlsFiles> {
    let files = TlsFiles {
        cert: dir.join("cert.pem"),
        key: dir.join("key.pem"),
        ca: dir.join("ca.pem"),
    };
    write_file(&files.ca, ca_pem, 0o644)?;
    write_file(&files.cert, &issued.cert_pem, 0o644)?;
    write_file(&files.key, &issued.key_pem, 0o600)?;
    Ok(files)
}

/// A job's set in `dir` (created mode 0700 if missing): a fresh authority,
/// one certificate for every rank with `names` (host names or addresses,
/// informational: peers check the authority, not the name), the
/// authority's key discarded.
pub fn write_job_set(dir: &Path, names: &[String]) -> std::io::Result<TlsFiles> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let authority = Authority::new("sncl job authority")?;
    let issued = authority.issue(names, false)?;
    write_files(dir, &authority.ca_pem(), &issued)
}
