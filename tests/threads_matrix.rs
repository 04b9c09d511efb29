//! Ranks as threads: every collective × every data type × every reduction
//! operator × rank counts 1..=8 × counts {0, 1, 7, more than one chunk},
//! in place and out of place, with each algorithm forced through
//! `Config::algo`. Expected results are computed independently here with
//! the documented semantics (integers wrap, `Avg` = sum / nranks truncated
//! for integers, f16 / bf16 / fp8 accumulate in f32 per step, fp8 rounding
//! with saturation).
//!
//! Also: several communicators driven at once, non-blocking scopes, grouped
//! point-to-point, and invalid arguments (rejected before anything is sent,
//! the communicator still usable afterwards).
//!
//! Each rank records what went wrong instead of panicking, so the other
//! ranks keep in step and a failure is reported, not a hang.

mod rank_kit;

use std::time::{Duration, Instant};

use comm_core::algo::Algorithm;
use comm_core::config::TransportChoice;
use half::{bf16, f16};
use kernels::{F8E4M3, F8E5M2};
use sncl::{Collective, Communicator, Config, Error, ReduceOp};

use rank_kit::*;

// ---------------------------------------------------------------------------
// Suites.

const CHUNK: usize = 4096;
const SLOT: usize = 4096;

/// The collectives whose algorithm can be forced.
const PLANNED: [Collective; 9] = [
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

/// Algorithm set `i`: the `i`-th entry of `Algorithm::available` for every
/// collective that has one (so every algorithm of every collective is forced
/// in some set, including ones added later). Set 0 covers every collective.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Kind(usize);

impl Kind {
    const FIRST: Kind = Kind(0);

    fn all() -> Vec<Kind> {
        let most = PLANNED
            .iter()
            .map(|c| Algorithm::available(*c).len())
            .max()
            .unwrap_or(1);
        (0..most).map(Kind).collect()
    }

    fn algo(self, coll: Collective) -> Option<Algorithm> {
        Algorithm::available(coll).get(self.0).copied()
    }

    fn has(self, coll: Collective) -> bool {
        self.algo(coll).is_some()
    }

    fn name(self) -> String {
        let v: Vec<String> = PLANNED
            .iter()
            .filter_map(|c| self.algo(*c).map(|a| format!("{}:{}", c.name(), a.name())))
            .collect();
        v.join(",")
    }
}

fn config(kind: Kind, transport: TransportChoice) -> Config {
    let algo = PLANNED
        .iter()
        .filter_map(|c| kind.algo(*c).map(|a| (*c, a)))
        .collect();
    Config {
        timeout: Duration::from_secs(60),
        algo,
        chunk_bytes: CHUNK,
        shm: sncl::ShmSettings {
            slot_bytes: SLOT,
            ..Default::default()
        },
        tcp: sncl::TcpSettings {
            piece_bytes: 4096,
            ..Default::default()
        },
        transport,
        ..Default::default()
    }
}

fn suite_t<T: TE>(k: &mut Rk, kind: Kind) -> Res {
    use Collective::*;
    let n = k.n;
    let ce = CHUNK / std::mem::size_of::<T>();
    // (whole-buffer count, per-rank block count): 0, 1, 7, and more than
    // one chunk / one shared-memory slot (two ring rounds and a remainder).
    let counts = [(0, 0), (1, 1), (7, 7), (2 * ce * n + 5, 2 * ce + 5)];
    for (ci, &(total, block)) in counts.iter().enumerate() {
        for &op in ops_for::<T>() {
            for in_place in [false, true] {
                if kind.has(AllReduce) {
                    t_all_reduce::<T>(k, op, total, in_place)?;
                }
                if kind.has(Reduce) {
                    t_reduce::<T>(k, op, total, in_place)?;
                }
                if kind.has(ReduceScatter) {
                    t_reduce_scatter::<T>(k, op, block, in_place)?;
                }
            }
        }
        if kind.has(Broadcast) {
            t_broadcast::<T>(k, total, false)?;
            t_broadcast::<T>(k, total, true)?;
        }
        if kind.has(AllGather) {
            t_all_gather::<T>(k, block, false)?;
            t_all_gather::<T>(k, block, true)?;
        }
        if kind.has(AllToAll) {
            t_alltoall::<T>(k, block)?;
        }
        if kind.has(Gather) {
            t_gather::<T>(k, block)?;
        }
        if kind.has(Scatter) {
            t_scatter::<T>(k, block)?;
        }
        if kind == Kind::FIRST {
            // Variable counts have one algorithm each, not forceable.
            t_all_gatherv::<T>(k, block)?;
            t_alltoallv::<T>(k, block)?;
        }
        if ci == 0 && kind.has(Barrier) {
            let c = k.c;
            k.ok("barrier", c.barrier())?;
        }
    }
    Ok(())
}

fn suite(k: &mut Rk, kind: Kind, only: &[&str]) -> Res {
    macro_rules! each {
        ($($t:ty),*) => {
            $(
                if only.is_empty() || only.contains(&<$t as TE>::NAME) {
                    suite_t::<$t>(k, kind)?;
                }
            )*
        };
    }
    each!(i8, u8, i32, u32, i64, u64, f16, f32, f64, bf16, F8E4M3, F8E5M2);
    Ok(())
}

fn matrix(n: usize) {
    let t0 = Instant::now();
    let mut errs = Vec::new();
    for kind in Kind::all() {
        let comms = init(n, config(kind, TransportChoice::Auto));
        for c in &comms {
            for (p, t) in c.transports().iter().enumerate() {
                let want = if p == c.rank() { "self" } else { "shm" };
                assert_eq!(*t, want, "rank {} to {p}", c.rank());
            }
        }
        errs.extend(on_ranks(&comms, &format!("{}/shm", kind.name()), |k| {
            suite(k, kind, &[])
        }));
    }
    eprintln!("matrix n={n}: {:?}", t0.elapsed());
    assert_clean(errs);
}

#[test]
fn matrix_n1() {
    matrix(1);
}
#[test]
fn matrix_n2() {
    matrix(2);
}
#[test]
fn matrix_n3() {
    matrix(3);
}
#[test]
fn matrix_n4() {
    matrix(4);
}
#[test]
fn matrix_n5() {
    matrix(5);
}
#[test]
fn matrix_n6() {
    matrix(6);
}
#[test]
fn matrix_n7() {
    matrix(7);
}
#[test]
fn matrix_n8() {
    matrix(8);
}

/// Over TCP between thread-ranks (`TransportChoice::Tcp`), every collective
/// and algorithm on a subset of the data types.
fn matrix_tcp(n: usize) {
    let t0 = Instant::now();
    let mut errs = Vec::new();
    for kind in Kind::all() {
        let comms = init(n, config(kind, TransportChoice::Tcp));
        for c in &comms {
            for (p, t) in c.transports().iter().enumerate() {
                let want = if p == c.rank() { "self" } else { "tcp" };
                assert_eq!(*t, want, "rank {} to {p}", c.rank());
            }
        }
        errs.extend(on_ranks(&comms, &format!("{}/tcp", kind.name()), |k| {
            suite(k, kind, &["u8", "i64", "f16", "f32", "f8e5m2"])
        }));
    }
    eprintln!("matrix over tcp n={n}: {:?}", t0.elapsed());
    assert_clean(errs);
}

#[test]
fn matrix_tcp_n2() {
    matrix_tcp(2);
}
#[test]
fn matrix_tcp_n3() {
    matrix_tcp(3);
}
#[test]
fn matrix_tcp_n5() {
    matrix_tcp(5);
}
#[test]
fn matrix_tcp_n8() {
    matrix_tcp(8);
}

/// Over RDMA between thread-ranks on the strict emulated provider
/// (`SNCL_IB_EMULATE=strict`, issue 36: pinned memory, a RoCE GID table on
/// a routed fabric, WRITE sources checked at completion), every collective
/// and algorithm on every data type.
fn matrix_rdma_strict(n: usize) {
    // Every rank pins its FIFOs to every peer in this one process.
    let need = n as u64
        * transport_rdma::pinned_for(
            n - 1,
            transport_rdma::DEFAULT_SLOTS,
            transport_rdma::DEFAULT_SLOT_BYTES,
        );
    if !transport_rdma::PinRules::of_process().allows(need) {
        eprintln!(
            "skipping the strict RDMA matrix: {need} bytes to pin are more than RLIMIT_MEMLOCK \
             allows this process (no CAP_IPC_LOCK)"
        );
        return;
    }
    let t0 = Instant::now();
    let mut errs = Vec::new();
    for kind in Kind::all() {
        let mut cfg = config(kind, TransportChoice::parse("rdma").unwrap());
        cfg.ib.emulate = true;
        cfg.ib.emulate_strict = true;
        let comms = init(n, cfg);
        for c in &comms {
            for (p, t) in c.transports().iter().enumerate() {
                let want = if p == c.rank() { "self" } else { "rdma" };
                assert_eq!(*t, want, "rank {} to {p}", c.rank());
            }
        }
        errs.extend(on_ranks(
            &comms,
            &format!("{}/rdma-strict", kind.name()),
            |k| suite(k, kind, &[]),
        ));
    }
    eprintln!("matrix over strict rdma n={n}: {:?}", t0.elapsed());
    assert_clean(errs);
}

#[test]
fn matrix_rdma_strict_n3() {
    matrix_rdma_strict(3);
}
#[test]
fn matrix_rdma_strict_n8() {
    matrix_rdma_strict(8);
}

/// Thread-ranks that claim to live on different nodes (`Config::node_id`
/// per rank): shared memory within a node, TCP across, and a topology the
/// hierarchical algorithms can use.
fn init_nodes(nodes: &[usize], cfg: Config) -> Vec<Communicator> {
    let n = nodes.len();
    let store = sncl::MemoryStore::new();
    let comm_id = 0x5EED_0000_0000 ^ nodes.iter().fold(n as u64, |a, &x| a * 31 + x as u64);
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let store: std::sync::Arc<dyn sncl::Store> = std::sync::Arc::new(store.for_rank(r));
            let mut cfg = cfg.clone();
            cfg.node_id = Some(format!("test-node-{}", nodes[r]));
            std::thread::spawn(move || Communicator::init_with_store(store, r, n, comm_id, cfg))
        })
        .collect();
    hs.into_iter()
        .map(|h| h.join().expect("init thread").expect("init_with_store"))
        .collect()
}

