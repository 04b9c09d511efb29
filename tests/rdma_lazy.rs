//! RDMA connections made at their first use (`SNCL_RUNTIME_CONNECT=1`, the
//! default; issue 36, risk 7 and issue 34): ranks as threads, one per
//! emulated "node", so every pair is an RDMA pair. Init connects nothing;
//! a ring all-reduce connects each rank to its two neighbours only; a
//! tagged send connects its pair, a receive from any source connects the
//! peer that asks; `SNCL_RUNTIME_CONNECT=0` connects every pair at init; a
//! peer that aborted before connecting is named at once. (64 nodes:
//! tests/rdma_lazy_scale.rs, a binary of its own since it counts the
//! process's device contexts.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use comm_core::algo::Algorithm;
use comm_core::wire::Collective;
use sncl::{Communicator, Config, MemoryStore, ReduceOp, Store};

fn config(r: usize, runtime_connect: bool) -> Config {
    let mut cfg = Config {
        node_id: Some(format!("lazy-node{r}")),
        timeout: Duration::from_secs(60),
        runtime_connect,
        algo: vec![(Collective::AllReduce, Algorithm::Ring)],
        ..Config::default()
    };
    cfg.ib.emulate = true;
    cfg
}

fn init(n: usize, comm_id: u64, runtime_connect: bool) -> Vec<Communicator> {
    let store = MemoryStore::new();
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let store: Arc<dyn Store> = Arc::new(store.for_rank(r));
            let cfg = config(r, runtime_connect);
            std::thread::spawn(move || Communicator::init_with_store(store, r, n, comm_id, cfg))
        })
        .collect();
    hs.into_iter()
        .map(|h| h.join().unwrap().expect("init"))
        .collect()
}

fn connected(comms: &[Communicator]) -> Vec<usize> {
    comms
        .iter()
        .map(|c| c.mem_stats().connected_peers)
        .collect()
}

fn ring_all_reduce(comms: &[Communicator], count: usize) {
    let n = comms.len();
    std::thread::scope(|s| {
        for c in comms {
            s.spawn(move || {
                let r = c.rank();
                let send: Vec<f32> = (0..count).map(|i| ((i + r) % 7) as f32).collect();
                let mut sum = vec![0f32; count];
                c.all_reduce(&send, &mut sum, ReduceOp::Sum).unwrap();
                for (i, x) in sum.iter().enumerate() {
                    let want: f32 = (0..n).map(|q| ((i + q) % 7) as f32).sum();
                    assert_eq!(*x, want, "rank {r} element {i}");
                }
            });
        }
    });
}

#[test]
fn init_connects_nothing_and_operations_connect_only_their_peers() {
    let n = 8;
    let comms = init(n, 0x1a2c_0001, true);
    for c in &comms {
        assert!(c.transports().iter().filter(|k| **k == "rdma").count() == n - 1);
    }
    assert_eq!(connected(&comms), vec![0; n], "nothing connected at init");

    // A ring all-reduce: each rank talks to its two neighbours.
    ring_all_reduce(&comms, 100_000);
    assert_eq!(connected(&comms), vec![2; n], "only the ring's pairs");
    // Again: nothing new.
    ring_all_reduce(&comms, 1000);
    assert_eq!(connected(&comms), vec![2; n]);

    // A tagged message between ranks 0 and 4 (not ring neighbours)
    // connects that pair; a receive from any source on rank 5 connects the
    // peer that sends to it (rank 1).
    std::thread::scope(|s| {
        let (c0, c4, c1, c5) = (&comms[0], &comms[4], &comms[1], &comms[5]);
        s.spawn(move || c0.send_tagged(&[7u8; 5000], 4, 3).unwrap());
        s.spawn(move || {
            let mut b = [0u8; 5000];
            assert_eq!(c4.recv_tagged(&mut b, Some(0), 3).unwrap(), 0);
            assert!(b.iter().all(|&x| x == 7));
        });
        s.spawn(move || c1.send_tagged(&[9u8; 10], 5, 4).unwrap());
        s.spawn(move || {
            let mut b = [0u8; 10];
            assert_eq!(c5.recv_tagged(&mut b, None, 4).unwrap(), 1);
            assert_eq!(b, [9u8; 10]);
        });
    });
    let after = connected(&comms);
    assert_eq!(after, vec![3, 3, 2, 2, 3, 3, 2, 2], "{after:?}");
}

#[test]
fn runtime_connect_0_connects_every_pair_at_init() {
    let n = 4;
    let comms = init(n, 0x1a2c_0002, false);
    assert_eq!(connected(&comms), vec![n - 1; n]);
    ring_all_reduce(&comms, 1000);
}

#[test]
fn a_peer_that_aborted_before_connecting_is_named_at_once() {
    let comms = init(2, 0x1a2c_0003, true);
    comms[1].abort();
    // Rank 1 notes its abort at its next call (it holds no connection to
    // tell rank 0 through).
    assert!(comms[1].barrier().is_err());
    let t0 = Instant::now();
    let e = comms[0]
        .send_tagged(&[1u8; 8], 1, 1)
        .unwrap_err()
        .to_string();
    let took = t0.elapsed();
    assert!(e.contains("rank 1") && e.contains("aborted"), "{e}");
    assert!(took < Duration::from_secs(5), "named after {took:?}: {e}");
}

#[test]
fn a_peer_gone_before_connecting_is_named_within_seconds() {
    let mut comms = init(2, 0x1a2c_0005, true);
    // Rank 1 goes away (its standby store with it) before rank 0 ever
    // needed it.
    drop(comms.pop());
    let t0 = Instant::now();
    let e = comms[0]
        .send_tagged(&[1u8; 8], 1, 1)
        .unwrap_err()
        .to_string();
    let took = t0.elapsed();
    assert!(e.contains("rank 1") && e.contains("gone"), "{e}");
    assert!(took < Duration::from_secs(5), "named after {took:?}: {e}");
    eprintln!("a peer gone before its first use named after {took:?}: {e}");
}
