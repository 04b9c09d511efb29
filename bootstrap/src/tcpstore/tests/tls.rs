//! The store over TLS: certificates in a fresh directory per test, made
//! by [`crate::tls::certs`] (feature `certs`).

use super::*;
use crate::tls::certs::{self, Authority, Issued};
use crate::tls::TlsIdentity;
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Every warning logged in this process (the server logs on its event
/// loop's thread, so a global subscriber is the one that sees them).
fn warnings() -> &'static Mutex<Vec<String>> {
    static WARNINGS: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    WARNINGS.get_or_init(|| {
        // Only this module installs one; another test binary's is its own.
        let _ = tracing::subscriber::set_global_default(WarningCapture);
        Mutex::new(Vec::new())
    })
}

/// The warnings that contain every one of `parts`, once there is one
/// (the server logs on its own thread, maybe after the client saw its
/// error) or after a second.
fn warnings_with(parts: &[&str]) -> Vec<String> {
    let t0 = Instant::now();
    loop {
        let found: Vec<String> = warnings()
            .lock()
            .unwrap()
            .iter()
            .filter(|w| parts.iter().all(|p| w.contains(p)))
            .cloned()
            .collect();
        if !found.is_empty() || t0.elapsed() > Duration::from_secs(1) {
            return found;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// A subscriber that keeps the text of warnings and errors.
struct WarningCapture;

struct Text(String);

impl tracing::field::Visit for Text {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write as _;
        let _ = write!(self.0, "{}={value:?} ", field.name());
    }
}

impl tracing::Subscriber for WarningCapture {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        *metadata.level() <= tracing::Level::WARN
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut text = Text(String::new());
        event.record(&mut text);
        warnings().lock().unwrap().push(text.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// A fresh directory (mode 0700) for one test's certificates, removed
/// when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let path = std::env::temp_dir().join(format!(
            "sncl-store-tls-{tag}-{}-{nanos}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .unwrap();
        TempDir(path)
    }

    /// `issued` and the authority `ca_pem` written into a subdirectory
    /// `name`, loaded.
    fn identity(&self, name: &str, ca_pem: &str, issued: &Issued) -> TlsIdentity {
        let dir = self.0.join(name);
        std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        TlsIdentity::load(&certs::write_files(&dir, ca_pem, issued).unwrap()).unwrap()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn names() -> Vec<String> {
    vec!["localhost".into(), "127.0.0.1".into()]
}

/// A job's authority with a server and a client identity from it.
struct Job {
    dir: TempDir,
    authority: Authority,
    server: TlsIdentity,
    client: TlsIdentity,
}

fn job(tag: &str) -> Job {
    let dir = TempDir::new(tag);
    let authority = Authority::new("sncl test job").unwrap();
    let ca = authority.ca_pem();
    let server = dir.identity("server", &ca, &authority.issue(&names(), false).unwrap());
    let client = dir.identity("client", &ca, &authority.issue(&names(), false).unwrap());
    Job {
        dir,
        authority,
        server,
        client,
    }
}

/// Asserts the server at `addr` does not greet a plaintext connection
/// (a TLS server waits for the client's hello; a plaintext one greets
/// at once).
fn assert_silent(addr: SocketAddr) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut buf = [0u8; GREETING_BYTES];
    match s.read(&mut buf) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("a TLS store greeted a plaintext connection: {other:?}"),
    }
}

/// A TLS client that works against `addr`: set, get.
fn assert_serves(addr: SocketAddr, tls: &TlsIdentity) {
    let t0 = Instant::now();
    let good = TcpStore::connect_tls(addr, SECRET, 0, deadline(), Some(tls)).unwrap();
    good.set("good", b"still served").unwrap();
    assert_eq!(good.get("good", T).unwrap(), b"still served");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
}

#[test]
fn tls_store_set_get_add_wait() {
    let job = job("roundtrip");
    let server = TcpStoreServer::start_tls(loopback0(), SECRET, Some(job.server.clone())).unwrap();
    let addr = server.local_addr();
    assert_silent(addr);
    let world = 4;
    let handles: Vec<_> = (0..world)
        .map(|r| {
            let tls = job.client.clone();
            thread::spawn(move || {
                let s = TcpStore::connect_tls(addr, SECRET, r, deadline(), Some(&tls)).unwrap();
                s.set(&format!("addr/{r}"), format!("10.0.0.{r}").as_bytes())
                    .unwrap();
                if s.add("arrived", 1).unwrap() == world as i64 {
                    s.set("go", b"").unwrap();
                }
                s.wait(&["go"], T).unwrap();
                for p in 0..world {
                    assert_eq!(
                        s.get(&format!("addr/{p}"), T).unwrap(),
                        format!("10.0.0.{p}").as_bytes()
                    );
                }
                assert_eq!(s.try_get("nope").unwrap(), None);
                let big = crate::PrefixStore::new("c", &s);
                big.set(&format!("x{r}"), &vec![r as u8; 100_000]).unwrap();
                assert_eq!(big.get(&format!("x{r}"), T).unwrap().len(), 100_000);
                store_barrier(&s, "b", world, T).unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(
        server.local_store().try_get("arrived").unwrap().unwrap(),
        b"4"
    );
}

#[test]
fn from_listener_and_unclaimed_servers_take_tls_too() {
    let job = job("ctors");
    let listener = TcpListener::bind(loopback0()).unwrap();
    let server =
        TcpStoreServer::from_listener_tls(listener, SECRET, Some(job.server.clone())).unwrap();
    assert_silent(server.local_addr());
    assert_serves(server.local_addr(), &job.client);
    let unclaimed = TcpStoreServer::start_unclaimed_tls(
        loopback0(),
        SECRET,
        Duration::from_secs(60),
        Some(job.server.clone()),
    )
    .unwrap();
    assert!(unclaimed.claim());
    assert_silent(unclaimed.local_addr());
    assert_serves(unclaimed.local_addr(), &job.client);
}

/// Connects with `tls` (expected to be refused) within a 5 s deadline;
/// the error, which must come at once, not at the deadline.
fn refused(addr: SocketAddr, tls: &TlsIdentity) -> String {
    let t0 = Instant::now();
    let err = TcpStore::connect_tls(
        addr,
        SECRET,
        3,
        Instant::now() + Duration::from_secs(5),
        Some(tls),
    )
    .unwrap_err()
    .to_string();
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "a refused certificate must fail fast, took {:?}: {err}",
        t0.elapsed()
    );
    assert!(err.contains("rank 3"), "{err}");
    assert!(err.contains(&addr.to_string()), "{err}");
    assert!(err.contains("TLS handshake"), "{err}");
    err
}

#[test]
fn certificate_from_another_authority_is_refused() {
    warnings();
    let job = job("rogue");
    let server = TcpStoreServer::start_tls(loopback0(), SECRET, Some(job.server.clone())).unwrap();
    let addr = server.local_addr();
    let rogue = Authority::new("another job").unwrap();
    let rogue_cert = rogue.issue(&names(), false).unwrap();
    // Trusts the job's authority, but its own certificate is the other
    // authority's: the server refuses it.
    let stranger = job
        .dir
        .identity("stranger", &job.authority.ca_pem(), &rogue_cert);
    let err = refused(addr, &stranger);
    assert!(err.contains("refused the TLS handshake"), "{err}");
    // The server said whom it refused and why, once.
    let logged = warnings_with(&["refused connection from 127.0.0.1:", "TLS", "UnknownIssuer"]);
    assert_eq!(logged.len(), 1, "{logged:?}");
    // Wholly the other job's: it refuses the server's certificate.
    let other_job = job.dir.identity("other-job", &rogue.ca_pem(), &rogue_cert);
    let err = refused(addr, &other_job);
    assert!(err.contains("certificate"), "{err}");
    assert_serves(addr, &job.client);
}

#[test]
fn expired_client_certificate_is_refused() {
    warnings();
    let job = job("expired");
    let server = TcpStoreServer::start_tls(loopback0(), SECRET, Some(job.server.clone())).unwrap();
    let addr = server.local_addr();
    let expired = job.dir.identity(
        "expired",
        &job.authority.ca_pem(),
        &job.authority.issue(&names(), true).unwrap(),
    );
    let err = refused(addr, &expired);
    assert!(err.contains("Expired"), "{err}");
    let logged = warnings_with(&["refused connection from 127.0.0.1:", "TLS", "Expired"]);
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert_serves(addr, &job.client);
}

#[test]
fn plaintext_client_against_tls_server_fails_within_its_deadline() {
    let job = job("plain-client");
    let server = TcpStoreServer::start_tls(loopback0(), SECRET, Some(job.server.clone())).unwrap();
    let addr = server.local_addr();
    let t0 = Instant::now();
    let err = TcpStore::connect(addr, SECRET, 2, Instant::now() + Duration::from_secs(3))
        .unwrap_err()
        .to_string();
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(5), "took {took:?}: {err}");
    assert!(
        err.contains("rank 2") && err.contains(&addr.to_string()),
        "{err}"
    );
    assert!(
        err.contains("requires TLS") && err.contains("SNCL_TLS_CERT"),
        "{err}"
    );
    assert_serves(addr, &job.client);
}

#[test]
fn tls_client_against_plaintext_server_is_told_it_does_not_speak_tls() {
    let job = job("plain-server");
    let server = TcpStoreServer::start(loopback0(), SECRET).unwrap();
    let addr = server.local_addr();
    let t0 = Instant::now();
    let err = TcpStore::connect_tls(addr, SECRET, 1, deadline(), Some(&job.client))
        .unwrap_err()
        .to_string();
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert!(
        err.contains(&format!("the store at {addr} does not speak TLS"))
            && err.contains("SNCL_TLS_"),
        "{err}"
    );
    let plain = TcpStore::connect(addr, SECRET, 0, deadline()).unwrap();
    plain.set("k", b"v").unwrap();
}

#[test]
fn truncated_client_hello_is_dropped_at_the_handshake_timeout() {
    let job = job("truncated");
    let server = TcpStoreServer::start_tls(loopback0(), SECRET, Some(job.server.clone())).unwrap();
    let addr = server.local_addr();
    let t0 = Instant::now();
    let mut half = TcpStream::connect(addr).unwrap();
    // A handshake record header announcing 255 bytes, and 3 of them.
    half.write_all(&[0x16, 0x03, 0x01, 0x00, 0xff, 1, 2, 3])
        .unwrap();
    let staller = thread::spawn(move || {
        half.set_read_timeout(Some(HANDSHAKE_TIMEOUT + Duration::from_secs(20)))
            .unwrap();
        let mut buf = [0u8; 64];
        let closed = loop {
            match half.read(&mut buf) {
                Ok(0) => break true,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
                Err(_) => break true,
            }
        };
        (closed, t0.elapsed())
    });
    thread::sleep(Duration::from_millis(100));
    assert_serves(addr, &job.client);
    let (closed, after) = staller.join().unwrap();
    assert!(closed, "the truncated handshake was never dropped");
    assert!(
        after >= HANDSHAKE_TIMEOUT - Duration::from_millis(500)
            && after < HANDSHAKE_TIMEOUT + Duration::from_secs(3),
        "dropped after {after:?}, not at the handshake timeout"
    );
}

/// A relay between a client and `upstream` that records every byte
/// either way (before forwarding it); its address.
fn recording_relay(upstream: SocketAddr, record: Arc<Mutex<Vec<u8>>>) -> SocketAddr {
    let listener = TcpListener::bind(loopback0()).unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        let (client, _) = listener.accept().unwrap();
        let server = TcpStream::connect(upstream).unwrap();
        let pipe = |mut from: TcpStream, mut to: TcpStream, record: Arc<Mutex<Vec<u8>>>| {
            thread::spawn(move || {
                let mut buf = [0u8; 16 << 10];
                loop {
                    match from.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            record.lock().unwrap().extend_from_slice(&buf[..n]);
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    }
                }
                let _ = to.shutdown(std::net::Shutdown::Write);
            })
        };
        pipe(
            client.try_clone().unwrap(),
            server.try_clone().unwrap(),
            record.clone(),
        );
        pipe(server, client, record);
    });
    addr
}

const MARKER: &[u8] = b"plaintext-gradient-marker";

/// Sets and gets [`MARKER`] through a recording relay; whether the
/// marker crossed the wire readable.
fn marker_on_the_wire(server_tls: Option<TlsIdentity>, client_tls: Option<&TlsIdentity>) -> bool {
    let server = TcpStoreServer::start_tls(loopback0(), SECRET, server_tls).unwrap();
    let record = Arc::new(Mutex::new(Vec::new()));
    let relay = recording_relay(server.local_addr(), record.clone());
    let c = TcpStore::connect_tls(relay, SECRET, 1, deadline(), client_tls).unwrap();
    c.set("grad", MARKER).unwrap();
    assert_eq!(c.get("grad", T).unwrap(), MARKER);
    assert_eq!(
        server.local_store().try_get("grad").unwrap().unwrap(),
        MARKER
    );
    let wire = record.lock().unwrap().clone();
    assert!(
        wire.len() > 2 * MARKER.len(),
        "the relay saw {} bytes",
        wire.len()
    );
    wire.windows(MARKER.len()).any(|w| w == MARKER)
}

#[test]
fn store_bytes_on_the_wire_are_encrypted() {
    assert!(
        marker_on_the_wire(None, None),
        "without TLS the relay must see the value (else this test proves nothing)"
    );
    let job = job("wire");
    assert!(
        !marker_on_the_wire(Some(job.server.clone()), Some(&job.client)),
        "the value crossed the wire in plaintext over TLS"
    );
}
