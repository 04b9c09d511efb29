//! Ranks as processes, over shared memory and over TCP: pairwise-covering
//! sets of (collective, data type, operator, rank count, count, algorithm
//! set) — every pair of values of any two of these factors that makes sense
//! together appears in at least one case — each run over both transports
//! (two sets drawn with different seeds, for variety).
//!
//! The test re-executes its own binary (`--exact child_rank`) once per rank
//! with `SNCL_RANK` / `SNCL_WORLD_SIZE` / `SNCL_ROOT` set; the child joins
//! with [`sncl::Communicator::from_env`], runs its job's cases in order,
//! checks every result independently and exits non-zero on any failure.

mod rank_kit;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use comm_core::algo::Algorithm;
use rank_kit::*;
use sncl::{Collective, Communicator, ReduceOp};

const CASES_ENV: &str = "SNCL_TEST_CASES";

/// Child side: does nothing unless started by the parent below.
#[test]
#[ignore = "a child process's entry point, run by its parent test"]
fn child_rank() {
    if !is_child() {
        return;
    }
    let cfg = child_config();
    let c = Communicator::from_env().unwrap_or_else(|e| panic!("init failed: {e}"));
    let tcp = std::env::var("SNCL_TRANSPORT").as_deref() == Ok("tcp");
    let r = c.rank();
    let node = std::env::var("SNCL_NODE_ID").expect("SNCL_NODE_ID");
    assert_eq!(c.node_ids()[r], node);
    for (p, t) in c.transports().iter().enumerate() {
        let w = if p == r {
            "self"
        } else if tcp || c.node_ids()[p] != node {
            "tcp"
        } else {
            "shm"
        };
        assert_eq!(
            *t,
            w,
            "rank {r} transport to {p} (nodes {:?})",
            c.node_ids()
        );
    }
    assert_eq!(c.config().chunk_bytes, cfg.chunk_bytes);
    let cases = std::env::var(CASES_ENV).expect("cases");
    let mut k = Rk::new(&c, "proc");
    let mut done = 0;
    for case in cases.split(';').filter(|s| !s.is_empty()) {
        let f: Vec<&str> = case.split('/').collect();
        let op = ReduceOp::from_name(f[2]).expect("op");
        let count: usize = f[3].parse().expect("count");
        if run_case(&mut k, f[0], f[1], op, count).is_err() {
            break;
        }
        done += 1;
    }
    // End in step: nobody leaves while a peer still needs it.
    if k.errs.is_empty() {
        if let Err(e) = c.barrier() {
            k.errs.push(format!("final barrier: {e}"));
        }
    }
    if !k.errs.is_empty() {
        panic!(
            "rank {} failed after {done} case(s):\n{}",
            c.rank(),
            k.errs.join("\n")
        );
    }
    println!("rank {} ran {done} case(s)", c.rank());
}

// ---------------------------------------------------------------------------
// The covering set.

const NRANKS: [usize; 3] = [2, 3, 4];
const COUNTS: [usize; 5] = [0, 1, 7, 5003, 100_003];
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

/// Algorithm sets as `SNCL_ALGO` values: set `i` forces the `i`-th entry of
/// `Algorithm::available` for every collective that has one.
fn algo_sets() -> Vec<String> {
    let most = PLANNED
        .iter()
        .map(|c| Algorithm::available(*c).len())
        .max()
        .unwrap_or(1);
    (0..most)
        .map(|i| {
            let v: Vec<String> = PLANNED
                .iter()
                .filter_map(|c| {
                    Algorithm::available(*c)
                        .get(i)
                        .map(|a| format!("{}:{}", c.name(), a.name()))
                })
                .collect();
            v.join(";")
        })
        .collect()
}

const F_COLL: usize = 0;
const F_DTYPE: usize = 1;
const F_OP: usize = 2;
const F_N: usize = 3;
const F_COUNT: usize = 4;
const F_ALGO: usize = 5;
const F_NODES: usize = 6;
const FACTORS: usize = 7;
/// Ranks spread over this many (simulated, via `SNCL_NODE_ID`) nodes:
/// shared memory within a node, TCP across.
const NODES: [usize; 2] = [1, 2];
fn sizes() -> [usize; FACTORS] {
    [
        COLLS.len(),
        DTYPES.len(),
        8,
        NRANKS.len(),
        COUNTS.len(),
        algo_sets().len(),
        NODES.len(),
    ]
}
const SEEDS: [u64; 2] = [0x5EED, 0xC0FFEE];

