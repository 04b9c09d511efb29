//! Every algorithm, checked symbolically for rank counts 1..=64 and awkward
//! counts (0, 1, primes, not divisible by the rank count, several chunks).

use comm_core::algo::{self, Algorithm, Params};
use comm_core::check::{check, Buffers, Mask, Sym};
use comm_core::topo::Topology;
use comm_core::wire::Collective;

type BufsFn = Box<dyn Fn(usize) -> Buffers>;
type ExpectFn = Box<dyn Fn(usize, usize) -> Option<Sym>>;

const COUNTS: [usize; 6] = [0, 1, 2, 7, 13, 100];

fn rank_counts() -> impl Iterator<Item = usize> {
    (1..=17).chain([23, 31, 32, 33, 48, 63, 64])
}

fn full(n: usize) -> Mask {
    Mask::all(n)
}

fn sym(mask: Mask, idx: usize, fin: bool) -> Option<Sym> {
    Some(Sym { mask, idx, fin })
}

fn run(
    coll: Collective,
    algo: Algorithm,
    topo: &Topology,
    count: usize,
    root: usize,
    chunk: usize,
    in_place: bool,
) {
    let n = topo.nranks();
    let scheds: Vec<_> = (0..n)
        .map(|r| {
            algo::build(
                coll,
                algo,
                &Params {
                    nranks: n,
                    rank: r,
                    count,
                    root,
                    chunk,
                },
                topo,
            )
            .expect("algorithm implements the collective")
        })
        .collect();
    let all = full(n);
    let (bufs, expect): (BufsFn, ExpectFn) = match coll {
        Collective::AllReduce => (
            Box::new(move |_| Buffers {
                send: count,
                recv: count,
                in_place_at: in_place.then_some(0),
            }),
            Box::new(move |_, i| sym(all, i, true)),
        ),
        Collective::ReduceScatter => (
            // In place the output is the input's own block: the executor
            // resolves that aliasing; the schedule is checked out of place.
            Box::new(move |_| Buffers {
                send: n * count,
                recv: count,
                in_place_at: None,
            }),
            Box::new(move |r, i| sym(all, r * count + i, true)),
        ),
        Collective::AllGather => (
            Box::new(move |r| Buffers {
                send: count,
                recv: n * count,
                in_place_at: in_place.then_some(r * count),
            }),
            Box::new(move |_, i| sym(Mask::one(i / count.max(1)), i % count.max(1), false)),
        ),
        Collective::Broadcast => (
            Box::new(move |r| Buffers {
                send: if r == root { count } else { 0 },
                recv: count,
                in_place_at: (in_place && r == root).then_some(0),
            }),
            Box::new(move |_, i| sym(Mask::one(root), i, false)),
        ),
        Collective::Reduce => (
            Box::new(move |r| Buffers {
                send: count,
                recv: if r == root { count } else { 0 },
                in_place_at: (in_place && r == root).then_some(0),
            }),
            Box::new(move |_, i| sym(all, i, true)),
        ),
        Collective::AllToAll => (
            Box::new(move |_| Buffers {
                send: n * count,
                recv: n * count,
                in_place_at: None,
            }),
            Box::new(move |r, i| {
                sym(
                    Mask::one(i / count.max(1)),
                    r * count + i % count.max(1),
                    false,
                )
            }),
        ),
        Collective::Gather => (
            Box::new(move |r| Buffers {
                send: count,
                recv: if r == root { n * count } else { 0 },
                in_place_at: None,
            }),
            Box::new(move |_, i| sym(Mask::one(i / count.max(1)), i % count.max(1), false)),
        ),
        Collective::Scatter => (
            Box::new(move |r| Buffers {
                send: if r == root { n * count } else { 0 },
                recv: count,
                in_place_at: None,
            }),
            Box::new(move |r, i| sym(Mask::one(root), r * count + i, false)),
        ),
        Collective::Barrier => (
            Box::new(|_| Buffers {
                send: 0,
                recv: 0,
                in_place_at: None,
            }),
            Box::new(|_, _| None),
        ),
        _ => unreachable!(),
    };
    if let Err(e) = check(&scheds, &*bufs, &*expect) {
        panic!(
            "{} / {} failed: n={n} nodes={:?} count={count} root={root} chunk={chunk} in_place={in_place}: {e}",
            coll.name(),
            algo.name(),
            topo.node_of
        );
    }
}

/// Placements: one node; nodes of 2 ranks, node-major; round-robin over 3
/// nodes; uneven nodes of 1, 2, 3, ... ranks; a scrambled numbering.
fn layouts(n: usize) -> Vec<Topology> {
    let mut v = vec![Topology::single_node(n)];
    if n > 17 {
        v.push(Topology::from_node_of((0..n).map(|r| r % 5).collect()));
        return v;
    }
    v.push(Topology::from_node_of((0..n).map(|r| r / 2).collect()));
    v.push(Topology::from_node_of((0..n).map(|r| r % 3).collect()));
    let mut uneven = Vec::new();
    let mut k = 0;
    while uneven.len() < n {
        for _ in 0..=k {
            if uneven.len() < n {
                uneven.push(k);
            }
        }
        k += 1;
    }
    v.push(Topology::from_node_of(uneven));
    v.push(Topology::from_node_of(
        (0..n).map(|r| (r * 7 + 3) % 4).collect(),
    ));
    v
}

