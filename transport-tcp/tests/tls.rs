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
use transport_tcp::{TcpEndpoint, TcpSetup, DEFAULT_MAX_PIECE};

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

/// Forwards one connection's bytes both ways, recording what rank 1 sent
/// and flipping its byte number `flip` (if any).
fn relay(to: SocketAddr, seen: Arc<Mutex<Vec<u8>>>, flip: Option<usize>) -> SocketAddr {
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
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let mut seen = seen.lock().unwrap();
                    if let Some(at) = flip.filter(|&at| (seen.len()..seen.len() + n).contains(&at))
                    {
                        buf[at - seen.len()] ^= 0x01;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    drop(seen);
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
    });
    addr
}

/// Rank 1 sends `marker` to rank 0 through a recording relay; the bytes
/// the relay saw.
fn wire_bytes(tls: Option<TlsIdentity>, marker: &[u8]) -> Vec<u8> {
    relayed(tls, marker, None).0
}

/// [`wire_bytes`], flipping byte `flip` of what rank 1 sends; also what
/// rank 0's receive reported (`Ok` when the marker arrived intact).
fn relayed(
    tls: Option<TlsIdentity>,
    marker: &[u8],
    flip: Option<usize>,
) -> (Vec<u8>, Result<(), String>) {
    let eps = [
        TcpEndpoint::bind(LOCALHOST).unwrap(),
        TcpEndpoint::bind(LOCALHOST).unwrap(),
    ];
    let seen = Arc::new(Mutex::new(Vec::new()));
    let via = relay(eps[0].local_addr(), seen.clone(), flip);
    let peers = [vec![(1, eps[1].local_addr())], vec![(0, via)]];
    let marker = marker.to_vec();
    let handles: Vec<_> = eps
        .into_iter()
        .zip(peers)
        .enumerate()
        .map(|(r, (ep, peers))| {
            let tls = tls.clone();
            let marker = marker.clone();
            thread::spawn(move || {
                let setup = TcpSetup {
                    tls,
                    ..setup(r, 1, DEFAULT_MAX_PIECE, Duration::from_secs(10))
                };
                let mut c = ep.establish(&setup, &peers).unwrap().pop().unwrap();
                let deadline = Instant::now() + Duration::from_secs(10);
                if r == 1 {
                    while !c
                        .try_post_send(&header(1, marker.len()), Outgoing::copied(&marker))
                        .unwrap()
                    {}
                    while !c.flush().unwrap() {
                        assert!(Instant::now() < deadline);
                    }
                    return (c, Ok(()));
                }
                let mut got = Vec::new();
                while got.is_empty() {
                    let r = c.try_recv(Space::Host, &mut |_, p| {
                        got = p.host().unwrap().to_vec();
                        Ok(())
                    });
                    if let Err(e) = r {
                        return (c, Err(e.to_string()));
                    }
                    assert!(Instant::now() < deadline, "nothing arrived");
                }
                let intact = if got == marker {
                    Ok(())
                } else {
                    Err("altered bytes were delivered".to_string())
                };
                (c, intact)
            })
        })
        .collect();
    let mut outcome = Ok(());
    for h in handles {
        let (c, r) = h.join().unwrap();
        outcome = outcome.and(r);
        drop(c);
    }
    let bytes = seen.lock().unwrap().clone();
    (bytes, outcome)
}

