//! Deterministic mode (`SNCL_DETERMINISTIC=1`, `Config::deterministic`):
//! all-reduce, reduce and reduce-scatter give the bits of the canonical
//! order (a fixed binary tree over the ranks in rank order,
//! `comm_core::algo::canonical_split`) for every data type, reduction,
//! algorithm, size and placement — thread ranks over shared memory and
//! TCP, one node and several. The reference is computed here with the
//! element kernels, node by node of the tree.
//!
//! `SNCL_TEST_SEEDS` (default 20) sets how many random inputs each f32 /
//! f16 / bf16 sum is checked with.

use std::sync::Arc;

use sncl::{Collective, Communicator, Config, DataType, Element, MemoryStore, ReduceOp, Store};

/// Thread ranks: `nodes` node names assigned round-robin (shared memory
/// inside a node, TCP across), or TCP between every pair.
fn group(n: usize, nodes: usize, tcp_only: bool, deterministic: bool) -> Vec<Communicator> {
    let store = MemoryStore::new();
    let comm_id = 0xde7e_0000 + n as u64 * 97 + nodes as u64 * 7 + u64::from(tcp_only);
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let store: Arc<dyn Store> = Arc::new(store.for_rank(r));
            let mut cfg = Config {
                node_id: Some(format!("node{}", r % nodes)),
                // Several chunks at the larger sizes: the tree placement
                // pipelines, the default algorithms cut pieces.
                chunk_bytes: 1024,
                deterministic,
                ..Config::default()
            };
            if tcp_only {
                cfg.transport = comm_core::config::TransportChoice::Tcp;
            }
            std::thread::spawn(move || Communicator::init_with_store(store, r, n, comm_id, cfg))
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
}

/// A small deterministic generator (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Random elements of `dtype` as bytes: finite floats of random sign and
/// mantissa with exponents near 1 (so that any other association rounds
/// differently, and products of 16 stay finite), any bits for integers.
fn random_bytes(dtype: DataType, count: usize, rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::with_capacity(count * dtype.size());
    for _ in 0..count {
        let x = rng.next();
        let sign = x >> 63;
        let e = (x >> 40) % 7; // 0..=6, centred on 3
        match dtype {
            DataType::Float32 => {
                let bits = (sign << 31) as u32 | ((124 + e as u32) << 23) | (x as u32 & 0x7f_ffff);
                out.extend_from_slice(&bits.to_ne_bytes());
            }
            DataType::Float64 => {
                let bits = (sign << 63) | ((1020 + e) << 52) | (x & 0xf_ffff_ffff_ffff);
                out.extend_from_slice(&bits.to_ne_bytes());
            }
            DataType::Float16 => {
                let bits = ((sign as u16) << 15) | ((12 + e as u16) << 10) | (x as u16 & 0x3ff);
                out.extend_from_slice(&bits.to_ne_bytes());
            }
            DataType::Bfloat16 => {
                let bits = ((sign as u16) << 15) | ((124 + e as u16) << 7) | (x as u16 & 0x7f);
                out.extend_from_slice(&bits.to_ne_bytes());
            }
            // E4M3: exponent bias 7; E5M2: bias 15 (no NaN or infinity).
            DataType::Float8e4m3 => {
                out.push(((sign as u8) << 7) | ((4 + e as u8) << 3) | (x as u8 & 7))
            }
            DataType::Float8e5m2 => {
                out.push(((sign as u8) << 7) | ((12 + e as u8) << 2) | (x as u8 & 3))
            }
            _ => out.extend_from_slice(&x.to_ne_bytes()[..dtype.size()]),
        }
    }
    out
}

/// The canonical reduction of `inputs[lo..hi]` (bytes of one dtype).
fn canonical(dtype: DataType, op: ReduceOp, inputs: &[Vec<u8>], lo: usize, hi: usize) -> Vec<u8> {
    if hi - lo == 1 {
        return inputs[lo].clone();
    }
    let mid = comm_core::algo::canonical_split(lo, hi);
    let (a, b) = (
        canonical(dtype, op, inputs, lo, mid),
        canonical(dtype, op, inputs, mid, hi),
    );
    let mut out = vec![0u8; a.len()];
    let kernel_op = if op == ReduceOp::Avg {
        ReduceOp::Sum
    } else {
        op
    };
    kernels::reduce_into(dtype, kernel_op, &mut out, &a, &b);
    out
}

