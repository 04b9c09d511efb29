//! Simulating one collective: the planner picks the algorithm and chunk,
//! the real builders make every (simulated) rank's schedule, the engine
//! runs them on the cluster model.

use comm_core::algo::{build, Algorithm, Params};
use comm_core::config::Config;
use comm_core::tune;
use comm_core::wire::Collective;

use crate::engine;
use crate::model::{Cluster, Placement};
use crate::program::Program;
use crate::{Result, SimError};

/// Which frame executes the schedules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame {
    /// Per rank up to [`PER_RANK_AUTO`] ranks, symmetric above when the
    /// algorithm allows it, else per rank up to [`PER_RANK_MAX`].
    Auto,
    /// One entity per rank.
    PerRank,
    /// One entity per local position (node-major, rings and `hier` only).
    Symmetric,
}

/// Largest job that [`Frame::Auto`] executes per rank.
pub const PER_RANK_AUTO: usize = 1024;
/// Largest job executed per rank at all.
pub const PER_RANK_MAX: usize = 8192;
/// Steps in all ranks' programs beyond which a run is refused.
pub const MAX_TOTAL_STEPS: u64 = 200_000_000;
/// Relative size difference under which steps merge in the symmetric frame.
pub const SYMMETRIC_MERGE_TOLERANCE: f64 = 0.02;
/// Steps in all simulated programs above which runs of alike steps execute
/// aggregated ([`engine::Options::aggregated`]) unless [`Request::aggregate`] says.
pub const AGGREGATE_ABOVE_STEPS: u64 = 200_000;
/// Steps in all programs above which a pipelined tree is simulated with
/// K1 and 2 K1 chunks (K1 = [`TREE_EXTRAPOLATION_CHUNKS`]) and its time,
/// bytes and waits extrapolated linearly to the real number of chunks
/// (the pipeline's period is one chunk's slowest edge, so the time is
/// linear in the chunks; tests check 1 % against the full run).
pub const EXTRAPOLATE_ABOVE_STEPS: u64 = 4_000_000;
/// K1 of the tree extrapolation.
pub const TREE_EXTRAPOLATION_CHUNKS: usize = 8;
/// Executed steps (runs, when aggregated) of all ranks up to which a
/// per-rank run records every step for its critical path.
pub const RECORD_STEPS_MAX: u64 = 20_000_000;

/// Builds and runs the programs of one collective.
struct Exec<'a> {
    cl: &'a Cluster,
    req: &'a Request,
    algo: Algorithm,
    chunk: usize,
    symmetric: bool,
    entities: usize,
}

