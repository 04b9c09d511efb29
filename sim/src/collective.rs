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

/// The algorithm and chunk (elements) the planner uses for `req` on `cl`.
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
    let plan = tune::plan(&cfg, req.coll, &cl.shape(), count * elem, elem)?;
    Ok((plan.algo, plan.chunk_elems, count))
}

/// Simulates one collective.
pub fn simulate(cl: &Cluster, req: &Request) -> Result<Prediction> {
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
                    "the symmetric frame needs node-major numbering and a ring or hier schedule of all_reduce, all_gather or reduce_scatter".into(),
                ));
            }
            true
        }
        Frame::Auto => n > PER_RANK_AUTO && symmetric_ok,
    };
    if !symmetric && n > PER_RANK_MAX {
        return Err(err(format!(
            "per-rank execution is limited to {PER_RANK_MAX} ranks and this schedule is not node-symmetric"
        )));
    }
    let topo = cl.topology();
    let entities = if symmetric { cl.ranks_per_node } else { n };
    let tolerance = if symmetric {
        SYMMETRIC_MERGE_TOLERANCE
    } else {
        -1.0
    };
    let mut progs = Vec::with_capacity(entities);
    let mut total_steps = 0u64;
    for r in 0..entities {
        let p = Params {
            nranks: n,
            rank: r,
            count,
            root: 0,
            chunk,
        };
        let s = build(req.coll, algo, &p, &topo)
            .ok_or_else(|| err("no schedule for this collective".into()))?;
        total_steps += s.steps.len() as u64;
        if r == 0 && (s.steps.len() as u64).saturating_mul(entities as u64) > MAX_TOTAL_STEPS {
            return Err(err(format!(
                "{} steps per rank x {entities} simulated ranks exceeds {MAX_TOTAL_STEPS}",
                s.steps.len()
            )));
        }
        progs.push(Program::from_schedule(&s, req.elem.max(1), tolerance));
    }
    tracing::debug!(
        entities,
        total_steps,
        symmetric,
        algo = algo.name(),
        "sim: programs built"
    );
    let out = engine::run(cl, &progs, symmetric);
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
    })
}

#[cfg(test)]
mod tests;