fn matrix_nodes(nodes: &[usize], only: &[&str]) {
    let t0 = Instant::now();
    let mut errs = Vec::new();
    for kind in Kind::all() {
        let comms = init_nodes(nodes, config(kind, TransportChoice::Auto));
        for c in &comms {
            let r = c.rank();
            assert_eq!(c.node_ids()[r], format!("test-node-{}", nodes[r]));
            for (p, t) in c.transports().iter().enumerate() {
                let want = if p == r {
                    "self"
                } else if nodes[p] == nodes[r] {
                    "shm"
                } else {
                    "tcp"
                };
                assert_eq!(*t, want, "rank {r} to {p} (nodes {nodes:?})");
            }
        }
        let tag = format!("{}/nodes {nodes:?}", kind.name());
        errs.extend(on_ranks(&comms, &tag, |k| suite(k, kind, only)));
    }
    eprintln!("matrix on nodes {nodes:?}: {:?}", t0.elapsed());
    assert_clean(errs);
}

#[test]
fn matrix_two_nodes_n4() {
    matrix_nodes(&[0, 0, 1, 1], &[]);
}
#[test]
fn matrix_two_uneven_nodes_n5() {
    matrix_nodes(
        &[0, 0, 0, 1, 1],
        &["u8", "i32", "u64", "f16", "f32", "bf16", "f8e4m3"],
    );
}
#[test]
fn matrix_two_interleaved_nodes_n6() {
    matrix_nodes(&[0, 1, 0, 1, 0, 1], &["i8", "u32", "f64", "bf16"]);
}
#[test]
fn matrix_three_nodes_n7() {
    matrix_nodes(&[2, 0, 1, 0, 2, 1, 1], &["i64", "f32", "f16"]);
}
#[test]
fn matrix_one_rank_per_node_n3() {
    matrix_nodes(&[0, 1, 2], &["u8", "i64", "f32", "bf16"]);
}