impl Exec<'_> {
    fn err(&self, why: String) -> SimError {
        SimError::Collective {
            op: self.req.coll.name(),
            algo: self.algo.name(),
            nranks: self.cl.nranks(),
            why,
        }
    }

    fn build(&self, rank: usize, count: usize) -> Result<comm_core::schedule::Schedule> {
        let p = Params {
            nranks: self.cl.nranks(),
            rank,
            count,
            root: 0,
            chunk: self.chunk,
        };
        build(self.req.coll, self.algo, &p, &self.cl.topology())
            .ok_or_else(|| self.err("no schedule for this collective".into()))
    }

    /// Trees: the table's builder recomputes the group order (O(n)) for
    /// every rank; this calls the same builder with the order computed once,
    /// after checking that ranks 0, 1 and n−1 get the table's schedules.
    #[allow(clippy::type_complexity)]
    fn tree_builder<'b>(
        &'b self,
        topo: &comm_core::topo::Topology,
        count: usize,
    ) -> Option<Box<dyn Fn(usize) -> comm_core::schedule::Schedule + 'b>> {
        use comm_core::algo::{
            arguments_checked_first as checked, tree_all_reduce, tree_broadcast, tree_reduce,
        };
        if self.algo != Algorithm::Tree || self.entities < 2 {
            return None;
        }
        let n = self.cl.nranks();
        let chunk = self.chunk.max(1);
        let order = topo.ring_order();
        let rooted: Vec<usize> = std::iter::once(0)
            .chain(order.iter().copied().filter(|&x| x != 0))
            .collect();
        let f: Box<dyn Fn(usize) -> comm_core::schedule::Schedule + 'b> = match self.req.coll {
            Collective::AllReduce => Box::new(move |r| tree_all_reduce(n, r, &order, count, chunk)),
            Collective::Broadcast => {
                Box::new(move |r| checked(tree_broadcast(n, r, &rooted, count, chunk)))
            }
            Collective::Reduce => {
                Box::new(move |r| checked(tree_reduce(n, r, &rooted, count, chunk)))
            }
            _ => return None,
        };
        for r in [0, 1, n - 1] {
            if self.build(r, count).ok().as_ref() != Some(&f(r)) {
                tracing::debug!(
                    rank = r,
                    "sim: tree fast path differs from the table; building through it"
                );
                return None;
            }
        }
        Some(f)
    }

    /// Programs of every entity for `count` elements, then the engine.
    fn run(&self, count: usize, aggregate: bool) -> Result<engine::Outcome> {
        let progs = self.programs(count, aggregate)?;
        let executed: u64 = progs
            .iter()
            .map(|p| {
                if aggregate {
                    p.runs.len() as u64
                } else {
                    p.steps()
                }
            })
            .sum();
        let opts = engine::Options {
            symmetric: self.symmetric,
            aggregated: aggregate,
            record_steps: !self.symmetric && executed <= RECORD_STEPS_MAX,
        };
        let out = engine::execute(self.cl, &progs, opts);
        let total = || progs.iter().map(Program::steps).sum::<u64>();
        if aggregate && !out.complete && total() <= MAX_TOTAL_STEPS {
            // Entities merged their steps differently: go step by step.
            tracing::warn!(
                algo = self.algo.name(),
                "sim: aggregated runs did not match; running step by step"
            );
            let opts = engine::Options {
                aggregated: false,
                record_steps: !self.symmetric && total() <= RECORD_STEPS_MAX,
                ..opts
            };
            return Ok(engine::execute(self.cl, &progs, opts));
        }
        Ok(out)
    }

    /// Every entity's program for `count` elements.
    fn programs(&self, count: usize, aggregate: bool) -> Result<Vec<Program>> {
        let topo = self.cl.topology();
        let n = self.cl.nranks();
        let tolerance = if self.symmetric || aggregate {
            SYMMETRIC_MERGE_TOLERANCE
        } else {
            -1.0
        };
        let elem = self.req.elem.max(1);
        let mut progs = Vec::with_capacity(self.entities);
        let mut total_steps = 0u64;
        if let Some(p) = self.rotated(count, tolerance)? {
            progs = p;
        }
        let tree = self.tree_builder(&topo, count);
        if progs.is_empty() {
            if let Some(t) = &tree {
                if let Some(p) = self.tree_classes(&topo, t, elem, tolerance) {
                    total_steps = p.iter().map(Program::steps).sum();
                    progs = p;
                }
            }
        }
        for r in progs.len()..self.entities {
            let p = Params {
                nranks: n,
                rank: r,
                count,
                root: 0,
                chunk: self.chunk,
            };
            let s = match &tree {
                Some(t) => t(r),
                None => build(self.req.coll, self.algo, &p, &topo)
                    .ok_or_else(|| self.err("no schedule for this collective".into()))?,
            };
            total_steps += s.steps.len() as u64;
            progs.push(Program::from_schedule(&s, elem, tolerance));
        }
        if let Some(ratio) = self.req.inter_ratio {
            // Entity r is rank r (node 0's ranks in the symmetric frame).
            for (r, p) in progs.iter_mut().enumerate() {
                let home = self.cl.node_of(r);
                for m in p.runs.iter_mut().flat_map(|run| run.msgs.iter_mut()) {
                    if self.cl.node_of(m.peer as usize) != home {
                        m.bytes *= ratio;
                    }
                }
            }
        }
        tracing::debug!(
            entities = self.entities,
            total_steps,
            symmetric = self.symmetric,
            aggregate,
            algo = self.algo.name(),
            "sim: programs built"
        );
        Ok(progs)
    }
}

