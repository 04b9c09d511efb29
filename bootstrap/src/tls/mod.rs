//! TLS for sncl's TCP connections (the transport's sockets and the
//! rendezvous store's), through rustls: aws-lc-rs for key exchange
//! (hybrid post-quantum first) and signatures, ring's cipher suites.
//!
//! Policy, the same on every connection:
//! * TLS 1.3 only, no session resumption (every connection is a full
//!   handshake), AES-128-GCM first (measured 9.8 GB/s a core against
//!   AES-256-GCM's 8.7 on this project's reference machine), then
//!   AES-256-GCM and ChaCha20-Poly1305;
//! * mutual authentication: each side presents its certificate
//!   ([`TlsFiles::cert`], [`TlsFiles::key`]) and must chain to the
//!   authorities of [`TlsFiles::ca`]; a peer without a certificate, with
//!   an expired one, or one from another authority is refused;
//! * no host-name check: ranks reach each other by address and a job
//!   usually shares one certificate, so (as in Gloo's TLS transport) the
//!   authority is what identifies the job. The job secret still
//!   authenticates every connection inside the TLS channel.
//!
//! [`TlsIdentity::load`] reads and checks the files once; its configs are
//! shared by every connection of a communicator.

#[cfg(feature = "certs")]
pub mod certs;

use std::path::Path;
use std::sync::{Arc, Mutex};

use comm_core::config::{TlsFiles, TlsSettings};
use comm_core::{Error, Result};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};

/// The name a connecting side asks for (not checked: see the module docs).
pub const SERVER_NAME: &str = "sncl";

/// Largest PEM file read (a chain or a bundle of authorities).
const MAX_PEM_BYTES: u64 = 1 << 20;

/// A rank's TLS credentials and the peer policy, ready for connections.
#[derive(Clone)]
pub struct TlsIdentity {
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsIdentity").finish_non_exhaustive()
    }
}

/// The provider: aws-lc-rs (key exchange with the hybrid post-quantum
/// group first, signatures, randomness) with ring's TLS 1.3 cipher suites
/// in this module's order. ring's record protection takes any starting
/// sequence number, which the transport's record layer needs when it takes
/// a session over after the handshake; aws-lc's TLS 1.3 AEAD insists that
/// the first record it seals is number 0.
fn provider() -> Arc<CryptoProvider> {
    use rustls::crypto::ring::cipher_suite;
    Arc::new(CryptoProvider {
        cipher_suites: vec![
            cipher_suite::TLS13_AES_128_GCM_SHA256,
            cipher_suite::TLS13_AES_256_GCM_SHA384,
            cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
        ],
        ..rustls::crypto::aws_lc_rs::default_provider()
    })
}

/// Reads a PEM file named by `setting` (size-bounded, errors naming both).
fn read_pem(setting: &str, path: &Path) -> Result<Vec<u8>> {
    let what = format!("{setting}={}", path.display());
    let meta = std::fs::metadata(path)
        .map_err(|e| Error::Config(format!("{what} cannot be read: {e}")))?;
    if !meta.is_file() || meta.len() > MAX_PEM_BYTES {
        return Err(Error::Config(format!(
            "{what} is not a regular file of at most {MAX_PEM_BYTES} bytes"
        )));
    }
    std::fs::read(path).map_err(|e| Error::Config(format!("{what} cannot be read: {e}")))
}

fn certificates(setting: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let pem = read_pem(setting, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| {
            Error::Config(format!(
                "{setting}={}: not a PEM certificate file: {e}",
                path.display()
            ))
        })?;
    if certs.is_empty() {
        return Err(Error::Config(format!(
            "{setting}={} holds no certificate (expected PEM blocks `BEGIN CERTIFICATE`)",
            path.display()
        )));
    }
    Ok(certs)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    let what = format!("SNCL_TLS_KEY={}", path.display());
    let meta = std::fs::metadata(path)
        .map_err(|e| Error::Config(format!("{what} cannot be read: {e}")))?;
    crate::environment::check_private_file(&what, path, &meta)?;
    let pem = read_pem("SNCL_TLS_KEY", path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        Error::Config(format!(
            "{what} holds no private key (expected a PEM PKCS#8, PKCS#1 or SEC1 key): {e}"
        ))
    })
}