/// The whole matrix again through the non-blocking forms (each started in
/// a `scope` and waited), over shared memory and over TCP.
fn matrix_nonblocking(n: usize, transport: TransportChoice, only: &[&str]) {
    let t0 = Instant::now();
    let mut errs = Vec::new();
    for kind in Kind::all() {
        let comms = init(n, config(kind, transport));
        let tag = format!("{}/{transport:?}/non-blocking", kind.name());
        errs.extend(on_ranks_with(&comms, &tag, true, |k| suite(k, kind, only)));
    }
    eprintln!(
        "non-blocking matrix {transport:?} n={n}: {:?}",
        t0.elapsed()
    );
    assert_clean(errs);
}

#[test]
fn matrix_nonblocking_n3() {
    matrix_nonblocking(3, TransportChoice::Auto, &[]);
}
#[test]
fn matrix_nonblocking_n4() {
    matrix_nonblocking(4, TransportChoice::Auto, &[]);
}
#[test]
fn matrix_nonblocking_tcp_n3() {
    matrix_nonblocking(3, TransportChoice::Tcp, &["i32", "bf16", "f64"]);
}

/// 1000003 elements (an odd count far beyond every chunk and slot): f32 sum
/// and i32 sum / avg / bxor through every all_reduce algorithm, plus the
/// other big-buffer collectives for f32.
#[test]
fn huge_count_1000003() {
    const COUNT: usize = 1_000_003;
    let t0 = Instant::now();
    let mut errs = Vec::new();
    for n in [2, 3, 8] {
        for kind in Kind::all() {
            let mut cfg = config(kind, TransportChoice::Auto);
            // Default-sized chunks and slots here: small ones would make
            // this slow without covering anything the matrix does not.
            cfg.chunk_bytes = Config::default().chunk_bytes;
            cfg.shm.slot_bytes = Config::default().shm.slot_bytes;
            let comms = init(n, cfg);
            errs.extend(on_ranks(&comms, &format!("{}/huge", kind.name()), |k| {
                use Collective::*;
                if kind.has(AllReduce) {
                    t_all_reduce::<f32>(k, ReduceOp::Sum, COUNT, true)?;
                    t_all_reduce::<f32>(k, ReduceOp::Sum, COUNT, false)?;
                    t_all_reduce::<i32>(k, ReduceOp::Sum, COUNT, false)?;
                }
                if kind == Kind::FIRST {
                    t_all_reduce::<i32>(k, ReduceOp::Avg, COUNT, true)?;
                    t_all_reduce::<i32>(k, ReduceOp::BitXor, COUNT, false)?;
                }
                if kind.has(Reduce) {
                    t_reduce::<f32>(k, ReduceOp::Sum, COUNT, false)?;
                }
                if kind.has(Broadcast) {
                    t_broadcast::<f32>(k, COUNT, false)?;
                }
                if kind == Kind::FIRST {
                    let block = COUNT / k.n;
                    t_reduce_scatter::<f32>(k, ReduceOp::Sum, block, false)?;
                    t_all_gather::<f32>(k, block, true)?;
                    t_alltoall::<f32>(k, block)?;
                }
                Ok(())
            }));
        }
    }
    eprintln!("huge counts: {:?}", t0.elapsed());
    assert_clean(errs);
}

/// The planner's own choices (nothing forced, default sizes) across sizes
/// that cross its algorithm thresholds.
#[test]
fn planner_choices_are_correct() {
    let mut errs = Vec::new();
    for n in [2, 4, 7] {
        let comms = init(n, Config::default());
        for c in &comms {
            for count in [1usize, 1000, 100_000] {
                let a = c
                    .algorithm_for(Collective::AllReduce, sncl::DataType::Float32, count)
                    .expect("algorithm_for");
                assert!(["ring", "tree", "rd", "one-shot"].contains(&a), "{a}");
            }
        }
        errs.extend(on_ranks(&comms, "auto", |k| {
            for count in [0, 1, 5, 100, 3000, 70_000, 300_001] {
                t_all_reduce::<f32>(k, ReduceOp::Sum, count, false)?;
                t_all_reduce::<bf16>(k, ReduceOp::Max, count, true)?;
                t_broadcast::<u8>(k, count, false)?;
                t_reduce::<f64>(k, ReduceOp::Min, count, false)?;
            }
            Ok(())
        }));
    }
    assert_clean(errs);
}

// ---------------------------------------------------------------------------
// Several communicators at once.

