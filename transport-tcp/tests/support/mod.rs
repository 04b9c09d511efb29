//! What the TCP transport's integration tests share: ranks as threads on
//! 127.0.0.1, pieces with recognisable contents, an all-to-all exchange
//! that checks order, headers and bytes.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::thread;
use std::time::{Duration, Instant};

use comm_core::transport::registry::MemoryKind;
use comm_core::transport::{Connection, Outgoing, Space};
use comm_core::wire::{Collective, Fingerprint, PieceHeader};
use comm_core::{DataType, Error, ReduceOp};
use sncl_bootstrap::tls::TlsIdentity;
use transport_tcp::{TcpConnection, TcpEndpoint, TcpSetup};

pub const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
pub const SECRET: [u8; 16] = *b"0123456789abcdef";
pub const COMM: u64 = 0x5eed_c0de;

pub fn setup(rank: usize, nsocks: usize, max_piece: usize, timeout: Duration) -> TcpSetup {
    TcpSetup {
        rank,
        comm_id: COMM,
        secret: SECRET,
        nsocks,
        max_piece,
        deadline: Instant::now() + timeout,
        pacing: Default::default(),
        tls: None,
    }
}

/// Connects `n` ranks pairwise; result[r] holds rank r's connections ordered by peer.
pub fn mesh(n: usize, nsocks: usize, max_piece: usize) -> Vec<Vec<TcpConnection>> {
    mesh_with(n, nsocks, max_piece, &vec![None; n])
        .into_iter()
        .map(|r| r.unwrap())
        .collect()
}

