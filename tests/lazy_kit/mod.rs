//! Ranks as threads, one per emulated "node" (so every pair is an RDMA
//! pair), all-reduces forced onto the ring: what tests/rdma_lazy.rs and
//! tests/rdma_lazy_scale.rs share.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use comm_core::algo::Algorithm;
use comm_core::wire::Collective;
use sncl::{Communicator, Config, MemoryStore, ReduceOp, Store};

/// `n` ranks of communicator `comm_id`, `SNCL_RUNTIME_CONNECT` as given.
pub fn init(n: usize, comm_id: u64, runtime_connect: bool) -> Vec<Communicator> {
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

/// [`init`] through a unique id: rank 0 serves the TCP store, as a job
/// launched by torchrun or Slurm does.
pub fn init_over_tcp_store(n: usize) -> Vec<Communicator> {
    let id = Communicator::unique_id("127.0.0.1:0".parse().unwrap()).expect("a unique id");
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let cfg = config(r, true);
            std::thread::spawn(move || Communicator::init_rank_with_config(&id, r, n, cfg))
        })
        .collect();
    hs.into_iter()
        .map(|h| h.join().unwrap().expect("init"))
        .collect()
}

/// Rank `r`'s settings: a node of its own on the emulated RDMA provider.
fn config(r: usize, runtime_connect: bool) -> Config {
    let mut cfg = Config {
        node_id: Some(format!("lazy-node{r}")),
        timeout: Duration::from_secs(120),
        runtime_connect,
        algo: vec![(Collective::AllReduce, Algorithm::Ring)],
        ..Config::default()
    };
    cfg.ib.emulate = true;
    cfg
}

/// Each rank's connected peers.
pub fn connected(comms: &[Communicator]) -> Vec<usize> {
    comms
        .iter()
        .map(|c| c.mem_stats().connected_peers)
        .collect()
}

/// A ring all-reduce of `count` floats on every rank, results checked.
pub fn ring_all_reduce(comms: &[Communicator], count: usize) {
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

/// Tagged messages off the ring (of at least 6 ranks): rank 0 to rank 4,
/// and rank 1 to rank 5, which receives from any source; checked.
pub fn tagged_off_the_ring(comms: &[Communicator]) {
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
}