/// Two 4-rank communicators with different algorithms, each driven by its
/// own threads, at the same time.
#[test]
fn two_communicators_driven_concurrently() {
    let errs = within(Duration::from_secs(120), "two communicators", || {
        let a = init(4, config(Kind::FIRST, TransportChoice::Auto));
        let b = init(4, config(Kind(1), TransportChoice::Auto));
        std::thread::scope(|s| {
            let hs: Vec<_> = a
                .iter()
                .map(|c| (c, Kind::FIRST, "A"))
                .chain(b.iter().map(|c| (c, Kind(1), "B")))
                .map(|(c, kind, tag)| {
                    s.spawn(move || {
                        let mut k = Rk::new(c, tag);
                        let _ = suite(&mut k, kind, &["u8", "f32", "bf16", "i64"]);
                        k.errs
                    })
                })
                .collect();
            hs.into_iter()
                .flat_map(|h| h.join().expect("rank thread"))
                .collect::<Vec<_>>()
        })
    });
    assert_clean(errs);
}

/// The same 4 threads each hold one rank of two communicators and
/// interleave operations on them (the same order on every rank).
#[test]
fn two_communicators_interleaved_on_the_same_threads() {
    let errs = within(Duration::from_secs(120), "interleaved", || {
        let a = init(4, config(Kind::FIRST, TransportChoice::Auto));
        let b = init(4, config(Kind(2), TransportChoice::Auto));
        std::thread::scope(|s| {
            let hs: Vec<_> = a
                .iter()
                .zip(&b)
                .map(|(ca, cb)| {
                    s.spawn(move || {
                        let mut ka = Rk::new(ca, "A");
                        let mut kb = Rk::new(cb, "B");
                        let _ = (|| -> Res {
                            for i in 0..40usize {
                                let count = [0, 1, 7, 3000][i % 4];
                                t_all_reduce::<f32>(&mut ka, ReduceOp::Sum, count, i % 2 == 0)?;
                                t_all_reduce::<i32>(&mut kb, ReduceOp::Max, count, i % 3 == 0)?;
                                t_all_gather::<u8>(&mut ka, count, false)?;
                                t_all_reduce::<u64>(&mut kb, ReduceOp::BitOr, count, false)?;
                                t_broadcast::<f64>(&mut ka, count, true)?;
                            }
                            Ok(())
                        })();
                        ka.errs.extend(kb.errs);
                        ka.errs
                    })
                })
                .collect();
            hs.into_iter()
                .flat_map(|h| h.join().expect("rank thread"))
                .collect::<Vec<_>>()
        })
    });
    assert_clean(errs);
}

/// Non-blocking operations on two communicators started in different
/// orders on different ranks: each communicator progresses on its own, so
/// this must not deadlock (blocking calls in these orders would).
#[test]
fn two_communicators_non_blocking_in_opposite_orders() {
    let errs = within(Duration::from_secs(60), "opposite orders", || {
        let a = init(4, config(Kind::FIRST, TransportChoice::Auto));
        let b = init(4, config(Kind::FIRST, TransportChoice::Auto));
        std::thread::scope(|s| {
            let hs: Vec<_> = a
                .iter()
                .zip(&b)
                .map(|(ca, cb)| {
                    s.spawn(move || {
                        let mut errs = Vec::new();
                        let r = ca.rank();
                        for iter in 0..20usize {
                            let count = 1 + iter * 997;
                            let xa: Vec<f32> = (0..count).map(|i| (i % 9 + r) as f32).collect();
                            let xb: Vec<i64> =
                                (0..count).map(|i| (i * 3 + r) as i64).collect();
                            let mut ya = vec![0f32; count];
                            let mut yb = vec![0i64; count];
                            let res = ca.scope(|sa| {
                                cb.scope(|sb| {
                                    let (wa, wb) = if (r + iter) % 2 == 0 {
                                        let wa = sa.all_reduce(&xa, &mut ya, ReduceOp::Sum)?;
                                        let wb = sb.all_reduce(&xb, &mut yb, ReduceOp::Max)?;
                                        (wa, wb)
                                    } else {
                                        let wb = sb.all_reduce(&xb, &mut yb, ReduceOp::Max)?;
                                        let wa = sa.all_reduce(&xa, &mut ya, ReduceOp::Sum)?;
                                        (wa, wb)
                                    };
                                    if r % 2 == 0 {
                                        wa.wait()?;
                                        wb.wait()
                                    } else {
                                        wb.wait()?;
                                        wa.wait()
                                    }
                                })
                            });
                            if let Err(e) = res {
                                errs.push(format!("rank {r} iteration {iter}: {e}"));
                                break;
                            }
                            for i in 0..count {
                                let sa: f32 = (0..4).map(|q| (i % 9 + q) as f32).sum();
                                let mb = (i * 3 + 3) as i64;
                                if ya[i] != sa || yb[i] != mb {
                                    errs.push(format!(
                                        "rank {r} iteration {iter} [{i}]: got {} / {}, want {sa} / {mb}",
                                        ya[i], yb[i]
                                    ));
                                    break;
                                }
                            }
                        }
                        errs
                    })
                })
                .collect();
            hs.into_iter()
                .flat_map(|h| h.join().expect("rank thread"))
                .collect::<Vec<_>>()
        })
    });
    assert_clean(errs);
}

// ---------------------------------------------------------------------------
// Non-blocking scopes.