/// The canonical result over all ranks, `Avg` divided once at the end.
fn reference(dtype: DataType, op: ReduceOp, inputs: &[Vec<u8>]) -> Vec<u8> {
    let mut out = canonical(dtype, op, inputs, 0, inputs.len());
    if op == ReduceOp::Avg {
        kernels::divide(dtype, &mut out, inputs.len());
    }
    out
}

fn typed<T: Element + Default>(bytes: &[u8]) -> Vec<T> {
    let mut v = vec![T::default(); bytes.len() / std::mem::size_of::<T>()];
    sncl::as_bytes_mut(&mut v).copy_from_slice(bytes);
    v
}

fn bytes_of<T: Element>(v: &[T]) -> Vec<u8> {
    sncl::as_bytes(v).to_vec()
}

/// One collective on every rank of `comms` (run on threads) with each
/// rank's input from `seed`, compared with the canonical reference.
#[derive(Clone, Copy, Debug)]
struct Case {
    coll: Collective,
    algo: &'static str,
    op: ReduceOp,
    count: usize,
    seed: u64,
    in_place: bool,
}

fn inputs(dtype: DataType, case: &Case, n: usize, per_rank: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|r| random_bytes(dtype, per_rank, &mut Rng(case.seed * 1000 + r as u64)))
        .collect()
}

/// Runs `case` on rank `c` for elements of type `T`; returns what this
/// rank must hold and what it holds.
fn run_case<T: Element + Default>(c: &Communicator, case: &Case) -> (Vec<u8>, Vec<u8>) {
    let (n, r) = (c.size(), c.rank());
    let dtype = T::DTYPE;
    let count = case.count;
    c.force_algorithm(case.coll, Some(case.algo)).unwrap();
    match case.coll {
        Collective::AllReduce => {
            let all = inputs(dtype, case, n, count);
            let want = reference(dtype, case.op, &all);
            let send: Vec<T> = typed(&all[r]);
            let got = if case.in_place {
                let mut buf = send.clone();
                c.all_reduce_in_place(&mut buf, case.op).unwrap();
                buf
            } else {
                let mut recv = vec![T::default(); count];
                c.all_reduce(&send, &mut recv, case.op).unwrap();
                recv
            };
            (want, bytes_of(&got))
        }
        Collective::ReduceScatter => {
            let all = inputs(dtype, case, n, n * count);
            let want = reference(dtype, case.op, &all);
            let want = want[r * count * dtype.size()..(r + 1) * count * dtype.size()].to_vec();
            let send: Vec<T> = typed(&all[r]);
            let mut recv = vec![T::default(); count];
            c.reduce_scatter(&send, &mut recv, case.op).unwrap();
            (want, bytes_of(&recv))
        }
        Collective::Reduce => {
            let root = (case.seed as usize) % n;
            let all = inputs(dtype, case, n, count);
            let want = if r == root {
                reference(dtype, case.op, &all)
            } else {
                Vec::new()
            };
            let send: Vec<T> = typed(&all[r]);
            let mut recv = vec![T::default(); if r == root { count } else { 0 }];
            c.reduce(&send, &mut recv, case.op, root).unwrap();
            (want, bytes_of(&recv))
        }
        other => unreachable!("{other:?} does not reduce"),
    }
}

/// Every rank runs `cases` for `T`; any differing bit fails naming the case.
fn check_all<T: Element + Default>(comms: &[Communicator], cases: &[Case]) {
    std::thread::scope(|s| {
        for c in comms {
            s.spawn(move || {
                for case in cases {
                    let (want, got) = run_case::<T>(c, case);
                    if want != got {
                        let first = want.iter().zip(&got).position(|(a, b)| a != b);
                        panic!(
                            "rank {} of {}: {:?} {case:?}: differs from the canonical order \
                             (first differing byte {first:?}, lengths {} / {})",
                            c.rank(),
                            c.size(),
                            T::DTYPE,
                            want.len(),
                            got.len()
                        );
                    }
                }
            });
        }
    });
}

