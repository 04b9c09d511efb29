//! The planner: picks an algorithm and a pipeline chunk per operation from
//! the alpha-beta cost functions of the algorithm table's rows
//! ([`crate::algo::ALGORITHMS`]) over the communicator's two tiers.
//! Overrides come from [`Config::algo`] (or `force_algorithm`). Every rank
//! holds the same config (rank 0's, adopted at init), so every rank derives
//! the same plan.

use crate::algo::{self, Algorithm};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::wire::Collective;

pub use crate::cluster::{LinkCost, Shape};

/// What the planner decided for one operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The algorithm.
    pub algo: Algorithm,
    /// Pipeline chunk in elements.
    pub chunk_elems: usize,
}

/// Predicted time in µs of `algo` for `coll` moving `bytes` per rank with a
/// chunk of `chunk` bytes (the table row's cost function); `None` when the
/// collective has no such algorithm.
pub fn predict(
    coll: Collective,
    algo: Algorithm,
    sh: &Shape,
    bytes: usize,
    chunk: usize,
) -> Option<f64> {
    algo::row(coll, algo).map(|r| (r.cost)(sh, bytes, chunk))
}

/// [`predict`] plus the time local reductions add when a rank reduces
/// `reduce_bytes_per_us` ([`reduce_cost`]; `None`: reductions are free).
pub fn predict_reducing(
    coll: Collective,
    algo: Algorithm,
    sh: &Shape,
    bytes: usize,
    chunk: usize,
    reduce_bytes_per_us: Option<f64>,
) -> Option<f64> {
    let red = reduce_bytes_per_us.unwrap_or(0.0);
    predict(coll, algo, sh, bytes, chunk)
        .map(|t| t + reduce_cost(coll, algo, sh, bytes, chunk, red))
}

/// Chooses the algorithm and chunk for one operation (see [`choose`]).
pub fn plan(
    cfg: &Config,
    coll: Collective,
    sh: &Shape,
    bytes: usize,
    elem_size: usize,
) -> Result<Plan> {
    choose(
        coll,
        cfg.forced(coll),
        sh,
        bytes,
        elem_size,
        cfg.chunk_bytes,
    )
}

/// Chooses the algorithm and chunk for one operation: `forced` (the
/// algorithm forced for `coll`, if any) when the collective has it — an
/// error listing the ones it has otherwise — else the cheapest of the
/// collective's table rows that the planner may pick on `sh` (the first of
/// equals in table order; the first row when none may be picked).
pub fn choose(
    coll: Collective,
    forced: Option<Algorithm>,
    sh: &Shape,
    bytes: usize,
    elem_size: usize,
    chunk_bytes: usize,
) -> Result<Plan> {
    choose_reducing(coll, forced, sh, bytes, elem_size, chunk_bytes, None)
}

/// [`choose`] with each candidate's cost from [`predict_reducing`]: with
/// `reduce_bytes_per_us` (the topology file's `intra.reduce_bandwidth`)
/// the planner counts local reductions that the transfers cannot hide.
pub fn choose_reducing(
    coll: Collective,
    forced: Option<Algorithm>,
    sh: &Shape,
    bytes: usize,
    elem_size: usize,
    chunk_bytes: usize,
    reduce_bytes_per_us: Option<f64>,
) -> Result<Plan> {
    let red = reduce_bytes_per_us.unwrap_or(0.0);
    // The schedule's chunk; the costs below keep pricing the configured
    // one (they differ only past MAX_PIPELINE_CHUNKS chunks, where the
    // per-chunk latency no longer decides between algorithms).
    let chunk_elems = (pipeline_chunk_bytes(bytes, chunk_bytes) / elem_size.max(1)).max(1);
    if let Some(a) = forced {
        return match algo::row(coll, a) {
            Some(_) => Ok(Plan {
                algo: a,
                chunk_elems,
            }),
            None => Err(Error::Config(algo::unavailable(coll, a))),
        };
    }
    let mut first = None;
    let mut best: Option<(f64, Algorithm)> = None;
    for row in algo::rows(coll) {
        first.get_or_insert(row.algo);
        if !row.eligible(sh) {
            continue;
        }
        let t = (row.cost)(sh, bytes, chunk_bytes)
            + reduce_cost(coll, row.algo, sh, bytes, chunk_bytes, red);
        if best.map(|(bt, _)| t < bt).unwrap_or(true) {
            best = Some((t, row.algo));
        }
    }
    let algo = best.map(|(_, a)| a).or(first).ok_or_else(|| {
        Error::Config(format!(
            "{} has no algorithm in the table (comm_core::algo::ALGORITHMS)",
            coll.name()
        ))
    })?;
    Ok(Plan { algo, chunk_elems })
}