#[test]
fn an_altered_byte_fails_the_connection_instead_of_arriving() {
    let job = Authority::new("job").unwrap();
    let id = identity("flip", &job, &job, false);
    let marker = vec![0x42u8; 3000];
    // Where rank 1's data starts: after its part of the setup, measured
    // on an untouched run (the handshake's size does not vary).
    let (clean, ok) = relayed(Some(id.clone()), &marker, None);
    ok.unwrap();
    let data_at = clean.len() - (marker.len() + 48 + 22);
    let (_, outcome) = relayed(Some(id), &marker, Some(data_at + 100));
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
    let start = Instant::now();
    let handles: Vec<_> = ranks
        .into_iter()
        .map(|mut conns| {
            thread::spawn(move || {
                let c = &mut conns[0];
                let piece = c.max_piece(comm_core::transport::registry::MemoryKind::Host);
                let fill = |k: u64| (k % 251) as u8 + 1;
                let mut data = vec![0u8; piece];
                let (mut sent, mut recvd, mut k, mut next, mut bad) = (0, 0, 0u64, 0u64, 0usize);
                while sent < TOTAL || recvd < TOTAL || !c.flush().unwrap() {
                    data.fill(fill(k));
                    if sent < TOTAL
                        && c.try_post_send(&header(k + 1, piece), Outgoing::copied(&data))
                            .unwrap()
                    {
                        sent += piece;
                        k += 1;
                    }
                    if recvd < TOTAL {
                        c.try_recv(Space::Host, &mut |_, p| {
                            let p = p.host().unwrap();
                            recvd += p.len();
                            bad += p.iter().filter(|&&b| b != fill(next)).count();
                            next += 1;
                            Ok(())
                        })
                        .unwrap();
                    }
                }
                assert_eq!(bad, 0, "bytes differ from their piece's fill, in order");
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "tcp+tls: 64 MiB each direction in {:.1} ms = {:.2} GB/s per direction",
        secs * 1e3,
        TOTAL as f64 / secs / 1e9
    );
}

/// Forwards rank 1's bytes to `to` until `cut` bytes of them have passed
/// (rank 0's bytes flow back freely), waits, then closes both ways: a
/// peer dying in the middle of a record.
fn cutting_relay(to: SocketAddr, cut: usize) -> SocketAddr {
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
        let mut buf = [0u8; 1];
        for _ in 0..cut {
            if from.read_exact(&mut buf).is_err() || to.write_all(&buf).is_err() {
                return;
            }
        }
        thread::sleep(Duration::from_millis(300));
        let _ = to.shutdown(std::net::Shutdown::Both);
        let _ = from.shutdown(std::net::Shutdown::Both);
    });
    addr
}

#[test]
fn a_peer_that_dies_mid_record_is_found_dead() {
    let job = Authority::new("job").unwrap();
    let id = identity("cut", &job, &job, false);
    // Rank 1's setup bytes, measured on an untouched run, then 1000 bytes
    // into its first record.
    let marker = vec![0x42u8; 3000];
    let (clean, ok) = relayed(Some(id.clone()), &marker, None);
    ok.unwrap();
    let cut = clean.len() - (marker.len() + 48 + 22) + 1000;
    let eps = [
        TcpEndpoint::bind(LOCALHOST).unwrap(),
        TcpEndpoint::bind(LOCALHOST).unwrap(),
    ];
    let via = cutting_relay(eps[0].local_addr(), cut);
    let peers = [vec![(1, eps[1].local_addr())], vec![(0, via)]];
    let handles: Vec<_> = eps
        .into_iter()
        .zip(peers)
        .enumerate()
        .map(|(r, (ep, peers))| {
            let tls = Some(id.clone());
            let marker = marker.clone();
            thread::spawn(move || {
                let setup = TcpSetup {
                    tls,
                    ..setup(r, 1, DEFAULT_MAX_PIECE, Duration::from_secs(10))
                };
                let mut c = ep.establish(&setup, &peers).unwrap().pop().unwrap();
                if r == 1 {
                    let _ = c.try_post_send(&header(1, marker.len()), Outgoing::copied(&marker));
                    let _ = c.flush();
                    thread::sleep(Duration::from_millis(800));
                    return None;
                }
                // Read what arrives (part of a record) before the relay
                // closes, then only ask whether the peer is alive: the
                // receive path would find the end of file by itself.
                let start = Instant::now();
                while start.elapsed() < Duration::from_millis(150) {
                    c.try_recv(Space::Host, &mut |_, _| Ok(())).unwrap();
                    thread::sleep(Duration::from_millis(5));
                }
                while start.elapsed() < Duration::from_secs(3) {
                    if c.check_alive().is_err() {
                        return Some(true);
                    }
                    thread::sleep(Duration::from_millis(20));
                }
                Some(false)
            })
        })
        .collect();
    let found: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(found[0], Some(true), "rank 0 never found its dead peer");
}