type Row = [usize; FACTORS];

fn op_of(i: usize) -> ReduceOp {
    ReduceOp::ALL[i]
}

/// Whether factor `f` matters for a row (the operator only for reductions;
/// type and count not for a barrier).
fn relevant(row: &Row, f: usize) -> bool {
    let coll = COLLS[row[F_COLL]];
    match f {
        F_OP => is_reducing(coll),
        F_DTYPE | F_COUNT => coll != "barrier",
        _ => true,
    }
}

/// Bitwise operators only on integer types (for reductions).
fn valid(row: &Row) -> bool {
    !is_reducing(COLLS[row[F_COLL]]) || is_int(DTYPES[row[F_DTYPE]]) || !bitwise(row[F_OP])
}

fn bitwise(op: usize) -> bool {
    matches!(
        op_of(op),
        ReduceOp::BitAnd | ReduceOp::BitOr | ReduceOp::BitXor
    )
}

fn pairs(row: &Row) -> Vec<(usize, usize, usize, usize)> {
    let mut v = Vec::new();
    for a in 0..FACTORS {
        if !relevant(row, a) {
            continue;
        }
        for b in a + 1..FACTORS {
            if relevant(row, b) {
                v.push((a, row[a], b, row[b]));
            }
        }
    }
    v
}

struct Lcg(u64);
impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

/// Greedy pairwise covering array (deterministic).
fn covering_rows(seed: u64) -> Vec<Row> {
    let mut required: HashSet<(usize, usize, usize, usize)> = HashSet::new();
    let mut row = [0usize; FACTORS];
    let sizes = sizes();
    let total: usize = sizes.iter().product();
    for mut idx in 0..total {
        for f in 0..FACTORS {
            row[f] = idx % sizes[f];
            idx /= sizes[f];
        }
        if valid(&row) {
            required.extend(pairs(&row));
        }
    }
    let mut uncovered: Vec<_> = required.into_iter().collect();
    uncovered.sort_unstable();
    let mut uncovered: HashSet<_> = uncovered.into_iter().collect();
    let mut rng = Lcg(seed);
    let mut rows = Vec::new();
    while !uncovered.is_empty() {
        let target = *uncovered.iter().min().expect("non-empty");
        let mut best: Option<(usize, Row)> = None;
        for _ in 0..60 {
            let mut cand = [0usize; FACTORS];
            for f in 0..FACTORS {
                cand[f] = rng.below(sizes[f]);
            }
            cand[target.0] = target.1;
            cand[target.2] = target.3;
            if !valid(&cand) {
                continue;
            }
            let gain = pairs(&cand)
                .iter()
                .filter(|p| uncovered.contains(p))
                .count();
            let better = match best {
                Some((g, _)) => gain > g,
                None => true,
            };
            if gain > 0 && better {
                best = Some((gain, cand));
            }
        }
        let Some((_, r)) = best else {
            // The target pair may need values the random draws missed; it
            // is realizable (it came from a valid row), so keep drawing.
            continue;
        };
        for p in pairs(&r) {
            uncovered.remove(&p);
        }
        rows.push(r);
    }
    rows
}

/// Environment of algorithm set `i`. Set 0: small chunks, slots and TCP
/// pieces; set 1: the same with one socket per peer and the fewest slots
/// (constant back-pressure); later sets: default sizes, three sockets.
fn algo_env(i: usize) -> Vec<(&'static str, String)> {
    let mut v = vec![("SNCL_ALGO", algo_sets()[i].clone())];
    if i <= 1 {
        v.push(("SNCL_CHUNK_BYTES", "4096".to_string()));
        v.push(("SNCL_SHM_SLOT_BYTES", "4096".to_string()));
        v.push(("SNCL_TCP_PIECE_BYTES", "4096".to_string()));
    }
    match i {
        0 => {}
        1 => {
            v.push(("SNCL_NSOCKS", "1".to_string()));
            v.push(("SNCL_SHM_SLOTS", "2".to_string()));
        }
        _ => v.push(("SNCL_NSOCKS", "3".to_string())),
    }
    v
}