#[test]
fn every_algorithm_every_rank_count() {
    let collectives = [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllToAll,
        Collective::Gather,
        Collective::Scatter,
        Collective::Barrier,
    ];
    for n in rank_counts() {
        for coll in collectives {
            for &algo in Algorithm::available(coll) {
                for count in COUNTS {
                    // Multi-chunk pipelines at every size up to 17 ranks; at
                    // larger rank counts the single-chunk form keeps it fast.
                    let chunks: &[usize] = if n <= 17 { &[3, 1 << 20] } else { &[1 << 20] };
                    for &chunk in chunks {
                        let roots: &[usize] = match coll {
                            Collective::Broadcast
                            | Collective::Reduce
                            | Collective::Gather
                            | Collective::Scatter
                                if n <= 17 =>
                            {
                                &[0, n / 2, n - 1]
                            }
                            Collective::Broadcast
                            | Collective::Reduce
                            | Collective::Gather
                            | Collective::Scatter => &[n / 2],
                            _ => &[0],
                        };
                        for &root in roots {
                            for in_place in [false, true] {
                                for topo in layouts(n) {
                                    run(coll, algo, &topo, count, root, chunk, in_place);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn all_gatherv_and_alltoallv_uneven() {
    for n in 1..=12usize {
        let counts: Vec<usize> = (0..n).map(|r| (r * 7 + 3) % 5).collect();
        let displs = algo::displacements(&counts);
        let total: usize = counts.iter().sum();
        let scheds: Vec<_> = (0..n)
            .map(|r| algo::ring_all_gatherv(n, r, &counts, &displs, 2))
            .collect();
        let (c2, d2) = (counts.clone(), displs.clone());
        check(
            &scheds,
            &|r| comm_core::check::Buffers {
                send: counts[r],
                recv: total,
                in_place_at: None,
            },
            &move |_, i| {
                let j = (0..n).rfind(|&j| d2[j] <= i && i < d2[j] + c2[j])?;
                sym(Mask::one(j), i - d2[j], false)
            },
        )
        .unwrap_or_else(|e| panic!("all_gatherv n={n}: {e}"));

        // alltoallv: rank r sends (r + j) % 3 elements to rank j.
        let sc = |r: usize| (0..n).map(|j| (r + j) % 3).collect::<Vec<_>>();
        let scheds: Vec<_> = (0..n)
            .map(|r| {
                let s = sc(r);
                let rc: Vec<usize> = (0..n).map(|j| sc(j)[r]).collect();
                algo::alltoallv(
                    n,
                    r,
                    &s,
                    &algo::displacements(&s),
                    &rc,
                    &algo::displacements(&rc),
                )
            })
            .collect();
        check(
            &scheds,
            &|r| {
                let rc: usize = (0..n).map(|j| sc(j)[r]).sum();
                comm_core::check::Buffers {
                    send: sc(r).iter().sum(),
                    recv: rc,
                    in_place_at: None,
                }
            },
            &|r, i| {
                let rc: Vec<usize> = (0..n).map(|j| sc(j)[r]).collect();
                let rd = algo::displacements(&rc);
                let j = (0..n).rfind(|&j| rd[j] <= i && i < rd[j] + rc[j])?;
                let sd = algo::displacements(&sc(j));
                sym(Mask::one(j), sd[r] + i - rd[j], false)
            },
        )
        .unwrap_or_else(|e| panic!("alltoallv n={n}: {e}"));
    }
}

#[test]
fn checker_catches_a_broken_schedule() {
    // Drop one op from a correct ring: the checker must object.
    let n = 4;
    let mut scheds: Vec<_> = (0..n)
        .map(|r| algo::ring_all_reduce(n, r, 8, 1 << 20))
        .collect();
    scheds[2].steps[1].ops.pop();
    let r = check(
        &scheds,
        &|_| comm_core::check::Buffers {
            send: 8,
            recv: 8,
            in_place_at: None,
        },
        &|_, i| sym(full(n), i, true),
    );
    assert!(r.is_err());
}

#[test]
fn hierarchical_on_uneven_supernodes_up_to_64_nodes_of_16() {
    // 64 nodes with 1..=16 ranks each (uneven), numbered round-robin-ish.
    let sizes: Vec<usize> = (0..64).map(|k| 1 + (k * 7) % 16).collect();
    let mut node_of = Vec::new();
    let mut left = sizes.clone();
    while left.iter().any(|&l| l > 0) {
        for (k, l) in left.iter_mut().enumerate() {
            if *l > 0 {
                node_of.push(k);
                *l -= 1;
            }
        }
    }
    let topo = Topology::from_node_of(node_of);
    assert_eq!(topo.nnodes(), 64);
    let n = topo.nranks();
    for coll in [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::Broadcast,
        Collective::Reduce,
    ] {
        run(coll, Algorithm::Hier, &topo, 5, n / 3, 2, false);
    }
    // The topology-aware ring crosses each node boundary once.
    assert_eq!(topo.crossings(&topo.ring_order()), 64);
}
