//! Issue 36's scale target on the emulated provider: 64 "nodes" × 1 rank
//! (threads of this process, one per node, so every pair is an RDMA pair).
//! Alone in its test binary, because it counts the process's device
//! contexts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use comm_core::algo::Algorithm;
use comm_core::wire::Collective;
use sncl::{Communicator, Config, MemoryStore, ReduceOp, Store};

fn init(n: usize, comm_id: u64) -> Vec<Communicator> {
    let store = MemoryStore::new();
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let store: Arc<dyn Store> = Arc::new(store.for_rank(r));
            let mut cfg = Config {
                node_id: Some(format!("scale-node{r}")),
                timeout: Duration::from_secs(120),
                algo: vec![(Collective::AllReduce, Algorithm::Ring)],
                ..Config::default()
            };
            cfg.ib.emulate = true;
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

/// Issue 36's target: 64 emulated nodes × 1 rank; init completes with one
/// device context (this process's; each rank would have its own process on
/// a cluster: tests/emulated.rs in transport-rdma checks 1 per process) and
/// no connection; a ring all-reduce then connects 2 peers per rank.
#[test]
fn sixty_four_nodes_init_without_connections() {
    let n = 64;
    let t0 = Instant::now();
    let comms = init(n, 0x1a2c_0004);
    let init_took = t0.elapsed();
    assert_eq!(connected(&comms), vec![0; n]);
    assert_eq!(
        transport_rdma::emu::contexts_open(),
        0,
        "no connection, no context yet"
    );
    let t1 = Instant::now();
    ring_all_reduce(&comms, 4096);
    let first_op = t1.elapsed();
    assert_eq!(connected(&comms), vec![2; n]);
    assert_eq!(
        transport_rdma::emu::contexts_open(),
        1,
        "one device context for the process's 128 connections"
    );
    eprintln!(
        "64 ranks (threads, emulated RDMA): init {init_took:?}, first ring all-reduce (connects \
         128 pairs) {first_op:?}"
    );
}
