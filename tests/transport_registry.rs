//! The transport registry: each peer pair gets the first kind (self, shm,
//! tcp) that can connect it, both ranks agree, and `SNCL_TRANSPORT=<name>`
//! forces one kind or fails naming what is missing. Each kind declares the
//! memory it moves (host; device too for self, nvlink and rdma).

use std::sync::Arc;
use std::time::Duration;

use comm_core::config::TransportChoice;
use comm_core::transport::registry::MemoryKind;
use sncl::{Communicator, Config, MemoryStore, Store};

/// `n` thread ranks, rank r on node `node(r)`.
fn init(
    n: usize,
    comm_id: u64,
    transport: TransportChoice,
    node: fn(usize) -> String,
) -> Vec<sncl::Result<Communicator>> {
    let store = MemoryStore::new();
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let store: Arc<dyn Store> = Arc::new(store.for_rank(r));
            let cfg = Config {
                node_id: Some(node(r)),
                transport,
                timeout: Duration::from_secs(20),
                ..Config::default()
            };
            std::thread::spawn(move || Communicator::init_with_store(store, r, n, comm_id, cfg))
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

fn two_nodes(r: usize) -> String {
    format!("registry-node{}", r % 2)
}

fn one_node(_: usize) -> String {
    "registry-node".into()
}

/// The error of an init that must fail.
fn failure(r: sncl::Result<Communicator>, why: &str) -> String {
    match r {
        Ok(c) => panic!("rank {}: {why}", c.rank()),
        Err(e) => e.to_string(),
    }
}

fn kinds(c: &Communicator) -> Vec<&'static str> {
    c.transports().to_vec()
}

#[test]
fn auto_takes_shm_within_a_node_and_tcp_across() {
    let comms: Vec<Communicator> = init(4, 0x7e91_0001, TransportChoice::Auto, two_nodes)
        .into_iter()
        .map(|c| c.unwrap())
        .collect();
    assert_eq!(kinds(&comms[0]), ["self", "tcp", "shm", "tcp"]);
    assert_eq!(kinds(&comms[1]), ["tcp", "self", "tcp", "shm"]);
    for a in &comms {
        for b in &comms {
            assert_eq!(a.transports()[b.rank()], b.transports()[a.rank()]);
        }
    }
    // The connections work: an all-reduce over both kinds.
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let send = [c.rank() as f32 + 1.0; 3];
                let mut recv = [0f32; 3];
                c.all_reduce(&send, &mut recv, sncl::ReduceOp::Sum).unwrap();
                assert_eq!(recv, [10.0; 3]);
            });
        }
    });
}

#[test]
fn forcing_tcp_or_shm_uses_it_for_every_pair() {
    for (choice, kind) in [(TransportChoice::Tcp, "tcp"), (TransportChoice::Shm, "shm")] {
        let comms: Vec<Communicator> = init(3, 0x7e91_0002, choice, one_node)
            .into_iter()
            .map(|c| c.unwrap())
            .collect();
        for c in &comms {
            for (p, t) in c.transports().iter().enumerate() {
                let want = if p == c.rank() { "self" } else { kind };
                assert_eq!(*t, want, "rank {} peer {p} under {choice}", c.rank());
            }
        }
        std::thread::scope(|s| {
            for c in &comms {
                s.spawn(move || c.barrier().unwrap());
            }
        });
    }
}

#[test]
fn forcing_shm_across_nodes_says_why_it_cannot() {
    for r in init(2, 0x7e91_0003, TransportChoice::Shm, two_nodes) {
        let e = failure(r, "shm across nodes must fail");
        assert!(
            e.contains("SNCL_TRANSPORT=shm")
                && e.contains("one node")
                && e.contains("registry-node0")
                && e.contains("registry-node1"),
            "{e}"
        );
    }
}

#[test]
fn forcing_an_unknown_or_self_transport_fails_clearly() {
    let warp = TransportChoice::parse("warp").unwrap();
    for r in init(2, 0x7e91_0004, warp, one_node) {
        let e = failure(r, "unknown transport must fail");
        assert!(
            e.contains("SNCL_TRANSPORT=warp") && e.contains("self, nvlink, shm, rdma, tcp"),
            "{e}"
        );
    }
    let only_self = TransportChoice::parse("self").unwrap();
    for r in init(2, 0x7e91_0005, only_self, one_node) {
        let e = failure(r, "self between two ranks must fail");
        assert!(e.contains("only to itself"), "{e}");
    }
    // One rank alone may force anything it has.
    let solo = init(1, 0x7e91_0006, only_self, one_node);
    assert_eq!(kinds(solo[0].as_ref().unwrap()), ["self"]);
}

#[test]
fn malformed_names_are_refused_when_parsed() {
    for bad in ["TCP", "a/b", "tcp shm", &"x".repeat(40)] {
        let e = TransportChoice::parse(bad).unwrap_err().to_string();
        assert!(e.contains("SNCL_TRANSPORT"), "{bad}: {e}");
    }
    assert_eq!(
        TransportChoice::parse("auto").unwrap(),
        TransportChoice::Auto
    );
    assert_eq!(
        TransportChoice::parse(" tcp ").unwrap(),
        TransportChoice::Tcp
    );
}

/// The memory each peer's kind moves: host for every kind; device too
/// for `self` (the rank's own copies) and the kinds with a device path
/// (`nvlink`, `rdma`); `shm` and `tcp` stage device pieces through host
/// memory. Forcing tcp makes every other peer host-only.
#[test]
fn each_peer_kind_declares_the_memory_it_moves() {
    const HOST: &[MemoryKind] = &[MemoryKind::Host];
    const BOTH: &[MemoryKind] = &[MemoryKind::Host, MemoryKind::Device];
    let declared = |kind: &str| match kind {
        "self" | "nvlink" | "rdma" => BOTH,
        "shm" | "tcp" => HOST,
        other => panic!("unexpected kind {other}"),
    };
    for (id, choice) in [
        (0x7e91_0007, TransportChoice::Auto),
        (0x7e91_0008, TransportChoice::Tcp),
    ] {
        let comms: Vec<Communicator> = init(4, id, choice, two_nodes)
            .into_iter()
            .map(|c| c.unwrap())
            .collect();
        for c in &comms {
            let mem = c.memory_kinds();
            assert_eq!(mem.len(), 4);
            for (p, kind) in c.transports().iter().enumerate() {
                assert_eq!(
                    mem[p],
                    declared(kind),
                    "rank {} peer {p} ({kind})",
                    c.rank()
                );
                if choice == TransportChoice::Tcp && p != c.rank() {
                    assert_eq!(mem[p], HOST);
                }
            }
            assert_eq!(mem[c.rank()], BOTH, "self moves both");
        }
        std::thread::scope(|s| {
            for c in &comms {
                s.spawn(move || c.barrier().unwrap());
            }
        });
    }
}