/// Many operations of different kinds queued at once; waited in reverse
/// order (and some not waited at all: the scope waits); stream order keeps
/// the ranks matched, and a blocking call made inside the scope runs after
/// the queued ones.
#[test]
fn scope_queues_many_operations_in_stream_order() {
    let errs = within(Duration::from_secs(60), "scope", || {
        let n = 3;
        let comms = init(n, config(Kind::FIRST, TransportChoice::Auto));
        on_ranks(&comms, "scope", |k| {
            let c = k.c;
            let r = k.r;
            for round in 0..5usize {
                let big = 20_000 + round * 1001;
                let a: Vec<f32> = (0..big).map(|i| (i % 13) as f32 + r as f32).collect();
                let mut a_out = vec![0f32; big];
                let mut b: Vec<u8> = if r == 1 {
                    (0..777).map(|i| (i * 7 % 251) as u8).collect()
                } else {
                    vec![0; 777]
                };
                let g_in: Vec<i64> = (0..5).map(|i| (r * 100 + i) as i64).collect();
                let mut g_out = vec![0i64; 5 * n];
                let rs_in: Vec<f64> = (0..n * 1000).map(|i| (i % 5) as f64).collect();
                let mut rs_out = vec![0f64; 1000];
                let t_in: Vec<bf16> = (0..n * 33)
                    .map(|i| bf16::from_f32((r * 1000 + i) as f32))
                    .collect();
                let mut t_out = vec![bf16::ZERO; n * 33];
                let mut inplace: Vec<i32> = vec![r as i32 + 1; 4099];
                let x = [r as u32; 10];
                let mut y = [0u32; 10];
                let res: sncl::Result<()> = c.scope(|s| {
                    let w1 = s.all_reduce(&a, &mut a_out, ReduceOp::Sum)?;
                    let w2 = s.broadcast(&mut b, 1)?;
                    let w3 = s.all_gather(&g_in, &mut g_out)?;
                    let w4 = s.reduce_scatter(&rs_in, &mut rs_out, ReduceOp::Max)?;
                    let w5 = s.alltoall(&t_in, &mut t_out)?;
                    let _unwaited = s.all_reduce_in_place(&mut inplace, ReduceOp::Prod)?;
                    // A blocking call takes its place after the queued ones.
                    c.all_reduce(&x, &mut y, ReduceOp::Sum)?;
                    w5.wait()?;
                    w4.wait()?;
                    assert!(w3.wait_timeout(Duration::from_secs(30))?, "w3 done");
                    assert!(w3.test());
                    w3.wait()?;
                    w2.wait()?;
                    w1.wait()
                });
                k.ok(&format!("scope round {round}"), res)?;
                let w: Vec<f32> = (0..big)
                    .map(|i| (0..n).map(|q| (i % 13) as f32 + q as f32).sum())
                    .collect();
                k.check("queued all_reduce", &a_out, |i| Some(w[i]));
                k.check("queued broadcast", &b, |i| Some((i * 7 % 251) as u8));
                k.check("queued all_gather", &g_out, |i| {
                    Some(((i / 5) * 100 + i % 5) as i64)
                });
                k.check("queued reduce_scatter", &rs_out, |i| {
                    Some(((r * 1000 + i) % 5) as f64)
                });
                k.check("queued alltoall", &t_out, |i| {
                    let (q, j) = (i / 33, i % 33);
                    Some(bf16::from_f32((q * 1000 + r * 33 + j) as f32))
                });
                let p: i32 = (1..=n as i32).product();
                k.check("unwaited all_reduce", &inplace, |_| Some(p));
                let sum: u32 = (0..n as u32).sum();
                k.check("blocking all_reduce in the scope", &y, |_| Some(sum));
            }
            Ok(())
        })
    });
    assert_clean(errs);
}

/// `test` / `wait_timeout` report an operation that cannot finish yet (a
/// peer has not started it) as running, and as done once it is.
#[test]
fn scope_test_and_wait_timeout() {
    let errs = within(Duration::from_secs(60), "wait_timeout", || {
        let comms = init(2, config(Kind::FIRST, TransportChoice::Auto));
        on_ranks(&comms, "wait_timeout", |k| {
            let c = k.c;
            let mut v = vec![k.r as f64 + 1.0; 1000];
            let res = c.scope(|s| {
                if k.r == 1 {
                    std::thread::sleep(Duration::from_millis(400));
                }
                let w = s.all_reduce_in_place(&mut v, ReduceOp::Sum)?;
                if k.r == 0 {
                    assert!(!w.test(), "done although rank 1 has not started");
                    assert!(
                        !w.wait_timeout(Duration::from_millis(50))?,
                        "wait_timeout reported done although rank 1 has not started"
                    );
                }
                let t = Instant::now();
                while !w.wait_timeout(Duration::from_millis(20))? {
                    assert!(t.elapsed() < Duration::from_secs(30), "never completes");
                }
                assert!(w.test());
                w.wait()
            });
            k.ok("all_reduce with wait_timeout", res)?;
            k.check("all_reduce with wait_timeout", &v, |_| Some(3.0));
            Ok(())
        })
    });
    assert_clean(errs);
}

/// A non-blocking operation that fails (a bitwise reduction on floats is
/// only rejected when it runs) reports the error through its `Work`; the
/// scope must still return, and the communicator must still work.
#[test]
fn scope_returns_after_a_failed_operation_was_waited() {
    let errs = within(Duration::from_secs(5), "scope after a failed wait", || {
        let comms = init(2, config(Kind::FIRST, TransportChoice::Auto));
        on_ranks(&comms, "failed-work", |k| {
            let c = k.c;
            let mut v = vec![1.0f32; 16];
            let r = c.scope(|s| {
                let w = s.all_reduce_in_place(&mut v, ReduceOp::BitAnd)?;
                w.wait()
            });
            match r {
                Err(Error::InvalidArgument { .. }) => {}
                other => k.push(format!("bitwise all_reduce on f32 in a scope: {other:?}")),
            }
            t_all_reduce::<f32>(k, ReduceOp::Sum, 100, false)
        })
    });
    assert_clean(errs);
}