fn algorithms(coll: Collective) -> &'static [&'static str] {
    match coll {
        Collective::AllReduce => &["ring", "flat-ring", "hier", "tree", "rd"],
        Collective::ReduceScatter => &["ring", "flat-ring", "hier"],
        _ => &["tree", "ring", "hier"],
    }
}

/// Cases for every (collective, algorithm, reduction) at sizes 0, 1, odd
/// and several chunks.
fn matrix(ops: &[ReduceOp], seed: u64) -> Vec<Case> {
    let mut v = Vec::new();
    for coll in [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::Reduce,
    ] {
        for &algo in algorithms(coll) {
            for &op in ops {
                for (k, count) in [0usize, 1, 7, 333, 2500].into_iter().enumerate() {
                    v.push(Case {
                        coll,
                        algo,
                        op,
                        count,
                        seed: seed + k as u64,
                        in_place: k % 2 == 1,
                    });
                }
            }
        }
    }
    v
}

const FLOAT_OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Avg,
    ReduceOp::Prod,
    ReduceOp::Max,
    ReduceOp::Min,
];
const INT_OPS: [ReduceOp; 8] = [
    ReduceOp::Sum,
    ReduceOp::Avg,
    ReduceOp::Prod,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::BitAnd,
    ReduceOp::BitOr,
    ReduceOp::BitXor,
];

/// Every data type and reduction on one group of ranks.
fn every_dtype(comms: &[Communicator]) {
    let floats = matrix(&FLOAT_OPS, 1);
    let ints = matrix(&INT_OPS, 2);
    check_all::<f32>(comms, &floats);
    check_all::<f64>(comms, &floats);
    check_all::<half::f16>(comms, &floats);
    check_all::<half::bf16>(comms, &floats);
    check_all::<kernels::F8E4M3>(comms, &floats);
    check_all::<kernels::F8E5M2>(comms, &floats);
    check_all::<i8>(comms, &ints);
    check_all::<u8>(comms, &ints);
    check_all::<i32>(comms, &ints);
    check_all::<u32>(comms, &ints);
    check_all::<i64>(comms, &ints);
    check_all::<u64>(comms, &ints);
}

