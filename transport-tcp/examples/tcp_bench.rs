//! Loopback throughput of the TCP transport.
//!
//! ```text
//! cargo run --release -p transport-tcp --example tcp_bench -- [threads|procs] [nsocks] [MiB] [iters]
//! ```
//!
//! Runs two ranks (two threads, or two processes: the program re-runs itself
//! as rank 1) and measures (a) 64 MiB each direction at once and (b) a
//! 2-rank ring all-reduce of f32 (reduce-scatter + all-gather, pieces
//! pipelined) with its bus bandwidth (= algorithm bandwidth for 2 ranks).
//! `SNCL_TLS_CERT`, `SNCL_TLS_KEY` and `SNCL_TLS_CA` turn TLS on.
//! `BENCH_SEND_BUFFER=<bytes>` sets
//! [`TcpConnection::set_send_buffer_limit`] on both ranks.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use comm_core::transport::{Connection, Outgoing, Space};
use comm_core::wire::{Collective, Fingerprint, PieceHeader};
use comm_core::{DataType, ReduceOp};
use transport_tcp::{TcpConnection, TcpEndpoint, TcpSetup, DEFAULT_MAX_PIECE};

const PIECE: usize = DEFAULT_MAX_PIECE;

fn header(seq: u64) -> PieceHeader {
    PieceHeader {
        checksum: None,
        comm_id: 1,
        seq,
        len: 0,
        fingerprint: Some(Fingerprint {
            collective: Collective::AllReduce,
            dtype: DataType::Float32,
            op: ReduceOp::Sum,
            root: -1,
            count: 0,
            settings: 0,
        }),
    }
}

fn connect(ep: TcpEndpoint, rank: usize, peer: SocketAddr, nsocks: usize) -> TcpConnection {
    let setup = TcpSetup {
        rank,
        comm_id: 1,
        secret: [3; 16],
        nsocks,
        max_piece: PIECE,
        deadline: Instant::now() + Duration::from_secs(20),
        pacing: Default::default(),
        // SNCL_TLS_CERT / SNCL_TLS_KEY / SNCL_TLS_CA: TLS on both ranks.
        tls: sncl_bootstrap::tls::TlsIdentity::from_settings(
            &comm_core::Config::from_vars(&|k| std::env::var(k).ok())
                .unwrap()
                .tcp
                .tls,
        )
        .unwrap(),
    };
    let mut c = ep
        .establish(&setup, &[(1 - rank, peer)])
        .unwrap()
        .pop()
        .unwrap();
    if let Ok(v) = std::env::var("BENCH_SEND_BUFFER") {
        c.set_send_buffer_limit(v.parse().unwrap());
    }
    c
}

/// Sends and receives `bytes` at once; returns the seconds taken.
fn bidir(c: &mut TcpConnection, bytes: usize) -> f64 {
    let data = vec![0x5au8; PIECE];
    let start = Instant::now();
    let (mut sent, mut recvd) = (0, 0);
    while sent < bytes || recvd < bytes || !c.flush().unwrap() {
        if sent < bytes {
            let n = PIECE.min(bytes - sent);
            if c.try_post_send(&header(1), Outgoing::copied(&data[..n]))
                .unwrap()
            {
                sent += n;
            }
        }
        if recvd < bytes {
            c.try_recv(Space::Host, &mut |_, p| {
                let p = p.host().expect("a host piece");
                recvd += p.len();
                Ok(())
            })
            .unwrap();
        }
    }
    start.elapsed().as_secs_f64()
}

/// 2-rank ring all-reduce (sum) of `buf` in place; returns the seconds taken.
fn allreduce(c: &mut TcpConnection, rank: usize, buf: &mut [f32]) -> f64 {
    let start = Instant::now();
    let half = buf.len() / 2;
    let piece = PIECE / 4;
    let (mine, theirs) = if rank == 0 {
        (0..half, half..buf.len())
    } else {
        (half..buf.len(), 0..half)
    };
    let npieces = half.div_ceil(piece);
    let range = |r: &std::ops::Range<usize>, k: usize| {
        r.start + k * piece..(r.start + (k + 1) * piece).min(r.end)
    };
    // Send order: the peer's half (to be reduced there), then my reduced half
    // piece by piece as soon as each is reduced.
    let (mut sent, mut recvd) = (0usize, 0usize);
    while sent < 2 * npieces || recvd < 2 * npieces || !c.flush().unwrap() {
        if sent < 2 * npieces && (sent < npieces || sent - npieces < recvd) {
            let r = if sent < npieces {
                range(&theirs, sent)
            } else {
                range(&mine, sent - npieces)
            };
            let bytes = as_bytes(&buf[r]);
            if c.try_post_send(&header(1), Outgoing::copied(bytes))
                .unwrap()
            {
                sent += 1;
            }
        }
        if recvd < 2 * npieces {
            let r = if recvd < npieces {
                range(&mine, recvd)
            } else {
                range(&theirs, recvd - npieces)
            };
            let reduce = recvd < npieces;
            let dst = &mut buf[r];
            if c.try_recv(Space::Host, &mut |_, p| {
                let p = p.host().expect("a host piece");
                let src = p
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()));
                if reduce {
                    dst.iter_mut().zip(src).for_each(|(d, s)| *d += s);
                } else {
                    dst.iter_mut().zip(src).for_each(|(d, s)| *d = s);
                }
                Ok(())
            })
            .unwrap()
            {
                recvd += 1;
            }
        }
    }
    start.elapsed().as_secs_f64()
}