/// Pieces an operation's buffer is cut into for pipelining, at most: a
/// schedule's steps (and its memory) grow with the pieces, so a larger
/// operation gets larger pieces instead of more of them. Thousands of
/// pieces pipeline as well as millions.
pub const MAX_PIPELINE_CHUNKS: usize = 4096;

/// The pipeline chunk of an operation of `bytes`: `chunk_bytes`
/// (`SNCL_CHUNK_BYTES`), grown so that the buffer makes at most
/// [`MAX_PIPELINE_CHUNKS`] chunks.
pub fn pipeline_chunk_bytes(bytes: usize, chunk_bytes: usize) -> usize {
    chunk_bytes.max(bytes.div_ceil(MAX_PIPELINE_CHUNKS))
}

/// Time in µs that local reductions add to `algo`'s cost for `coll`
/// (`bytes`, `chunk` as for the cost functions) when a rank reduces
/// `reduce_bytes_per_us`: a received piece is reduced as it arrives, so a
/// reducing step takes `max(transfer, reduced bytes / speed)` after its
/// latency, and this is the sum over the reducing steps on the critical
/// path of `max(0, reduced / speed − transfer)`, plus `rd`'s local copies
/// of the whole vector at the same speed. Zero for collectives that
/// do not reduce, and for a speed that is not positive and finite. The
/// simulator (`sim` crate) charges the same.
pub fn reduce_cost(
    coll: Collective,
    algo: Algorithm,
    sh: &Shape,
    bytes: usize,
    chunk: usize,
    reduce_bytes_per_us: f64,
) -> f64 {
    use Algorithm::{FlatRing, Hier, Rd, Ring, Tree};
    use Collective::{AllReduce, Reduce, ReduceScatter};
    if !(reduce_bytes_per_us.is_finite() && reduce_bytes_per_us > 0.0) {
        return 0.0;
    }
    let b = bytes as f64;
    let nf = sh.nranks as f64;
    let (nn, ll) = (sh.nnodes as f64, sh.max_local as f64);
    let l = algo::ceil_log2(sh.nranks) as f64;
    let k = (bytes.div_ceil(chunk.max(1))).max(1) as f64;
    let link = sh.slowest();
    // Beyond the transfer of `moved` bytes on `bw`, reducing `reduced`.
    let over =
        |reduced: f64, moved: f64, bw: f64| (reduced / reduce_bytes_per_us - moved / bw).max(0.0);
    // Hierarchical reduce-scatter phases: intra ring steps reduce what they
    // move; a cross-node step moves the node's b / nn, a rank reduces its
    // shard's b / (ll nn).
    let hier_rs = (ll - 1.0) * over(b / ll, b / ll, sh.intra.bytes_per_us)
        + (nn - 1.0) * over(b / (ll * nn), b / nn, sh.inter.bytes_per_us);
    match (coll, algo) {
        (AllReduce | ReduceScatter, Ring | FlatRing) => {
            (nf - 1.0) * over(b / nf, b / nf, link.bytes_per_us)
        }
        (AllReduce | ReduceScatter, Hier) => hier_rs,
        // log2 exchanges, plus the fold of a non-power-of-two count: l
        // steps; and a local copy of all of S, the last partial sum back
        // from scratch, after an odd number of exchanges
        // (`algo::rd_all_reduce`).
        (AllReduce, Rd) => {
            let exchanges = if sh.nranks == 0 {
                0
            } else {
                usize::BITS - 1 - sh.nranks.leading_zeros()
            };
            let copies = f64::from(exchanges % 2);
            l * over(b, b, link.bytes_per_us) + copies * b / reduce_bytes_per_us
        }
        (AllReduce | Reduce, Tree) => {
            let m = l.min(k).max(1.0) * b / k;
            (l + k - 1.0) * over(m, m, link.bytes_per_us)
        }
        (Reduce, Ring) => (nf + k - 2.0) * over(b / k, b / k, link.bytes_per_us),
        (Reduce, Hier) => {
            let li = algo::ceil_log2(sh.nnodes) as f64;
            let la = algo::ceil_log2(sh.max_local) as f64;
            let (mi, ma) = (li.min(k).max(1.0) * b / k, la.min(k).max(1.0) * b / k);
            (li + k - 1.0) * over(mi, mi, sh.inter.bytes_per_us)
                + (la + k - 1.0) * over(ma, ma, sh.intra.bytes_per_us)
        }
        _ => 0.0,
    }
}

