//! The rdma kind in the runtime's registry, on the emulated provider
//! (`Config::ib.emulate`, as `SNCL_IB_EMULATE=1` sets it): across "nodes" it
//! is chosen before tcp, within a node shm stays first, `SNCL_TRANSPORT=rdma`
//! forces it between every pair; collectives over it are exact.

use std::sync::Arc;
use std::time::Duration;

use comm_core::config::TransportChoice;
use sncl::{Communicator, Config, MemoryStore, ReduceOp, Store};

fn init(n: usize, comm_id: u64, transport: TransportChoice) -> Vec<Communicator> {
    let store = MemoryStore::new();
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let store: Arc<dyn Store> = Arc::new(store.for_rank(r));
            let mut cfg = Config {
                // Two ranks per "node": shm inside, rdma across.
                node_id: Some(format!("rdma-node{}", r / 2)),
                transport,
                timeout: Duration::from_secs(30),
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

fn check_collectives(comms: &[Communicator]) {
    let n = comms.len();
    std::thread::scope(|s| {
        for c in comms {
            s.spawn(move || {
                let r = c.rank();
                for count in [1usize, 1000, 300_001] {
                    let send: Vec<f32> = (0..count).map(|i| ((i + r) % 13) as f32).collect();
                    let mut sum = vec![0f32; count];
                    c.all_reduce(&send, &mut sum, ReduceOp::Sum).unwrap();
                    for (i, x) in sum.iter().enumerate() {
                        let want: f32 = (0..n).map(|q| ((i + q) % 13) as f32).sum();
                        assert_eq!(*x, want, "rank {r} count {count} element {i}");
                    }
                    let mut all = vec![0f32; n * count];
                    c.all_gather(&send, &mut all).unwrap();
                    for q in 0..n {
                        assert_eq!(all[q * count], (q % 13) as f32, "rank {r} block {q}");
                    }
                }
            });
        }
    });
}

#[test]
fn rdma_between_nodes_shm_within_and_forced_everywhere() {
    let comms = init(4, 0x5d3a_0001, TransportChoice::Auto);
    for c in &comms {
        let r = c.rank();
        let kinds = c.transports();
        for (p, k) in kinds.iter().enumerate() {
            let want = if p == r {
                "self"
            } else if p / 2 == r / 2 {
                "shm"
            } else {
                "rdma"
            };
            assert_eq!(*k, want, "rank {r} to {p}: {kinds:?}");
        }
    }
    check_collectives(&comms);
    // Per-transport accounting: every rank moved bytes over both kinds.
    for c in &comms {
        let st = c.stats();
        for kind in ["shm", "rdma"] {
            let (_, sent, received) = st
                .by_transport
                .iter()
                .find(|(k, _, _)| k == kind)
                .unwrap_or_else(|| {
                    panic!(
                        "rank {} has no {kind} bytes: {:?}",
                        c.rank(),
                        st.by_transport
                    )
                });
            assert!(
                *sent > 0 && *received > 0,
                "rank {} {kind}: {sent} / {received}",
                c.rank()
            );
        }
        let total: u64 = st.by_transport.iter().map(|(_, s, _)| s).sum();
        assert_eq!(total, st.intra_sent + st.inter_sent, "rank {}", c.rank());
    }
    drop(comms);
    let forced = TransportChoice::parse("rdma").unwrap();
    let comms = init(3, 0x5d3a_0002, forced);
    for c in &comms {
        for (p, k) in c.transports().iter().enumerate() {
            if p != c.rank() {
                assert_eq!(*k, "rdma", "rank {} to {p}", c.rank());
            }
        }
    }
    check_collectives(&comms);
}