fn as_bytes(v: &[f32]) -> &[u8] {
    // Little-endian host assumed (x86_64/aarch64); safe view via bytemuck-free copy would cost a pass.
    let len = std::mem::size_of_val(v);
    // SAFETY: f32 has no padding and any byte pattern is a valid u8; the
    // slice covers exactly the memory of `v` for its lifetime.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), len) }
}

fn run(c: &mut TcpConnection, rank: usize, mib: usize, iters: usize) {
    let bytes = mib << 20;
    bidir(c, bytes); // warm-up
    let mut best = f64::MAX;
    for _ in 0..iters {
        best = best.min(bidir(c, bytes));
    }
    if rank == 0 {
        eprintln!(
            "bidir {mib} MiB each way, nsocks {}: best {:.1} ms = {:.2} GB/s per direction",
            c.nsocks(),
            best * 1e3,
            bytes as f64 / best / 1e9
        );
    }
    let mut buf = vec![(rank + 1) as f32; bytes / 4];
    allreduce(c, rank, &mut buf);
    let (mut best, mut total) = (f64::MAX, 0.0);
    for _ in 0..iters {
        buf.iter_mut().for_each(|x| *x = (rank + 1) as f32);
        let t = allreduce(c, rank, &mut buf);
        assert!(buf.iter().all(|&x| x == 3.0));
        best = best.min(t);
        total += t;
    }
    if rank == 0 {
        eprintln!(
            "all_reduce {mib} MiB f32, 2 ranks, nsocks {}: best {:.1} ms = {:.2} GB/s busbw (mean {:.2} GB/s)",
            c.nsocks(),
            best * 1e3,
            bytes as f64 / best / 1e9,
            bytes as f64 / (total / iters as f64) / 1e9
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, d: &str| args.get(i).cloned().unwrap_or_else(|| d.to_string());
    let mode = arg(1, "threads");
    let nsocks: usize = arg(2, "2").parse().unwrap();
    let mib: usize = arg(3, "64").parse().unwrap();
    let iters: usize = arg(4, "5").parse().unwrap();
    let local = IpAddr::V4(Ipv4Addr::LOCALHOST);
    match mode.as_str() {
        "threads" => {
            let ep0 = TcpEndpoint::bind(local).unwrap();
            let ep1 = TcpEndpoint::bind(local).unwrap();
            let (a0, a1) = (ep0.local_addr(), ep1.local_addr());
            let t = std::thread::spawn(move || {
                let mut c = connect(ep1, 1, a0, nsocks);
                run(&mut c, 1, mib, iters);
            });
            let mut c = connect(ep0, 0, a1, nsocks);
            run(&mut c, 0, mib, iters);
            t.join().unwrap();
        }
        "procs" => {
            let ep0 = TcpEndpoint::bind(local).unwrap();
            let mut child = Command::new(&args[0])
                .args([
                    "child",
                    &nsocks.to_string(),
                    &mib.to_string(),
                    &iters.to_string(),
                ])
                .arg(ep0.local_addr().to_string())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let mut line = String::new();
            BufReader::new(child.stdout.take().unwrap())
                .read_line(&mut line)
                .unwrap();
            let a1: SocketAddr = line.trim().parse().unwrap();
            let mut c = connect(ep0, 0, a1, nsocks);
            run(&mut c, 0, mib, iters);
            assert!(child.wait().unwrap().success());
        }
        "child" => {
            let a0: SocketAddr = arg(5, "").parse().unwrap();
            let ep1 = TcpEndpoint::bind(local).unwrap();
            let mut out = std::io::stdout();
            writeln!(out, "{}", ep1.local_addr()).unwrap();
            out.flush().unwrap();
            let mut c = connect(ep1, 1, a0, nsocks);
            run(&mut c, 1, mib, iters);
        }
        other => panic!("unknown mode {other}: use threads or procs"),
    }
}