/// One simulated collective.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Request {
    /// The collective (all_reduce, reduce_scatter, all_gather, broadcast, reduce).
    pub coll: Collective,
    /// Forced algorithm; `None`: the planner's choice.
    pub algo: Option<Algorithm>,
    /// Size as nccl-tests counts it: the buffer of all_reduce / broadcast /
    /// reduce, the whole output of all_gather, the whole input of
    /// reduce_scatter.
    pub bytes: usize,
    /// Element size in bytes.
    pub elem: usize,
    /// Pipeline chunk in bytes (`SNCL_CHUNK_BYTES`).
    pub chunk_bytes: usize,
    /// Frame.
    pub frame: Frame,
    /// Whether runs of alike steps execute aggregated (one step of R × the
    /// bytes and latency); `None`: when the programs hold more than
    /// [`AGGREGATE_ABOVE_STEPS`] steps or more than [`PER_RANK_MAX`] ranks
    /// run per rank.
    pub aggregate: Option<bool>,
    /// Compression on the slow tier: every message between two nodes
    /// carries this fraction of its bytes (a codec's encoded size over the
    /// data's: 8.25 / 32 for mxfp8 of f32); `None`: 1. With the hierarchical
    /// all-reduce this is the compressed all-reduce's traffic: its
    /// cross-node phase moves encoded parts, its node phases full
    /// precision. The codec's own compute is not modelled.
    pub inter_ratio: Option<f64>,
}

impl Request {
    /// The planner's defaults: float elements, 256 KiB chunks, auto frame.
    pub fn new(coll: Collective, algo: Option<Algorithm>, bytes: usize) -> Request {
        Request {
            coll,
            algo,
            bytes,
            elem: 4,
            chunk_bytes: Config::default().chunk_bytes,
            frame: Frame::Auto,
            aggregate: None,
            inter_ratio: None,
        }
    }
}

/// What the simulator predicts for one collective.
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    /// The algorithm that ran.
    pub algo: Algorithm,
    /// Whether the symmetric frame ran.
    pub symmetric: bool,
    /// Ranks.
    pub nranks: usize,
    /// Size (nccl-tests convention).
    pub bytes: usize,
    /// Elements per rank as the collective's `count`.
    pub count: usize,
    /// Predicted time, µs (last rank done).
    pub time_us: f64,
    /// bytes / time, GB/s.
    pub algbw_gbs: f64,
    /// algbw × the collective's bus factor, GB/s.
    pub busbw_gbs: f64,
    /// Bytes sent inside nodes, all ranks.
    pub intra_bytes: f64,
    /// Bytes sent across nodes, all ranks.
    pub inter_bytes: f64,
    /// Longest wait of a rank for its peers, µs.
    pub wait_max_us: f64,
    /// Mean wait, µs.
    pub wait_mean_us: f64,
    /// Events the engine processed.
    pub events: u64,
    /// Per-rank frame: the critical path, walked back from the last rank
    /// to finish (`None` in the symmetric frame, for extrapolated trees and
    /// above [`RECORD_STEPS_MAX`] executed steps).
    pub critical: Option<crate::critical::CriticalPath>,
    /// Per rank (per local position in the symmetric frame): time spent
    /// waiting for peers, µs.
    pub wait_us: Vec<f64>,
}

impl Prediction {
    /// Share of the bytes that cross nodes.
    pub fn cross_share(&self) -> f64 {
        let t = self.intra_bytes + self.inter_bytes;
        if t > 0.0 {
            self.inter_bytes / t
        } else {
            0.0
        }
    }
}

/// nccl-tests' bus factor of a collective on `n` ranks.
pub fn bus_factor(coll: Collective, n: usize) -> f64 {
    let nf = n as f64;
    match coll {
        Collective::AllReduce => 2.0 * (nf - 1.0) / nf,
        Collective::AllGather | Collective::ReduceScatter => (nf - 1.0) / nf,
        _ => 1.0,
    }
}