/// Sums of the float types over many random inputs, every algorithm.
fn many_seeds(comms: &[Communicator]) {
    let seeds: u64 = std::env::var("SNCL_TEST_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let mut cases = Vec::new();
    for seed in 0..seeds {
        for &algo in algorithms(Collective::AllReduce) {
            let count = [1usize, 5, 64, 1001, 4097][seed as usize % 5];
            cases.push(Case {
                coll: Collective::AllReduce,
                algo,
                op: ReduceOp::Sum,
                count,
                seed: 100 + seed,
                in_place: false,
            });
        }
    }
    check_all::<f32>(comms, &cases);
    check_all::<half::f16>(comms, &cases);
    check_all::<half::bf16>(comms, &cases);
}

#[test]
fn one_node_of_2_3_4_5_8_ranks_over_shared_memory() {
    for n in [2, 3, 4, 5, 8] {
        let comms = group(n, 1, false, true);
        every_dtype(&comms);
        many_seeds(&comms);
    }
}

#[test]
fn sixteen_ranks_on_four_nodes_over_shared_memory_and_tcp() {
    let comms = group(16, 4, false, true);
    assert_eq!(comms[0].transports()[4], "shm");
    assert_eq!(comms[0].transports()[1], "tcp");
    check_all::<f32>(&comms, &matrix(&FLOAT_OPS, 3));
    check_all::<half::bf16>(&comms, &matrix(&[ReduceOp::Sum, ReduceOp::Avg], 4));
    many_seeds(&comms);
}

#[test]
fn three_and_five_ranks_over_tcp_only() {
    for n in [3, 5] {
        let comms = group(n, n, true, true);
        check_all::<f32>(&comms, &matrix(&FLOAT_OPS, 5));
        check_all::<half::f16>(&comms, &matrix(&[ReduceOp::Sum, ReduceOp::Avg], 6));
        check_all::<i32>(&comms, &matrix(&INT_OPS, 7));
    }
}

/// Max and min over inputs full of +0, -0 and NaNs of several payloads:
/// the kernels' max and min are commutative bit for bit, so every
/// placement of the canonical tree gives the same bits there too.
#[test]
fn signed_zeros_and_nans_in_max_and_min() {
    for n in [3, 5, 8] {
        let comms = group(n, 1, false, true);
        std::thread::scope(|s| {
            for c in &comms {
                s.spawn(move || {
                    let (n, r) = (c.size(), c.rank());
                    let special = [
                        0u32,
                        0x8000_0000,
                        0x7fc0_0000,
                        0xffc0_0000,
                        0x7f80_0001,
                        0x3f80_0000,
                    ];
                    let input = |q: usize| -> Vec<u8> {
                        let mut rng = Rng(77 + q as u64);
                        (0..999)
                            .flat_map(|_| {
                                let x = rng.next();
                                let bits = if x.is_multiple_of(3) {
                                    0xbf80_0000
                                } else {
                                    special[(x >> 8) as usize % special.len()]
                                };
                                bits.to_ne_bytes()
                            })
                            .collect()
                    };
                    let all: Vec<Vec<u8>> = (0..n).map(input).collect();
                    for op in [ReduceOp::Max, ReduceOp::Min] {
                        let want = reference(DataType::Float32, op, &all);
                        for &algo in algorithms(Collective::AllReduce) {
                            c.force_algorithm(Collective::AllReduce, Some(algo))
                                .unwrap();
                            let send: Vec<f32> = typed(&all[r]);
                            let mut recv = vec![0f32; send.len()];
                            c.all_reduce(&send, &mut recv, op).unwrap();
                            assert_eq!(bytes_of(&recv), want, "{n} ranks, {op:?}, {algo}");
                        }
                    }
                });
            }
        });
    }
}

/// Across rank counts: a run of `n` ranks whose rank `i` holds the
/// canonical sum of ranks `i*m .. (i+1)*m` of a run of `n*m` ranks (`m` a
/// power of two: the same data cut in coarser canonical shards) gets the
/// larger run's bits, because the canonical tree over `n*m` ranks is the
/// tree over `n` with a subtree of `m` under each leaf.
#[test]
fn coarser_canonical_shards_give_the_larger_runs_bits() {
    let fine = 12;
    let all: Vec<Vec<u8>> = (0..fine)
        .map(|q| random_bytes(DataType::Float32, 5000, &mut Rng(500 + q as u64)))
        .collect();
    let want = reference(DataType::Float32, ReduceOp::Sum, &all);
    for m in [1usize, 2, 4] {
        let n = fine / m;
        let coarse: Vec<Vec<u8>> = (0..n)
            .map(|i| canonical(DataType::Float32, ReduceOp::Sum, &all, i * m, (i + 1) * m))
            .collect();
        let comms = group(n, 1, false, true);
        std::thread::scope(|s| {
            for c in &comms {
                let (coarse, want) = (&coarse, &want);
                s.spawn(move || {
                    let send: Vec<f32> = typed(&coarse[c.rank()]);
                    let mut recv = vec![0f32; send.len()];
                    c.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
                    assert_eq!(
                        &bytes_of(&recv),
                        want,
                        "{} ranks of {m}-rank shards",
                        c.size()
                    );
                });
            }
        });
    }
}

/// The check can fail: without deterministic mode, the ring and the tree
/// of 5 ranks round f32 sums differently.
#[test]
fn without_deterministic_mode_algorithms_round_differently() {
    let comms = group(5, 1, false, false);
    let results: Vec<Vec<Vec<u8>>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    ["ring", "tree"]
                        .iter()
                        .map(|&algo| {
                            let case = Case {
                                coll: Collective::AllReduce,
                                algo,
                                op: ReduceOp::Sum,
                                count: 4096,
                                seed: 9,
                                in_place: false,
                            };
                            run_case::<f32>(c, &case).1
                        })
                        .collect()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_ne!(
        results[0][0], results[0][1],
        "ring and tree agree bit for bit without deterministic mode"
    );
}
