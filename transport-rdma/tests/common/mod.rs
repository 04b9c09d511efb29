//! Shared helpers: emulated-verbs setups, ranks as threads (a
//! `MemoryStore`) or as processes (the test binary re-executes itself with
//! `RDMA_TEST_CHILD` set and reaches the store over TCP).

#![allow(dead_code)]

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use comm_core::transport::{Connection, Outgoing, Space};
use comm_core::wire::{Collective, Fingerprint, PieceHeader};
use comm_core::{DataType, ReduceOp};
use sncl_bootstrap::{MemoryStore, Store, TcpStore, TcpStoreServer};
use transport_rdma::{establish, ContextScope, IbSettings, Provider, RdmaConnection, RdmaSetup};

/// Set in a child's environment: the name of the test whose child body runs.
pub const CHILD_ENV: &str = "RDMA_TEST_CHILD";

pub fn child_role() -> Option<(String, usize, usize, SocketAddr, [u8; 16], String)> {
    let role = std::env::var(CHILD_ENV).ok()?;
    let get = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} unset"));
    let secret: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(&get("RDMA_TEST_SECRET")[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    Some((
        role,
        get("RDMA_TEST_RANK").parse().unwrap(),
        get("RDMA_TEST_NRANKS").parse().unwrap(),
        get("RDMA_TEST_STORE").parse().unwrap(),
        secret.try_into().unwrap(),
        std::env::var("RDMA_TEST_ARG").unwrap_or_default(),
    ))
}

pub fn settings(qps: usize) -> IbSettings {
    IbSettings {
        emulate: true,
        qps_per_conn: qps,
        ..IbSettings::default()
    }
}

pub fn rdma_setup(rank: usize, slots: usize, slot_bytes: usize, qps: usize) -> RdmaSetup {
    RdmaSetup {
        rank,
        comm_id: 0x5eed,
        settings: settings(qps),
        slots,
        slot_bytes,
        deadline: Instant::now() + Duration::from_secs(20),
        liveness_ip: Some(std::net::Ipv4Addr::LOCALHOST.into()),
        context: ContextScope::Process,
    }
}

pub fn header(len: usize, seq: u64) -> PieceHeader {
    PieceHeader {
        checksum: None,
        comm_id: 0x5eed,
        seq,
        len: len as u32,
        fingerprint: Some(Fingerprint {
            collective: Collective::SendRecv,
            dtype: DataType::Uint8,
            op: ReduceOp::Sum,
            root: -1,
            count: 0,
            settings: 0,
        }),
    }
}

/// Two connected ranks as threads of this process.
pub fn pair(slots: usize, slot_bytes: usize, qps: usize) -> (RdmaConnection, RdmaConnection) {
    pair_with(slots, slot_bytes, settings(qps))
}

/// As [`pair`], with these settings on both ranks.
pub fn pair_with(
    slots: usize,
    slot_bytes: usize,
    settings: IbSettings,
) -> (RdmaConnection, RdmaConnection) {
    let store = MemoryStore::new();
    let s1 = store.for_rank(1);
    // Two nodes as threads: each its own NIC (a fault stays on its side).
    let setup = move |rank| RdmaSetup {
        settings: settings.clone(),
        context: ContextScope::Connection,
        ..rdma_setup(rank, slots, slot_bytes, 1)
    };
    let setup1 = setup(1);
    let t = std::thread::spawn(move || establish(&setup1, &Provider::Emulated, &s1, &[0]));
    let mut c0 = establish(&setup(0), &Provider::Emulated, &store, &[1]).unwrap();
    let mut c1 = t.join().unwrap().unwrap();
    (c0.remove(0), c1.remove(0))
}

/// The bytes of piece `i` from `from` to `to`.
pub fn payload(from: usize, to: usize, i: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (k as u64 * 31 + i as u64 * 7 + from as u64 * 101 + to as u64 * 13) as u8)
        .collect()
}

