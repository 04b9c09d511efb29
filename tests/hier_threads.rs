//! Hierarchical and topology-aware algorithms on a two-tier layout built of
//! thread ranks: 4 "nodes" (distinct SNCL_NODE_ID) of 2 ranks placed
//! round-robin, shared memory inside a node and TCP between nodes.

use std::sync::Arc;

use sncl::{Collective, Communicator, Config, MemoryStore, ReduceOp, Store};

fn two_tier(n: usize, nodes: usize) -> Vec<Communicator> {
    let store = MemoryStore::new();
    let comm_id = 0x5eed_0000 + n as u64 * 31 + nodes as u64;
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let store: Arc<dyn Store> = Arc::new(store.for_rank(r));
            let cfg = Config {
                node_id: Some(format!("node{}", r % nodes)),
                chunk_bytes: 4096,
                ..Config::default()
            };
            std::thread::spawn(move || Communicator::init_with_store(store, r, n, comm_id, cfg))
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
}

#[test]
fn hier_and_ring_agree_with_the_exact_result() {
    let comms = two_tier(8, 4);
    assert_eq!(comms[0].transports()[4], "shm");
    assert_eq!(comms[0].transports()[1], "tcp");
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let (n, r) = (c.size(), c.rank());
                for algo in ["hier", "ring", "flat-ring", "tree", "rd"] {
                    c.force_algorithm(Collective::AllReduce, Some(algo))
                        .unwrap();
                    for count in [0usize, 1, 7, 1000, 100_003] {
                        let send: Vec<f32> =
                            (0..count).map(|i| ((i * 3 + r) % 10) as f32).collect();
                        let mut recv = vec![0f32; count];
                        c.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
                        for (i, x) in recv.iter().enumerate() {
                            let want: f32 = (0..n).map(|q| ((i * 3 + q) % 10) as f32).sum();
                            assert_eq!(*x, want, "{algo} count {count} elem {i}");
                        }
                    }
                }
                for algo in ["hier", "ring", "flat-ring"] {
                    c.force_algorithm(Collective::AllGather, Some(algo))
                        .unwrap();
                    c.force_algorithm(Collective::ReduceScatter, Some(algo))
                        .unwrap();
                    for count in [0usize, 1, 13, 5000] {
                        let mine: Vec<i32> = (0..count).map(|i| (r * 1000 + i) as i32).collect();
                        let mut all = vec![0i32; count * n];
                        c.all_gather(&mine, &mut all).unwrap();
                        for q in 0..n {
                            for i in 0..count {
                                assert_eq!(all[q * count + i], (q * 1000 + i) as i32, "{algo}");
                            }
                        }
                        let input: Vec<i64> = (0..count * n).map(|i| (i + r) as i64).collect();
                        let mut out = vec![0i64; count];
                        c.reduce_scatter(&input, &mut out, ReduceOp::Sum).unwrap();
                        for (i, x) in out.iter().enumerate() {
                            let want: i64 = (0..n).map(|q| (r * count + i + q) as i64).sum();
                            assert_eq!(*x, want, "{algo} rs");
                        }
                    }
                }
                for algo in ["hier", "tree", "ring"] {
                    c.force_algorithm(Collective::Broadcast, Some(algo))
                        .unwrap();
                    c.force_algorithm(Collective::Reduce, Some(algo)).unwrap();
                    for root in [0, 3, 6] {
                        let mut buf: Vec<u64> = (0..10_000)
                            .map(|i| if r == root { i * 7 } else { 0 })
                            .collect();
                        c.broadcast(&mut buf, root).unwrap();
                        assert!(
                            buf.iter().enumerate().all(|(i, x)| *x == i as u64 * 7),
                            "{algo} bcast"
                        );
                        let send: Vec<f64> = (0..3000).map(|i| (i % 5 + r) as f64).collect();
                        let mut out = vec![0f64; 3000];
                        c.reduce(&send, &mut out, ReduceOp::Avg, root).unwrap();
                        if r == root {
                            for (i, x) in out.iter().enumerate() {
                                let sum: f64 = (0..n).map(|q| (i % 5 + q) as f64).sum();
                                assert_eq!(*x, sum / n as f64, "{algo} reduce");
                            }
                        }
                    }
                }
            });
        }
    });
}

#[test]
fn inter_node_bytes_match_the_algorithm() {
    // 4 nodes x 2 ranks, round-robin: hier all_reduce of C floats sends
    // 2 (N-1)/N x C/L elements per rank across nodes.
    let comms = two_tier(8, 4);
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let count = 8192usize;
                c.force_algorithm(Collective::AllReduce, Some("hier"))
                    .unwrap();
                let before = c.stats();
                let mut v = vec![1f32; count];
                c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                let d = c.stats().since(&before);
                let (nodes, local) = (4u64, 2u64);
                let want = 2 * (nodes - 1) * (count as u64 / local) / nodes * 4;
                assert_eq!(d.inter_sent, want, "rank {}", c.rank());
                assert_eq!(d.inter_received, want, "rank {}", c.rank());
                assert_eq!(d.ops, 1);
                // The flat ring in rank order crosses nodes on every edge.
                c.force_algorithm(Collective::AllReduce, Some("flat-ring"))
                    .unwrap();
                let before = c.stats();
                c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                let d = c.stats().since(&before);
                assert_eq!(d.intra_sent, 0);
                assert_eq!(d.inter_sent, 2 * 7 * (count as u64 / 8) * 4);
                assert!((d.cross_tier_share() - 1.0).abs() < 1e-12);
            });
        }
    });
}

#[test]
fn split_and_the_2d_layout() {
    let comms = two_tier(8, 4);
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let r = c.rank();
                // Even / odd split, reversed order by key.
                let sub = c.split(Some((r % 2) as u32), -(r as i64)).unwrap().unwrap();
                assert_eq!(sub.size(), 4);
                assert_eq!(sub.rank(), 3 - r / 2);
                let mut v = [r as u64];
                sub.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                assert_eq!(v[0], if r % 2 == 0 { 12 } else { 16 });
                // A rank may stay out.
                let none = c.split(if r == 5 { None } else { Some(0) }, 0).unwrap();
                assert_eq!(none.is_none(), r == 5);
                if let Some(x) = none {
                    assert_eq!(x.size(), 7);
                    x.barrier().unwrap();
                }
                // 2-D: node groups of 2 over shm, replica groups of 4 over tcp.
                let (node, replicas) = c.split_2d().unwrap();
                assert_eq!(node.size(), 2);
                assert_eq!(replicas.size(), 4);
                assert!(node.transports().iter().all(|t| *t != "tcp"));
                assert!(replicas.transports().iter().all(|t| *t != "shm"));
                // Gradient all-reduce composed from the 2-D layout equals the flat one.
                let grad: Vec<f32> = (0..1000).map(|i| ((i + r) % 7) as f32).collect();
                let mut shard = vec![0f32; 500];
                node.reduce_scatter(&grad, &mut shard, ReduceOp::Sum)
                    .unwrap();
                replicas
                    .all_reduce_in_place(&mut shard, ReduceOp::Sum)
                    .unwrap();
                let mut two_d = vec![0f32; 1000];
                node.all_gather(&shard, &mut two_d).unwrap();
                let mut flat = vec![0f32; 1000];
                c.all_reduce(&grad, &mut flat, ReduceOp::Sum).unwrap();
                assert_eq!(two_d, flat);
            });
        }
    });
}