impl TlsIdentity {
    /// Reads the certificate chain, key and authorities of `files` and
    /// builds both sides' configurations. Errors name the setting and the
    /// file: unreadable, not PEM, no certificate or key, a key that does
    /// not belong to the certificate, a key file others can read.
    pub fn load(files: &TlsFiles) -> Result<TlsIdentity> {
        let chain = certificates("SNCL_TLS_CERT", &files.cert)?;
        let key = private_key(&files.key)?;
        let mut roots = RootCertStore::empty();
        for ca in certificates("SNCL_TLS_CA", &files.ca)? {
            roots.add(ca).map_err(|e| {
                Error::Config(format!(
                    "SNCL_TLS_CA={}: a certificate is not a usable authority: {e}",
                    files.ca.display()
                ))
            })?;
        }
        let roots = Arc::new(roots);
        let provider = provider();
        let config_error = |side: &str, e: rustls::Error| {
            Error::Config(format!(
                "TLS {side} configuration from SNCL_TLS_CERT={} and SNCL_TLS_KEY={}: {e}",
                files.cert.display(),
                files.key.display()
            ))
        };
        let signing = provider
            .key_provider
            .load_private_key(key.clone_key())
            .map_err(|e| config_error("key", e))?;
        let certified = rustls::sign::CertifiedKey::new(chain.clone(), signing);
        certified.keys_match().map_err(|_| {
            Error::Config(format!(
                "SNCL_TLS_KEY={} is not the key of the certificate in SNCL_TLS_CERT={}",
                files.key.display(),
                files.cert.display()
            ))
        })?;

        let client_verifier =
            WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
                .build()
                .map_err(|e| {
                    Error::Config(format!(
                        "SNCL_TLS_CA={}: cannot verify peers with it: {e}",
                        files.ca.display()
                    ))
                })?;
        let mut server = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| config_error("server", e))?
            .with_client_cert_verifier(client_verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| config_error("server", e))?;
        server.send_tls13_tickets = 0;
        // The transport hands established sessions to its own record layer
        // (rustls's kernel-TLS interface), which needs the traffic secrets.
        server.enable_secret_extraction = true;
        server.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});

        let verifier = Arc::new(ChainToAuthorities {
            roots,
            algorithms: provider.signature_verification_algorithms,
        });
        let mut client = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| config_error("client", e))?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_client_auth_cert(chain, key)
            .map_err(|e| config_error("client", e))?;
        client.resumption = rustls::client::Resumption::disabled();
        client.enable_secret_extraction = true;
        Ok(TlsIdentity {
            client: Arc::new(client),
            server: Arc::new(server),
        })
    }

    /// The identity `settings` configure: `None` with TLS off, an error
    /// when they are half set or a file is unusable ([`TlsIdentity::load`]).
    ///
    /// A process makes several sets of connections from the same settings
    /// (its store, its standby store, each communicator's transport): the
    /// files are read and checked once and read again only when one of them
    /// changed (another file, new contents, new mode: its inode, size or
    /// status-change time differ).
    pub fn from_settings(settings: &TlsSettings) -> Result<Option<TlsIdentity>> {
        static LOADED: Mutex<Option<(TlsFiles, Vec<FileStamp>, TlsIdentity)>> = Mutex::new(None);
        let Some(files) = settings.files()? else {
            return Ok(None);
        };
        let stamps: Option<Vec<FileStamp>> = [&files.cert, &files.key, &files.ca]
            .iter()
            .map(|p| FileStamp::of(p))
            .collect();
        let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some((f, s, id)), Some(now)) = (loaded.as_ref(), stamps.as_ref()) {
            if *f == files && s == now {
                return Ok(Some(id.clone()));
            }
        }
        let identity = TlsIdentity::load(&files)?;
        *loaded = stamps.map(|s| (files, s, identity.clone()));
        Ok(Some(identity))
    }

    /// The connecting side's configuration.
    pub fn client_config(&self) -> Arc<ClientConfig> {
        self.client.clone()
    }

    /// The accepting side's configuration (client certificates required).
    pub fn server_config(&self) -> Arc<ServerConfig> {
        self.server.clone()
    }

    /// The name the connecting side sends ([`SERVER_NAME`]).
    pub fn server_name() -> ServerName<'static> {
        ServerName::try_from(SERVER_NAME).expect("a valid DNS name")
    }
}