/// [`mesh`] with rank r's TLS identity `tls[r]`; each rank's outcome.
pub fn mesh_with(
    n: usize,
    nsocks: usize,
    max_piece: usize,
    tls: &[Option<TlsIdentity>],
) -> Vec<Result<Vec<TcpConnection>, Error>> {
    let eps: Vec<TcpEndpoint> = (0..n)
        .map(|_| TcpEndpoint::bind(LOCALHOST).unwrap())
        .collect();
    let addrs: Vec<SocketAddr> = eps.iter().map(|e| e.local_addr()).collect();
    let handles: Vec<_> = eps
        .into_iter()
        .enumerate()
        .map(|(r, ep)| {
            let peers: Vec<(usize, SocketAddr)> =
                (0..n).filter(|&p| p != r).map(|p| (p, addrs[p])).collect();
            let tls = tls[r].clone();
            thread::spawn(move || {
                let setup = TcpSetup {
                    tls,
                    ..setup(r, nsocks, max_piece, Duration::from_secs(10))
                };
                ep.establish(&setup, &peers)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

pub fn header(seq: u64, len: usize) -> PieceHeader {
    PieceHeader {
        checksum: None,
        comm_id: COMM,
        seq,
        len: len as u32,
        fingerprint: Some(Fingerprint {
            collective: Collective::AllReduce,
            dtype: DataType::Float32,
            op: ReduceOp::Sum,
            root: -1,
            count: 12345,
            settings: 0,
        }),
    }
}

pub fn seed(src: usize, dst: usize, k: usize) -> u8 {
    (src as u8).wrapping_mul(61) ^ (dst as u8).wrapping_mul(17) ^ (k as u8).wrapping_mul(29)
}

pub fn fill(buf: &mut [u8], s: u8) {
    for (j, b) in buf.iter_mut().enumerate() {
        *b = s.wrapping_add((j % 251) as u8);
    }
}

pub fn check(buf: &[u8], s: u8) -> bool {
    buf.iter()
        .enumerate()
        .all(|(j, &b)| b == s.wrapping_add((j % 251) as u8))
}

/// Mixed piece sizes: empty, one byte, full pieces and odd sizes.
pub fn sizes(count: usize, max_piece: usize) -> Vec<usize> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..count)
        .map(|k| match k % 7 {
            0 => 0,
            1 => 1,
            2 => max_piece,
            _ => {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % max_piece as u64) as usize
            }
        })
        .collect()
}

/// Sends `sizes` to every peer and receives the same from each, all at
/// once, checking order, headers and content.
pub fn exchange(rank: usize, conns: &mut [TcpConnection], sizes: &[usize]) {
    let max = conns[0].max_piece(MemoryKind::Host);
    let mut buf = vec![0u8; max];
    let mut sent = vec![0usize; conns.len()];
    let mut recvd = vec![0usize; conns.len()];
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut done = true;
        for (c, conn) in conns.iter_mut().enumerate() {
            let peer = conn.peer();
            if sent[c] < sizes.len() {
                let k = sent[c];
                let data = &mut buf[..sizes[k]];
                fill(data, seed(rank, peer, k));
                // Every other piece asks for a checksum (a CRC32C trailer);
                // every third goes without a fingerprint (a short header).
                let full = header(k as u64 + 1, sizes[k]);
                let h = PieceHeader {
                    checksum: (k % 2 == 1).then_some(0),
                    fingerprint: full.fingerprint.filter(|_| k % 3 != 2),
                    ..full
                };
                if conn.try_post_send(&h, Outgoing::copied(data)).unwrap() {
                    sent[c] += 1;
                }
            }
            let flushed = conn.flush().unwrap();
            if recvd[c] < sizes.len() {
                let k = recvd[c];
                let got = conn
                    .try_recv(Space::Host, &mut |h, p| {
                        let p = p.host().expect("a host piece");
                        assert_eq!(h.seq, k as u64 + 1, "rank {rank} from {peer}: out of order");
                        assert_eq!(h.len as usize, p.len());
                        assert_eq!(p.len(), sizes[k], "piece {k} size");
                        let fp = header(0, 0).fingerprint.filter(|_| k % 3 != 2);
                        assert_eq!(h.fingerprint, fp, "piece {k}");
                        assert!(check(p, seed(peer, rank, k)), "piece {k} content");
                        let crc = comm_core::wire::piece_checksum(p);
                        assert_eq!(h.checksum, (k % 2 == 1).then_some(crc), "piece {k}");
                        Ok(())
                    })
                    .unwrap();
                if got {
                    recvd[c] += 1;
                }
            }
            done &= sent[c] == sizes.len() && recvd[c] == sizes.len() && flushed;
        }
        if done {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "rank {rank}: stuck, sent {sent:?} received {recvd:?}"
        );
    }
}

pub fn run_exchange(n: usize, nsocks: usize, max_piece: usize, count: usize) {
    let ranks = mesh(n, nsocks, max_piece);
    run_exchange_on(ranks, nsocks, max_piece, count);
}

/// [`run_exchange`] on connected ranks.
pub fn run_exchange_on(
    ranks: Vec<Vec<TcpConnection>>,
    nsocks: usize,
    max_piece: usize,
    count: usize,
) {
    let sizes = sizes(count, max_piece);
    let handles: Vec<_> = ranks
        .into_iter()
        .enumerate()
        .map(|(r, mut conns)| {
            let sizes = sizes.clone();
            thread::spawn(move || {
                for (i, c) in conns.iter().enumerate() {
                    assert_eq!(c.peer(), if i < r { i } else { i + 1 });
                    assert_eq!(c.kind(), "tcp");
                    assert_eq!(c.nsocks(), nsocks);
                }
                exchange(r, &mut conns, &sizes);
                conns
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

/// Streams `total` bytes each way between the two ranks of `ranks` at
/// once, a piece of the connection's largest size at a time: piece k
/// carries the byte `k % 251 + 1` throughout and the receiver checks every
/// byte of every piece, in order. Returns GB/s per direction.
pub fn stream_both_ways(ranks: Vec<Vec<TcpConnection>>, total: usize) -> f64 {
    let start = Instant::now();
    let handles: Vec<_> = ranks
        .into_iter()
        .map(|mut conns| {
            thread::spawn(move || {
                let c = &mut conns[0];
                let piece = c.max_piece(MemoryKind::Host);
                let fill = |k: u64| (k % 251) as u8 + 1;
                let mut data = vec![0u8; piece];
                let (mut sent, mut recvd, mut k) = (0, 0, 0u64);
                let (mut next, mut bad) = (0u64, 0usize);
                while sent < total || recvd < total || !c.flush().unwrap() {
                    data.fill(fill(k));
                    if sent < total
                        && c.try_post_send(&header(k + 1, piece), Outgoing::copied(&data))
                            .unwrap()
                    {
                        sent += piece;
                        k += 1;
                    }
                    if recvd < total {
                        c.try_recv(Space::Host, &mut |_, p| {
                            let p = p.host().expect("a host piece");
                            recvd += p.len();
                            // In order, each byte its piece's fill.
                            bad += p.iter().filter(|&&b| b != fill(next)).count();
                            next += 1;
                            Ok(())
                        })
                        .unwrap();
                    }
                }
                assert_eq!(bad, 0, "bytes differ from their piece's fill, in order");
                assert_eq!(next, (total / piece) as u64, "pieces received");
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    total as f64 / start.elapsed().as_secs_f64() / 1e9
}
