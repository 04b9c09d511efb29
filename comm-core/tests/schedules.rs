//! Every row of the algorithm table, checked symbolically for rank counts
//! 1..=64 and awkward counts (0, 1, primes, not divisible by the rank count,
//! several chunks). A new row is checked without touching this file; a new
//! collective fails to compile in `expectation` until it says what the
//! collective must produce.

use comm_core::algo::{self, Algorithm, Blocks, Input, Params, Row, Transfer, VarCounts};
use comm_core::check::{check, check_canonical, Buffers, Mask, Sym};
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

/// The transfers of rank `r`'s point-to-point group in the checked pattern:
/// `count` elements to each of the next two ranks, from each of the previous
/// two (transfers to the rank itself are copies outside the schedule).
fn p2p_pattern(n: usize, r: usize, count: usize) -> Vec<Transfer> {
    let mut v = Vec::new();
    for d in 1..n.min(3) {
        v.push(Transfer {
            peer: (r + d) % n,
            is_send: true,
            len: count,
        });
        v.push(Transfer {
            peer: (r + n - d) % n,
            is_send: false,
            len: count,
        });
    }
    v
}

fn run(row: &Row, topo: &Topology, count: usize, root: usize, chunk: usize, in_place: bool) {
    run_mode(row, topo, (count, root, chunk), in_place, false);
}

/// [`run`] in default or deterministic mode.
fn run_mode(
    row: &Row,
    topo: &Topology,
    sizes: (usize, usize, usize),
    in_place: bool,
    deterministic: bool,
) {
    // Rooted collectives with and without their argument check.
    for check_roots in [true, false] {
        if check_roots || row.coll.is_rooted() {
            run_checked(row, topo, sizes, in_place, (check_roots, deterministic));
        }
    }
}

fn run_checked(
    row: &Row,
    topo: &Topology,
    (count, root, chunk): (usize, usize, usize),
    in_place: bool,
    (check_roots, deterministic): (bool, bool),
) {
    let (coll, algo) = (row.coll, row.algo);
    let n = topo.nranks();
    let scheds: Vec<_> = (0..n)
        .map(|r| {
            let transfers = p2p_pattern(n, r, count);
            let input = Input {
                p: Params {
                    nranks: n,
                    rank: r,
                    count,
                    root,
                    chunk,
                },
                topo,
                blocks: if coll == Collective::SendRecv {
                    Blocks::P2p(&transfers)
                } else {
                    Blocks::Uniform
                },
                check_roots,
            };
            if deterministic {
                algo::build_deterministic(coll, algo, &input).expect("the table's row builds")
            } else {
                algo::build_input(coll, algo, &input).expect("the table's row builds")
            }
        })
        .collect();
    let (bufs, expect) = expectation(coll, n, count, root, in_place);
    let checked = if deterministic {
        check_canonical(&scheds, &*bufs, &*expect)
    } else {
        check(&scheds, &*bufs, &*expect)
    };
    if let Err(e) = checked {
        panic!(
            "{} / {} failed: n={n} nodes={:?} count={count} root={root} chunk={chunk} in_place={in_place} check_roots={check_roots} deterministic={deterministic}: {e}",
            coll.name(),
            algo.name(),
            topo.node_of
        );
    }
}