fn run_groups(transport: &str) {
    let t0 = Instant::now();
    let rows: Vec<Row> = SEEDS.iter().flat_map(|&s| covering_rows(s)).collect();
    let mut groups: Vec<((usize, usize, usize), Vec<String>)> = Vec::new();
    for r in &rows {
        let key = (r[F_N], r[F_ALGO], r[F_NODES]);
        let coll = COLLS[r[F_COLL]];
        let case = format!(
            "{coll}/{}/{}/{}",
            DTYPES[r[F_DTYPE]],
            op_of(r[F_OP]).name(),
            COUNTS[r[F_COUNT]]
        );
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(case),
            None => groups.push((key, vec![case])),
        }
    }
    eprintln!("{transport}: {} cases in {} jobs", rows.len(), groups.len());
    let mut failures = Vec::new();
    for ((ni, ai, nodes), cases) in &groups {
        let n = NRANKS[*ni];
        let nodes = NODES[*nodes];
        let mut env = algo_env(*ai);
        let algo = algo_sets()[*ai].clone();
        env.push(("SNCL_TIMEOUT_MS", "30000".to_string()));
        let choice = if transport == "tcp" { "tcp" } else { "auto" };
        env.push(("SNCL_TRANSPORT", choice.to_string()));
        env.push((CASES_ENV, cases.join(";")));
        let started = Instant::now();
        let node_of = move |r: usize| vec![("SNCL_NODE_ID", format!("pnode-{}", r * nodes / n))];
        let mut ranks = spawn_job_per_rank("child_rank", n, &env, &node_of);
        let clean = wait_all(&mut ranks, Instant::now() + Duration::from_secs(90));
        for r in &mut ranks {
            let (ok, status) = match r.exit {
                Some((st, _)) => (st.success(), format!("{st}")),
                None => (false, "killed after 90 s (hung)".to_string()),
            };
            // A child that ran nothing (say, a test filter that matched
            // nothing) must not pass.
            let ran = format!("rank {} ran {} case(s)", r.rank, cases.len());
            let ok = ok && r.text().contains(&ran);
            if !ok || !clean {
                let text = tail(&r.text(), 15);
                failures.push(format!(
                    "{transport} n={n} nodes={nodes} algo={algo} rank {}: {status}; cases {cases:?}\n{text}",
                    r.rank
                ));
            }
        }
        eprintln!(
            "  n={n} nodes={nodes} algorithm set {ai}: {} cases in {:?}",
            cases.len(),
            started.elapsed()
        );
    }
    eprintln!("{transport}: all jobs in {:?}", t0.elapsed());
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn covering_set_is_pairwise_complete() {
    if is_child() {
        return;
    }
    let rows = covering_rows(SEEDS[0]);
    let mut seen = HashSet::new();
    for r in &rows {
        assert!(valid(r));
        seen.extend(pairs(r));
    }
    // Every collective, type, operator, rank count, count, transport and
    // algorithm set appears.
    for f in 0..FACTORS {
        for v in 0..sizes()[f] {
            assert!(rows.iter().any(|r| r[f] == v), "factor {f} value {v}");
        }
    }
    // Bitwise operators with every integer type, through a reduction.
    for (d, name) in DTYPES.iter().enumerate() {
        for op in 0..8 {
            let want = is_int(name) || !bitwise(op);
            let got = rows
                .iter()
                .any(|r| is_reducing(COLLS[r[F_COLL]]) && r[F_DTYPE] == d && r[F_OP] == op);
            assert_eq!(got, want, "{name} {:?}", op_of(op));
        }
    }
    eprintln!("{} rows cover {} pairs", rows.len(), seen.len());
}

#[test]
fn processes_over_shm() {
    if is_child() {
        return;
    }
    run_groups("shm");
}

#[test]
fn processes_over_tcp() {
    if is_child() {
        return;
    }
    run_groups("tcp");
}