/// The algorithm and chunk (elements) the planner uses for `req` on `cl`
/// (`tune::choose_reducing` with the cluster's local reduction speed; with
/// none set, what `tune::plan` gives the runtime).
pub fn planned(cl: &Cluster, req: &Request) -> Result<(Algorithm, usize, usize)> {
    let n = cl.nranks();
    let elem = req.elem.max(1);
    let count = match req.coll {
        Collective::AllGather | Collective::ReduceScatter => req.bytes / elem / n,
        _ => req.bytes / elem,
    };
    let mut cfg = Config {
        chunk_bytes: req.chunk_bytes.max(1),
        ..Config::default()
    };
    if let Some(a) = req.algo {
        cfg.algo = vec![(req.coll, a)];
    }
    let reduce = (cl.reduce_bytes_per_s > 0.0).then_some(cl.reduce_bytes_per_s / 1e6);
    let plan = tune::choose_reducing(
        req.coll,
        cfg.forced(req.coll),
        &cl.shape(),
        count * elem,
        elem,
        cfg.chunk_bytes,
        reduce,
    )?;
    Ok((plan.algo, plan.chunk_elems, count))
}

/// Simulates one collective.
pub fn simulate(cl: &Cluster, req: &Request) -> Result<Prediction> {
    simulate_cached(cl, req, &mut TreeRuns::default())
}

/// The K1- and 2 K1-chunk runs of extrapolated trees, kept between calls:
/// they depend on the cluster, the collective, the element size and the
/// chunk but not on the size, so a sweep of sizes (`commbench sim -b 4M -e
/// 1G`) runs them once. Emptied when used with another cluster.
#[derive(Default)]
pub struct TreeRuns {
    cluster: Option<Cluster>,
    runs: std::collections::HashMap<(Collective, usize, usize, usize, bool), engine::Outcome>,
}

/// [`simulate`] reusing the tree runs in `cache` (see [`TreeRuns`]); the
/// predictions are the same.
pub fn simulate_cached(cl: &Cluster, req: &Request, cache: &mut TreeRuns) -> Result<Prediction> {
    if cache.cluster.as_ref() != Some(cl) {
        cache.runs.clear();
        cache.cluster = Some(cl.clone());
    }
    simulate_with(cl, req, EXTRAPOLATE_ABOVE_STEPS, cache)
}