/// Buffer sizes and expected output of `coll` with uniform blocks of
/// `count` (variable-count collectives in their uniform form).
fn expectation(
    coll: Collective,
    n: usize,
    count: usize,
    root: usize,
    in_place: bool,
) -> (BufsFn, ExpectFn) {
    let all = full(n);
    match coll {
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
        Collective::AllGather | Collective::AllGatherV => (
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
        Collective::AllToAll | Collective::AllToAllV => (
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
        // Only rendezvous matching, lengths and completion: a group's
        // buffers are the caller's, outside the send / receive buffers.
        Collective::Barrier | Collective::SendRecv => (
            Box::new(|_| Buffers {
                send: 0,
                recv: 0,
                in_place_at: None,
            }),
            Box::new(|_, _| None),
        ),
        // Tagged messages bypass the schedules (src/comm/tagged.rs): the
        // table has no row for them, so this arm is never reached.
        Collective::Tagged => unreachable!("tagged messages have no schedule"),
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
fn every_row_of_the_table_every_rank_count() {
    for n in rank_counts() {
        for row in algo::ALGORITHMS {
            // Rooted collectives from several roots (one at large sizes).
            let roots: &[usize] = match (row.coll.is_rooted(), n <= 17) {
                (true, true) => &[0, n / 2, n - 1],
                (true, false) => &[n / 2],
                (false, _) => &[0],
            };
            // Multi-chunk pipelines at every size up to 17 ranks; at larger
            // rank counts the single-chunk form keeps it fast.
            let chunks: &[usize] = if n <= 17 { &[3, 1 << 20] } else { &[1 << 20] };
            for count in COUNTS {
                for &chunk in chunks {
                    for &root in roots {
                        for in_place in [false, true] {
                            for topo in layouts(n) {
                                run(row, &topo, count, root, chunk, in_place);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Deterministic mode: every reducing row, every rank count and placement,
/// proves each output element reduced in the canonical tree's order (the
/// checker refuses any combine of two non-sibling nodes).
#[test]
fn every_reducing_row_in_deterministic_mode_reduces_in_the_canonical_order() {
    for n in rank_counts() {
        for row in algo::ALGORITHMS.iter().filter(|r| r.coll.is_reducing()) {
            let roots: &[usize] = match (row.coll.is_rooted(), n <= 17) {
                (true, true) => &[0, n / 2, n - 1],
                (true, false) => &[n / 2],
                (false, _) => &[0],
            };
            let chunks: &[usize] = if n <= 17 { &[3, 1 << 20] } else { &[1 << 20] };
            for count in COUNTS {
                for &chunk in chunks {
                    for &root in roots {
                        for in_place in [false, true] {
                            for topo in layouts(n) {
                                run_mode(row, &topo, (count, root, chunk), in_place, true);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The canonical check is not vacuous: the default ring all-reduce of 5
/// ranks combines partial sums that are not canonical siblings.
#[test]
fn the_canonical_check_refuses_the_default_ring() {
    let n = 5;
    let topo = Topology::single_node(n);
    let row = algo::row(Collective::AllReduce, Algorithm::Ring).expect("ring");
    let scheds: Vec<_> = (0..n)
        .map(|r| {
            let p = Params {
                nranks: n,
                rank: r,
                count: 10,
                root: 0,
                chunk: 1 << 20,
            };
            algo::build(row.coll, row.algo, &p, &topo).expect("builds")
        })
        .collect();
    let (bufs, expect) = expectation(Collective::AllReduce, n, 10, 0, false);
    check(&scheds, &*bufs, &*expect).expect("a correct schedule");
    let e = check_canonical(&scheds, &*bufs, &*expect).expect_err("not canonical");
    assert!(e.contains("not two siblings"), "{e}");
}

/// The variable-count rows with uneven counts, on every placement.
#[test]
fn all_gatherv_and_alltoallv_uneven() {
    for n in 1..=12usize {
        for topo in layouts(n) {
            for row in algo::rows(Collective::AllGatherV) {
                all_gatherv_uneven(row, &topo);
            }
            for row in algo::rows(Collective::AllToAllV) {
                alltoallv_uneven(row, &topo);
            }
        }
    }
}

fn build_var(
    row: &Row,
    topo: &Topology,
    r: usize,
    v: VarCounts<'_>,
) -> comm_core::schedule::Schedule {
    let input = Input {
        p: Params {
            nranks: topo.nranks(),
            rank: r,
            count: 0,
            root: 0,
            chunk: 2,
        },
        topo,
        blocks: Blocks::Var(v),
        check_roots: true,
    };
    algo::build_input(row.coll, row.algo, &input).expect("the table's row builds")
}

fn all_gatherv_uneven(row: &Row, topo: &Topology) {
    let n = topo.nranks();
    let counts: Vec<usize> = (0..n).map(|r| (r * 7 + 3) % 5).collect();
    let displs = algo::displacements(&counts);
    let total: usize = counts.iter().sum();
    let scheds: Vec<_> = (0..n)
        .map(|r| {
            let v = VarCounts {
                send_counts: &[],
                send_displs: &[],
                recv_counts: &counts,
                recv_displs: &displs,
            };
            build_var(row, topo, r, v)
        })
        .collect();
    let (c2, d2) = (counts.clone(), displs.clone());
    check(
        &scheds,
        &|r| Buffers {
            send: counts[r],
            recv: total,
            in_place_at: None,
        },
        &move |_, i| {
            let j = (0..n).rfind(|&j| d2[j] <= i && i < d2[j] + c2[j])?;
            sym(Mask::one(j), i - d2[j], false)
        },
    )
    .unwrap_or_else(|e| {
        panic!(
            "all_gatherv / {} n={n} nodes={:?}: {e}",
            row.algo.name(),
            topo.node_of
        )
    });
}

fn alltoallv_uneven(row: &Row, topo: &Topology) {
    let n = topo.nranks();
    // Rank r sends (r + j) % 3 elements to rank j.
    let sc = |r: usize| (0..n).map(|j| (r + j) % 3).collect::<Vec<_>>();
    let rc = |r: usize| (0..n).map(|j| sc(j)[r]).collect::<Vec<_>>();
    let scheds: Vec<_> = (0..n)
        .map(|r| {
            let (s, rcv) = (sc(r), rc(r));
            let (sd, rd) = (algo::displacements(&s), algo::displacements(&rcv));
            let v = VarCounts {
                send_counts: &s,
                send_displs: &sd,
                recv_counts: &rcv,
                recv_displs: &rd,
            };
            build_var(row, topo, r, v)
        })
        .collect();
    check(
        &scheds,
        &|r| Buffers {
            send: sc(r).iter().sum(),
            recv: rc(r).iter().sum(),
            in_place_at: None,
        },
        &|r, i| {
            let rcv = rc(r);
            let rd = algo::displacements(&rcv);
            let j = (0..n).rfind(|&j| rd[j] <= i && i < rd[j] + rcv[j])?;
            let sd = algo::displacements(&sc(j));
            sym(Mask::one(j), sd[r] + i - rd[j], false)
        },
    )
    .unwrap_or_else(|e| {
        panic!(
            "alltoallv / {} n={n} nodes={:?}: {e}",
            row.algo.name(),
            topo.node_of
        )
    });
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
fn checker_catches_a_broken_p2p_group() {
    // A receive one element longer than its send, and a send nobody takes.
    let n = 3;
    let topo = Topology::single_node(n);
    let row = algo::row(Collective::SendRecv, Algorithm::Pairwise).expect("sendrecv row");
    let bufs = |_| Buffers {
        send: 0,
        recv: 0,
        in_place_at: None,
    };
    for broken in [0usize, 1] {
        let scheds: Vec<_> = (0..n)
            .map(|r| {
                let mut t = p2p_pattern(n, r, 4);
                if r == 1 && broken == 0 {
                    t[1].len += 1;
                }
                if r == 2 && broken == 1 {
                    t.push(Transfer {
                        peer: 0,
                        is_send: true,
                        len: 1,
                    });
                }
                let input = Input {
                    p: Params {
                        nranks: n,
                        rank: r,
                        count: 4,
                        root: 0,
                        chunk: 1,
                    },
                    topo: &topo,
                    blocks: Blocks::P2p(&t),
                    check_roots: true,
                };
                algo::build_input(row.coll, row.algo, &input).expect("builds")
            })
            .collect();
        assert!(
            check(&scheds, &bufs, &|_, _| None).is_err(),
            "broken={broken}"
        );
    }
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
    let hier: Vec<&Row> = algo::ALGORITHMS
        .iter()
        .filter(|r| r.algo == Algorithm::Hier)
        .collect();
    assert!(!hier.is_empty());
    for row in hier {
        run(row, &topo, 5, n / 3, 2, false);
    }
    // The topology-aware ring crosses each node boundary once.
    assert_eq!(topo.crossings(&topo.ring_order()), 64);
}

/// Rooted collectives start with ⌈log2 n⌉ empty exchanges that do not
/// depend on the root (so ranks that disagree on it still meet there);
/// `check_roots: false` (SNCL_CHECK_ROOTS=0) builds the row's schedule alone;
/// unrooted collectives never get them.
#[test]
fn rooted_schedules_start_with_a_root_independent_check() {
    let topo = Topology::single_node(6);
    for row in algo::ALGORITHMS {
        for rank in 0..6 {
            let build = |root: usize, check_roots: bool| {
                let input = Input {
                    p: Params {
                        nranks: 6,
                        rank,
                        count: 8,
                        root,
                        chunk: 4,
                    },
                    topo: &topo,
                    blocks: Blocks::Uniform,
                    check_roots,
                };
                algo::build_input(row.coll, row.algo, &input).expect("builds")
            };
            let (checked, plain) = (build(1, true), build(1, false));
            if !row.coll.is_rooted() {
                assert_eq!(checked, plain, "{:?}", row.coll);
                continue;
            }
            assert_eq!(checked.steps.len(), plain.steps.len() + 3, "{:?}", row.coll);
            assert_eq!(checked.steps[3..], plain.steps[..], "{:?}", row.coll);
            // The same first steps whatever the root.
            assert_eq!(
                checked.steps[..3],
                build(4, true).steps[..3],
                "{:?}",
                row.coll
            );
            assert_eq!(
                checked.steps[..3],
                algo::barrier(6, rank).steps[..],
                "{:?}",
                row.coll
            );
        }
    }
}