/// Sends `sizes` to every peer and receives theirs, checking every byte,
/// all non-blocking, by `deadline`.
pub fn exchange(
    me: usize,
    conns: &mut [RdmaConnection],
    sizes: &[usize],
    deadline: Instant,
) -> Result<(), String> {
    let n = conns.len();
    let mut sent = vec![0usize; n];
    let mut got = vec![0usize; n];
    while sent.iter().chain(&got).any(|&k| k < sizes.len()) {
        if Instant::now() > deadline {
            return Err(format!(
                "rank {me}: deadline passed (sent {sent:?}, got {got:?})"
            ));
        }
        for (c, conn) in conns.iter_mut().enumerate() {
            let peer = conn.peer();
            while sent[c] < sizes.len() {
                let i = sent[c];
                let data = payload(me, peer, i, sizes[i]);
                match conn.try_post_send(&header(data.len(), i as u64 + 1), Outgoing::copied(&data))
                {
                    Ok(true) => sent[c] += 1,
                    Ok(false) => break,
                    Err(e) => return Err(format!("rank {me}: send to {peer}: {e}")),
                }
            }
            loop {
                let i = got[c];
                let mut bad = None;
                let r = conn.try_recv(Space::Host, &mut |h, p| {
                    let d = p.host().expect("a host piece");
                    let want = payload(peer, me, i, sizes.get(i).copied().unwrap_or(0));
                    if h.seq != i as u64 + 1 || d != want.as_slice() {
                        bad = Some(format!(
                            "rank {me}: piece {i} from {peer}: seq {} len {} (expected {} bytes)",
                            h.seq,
                            d.len(),
                            want.len()
                        ));
                    }
                    Ok(())
                });
                if let Some(b) = bad {
                    return Err(b);
                }
                match r {
                    Ok(true) => got[c] += 1,
                    Ok(false) => break,
                    Err(e) => return Err(format!("rank {me}: recv from {peer}: {e}")),
                }
            }
            conn.flush()
                .map_err(|e| format!("rank {me}: flush {peer}: {e}"))?;
        }
    }
    Ok(())
}

/// A store server on loopback and its secret.
pub fn store_server() -> (TcpStoreServer, [u8; 16]) {
    let mut secret = [0u8; 16];
    for (i, b) in secret.iter_mut().enumerate() {
        *b = (std::process::id() as u8).wrapping_mul(i as u8 + 3) ^ 0x5a;
    }
    let server = TcpStoreServer::start("127.0.0.1:0".parse().unwrap(), secret).unwrap();
    (server, secret)
}

pub fn connect_store(addr: SocketAddr, secret: [u8; 16], rank: usize) -> TcpStore {
    TcpStore::connect(addr, secret, rank, Instant::now() + Duration::from_secs(20)).unwrap()
}

/// Spawns `nranks` children running test `test` (`arg` passed along).
pub fn spawn_ranks(test: &str, nranks: usize, arg: &str) -> (TcpStoreServer, Vec<Child>) {
    let (server, secret) = store_server();
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    let exe = std::env::current_exe().unwrap();
    let children = (0..nranks)
        .map(|rank| {
            Command::new(&exe)
                .args(["--exact", test, "--nocapture", "--test-threads=1"])
                .env(CHILD_ENV, test)
                .env("RDMA_TEST_RANK", rank.to_string())
                .env("RDMA_TEST_NRANKS", nranks.to_string())
                .env("RDMA_TEST_STORE", server.local_addr().to_string())
                .env("RDMA_TEST_SECRET", &hex)
                .env("RDMA_TEST_ARG", arg)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    (server, children)
}

/// Waits for every child by `limit`; returns (exit ok, combined output).
pub fn wait_ranks(children: Vec<Child>, limit: Duration) -> Vec<(bool, String)> {
    let deadline = Instant::now() + limit;
    children
        .into_iter()
        .map(|mut c| loop {
            if let Some(status) = c.try_wait().unwrap() {
                let out = c.wait_with_output().unwrap();
                let text = format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                break (status.success(), text);
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let out = c.wait_with_output().unwrap();
                break (
                    false,
                    format!("TIMED OUT\n{}", String::from_utf8_lossy(&out.stderr)),
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        })
        .collect()
}

pub fn store_of(addr: SocketAddr, secret: [u8; 16], rank: usize) -> Box<dyn Store> {
    Box::new(connect_store(addr, secret, rank))
}