/// Same, observing the error with `wait_timeout` and then `wait`.
#[test]
fn scope_returns_after_a_failed_operation_was_polled() {
    let errs = within(Duration::from_secs(5), "scope after a failed poll", || {
        let comms = init(2, config(Kind::FIRST, TransportChoice::Auto));
        on_ranks(&comms, "failed-poll", |k| {
            let c = k.c;
            let mut v = vec![1.0f64; 16];
            let r = c.scope(|s| {
                let w = s.all_reduce_in_place(&mut v, ReduceOp::BitXor)?;
                let first = w.wait_timeout(Duration::from_secs(10));
                assert!(first.is_err(), "bitwise op on f64 must fail: {first:?}");
                w.wait()
            });
            if r.is_ok() {
                k.push("second look at a failed Work returned Ok".into());
            }
            t_all_reduce::<f64>(k, ReduceOp::Sum, 100, false)
        })
    });
    assert_clean(errs);
}

// ---------------------------------------------------------------------------
// Grouped point-to-point.

#[test]
fn group_ring_exchange() {
    let mut errs = Vec::new();
    for n in 2..=5 {
        let comms = init(n, config(Kind::FIRST, TransportChoice::Auto));
        errs.extend(on_ranks(&comms, "ring-exchange", |k| {
            let c = k.c;
            let (r, n) = (k.r, k.n);
            let next = (r + 1) % n;
            let prev = (r + n - 1) % n;
            for round in 0..6usize {
                // Lengths differ per rank; one round is large (many slots).
                let len = |q: usize| {
                    if round == 3 {
                        50_000 + q
                    } else {
                        q * 3 + round
                    }
                };
                let out: Vec<f32> = (0..len(r)).map(|i| (r * 1_000_000 + i) as f32).collect();
                let mut inc = vec![-1f32; len(prev)];
                let res = c.group(|g| {
                    g.send(&out, next);
                    g.recv(&mut inc, prev);
                });
                k.ok(&format!("ring exchange round {round}"), res)?;
                k.check("ring exchange", &inc, |i| {
                    Some((prev * 1_000_000 + i) as f32)
                });
            }
            // Blocking send / recv pairs in the other direction (even ranks
            // send first; odd ranks receive first).
            if n % 2 == 0 {
                let out = vec![r as u64; 300];
                let mut inc = vec![0u64; 300];
                if r % 2 == 0 {
                    k.ok("send", c.send(&out, prev))?;
                    k.ok("recv", c.recv(&mut inc, next))?;
                } else {
                    k.ok("recv", c.recv(&mut inc, next))?;
                    k.ok("send", c.send(&out, prev))?;
                }
                k.check("send/recv pair", &inc, |_| Some(next as u64));
            }
            t_all_reduce::<i32>(k, ReduceOp::Sum, 100, false)
        }));
    }
    assert_clean(errs);
}

/// Several sends to the same peer in one group arrive in order, whatever
/// their types and sizes (one bigger than all the slots together), while
/// another peer sends to the same receiver in the same group.
#[test]
fn group_several_sends_to_one_peer_arrive_in_order() {
    let comms = init(3, config(Kind::FIRST, TransportChoice::Auto));
    let errs = on_ranks(&comms, "p2p-order", |k| {
        let c = k.c;
        let r = k.r;
        let a: Vec<u8> = (0..5).map(|i| i as u8 + 10 * r as u8).collect();
        let b: Vec<f64> = (0..40_000).map(|i| i as f64 * 0.5).collect();
        let cc: Vec<i8> = (0..3).map(|i| -(i as i8) - 1).collect();
        let d: Vec<u32> = (0..9).map(|i| i * 3 + r as u32).collect();
        let mut ra = vec![0u8; 5];
        let mut rb = vec![0f64; 40_000];
        let mut rc = vec![0i8; 3];
        let mut rd = vec![0u32; 9];
        let mut rd2 = vec![0u32; 9];
        let mut ra2 = vec![0u8; 5];
        // Rank 0 sends a, b, c, d to rank 1 and rank 2 sends d then a to
        // rank 1, all in one group on each side.
        let res = c.group(|g| match r {
            0 => {
                g.send(&a, 1);
                g.send(&b, 1);
                g.send(&cc, 1);
                g.send(&d, 1);
            }
            1 => {
                g.recv(&mut rd2, 2);
                g.recv(&mut ra, 0);
                g.recv(&mut rb, 0);
                g.recv(&mut ra2, 2);
                g.recv(&mut rc, 0);
                g.recv(&mut rd, 0);
            }
            _ => {
                g.send(&d, 1);
                g.send(&a, 1);
            }
        });
        k.ok("group of several sends to one peer", res)?;
        if r == 1 {
            k.check("first send from 0", &ra, |i| Some(i as u8));
            k.check("second send from 0", &rb, |i| Some(b[i]));
            k.check("third send from 0", &rc, |i| Some(cc[i]));
            k.check("fourth send from 0", &rd, |i| Some(i as u32 * 3));
            k.check("first send from 2", &rd2, |i| Some(i as u32 * 3 + 2));
            k.check("second send from 2", &ra2, |i| Some(i as u8 + 20));
        }
        t_all_reduce::<f32>(k, ReduceOp::Sum, 10, false)
    });
    assert_clean(errs);
}

/// Point-to-point between some ranks only: the others do not take part, and
/// a collective on all ranks afterwards must still match up.
#[test]
fn p2p_between_a_subset_then_a_collective() {
    let errs = within(Duration::from_secs(30), "p2p subset", || {
        let mut cfg = config(Kind::FIRST, TransportChoice::Auto);
        cfg.timeout = Duration::from_secs(5);
        let comms = init(3, cfg);
        on_ranks(&comms, "p2p-subset", |k| {
            let c = k.c;
            let out = vec![7u32; 64];
            let mut inc = vec![0u32; 64];
            match k.r {
                0 => k.ok("send 0 -> 1 (rank 2 idle)", c.send(&out, 1))?,
                1 => k.ok("recv 1 <- 0 (rank 2 idle)", c.recv(&mut inc, 0))?,
                _ => {}
            }
            if k.r == 1 {
                k.check("recv 1 <- 0", &inc, |_| Some(7u32));
            }
            t_all_reduce::<f32>(k, ReduceOp::Sum, 100, false)?;
            t_broadcast::<u8>(k, 10, false)
        })
    });
    assert_clean(errs);
}