/// The direct all-reduce kernels over registered device memory (nvlink
/// version 2) that the planner chooses between by size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirectKind {
    /// Every rank reads every input whole: 2 flag rounds, (n + 1) S bytes
    /// of traffic per rank.
    OneShot,
    /// Reduce-scatter then all-gather through the peers' buffers: 3 flag
    /// rounds, S (1 + 1/n + 2 (n - 1)/n) bytes per rank.
    TwoShot,
    /// One-shot with data and flag in one 8-byte store (NCCL's LL; the
    /// kernel path's lane only): 1 round (the data lines themselves), but
    /// every byte travels with a flag: (2n + 1) S bytes per rank.
    LowLatency,
}

/// A flag round of the direct kernels (a system-scope store seen by a
/// peer's polling block), µs: a few NVLink round trips.
pub const DIRECT_ROUND_US: f64 = 3.0;

/// Predicted µs of a direct all-reduce of `bytes` on `nranks` ranks whose
/// memory moves at `link.bytes_per_us` per rank (the device tier's intra
/// link; its alpha is the staged path's and not used here).
pub fn predict_direct(kind: DirectKind, bytes: usize, nranks: usize, link: LinkCost) -> f64 {
    let (s, n) = (bytes as f64, nranks.max(1) as f64);
    let (rounds, traffic) = match kind {
        DirectKind::OneShot => (2.0, (n + 1.0) * s),
        DirectKind::TwoShot => (3.0, s * (1.0 + 1.0 / n + 2.0 * (n - 1.0) / n)),
        DirectKind::LowLatency => (1.0, (2.0 * n + 1.0) * s),
    };
    rounds * DIRECT_ROUND_US + traffic / link.bytes_per_us.max(1e-9)
}

/// The cheaper direct all-reduce for `bytes` on `nranks` (one-shot for
/// small messages, two-shot above the crossover: about 600 KB on 2 ranks
/// at NVLink's 100 GB/s). Every rank computes the same.
pub fn choose_direct(bytes: usize, nranks: usize, link: LinkCost) -> DirectKind {
    let one = predict_direct(DirectKind::OneShot, bytes, nranks, link);
    let two = predict_direct(DirectKind::TwoShot, bytes, nranks, link);
    if one <= two {
        DirectKind::OneShot
    } else {
        DirectKind::TwoShot
    }
}