/// [`simulate`] with the step count above which trees are extrapolated.
fn simulate_with(
    cl: &Cluster,
    req: &Request,
    extrapolate_above: u64,
    cache: &mut TreeRuns,
) -> Result<Prediction> {
    cl.validate()?;
    let n = cl.nranks();
    let (algo, chunk, count) = planned(cl, req)?;
    let err = |why: String| SimError::Collective {
        op: req.coll.name(),
        algo: algo.name(),
        nranks: n,
        why,
    };
    let symmetric_ok = cl.placement == Placement::NodeMajor
        && cl.slowdowns.is_empty()
        && matches!(
            algo,
            Algorithm::Ring | Algorithm::FlatRing | Algorithm::Hier
        )
        && matches!(
            req.coll,
            Collective::AllReduce | Collective::AllGather | Collective::ReduceScatter
        );
    let symmetric = match req.frame {
        Frame::PerRank => false,
        Frame::Symmetric => {
            if !symmetric_ok {
                return Err(err(
                    "the symmetric frame needs node-major numbering, no slow node and a ring or hier schedule of all_reduce, all_gather or reduce_scatter".into(),
                ));
            }
            true
        }
        Frame::Auto => n > PER_RANK_AUTO && symmetric_ok,
    };
    let entities = if symmetric { cl.ranks_per_node } else { n };
    if !symmetric && n > PER_RANK_MAX && req.aggregate == Some(false) {
        return Err(err(format!(
            "step-by-step per-rank execution is limited to {PER_RANK_MAX} ranks and this schedule is not node-symmetric"
        )));
    }
    let ex = Exec {
        cl,
        req,
        algo,
        chunk,
        symmetric,
        entities,
    };
    // Rank 0's schedule tells how many steps the whole job holds.
    let schedule0 = ex.build(0, count)?;
    let steps0 = schedule0.steps.len() as u64;
    let total = steps0.saturating_mul(entities as u64);
    let aggregate = req
        .aggregate
        .unwrap_or(total > AGGREGATE_ABOVE_STEPS || entities > PER_RANK_MAX);
    // What the engine executes: steps, or runs of alike steps when aggregated.
    let (executed0, unit) = if aggregate {
        let p = Program::from_schedule(&schedule0, req.elem.max(1), SYMMETRIC_MERGE_TOLERANCE);
        (p.runs.len() as u64, "runs")
    } else {
        (steps0, "steps")
    };
    drop(schedule0);
    let executed = executed0.saturating_mul(entities as u64);
    // Pipelined trees on many ranks: simulate K1 and 2 K1 chunks, extrapolate.
    let chunk_units = count.div_ceil(chunk.max(1));
    let k1 = TREE_EXTRAPOLATION_CHUNKS;
    let out = if algo == Algorithm::Tree
        && !symmetric
        && total > extrapolate_above
        && chunk_units > 2 * k1
    {
        let mut run = |count: usize| -> Result<engine::Outcome> {
            let key = (req.coll, req.elem, chunk, count, aggregate);
            if let Some(o) = cache.runs.get(&key) {
                return Ok(o.clone());
            }
            let o = ex.run(count, aggregate)?;
            cache.runs.insert(key, o.clone());
            Ok(o)
        };
        let o1 = run(k1 * chunk)?;
        let o2 = run(2 * k1 * chunk)?;
        let x = (count as f64 / chunk as f64 - k1 as f64) / k1 as f64;
        let lin = |a: f64, b: f64| a + (b - a) * x;
        tracing::debug!(k1, x, "sim: tree extrapolated from K1 and 2 K1 chunks");
        engine::Outcome {
            time_us: lin(o1.time_us, o2.time_us),
            finish_us: o1
                .finish_us
                .iter()
                .zip(&o2.finish_us)
                .map(|(a, b)| lin(*a, *b))
                .collect(),
            wait_us: o1
                .wait_us
                .iter()
                .zip(&o2.wait_us)
                .map(|(a, b)| lin(*a, *b))
                .collect(),
            intra_bytes: lin(o1.intra_bytes, o2.intra_bytes),
            inter_bytes: lin(o1.inter_bytes, o2.inter_bytes),
            events: o1.events + o2.events,
            complete: o1.complete && o2.complete,
            steps: Vec::new(),
        }
    } else {
        if executed > MAX_TOTAL_STEPS {
            return Err(err(format!(
                "{executed0} {unit} per rank x {entities} simulated ranks exceeds {MAX_TOTAL_STEPS}"
            )));
        }
        // A large tree of a whole number of chunks up to 2 K1 is one of the
        // extrapolation's runs: share it with the cache.
        let key = (req.coll, req.elem, chunk, count, aggregate);
        let shared = algo == Algorithm::Tree
            && !symmetric
            && total > extrapolate_above / 4
            && count.is_multiple_of(chunk.max(1));
        match cache.runs.get(&key) {
            Some(o) if shared => o.clone(),
            _ => {
                let o = ex.run(count, aggregate)?;
                if shared {
                    cache.runs.insert(key, o.clone());
                }
                o
            }
        }
    };
    if !out.complete {
        return Err(err(
            "a message was never matched (schedules disagree)".into()
        ));
    }
    let algbw = if out.time_us > 0.0 {
        req.bytes as f64 / out.time_us / 1e3
    } else {
        0.0
    };
    let wait_max = out.wait_us.iter().copied().fold(0.0, f64::max);
    let wait_mean = out.wait_us.iter().sum::<f64>() / out.wait_us.len().max(1) as f64;
    Ok(Prediction {
        algo,
        symmetric,
        nranks: n,
        bytes: req.bytes,
        count,
        time_us: out.time_us,
        algbw_gbs: algbw,
        busbw_gbs: algbw * bus_factor(req.coll, n),
        intra_bytes: out.intra_bytes,
        inter_bytes: out.inter_bytes,
        wait_max_us: wait_max,
        wait_mean_us: wait_mean,
        events: out.events,
        critical: (!out.steps.is_empty())
            .then(|| crate::critical::walk(&out.steps, &out.finish_us)),
        wait_us: out.wait_us,
    })
}

mod derive;
#[cfg(test)]
use derive::alike;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod asymmetric_tests;

#[cfg(test)]
mod placement_tests;