/// Zero-length receives from two peers in one group are legitimate (an
/// exchange where some counts are 0); empty slices may share an address.
#[test]
fn group_with_two_empty_receives() {
    let errs = within(Duration::from_secs(30), "empty receives", || {
        let mut cfg = config(Kind::FIRST, TransportChoice::Auto);
        cfg.timeout = Duration::from_secs(5);
        let comms = init(3, cfg);
        on_ranks(&comms, "empty-recv", |k| {
            let c = k.c;
            let r = k.r;
            let empty_out: Vec<f32> = Vec::new();
            let mut from_a: Vec<f32> = Vec::new();
            let mut from_b: Vec<f32> = Vec::new();
            let (a, b) = ((r + 1) % 3, (r + 2) % 3);
            let res = c.group(|g| {
                g.send(&empty_out, a);
                g.send(&empty_out, b);
                g.recv(&mut from_a, a);
                g.recv(&mut from_b, b);
            });
            k.ok("group of empty sends and receives", res)?;
            t_all_reduce::<f32>(k, ReduceOp::Sum, 100, false)
        })
    });
    assert_clean(errs);
}

// ---------------------------------------------------------------------------
// Invalid arguments: rejected with InvalidArgument on every rank before
// anything is sent; the communicator works afterwards.

fn expect_invalid(k: &mut Rk, what: &str, r: sncl::Result<()>, name: &str) {
    match r {
        Err(Error::InvalidArgument {
            rank,
            op,
            ref detail,
        }) => {
            if rank != k.r {
                k.push(format!("{what}: error names rank {rank}"));
            }
            if !op.contains(name) && !detail.contains(name) {
                k.push(format!(
                    "{what}: error names {op:?} ({detail}), want {name:?}"
                ));
            }
        }
        other => k.push(format!("{what}: want InvalidArgument, got {other:?}")),
    }
}

#[test]
fn invalid_arguments_are_rejected_and_the_communicator_survives() {
    let mut errs = Vec::new();
    for n in [1, 2, 3] {
        let mut cfg = config(Kind::FIRST, TransportChoice::Auto);
        cfg.timeout = Duration::from_secs(10);
        let comms = init(n, cfg);
        errs.extend(on_ranks(&comms, "invalid", |k| {
            let c = k.c;
            let n = k.n;
            let r = k.r;
            let mut f = vec![1.0f32; 6 * n];
            let mut g = vec![0.0f32; 6 * n];
            let x = vec![1u8; 4];
            let mut y = vec![0u8; 4 * n];

            // Root out of range.
            expect_invalid(k, "broadcast root", c.broadcast(&mut f, n), "broadcast");
            expect_invalid(
                k,
                "broadcast_from root",
                c.broadcast_from(&x, &mut y[..4], n + 3),
                "broadcast",
            );
            expect_invalid(
                k,
                "reduce root",
                c.reduce(&f, &mut g, ReduceOp::Sum, n),
                "reduce",
            );
            expect_invalid(
                k,
                "reduce_in_place root",
                c.reduce_in_place(&mut f, ReduceOp::Max, usize::MAX),
                "reduce",
            );
            expect_invalid(k, "gather root", c.gather(&x, &mut y, n), "gather");
            expect_invalid(k, "scatter root", c.scatter(&f, &mut g[..6], n), "scatter");
            t_all_reduce::<f32>(k, ReduceOp::Sum, 33, false)?;

            // Buffer lengths.
            expect_invalid(
                k,
                "all_reduce lengths",
                c.all_reduce(&f, &mut g[..5], ReduceOp::Sum),
                "all_reduce",
            );
            expect_invalid(
                k,
                "reduce_scatter lengths",
                c.reduce_scatter(&f[..6 * n - 1], &mut g[..6], ReduceOp::Sum),
                "reduce_scatter",
            );
            expect_invalid(
                k,
                "all_gather lengths",
                c.all_gather(&x, &mut y[..4 * n - 1]),
                "all_gather",
            );
            if n > 1 {
                expect_invalid(
                    k,
                    "reduce_scatter_in_place divisibility",
                    c.reduce_scatter_in_place(&mut f[..6 * n - 1], ReduceOp::Sum),
                    "reduce_scatter",
                );
                expect_invalid(
                    k,
                    "all_gather_in_place divisibility",
                    c.all_gather_in_place(&mut f[..6 * n - 1]),
                    "all_gather",
                );
                expect_invalid(
                    k,
                    "alltoall divisibility",
                    c.alltoall(&f[..n + 1], &mut g[..n + 1]),
                    "alltoall",
                );
            }
            expect_invalid(
                k,
                "alltoall lengths",
                c.alltoall(&f[..n], &mut g[..2 * n]),
                "alltoall",
            );
            // Each rank names itself as the root, so every rank checks the
            // root's buffer and rejects.
            expect_invalid(
                k,
                "gather root recv length",
                c.gather(&x, &mut y[..4 * n - 1], r),
                "gather",
            );
            expect_invalid(
                k,
                "scatter root send length",
                c.scatter(&f[..6 * n - 1], &mut g[..6], r),
                "scatter",
            );
            expect_invalid(
                k,
                "reduce root recv length",
                c.reduce(&f, &mut g[..1], ReduceOp::Sum, r),
                "reduce",
            );
            expect_invalid(
                k,
                "all_gatherv counts",
                c.all_gatherv(&x, &mut y, &vec![4; n + 1], &vec![0; n + 1]),
                "all_gatherv",
            );
            expect_invalid(
                k,
                "all_gatherv send length",
                c.all_gatherv(
                    &x[..3],
                    &mut y,
                    &vec![4; n],
                    &(0..n).map(|q| 4 * q).collect::<Vec<_>>(),
                ),
                "all_gatherv",
            );
            expect_invalid(
                k,
                "all_gatherv recv too small",
                c.all_gatherv(
                    &x,
                    &mut y[..4 * n - 1],
                    &vec![4; n],
                    &(0..n).map(|q| 4 * q).collect::<Vec<_>>(),
                ),
                "all_gatherv",
            );
            expect_invalid(
                k,
                "alltoallv counts",
                c.alltoallv(&x, &[1], &[0, 0, 0, 0, 0], &mut y, &vec![1; n], &vec![0; n]),
                "alltoallv",
            );
            expect_invalid(
                k,
                "alltoallv extent",
                c.alltoallv(
                    &x,
                    &vec![5; n],
                    &vec![0; n],
                    &mut y,
                    &vec![1; n],
                    &vec![0; n],
                ),
                "alltoallv",
            );
            t_all_reduce::<f32>(k, ReduceOp::Sum, 33, true)?;

            // Bitwise operators on floats.
            let hf = vec![half::f16::ONE; 4 * n];
            let mut hg = vec![half::f16::ZERO; 4];
            expect_invalid(
                k,
                "band on f32",
                c.all_reduce(&f, &mut g, ReduceOp::BitAnd),
                "all_reduce",
            );
            expect_invalid(
                k,
                "bor on f64",
                c.all_reduce_in_place(&mut [1.0f64; 3], ReduceOp::BitOr),
                "all_reduce",
            );
            expect_invalid(
                k,
                "bxor on f16",
                c.reduce_scatter(&hf, &mut hg, ReduceOp::BitXor),
                "reduce_scatter",
            );
            expect_invalid(
                k,
                "band on bf16",
                c.reduce(&[bf16::ONE; 2], &mut [bf16::ZERO; 2], ReduceOp::BitAnd, 0),
                "reduce",
            );
            t_all_reduce::<f64>(k, ReduceOp::Max, 1000, false)?;

            // Point-to-point with a bad peer.
            expect_invalid(k, "send to self", c.send(&x, r), "send");
            expect_invalid(k, "recv from out of range", c.recv(&mut y, n), "recv");
            t_all_gather::<u8>(k, 50, false)?;

            // The non-blocking forms reject at once, before queueing.
            let r1 = c.scope(|s| s.broadcast(&mut f, n).map(|_| ()));
            expect_invalid(k, "non-blocking broadcast root", r1, "broadcast");
            let r2 = c.scope(|s| s.all_reduce(&f, &mut g[..1], ReduceOp::Sum).map(|_| ()));
            expect_invalid(k, "non-blocking all_reduce lengths", r2, "all_reduce");
            let r3 = c.scope(|s| s.scatter(&f, &mut g[..6], n + 1).map(|_| ()));
            expect_invalid(k, "non-blocking scatter root", r3, "scatter");
            t_reduce::<i64>(k, ReduceOp::Sum, 500, false)?;
            k.ok("barrier", c.barrier())?;
            Ok(())
        }));
    }
    assert_clean(errs);
}