/// The cheapest kernel for an all-reduce of `bytes` on `nranks` through
/// the kernel path's lane: [`choose_direct`]'s, or the low-latency
/// protocol where `ll_fits` (every block's flagged lines fit its slot of
/// the LL region) and it is predicted cheaper (below about 100 KB on 2
/// ranks at NVLink's 100 GB/s). Every rank computes the same.
pub fn choose_lane(bytes: usize, nranks: usize, link: LinkCost, ll_fits: bool) -> DirectKind {
    let kind = choose_direct(bytes, nranks, link);
    let ll = predict_direct(DirectKind::LowLatency, bytes, nranks, link);
    if ll_fits && ll < predict_direct(kind, bytes, nranks, link) {
        DirectKind::LowLatency
    } else {
        kind
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lane_takes_ll_for_small_messages_where_it_fits() {
        let nv = crate::topo::NVLINK;
        assert_eq!(choose_lane(8, 2, nv, true), DirectKind::LowLatency);
        assert_eq!(choose_lane(32 << 10, 2, nv, true), DirectKind::LowLatency);
        assert_eq!(choose_lane(32 << 10, 2, nv, false), DirectKind::OneShot);
        assert_eq!(choose_lane(1 << 20, 2, nv, true), DirectKind::TwoShot);
        // LL's flags double its traffic: one-shot wins from about a
        // round's worth of bytes, sooner with more ranks.
        let cross = |n| {
            (3..24)
                .map(|k| 1usize << k)
                .find(|&b| choose_lane(b, n, nv, true) != DirectKind::LowLatency)
                .expect("a crossover")
        };
        assert!(cross(8) < cross(2), "{} {}", cross(8), cross(2));
        assert!((64 << 10..=256 << 10).contains(&cross(2)), "{}", cross(2));
    }

    #[test]
    fn direct_kinds_cross_over_by_size() {
        let nv = crate::topo::NVLINK;
        assert_eq!(choose_direct(8 << 10, 2, nv), DirectKind::OneShot);
        assert_eq!(choose_direct(256 << 10, 2, nv), DirectKind::OneShot);
        assert_eq!(choose_direct(4 << 20, 2, nv), DirectKind::TwoShot);
        assert_eq!(choose_direct(256 << 20, 2, nv), DirectKind::TwoShot);
        // More ranks: one-shot reads more, so two-shot wins sooner.
        let cross = |n| {
            (10..30)
                .map(|k| 1usize << k)
                .find(|&b| choose_direct(b, n, nv) == DirectKind::TwoShot)
                .expect("a crossover")
        };
        assert!(cross(4) < cross(2), "{} {}", cross(4), cross(2));
        // 2 ranks at 256 MiB: two-shot moves 2.5 S, one-shot 3 S (docs/perf-notes/NOTEBOOK.md §14).
        let s = 256usize << 20;
        let ratio = predict_direct(DirectKind::OneShot, s, 2, nv)
            / predict_direct(DirectKind::TwoShot, s, 2, nv);
        assert!((ratio - 1.2).abs() < 0.01, "{ratio}");
    }

    #[test]
    fn small_messages_use_rd_large_use_ring() {
        let c = Config::default();
        let p = plan(
            &c,
            Collective::AllReduce,
            &Shape::flat(2, LinkCost::SHM),
            8,
            4,
        )
        .unwrap();
        assert_eq!(p.algo, Algorithm::Rd);
        let p = plan(
            &c,
            Collective::AllReduce,
            &Shape::flat(8, LinkCost::SHM),
            64 << 20,
            4,
        )
        .unwrap();
        assert_eq!(p.algo, Algorithm::Ring);
        let p = plan(
            &c,
            Collective::Broadcast,
            &Shape::flat(8, LinkCost::TCP),
            64 << 20,
            4,
        )
        .unwrap();
        assert_eq!(p.algo, Algorithm::Ring);
        let p = plan(
            &c,
            Collective::Broadcast,
            &Shape::flat(8, LinkCost::TCP),
            64,
            4,
        )
        .unwrap();
        assert_eq!(p.algo, Algorithm::Tree);
    }

    /// Issue 15, point 4 (docs/perf-notes/NOTEBOOK.md §15): on 2 ranks rd was chosen at
    /// every size while the ring was 1.8–2.5× faster from 512 KiB; issue 35
    /// item 2 (§28): up to 256 KiB rd's exchange overlaps its directions
    /// and rd was as fast or faster (tcp 32 KiB: 1.3–1.6×), where the
    /// planner had taken the ring.
    #[test]
    fn two_ranks_pick_rd_while_the_exchange_overlaps_and_the_ring_beyond() {
        let c = Config::default();
        for link in [LinkCost::SHM, LinkCost::TCP] {
            let sh = Shape::flat(2, link);
            for bytes in [512 << 10, 2 << 20, 16 << 20, 64 << 20] {
                let p = plan(&c, Collective::AllReduce, &sh, bytes, 4).unwrap();
                assert_eq!(p.algo, Algorithm::Ring, "{link:?} {bytes} B");
            }
            for bytes in [8, 64, 512, 32 << 10, 256 << 10] {
                let p = plan(&c, Collective::AllReduce, &sh, bytes, 4).unwrap();
                assert_eq!(p.algo, Algorithm::Rd, "{link:?} {bytes} B");
            }
        }
    }

    #[test]
    fn two_tiers_pick_hier_for_large_all_reduce() {
        let c = Config::default();
        let sh = Shape {
            nranks: 8,
            nnodes: 4,
            max_local: 2,
            intra: LinkCost::SHM,
            inter: LinkCost {
                alpha_us: 50.0,
                bytes_per_us: 120.0,
            },
        };
        let p = plan(&c, Collective::AllReduce, &sh, 64 << 20, 4).unwrap();
        assert_eq!(p.algo, Algorithm::Hier);
        let p = plan(&c, Collective::AllReduce, &sh, 8, 4).unwrap();
        assert_eq!(p.algo, Algorithm::Rd);
    }

    #[test]
    fn override_wins() {
        let c = Config {
            algo: vec![(Collective::AllReduce, Algorithm::Tree)],
            ..Default::default()
        };
        let p = plan(
            &c,
            Collective::AllReduce,
            &Shape::flat(4, LinkCost::SHM),
            1 << 20,
            4,
        )
        .unwrap();
        assert_eq!(p.algo, Algorithm::Tree);
    }
}
