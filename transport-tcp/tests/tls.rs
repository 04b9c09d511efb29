//! TLS on the transport's sockets (`SNCL_TLS_*`): ranks with certificates
//! from one authority exchange every piece size; a rank with a certificate
//! from another authority, an expired one, or no TLS at all is refused
//! with an error naming the peer; the bytes on the wire are not the
//! plaintext.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use comm_core::transport::{Connection, Outgoing, Space};
use comm_core::Error;
use sncl_bootstrap::tls::certs::{self, Authority};
use sncl_bootstrap::tls::TlsIdentity;
use transport_tcp::{TcpConnection, TcpEndpoint, TcpSetup, DEFAULT_MAX_PIECE};

mod support;
use support::*;

/// A fresh private directory for one test's files.
fn temp_dir(name: &str) -> PathBuf {
    use std::os::unix::fs::DirBuilderExt;
    let dir = std::env::temp_dir().join(format!("sncl-tls-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
    dir
}

/// An identity issued by `authority` (expired or not), trusting `trust`.
fn identity(dir: &str, authority: &Authority, trust: &Authority, expired: bool) -> TlsIdentity {
    let issued = authority.issue(&["rank".into()], expired).unwrap();
    let files = certs::write_files(&temp_dir(dir), &trust.ca_pem(), &issued).unwrap();
    TlsIdentity::load(&files).unwrap()
}

fn bootstrap_detail(r: &Result<Vec<transport_tcp::TcpConnection>, Error>) -> String {
    match r {
        Err(Error::Bootstrap { detail, .. }) => detail.clone(),
        Err(e) => panic!("expected a bootstrap error, got {e}"),
        Ok(_) => panic!("expected a bootstrap error, the setup succeeded"),
    }
}

#[test]
fn ranks_with_one_authority_exchange_every_piece_size() {
    let job = Authority::new("job").unwrap();
    let id = identity("job-3", &job, &job, false);
    for nsocks in [1, 2] {
        let ranks: Vec<_> = mesh_with(3, nsocks, 64 * 1024, &vec![Some(id.clone()); 3])
            .into_iter()
            .map(Result::unwrap)
            .collect();
        run_exchange_on(ranks, nsocks, 64 * 1024, 300);
    }
}

#[test]
fn a_certificate_from_another_authority_is_refused_naming_the_peer() {
    let job = Authority::new("job").unwrap();
    let stranger = Authority::new("stranger").unwrap();
    let good = identity("good", &job, &job, false);
    let foreign = identity("foreign", &stranger, &job, false);
    let out = mesh_with(2, 1, 4096, &[Some(good), Some(foreign)]);
    let (d0, d1) = (bootstrap_detail(&out[0]), bootstrap_detail(&out[1]));
    // Rank 0 (the server) refuses rank 1's certificate; rank 1 hears so.
    assert!(
        d0.contains("peer rank 1") && d0.contains("certificate"),
        "{d0}"
    );
    assert!(d1.contains("peer rank 0"), "{d1}");
}

#[test]
fn an_expired_certificate_is_refused() {
    let job = Authority::new("job").unwrap();
    let good = identity("exp-good", &job, &job, false);
    let expired = identity("expired", &job, &job, true);
    // The expired rank is the server: the client checks and refuses it.
    let out = mesh_with(2, 1, 4096, &[Some(expired), Some(good)]);
    let d1 = bootstrap_detail(&out[1]);
    assert!(d1.contains("peer rank 0") && d1.contains("Expired"), "{d1}");
    assert!(out[0].is_err());
}

#[test]
fn a_rank_without_tls_is_refused_on_both_sides() {
    let job = Authority::new("job").unwrap();
    let id = identity("mixed", &job, &job, false);
    for tls in [[Some(id.clone()), None], [None, Some(id.clone())]] {
        let start = Instant::now();
        let out = mesh_with(2, 1, 4096, &tls);
        let (d0, d1) = (bootstrap_detail(&out[0]), bootstrap_detail(&out[1]));
        assert!(d0.contains("TLS") && d0.contains("peer rank 1"), "{d0}");
        assert!(d1.contains("TLS") && d1.contains("peer rank 0"), "{d1}");
        // Refused at the hello, not at the 10 s deadline.
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
    }
}

#[test]
fn a_key_that_is_not_the_certificates_is_refused_at_load() {
    let job = Authority::new("job").unwrap();
    let dir = temp_dir("mismatch");
    let a = job.issue(&["a".into()], false).unwrap();
    let b = job.issue(&["b".into()], false).unwrap();
    let mixed = certs::Issued {
        cert_pem: a.cert_pem,
        key_pem: b.key_pem,
    };
    let files = certs::write_files(&dir, &job.ca_pem(), &mixed).unwrap();
    let e = TlsIdentity::load(&files).unwrap_err().to_string();
    assert!(
        e.contains("SNCL_TLS_KEY") && e.contains("not the key"),
        "{e}"
    );
    // A key others can read is refused too.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&files.key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = TlsIdentity::load(&files).unwrap_err().to_string();
    assert!(
        e.contains("SNCL_TLS_KEY") && e.contains("readable by other users"),
        "{e}"
    );
}

/// What the relay does to rank 1's bytes.
#[derive(Clone, Copy)]
enum Tamper {
    /// Forward them as they are.
    Nothing,
    /// Flip the lowest bit of byte number `n`.
    Flip(usize),
    /// Forward the first `n`, wait, then close both ways: a peer dying in
    /// the middle of what it sends.
    Cut(usize),
}

/// Forwards one connection's bytes both ways, recording what rank 1 sent
/// and tampering with it as `tamper` says.
fn relay(to: SocketAddr, seen: Arc<Mutex<Vec<u8>>>, tamper: Tamper) -> SocketAddr {
    let listener = TcpListener::bind((LOCALHOST, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        let (from, _) = listener.accept().unwrap();
        let to = TcpStream::connect(to).unwrap();
        let (mut a, mut b) = (from.try_clone().unwrap(), to.try_clone().unwrap());
        thread::spawn(move || {
            let _ = std::io::copy(&mut b, &mut a);
        });
        let (mut from, mut to) = (from, to);
        let mut buf = [0u8; 65536];
        loop {
            let mut n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let mut seen = seen.lock().unwrap();
            let at = seen.len();
            let cut = match tamper {
                Tamper::Flip(k) if (at..at + n).contains(&k) => {
                    buf[k - at] ^= 0x01;
                    false
                }
                Tamper::Cut(k) if at + n >= k => {
                    n = k - at;
                    true
                }
                _ => false,
            };
            seen.extend_from_slice(&buf[..n]);
            drop(seen);
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
            if cut {
                thread::sleep(Duration::from_millis(300));
                let _ = from.shutdown(std::net::Shutdown::Both);
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Both);
    });
    addr
}

/// Two ranks with `tls`, rank 1 reaching rank 0 through [`relay`]: their
/// connections and what the relay saw of rank 1's bytes.
fn through_relay(
    tls: Option<TlsIdentity>,
    tamper: Tamper,
) -> (TcpConnection, TcpConnection, Arc<Mutex<Vec<u8>>>) {
    let eps = [
        TcpEndpoint::bind(LOCALHOST).unwrap(),
        TcpEndpoint::bind(LOCALHOST).unwrap(),
    ];
    let seen = Arc::new(Mutex::new(Vec::new()));
    let via = relay(eps[0].local_addr(), seen.clone(), tamper);
    let peers = [vec![(1, eps[1].local_addr())], vec![(0, via)]];
    let mut conns = eps
        .into_iter()
        .zip(peers)
        .enumerate()
        .map(|(r, (ep, peers))| {
            let tls = tls.clone();
            thread::spawn(move || {
                let setup = TcpSetup {
                    tls,
                    ..setup(r, 1, DEFAULT_MAX_PIECE, Duration::from_secs(10))
                };
                ep.establish(&setup, &peers).unwrap().pop().unwrap()
            })
        });
    let (r0, r1) = (conns.next().unwrap(), conns.next().unwrap());
    (r0.join().unwrap(), r1.join().unwrap(), seen)
}

/// Rank 1 sends `marker` as one piece and flushes it (in a thread).
fn send_marker(mut c: TcpConnection, marker: &[u8]) -> thread::JoinHandle<TcpConnection> {
    let marker = marker.to_vec();
    thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(10);
        let h = header(1, marker.len());
        while !matches!(
            c.try_post_send(&h, Outgoing::copied(&marker)),
            Ok(true) | Err(_)
        ) {}
        while !c.flush().unwrap_or(true) {
            assert!(Instant::now() < deadline);
        }
        c
    })
}

/// Rank 1 sends `marker` to rank 0 through a recording relay; the bytes
/// the relay saw.
fn wire_bytes(tls: Option<TlsIdentity>, marker: &[u8]) -> Vec<u8> {
    relayed(tls, marker, Tamper::Nothing).0
}

/// [`wire_bytes`] with `tamper`; also what rank 0's receive reported
/// (`Ok` when the marker arrived intact).
fn relayed(
    tls: Option<TlsIdentity>,
    marker: &[u8],
    tamper: Tamper,
) -> (Vec<u8>, Result<(), String>) {
    let (mut c, sender, seen) = through_relay(tls, tamper);
    let sender = send_marker(sender, marker);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    let mut outcome = Ok(());
    while got.is_empty() {
        let r = c.try_recv(Space::Host, &mut |_, p| {
            got = p.host().unwrap().to_vec();
            Ok(())
        });
        if let Err(e) = r {
            outcome = Err(e.to_string());
            break;
        }
        assert!(Instant::now() < deadline, "nothing arrived");
    }
    if outcome.is_ok() && got != marker {
        outcome = Err("altered bytes were delivered".to_string());
    }
    drop(sender.join().unwrap());
    drop(c);
    let bytes = seen.lock().unwrap().clone();
    (bytes, outcome)
}

/// Where rank 1's data starts in what the relay sees: after its part of
/// the setup, measured on an untouched run (the handshake's size does not
/// vary) carrying `marker` (one record: 48 bytes of header, 22 of record
/// overhead).
fn data_start(id: &TlsIdentity, marker: &[u8]) -> usize {
    let (clean, ok) = relayed(Some(id.clone()), marker, Tamper::Nothing);
    ok.unwrap();
    clean.len() - (marker.len() + 48 + 22)
}

#[test]
fn an_altered_byte_fails_the_connection_instead_of_arriving() {
    let job = Authority::new("job").unwrap();
    let id = identity("flip", &job, &job, false);
    let marker = vec![0x42u8; 3000];
    let data_at = data_start(&id, &marker);
    let (_, outcome) = relayed(Some(id), &marker, Tamper::Flip(data_at + 100));
    let e = outcome.expect_err("an altered record was accepted");
    assert!(e.contains("failed to open (altered"), "{e}");
}

#[test]
fn the_bytes_on_the_wire_are_not_the_plaintext() {
    let marker: Vec<u8> = b"plaintext-gradient-marker:".repeat(40);
    let find = |hay: &[u8]| hay.windows(26).any(|w| w == &marker[..26]);
    // The check can fail: without TLS the marker is on the wire.
    assert!(
        find(&wire_bytes(None, &marker)),
        "plain TCP should carry the marker"
    );
    let job = Authority::new("job").unwrap();
    let id = identity("wire", &job, &job, false);
    let seen = wire_bytes(Some(id), &marker);
    assert!(
        seen.len() > marker.len(),
        "the relay saw {} bytes",
        seen.len()
    );
    assert!(!find(&seen), "the marker crossed the wire in the clear");
}

#[test]
fn throughput_64mib_each_direction_with_tls() {
    const TOTAL: usize = 64 << 20;
    let job = Authority::new("job").unwrap();
    let id = identity("bw", &job, &job, false);
    let ranks: Vec<_> = mesh_with(2, 1, DEFAULT_MAX_PIECE, &[Some(id.clone()), Some(id)])
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let gbps = stream_both_ways(ranks, TOTAL);
    eprintln!(
        "tcp+tls: 64 MiB each direction in {:.1} ms = {gbps:.2} GB/s per direction",
        TOTAL as f64 / gbps / 1e6
    );
}

#[test]
fn a_peer_that_dies_mid_record_is_found_dead() {
    let job = Authority::new("job").unwrap();
    let id = identity("cut", &job, &job, false);
    // The relay forwards rank 1's setup and 1000 bytes of its first record.
    let marker = vec![0x42u8; 3000];
    let cut = data_start(&id, &marker) + 1000;
    let (mut c, sender, _) = through_relay(Some(id), Tamper::Cut(cut));
    let sender = send_marker(sender, &marker);
    // Read what arrives (part of a record) before the relay closes, then
    // only ask whether the peer is alive: the receive path would find the
    // end of file by itself.
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(150) {
        c.try_recv(Space::Host, &mut |_, _| Ok(())).unwrap();
        thread::sleep(Duration::from_millis(5));
    }
    let mut found = false;
    while !found && start.elapsed() < Duration::from_secs(3) {
        found = c.check_alive().is_err();
        thread::sleep(Duration::from_millis(20));
    }
    drop(sender.join().unwrap());
    assert!(found, "rank 0 never found its dead peer");
}