/// alltoallv whose send blocks overlap (every peer gets the same region,
/// as MPI allows) and whose counts differ per peer.
#[test]
fn alltoallv_with_shared_send_region() {
    let mut errs = Vec::new();
    for n in [2, 3, 5] {
        let comms = init(n, config(Kind::FIRST, TransportChoice::Auto));
        errs.extend(on_ranks(&comms, "alltoallv-shared", |k| {
            let c = k.c;
            let (r, n) = (k.r, k.n);
            let src: Vec<u32> = (0..100).map(|i| (r * 1000 + i) as u32).collect();
            // To peer d: the first 10 * (d + 1) elements, all starting at 0.
            let send_counts: Vec<usize> = (0..n).map(|d| 10 * (d + 1)).collect();
            let send_displs = vec![0; n];
            let recv_counts = vec![10 * (r + 1); n];
            let recv_displs: Vec<usize> = (0..n).map(|q| q * 10 * (r + 1)).collect();
            let mut recv = vec![u32::MAX; n * 10 * (r + 1)];
            k.ok(
                "alltoallv with a shared send region",
                c.alltoallv(
                    &src,
                    &send_counts,
                    &send_displs,
                    &mut recv,
                    &recv_counts,
                    &recv_displs,
                ),
            )?;
            let m = 10 * (r + 1);
            k.check("alltoallv with a shared send region", &recv, |i| {
                Some(((i / m) * 1000 + i % m) as u32)
            });
            Ok(())
        }));
    }
    assert_clean(errs);
}

/// Forcing an algorithm a collective does not have is an error (at init or
/// at the first call), on every rank alike.
#[test]
fn forced_algorithm_a_collective_lacks_is_rejected() {
    let cfg = Config {
        algo: vec![(Collective::AllToAll, Algorithm::Ring)],
        timeout: Duration::from_secs(10),
        ..Default::default()
    };
    let comms = match Communicator::init_threads(2, cfg) {
        Err(e) => {
            eprintln!("init rejected alltoall:ring: {e}");
            return;
        }
        Ok(c) => c,
    };
    let errs = on_ranks(&comms, "forced", |k| {
        let c = k.c;
        let x = [1f32; 4];
        let mut y = [0f32; 4];
        match c.alltoall(&x, &mut y) {
            Err(Error::Config(m)) if m.contains("alltoall") => {}
            other => k.push(format!("alltoall with a forced ring: {other:?}")),
        }
        t_all_reduce::<f32>(k, ReduceOp::Sum, 10, false)
    });
    assert_clean(errs);
}