/// What tells a file's version apart: device, inode, size and
/// status-change time (which a rewrite, a replacement and a chmod all move).
#[derive(Clone, Debug, PartialEq, Eq)]
struct FileStamp(u64, u64, u64, i64, i64);

impl FileStamp {
    fn of(path: &Path) -> Option<FileStamp> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        Some(FileStamp(
            m.dev(),
            m.ino(),
            m.size(),
            m.ctime(),
            m.ctime_nsec(),
        ))
    }
}

/// Whether a TLS failure means the peer answered with something that is
/// not TLS at all (a plaintext sncl endpoint greets with its own bytes).
pub fn peer_speaks_no_tls(e: &rustls::Error) -> bool {
    matches!(
        e,
        rustls::Error::InvalidMessage(_)
            | rustls::Error::InappropriateMessage { .. }
            | rustls::Error::InappropriateHandshakeMessage { .. }
    )
}

/// Reads a TLS failure as a person would: who refused whom and why.
pub fn describe(e: &rustls::Error) -> String {
    match e {
        rustls::Error::InvalidCertificate(c) => {
            format!("the peer's certificate was refused here: {c:?}")
        }
        rustls::Error::NoCertificatesPresented => {
            "the peer presented no certificate (is SNCL_TLS_CERT set on every rank?)".into()
        }
        rustls::Error::AlertReceived(a) => format!(
            "the peer refused the TLS handshake (alert {a:?}): it does not accept this rank's \
             certificate, or it runs another sncl TLS setup"
        ),
        e if peer_speaks_no_tls(e) => {
            format!("the peer does not speak TLS ({e}): does it run without SNCL_TLS_* settings?")
        }
        other => other.to_string(),
    }
}

/// The connecting side's check of the accepting side's certificate: it
/// must chain to one of `roots` and be valid now (time, key usage); the
/// name is not checked (see the module docs).
#[derive(Debug)]
struct ChainToAuthorities {
    roots: Arc<RootCertStore>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for ChainToAuthorities {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.algorithms.all,
        )?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(all(test, feature = "certs"))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// The only test of this binary that loads through `from_settings`
    /// (its cache is process-wide).
    #[test]
    fn settings_are_loaded_once_and_again_when_a_file_changes() {
        let dir = std::env::temp_dir().join(format!("sncl-tls-memo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let job = certs::Authority::new("job").unwrap();
        let files = certs::write_files(
            &dir,
            &job.ca_pem(),
            &job.issue(&["a".into()], false).unwrap(),
        )
        .unwrap();
        let settings = TlsSettings {
            cert: Some(files.cert.clone()),
            key: Some(files.key.clone()),
            ca: Some(files.ca.clone()),
        };
        let first = TlsIdentity::from_settings(&settings).unwrap().unwrap();
        let again = TlsIdentity::from_settings(&settings).unwrap().unwrap();
        assert!(
            Arc::ptr_eq(&first.client_config(), &again.client_config()),
            "loaded twice"
        );
        // A key made readable by others is noticed: the files are checked again.
        std::fs::set_permissions(&files.key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = TlsIdentity::from_settings(&settings)
            .unwrap_err()
            .to_string();
        assert!(e.contains("readable by other users"), "{e}");
        // New contents are read: another certificate and key.
        let other = job.issue(&["b".into()], false).unwrap();
        let files = certs::write_files(&dir, &job.ca_pem(), &other).unwrap();
        let renewed = TlsIdentity::from_settings(&settings).unwrap().unwrap();
        assert!(!Arc::ptr_eq(
            &first.client_config(),
            &renewed.client_config()
        ));
        assert_eq!(files.key, settings.key.clone().unwrap());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
