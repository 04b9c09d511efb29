//! Training-step communication cost: bytes per parallel dimension and tier,
//! predicted time (from the simulator), exposed time under stated overlap
//! rules, utilisation and the cost of the waiting. Formulas and sources in
//! docs/COST.md (Megatron-LM: Shoeybi et al. 2019, Narayanan et al. 2021,
//! Korthikanti et al. 2022; ZeRO: Rajbhandari et al. 2020).

use comm_core::algo::Algorithm;
use comm_core::wire::Collective;

use crate::collective::{simulate, Request};
use crate::model::{Cluster, Nic};
use crate::{Result, SimError};

/// A parallel dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dim {
    /// Data parallel.
    Dp,
    /// Tensor parallel.
    Tp,
    /// Pipeline parallel.
    Pp,
    /// Expert parallel.
    Ep,
}

impl Dim {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Dim::Dp => "dp",
            Dim::Tp => "tp",
            Dim::Pp => "pp",
            Dim::Ep => "ep",
        }
    }

    /// Parses a name.
    pub fn from_name(s: &str) -> Option<Dim> {
        match s {
            "dp" => Some(Dim::Dp),
            "tp" => Some(Dim::Tp),
            "pp" => Some(Dim::Pp),
            "ep" => Some(Dim::Ep),
            _ => None,
        }
    }
}

/// A training configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Training {
    /// Parameters.
    pub params: f64,
    /// Transformer layers.
    pub layers: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Sequence length.
    pub seq: usize,
    /// Micro-batch (sequences).
    pub micro_batch: usize,
    /// Global batch (sequences).
    pub global_batch: usize,
    /// Bytes per gradient element.
    pub grad_bytes: usize,
    /// Bytes per activation element.
    pub act_bytes: usize,
    /// Degrees.
    pub dp: usize,
    /// Tensor parallel degree.
    pub tp: usize,
    /// Pipeline stages.
    pub pp: usize,
    /// Expert parallel degree (1: dense model).
    pub ep: usize,
    /// Experts per MoE layer.
    pub experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Capacity factor.
    pub capacity_factor: f64,
    /// Megatron sequence parallelism.
    pub sequence_parallel: bool,
    /// Full activation recomputation.
    pub recompute: bool,
    /// ZeRO / FSDP stage 0..=3.
    pub zero: u8,
    /// Compute time of one global step without communication, ms.
    pub step_compute_ms: f64,
    /// Price per accelerator-hour.
    pub price_per_hour: f64,
    /// Global steps of the whole run.
    pub steps: f64,
    /// DP gradient bucket (bytes): the last one is exposed.
    pub dp_bucket_bytes: f64,
    /// Overrides: fraction of a dimension's time hidden behind compute.
    pub overlap: Vec<(Dim, f64)>,
    /// The DP gradient all-reduce compressed on the slow tier (sncl's
    /// compressed all-reduce, ZeRO 0 only): the share of its bytes a
    /// message between nodes keeps (a codec's encoded size over the
    /// gradients'; `commbench plan --compress`); `None`: uncompressed.
    pub dp_compress: Option<f64>,
}

/// Where a dimension lies: innermost-first order and which tier it is meant for.
#[derive(Clone, Debug, PartialEq)]
pub struct Mapping {
    /// (dimension, meant to stay inside a node), innermost first.
    pub order: Vec<(Dim, bool)>,
}

impl Mapping {
    /// Parses `tp:intra,pp:inter,dp:inter`. Dimensions mapped `intra` are
    /// laid out innermost (in the order given), then `inter` ones; missing
    /// dimensions go outermost in the order tp, ep, pp, dp.
    pub fn parse(s: &str) -> Result<Mapping> {
        let mut intra = Vec::new();
        let mut inter = Vec::new();
        for part in s.split(',').filter(|p| !p.trim().is_empty()) {
            let (d, t) = part.trim().split_once(':').ok_or_else(|| {
                SimError::Config(format!("--map {part:?}: expected DIM:intra or DIM:inter"))
            })?;
            let d = Dim::from_name(d.trim()).ok_or_else(|| {
                SimError::Config(format!("--map: unknown dimension {d:?} (dp, tp, pp, ep)"))
            })?;
            if intra.contains(&d) || inter.contains(&d) {
                return Err(SimError::Config(format!("--map: {} given twice", d.name())));
            }
            match t.trim() {
                "intra" => intra.push(d),
                "inter" => inter.push(d),
                x => {
                    return Err(SimError::Config(format!(
                        "--map {part:?}: tier {x:?} is not intra or inter"
                    )))
                }
            }
        }
        for d in [Dim::Tp, Dim::Ep, Dim::Pp, Dim::Dp] {
            if !intra.contains(&d) && !inter.contains(&d) {
                inter.push(d);
            }
        }
        let order = intra
            .into_iter()
            .map(|d| (d, true))
            .chain(inter.into_iter().map(|d| (d, false)))
            .collect();
        Ok(Mapping { order })
    }

    /// The text form.
    pub fn text(&self) -> String {
        self.order
            .iter()
            .map(|(d, i)| format!("{}:{}", d.name(), if *i { "intra" } else { "inter" }))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// The communication of one dimension per global step.
#[derive(Clone, Debug, PartialEq)]
pub struct DimCost {
    /// The dimension.
    pub dim: Dim,
    /// Degree.
    pub degree: usize,
    /// Members of one group on one node.
    pub per_node: usize,
    /// Nodes one group spans.
    pub nodes: usize,
    /// What it runs (e.g. "all_reduce").
    pub collective: String,
    /// Operations per global step.
    pub ops: f64,
    /// Bytes of one operation's buffer (nccl-tests size).
    pub op_bytes: f64,
    /// Bytes each rank sends per global step, all tiers.
    pub bytes_per_rank: f64,
    /// Of those, inside nodes.
    pub intra_bytes: f64,
    /// Of those, across nodes.
    pub inter_bytes: f64,
    /// Predicted communication time per global step, ms.
    pub time_ms: f64,
    /// Exposed (not overlapped) part, ms.
    pub exposed_ms: f64,
    /// The overlap rule applied.
    pub rule: String,
    /// Algorithm simulated: the planner's choice, or with `*` a faster one
    /// that `SNCL_ALGO` would have to force.
    pub algo: String,
}

/// The whole report.
#[derive(Clone, Debug, PartialEq)]
pub struct StepCost {
    /// The mapping.
    pub mapping: String,
    /// Per dimension (degree > 1).
    pub dims: Vec<DimCost>,
    /// Micro-batches per global step per pipeline (gradient accumulation).
    pub micro_batches: usize,
    /// Compute per step, ms.
    pub compute_ms: f64,
    /// Pipeline bubble, ms (exposed, counted in `exposed_ms`).
    pub bubble_ms: f64,
    /// Exposed communication + bubble, ms.
    pub exposed_ms: f64,
    /// compute / (compute + exposed).
    pub utilisation: f64,
    /// Share of all bytes sent that cross nodes.
    pub cross_domain_share: f64,
    /// Cost of the exposed time per step (all accelerators).
    pub waiting_cost_per_step: f64,
    /// Same for the whole run.
    pub waiting_cost_per_run: f64,
}

impl Training {
    fn check(&self, cl: &Cluster) -> Result<usize> {
        let bad = |m: String| Err(SimError::Config(m));
        if [
            self.dp,
            self.tp,
            self.pp,
            self.ep,
            self.layers,
            self.hidden,
            self.seq,
        ]
        .contains(&0)
            || self.micro_batch == 0
        {
            return bad("degrees, layers, hidden, seq and micro-batch must be >= 1".into());
        }
        if !(self.params.is_finite() && self.params > 0.0) {
            return bad(format!("--params {} must be > 0", self.params));
        }
        let world = self.dp * self.tp * self.pp;
        if world != cl.nranks() {
            return bad(format!(
                "dp {} x tp {} x pp {} = {world} ranks, but the cluster has {} x {} = {}",
                self.dp,
                self.tp,
                self.pp,
                cl.nodes,
                cl.ranks_per_node,
                cl.nranks()
            ));
        }
        if let Some(ratio) = self.dp_compress {
            if self.zero != 0 {
                return bad(format!(
                    "a compressed DP all-reduce needs ZeRO 0 (ZeRO {} reduce-scatters and gathers, \
                     which sncl does not compress)",
                    self.zero
                ));
            }
            if !(ratio.is_finite() && ratio > 0.0 && ratio <= 1.0) {
                return bad(format!("a compression ratio of {ratio} is not in (0, 1]"));
            }
        }
        if self.ep > 1
            && (!self.dp.is_multiple_of(self.ep) || !self.experts.is_multiple_of(self.ep))
        {
            return bad(format!(
                "ep {} must divide dp {} and the expert count {}",
                self.ep, self.dp, self.experts
            ));
        }
        if !self.layers.is_multiple_of(self.pp) {
            return bad(format!("pp {} must divide layers {}", self.pp, self.layers));
        }
        if !self.global_batch.is_multiple_of(self.micro_batch * self.dp) {
            return bad(format!(
                "global batch {} is not a multiple of micro-batch {} x dp {}",
                self.global_batch, self.micro_batch, self.dp
            ));
        }
        if self.zero > 3 {
            return bad(format!("--zero {} (0..3)", self.zero));
        }
        Ok(self.global_batch / (self.micro_batch * self.dp))
    }

    fn overlap_of(&self, d: Dim) -> Option<f64> {
        self.overlap
            .iter()
            .rev()
            .find(|(x, _)| *x == d)
            .map(|(_, f)| *f)
    }
}

/// Members per node and nodes spanned of each dimension under `map`.
pub fn layout(t: &Training, map: &Mapping, cl: &Cluster) -> Vec<(Dim, usize, usize)> {
    let mut cap = cl.ranks_per_node;
    let mut v = Vec::new();
    for &(d, _) in &map.order {
        let deg = match d {
            Dim::Dp => t.dp / t.ep.max(1),
            Dim::Tp => t.tp,
            Dim::Pp => t.pp,
            Dim::Ep => t.ep,
        };
        let m = deg.min(cap).max(1);
        cap = (cap / m).max(1);
        v.push((d, m, deg.div_ceil(m)));
    }
    v
}

/// The cluster one group of a dimension sees: `per_node` members on each of
/// `nodes` nodes; with the NICs of a node shared by every group on it.
fn sub_cluster(cl: &Cluster, per_node: usize, nodes: usize) -> Cluster {
    let mut c = cl.clone();
    c.nodes = nodes.max(1);
    c.ranks_per_node = per_node.max(1);
    let groups_per_node = (cl.ranks_per_node / per_node.max(1)).max(1) as f64;
    c.inter.bytes_per_s = match cl.nic {
        Nic::PerRank => cl.inter.bytes_per_s / cl.oversubscription,
        Nic::PerNode => cl.inter.bytes_per_s / groups_per_node / cl.oversubscription,
    };
    c.oversubscription = 1.0;
    c
}

/// Simulates `coll` on one group with the planner's choice and, for
/// rings-or-hier collectives, the other of ring / hier; returns the fastest
/// (time ms, intra and inter bytes per rank, algorithm — marked `*` when it
/// is not the planner's choice, i.e. it needs `SNCL_ALGO`). `compress`:
/// the compressed all-reduce's share of bytes between nodes; it always runs
/// hierarchically (flat where a node has one rank), marked `compressed`.
fn sim_ms(
    c: &Cluster,
    coll: Collective,
    bytes: f64,
    elem: usize,
    compress: Option<f64>,
) -> Result<(f64, f64, f64, String)> {
    let n = c.nranks();
    if n <= 1 || bytes <= 0.0 {
        return Ok((0.0, 0.0, 0.0, "-".into()));
    }
    let mut r = Request::new(coll, None, bytes as usize);
    r.elem = elem;
    if let Some(ratio) = compress {
        r.inter_ratio = Some(ratio);
        r.algo = Some(if c.nodes >= 2 && c.ranks_per_node >= 2 {
            Algorithm::Hier
        } else {
            Algorithm::Ring
        });
        let p = simulate(c, &r)?;
        return Ok((
            p.time_us / 1e3,
            p.intra_bytes / n as f64,
            p.inter_bytes / n as f64,
            format!("{} compressed", p.algo.name()),
        ));
    }
    let planned = simulate(c, &r)?;
    let mut best = (planned.clone(), false);
    for alt in [Algorithm::Ring, Algorithm::Hier] {
        if alt == planned.algo || (alt == Algorithm::Hier && (c.nodes < 2 || c.ranks_per_node < 2))
        {
            continue;
        }
        r.algo = Some(alt);
        if let Ok(p) = simulate(c, &r) {
            if p.time_us < best.0.time_us {
                best = (p, true);
            }
        }
    }
    let p = best.0;
    Ok((
        p.time_us / 1e3,
        p.intra_bytes / n as f64,
        p.inter_bytes / n as f64,
        format!("{}{}", p.algo.name(), if best.1 { "*" } else { "" }),
    ))
}

/// Evaluates one mapping.
pub fn step_cost(t: &Training, map: &Mapping, cl: &Cluster) -> Result<StepCost> {
    let ga = t.check(cl)?;
    let gaf = ga as f64;
    let lay = layout(t, map, cl);
    let find = |d: Dim| lay.iter().find(|x| x.0 == d).copied().unwrap_or((d, 1, 1));
    let h = t.hidden as f64;
    // Activations of one micro-batch at a layer boundary, bytes.
    let act = (t.seq * t.micro_batch) as f64 * h * t.act_bytes as f64;
    let params_per_rank = t.params / (t.tp * t.pp) as f64;
    let grad = params_per_rank * t.grad_bytes as f64;
    let backward_ms = t.step_compute_ms * 2.0 / 3.0;
    let mut dims = Vec::new();
    let mut bubble_ms = 0.0;
    for &(d, per_node, nodes) in &lay {
        let degree = per_node * nodes;
        let deg_true = match d {
            Dim::Dp => t.dp,
            Dim::Tp => t.tp,
            Dim::Pp => t.pp,
            Dim::Ep => t.ep,
        };
        if deg_true <= 1 {
            continue;
        }
        let sub = sub_cluster(cl, per_node, nodes);
        let nf = deg_true as f64;
        let (collective, ops, op_bytes, sent, time, intra, inter, algo, exposed, rule) = match d {
            Dim::Dp => {
                let (dn, dnodes) = (find(Dim::Dp).1, find(Dim::Dp).2);
                let sub = sub_cluster(cl, dn, dnodes);
                let ar = sim_ms(
                    &sub,
                    Collective::AllReduce,
                    grad,
                    t.grad_bytes,
                    t.dp_compress,
                )?;
                let (coll, ops, vol, time, intra, inter) = match t.zero {
                    0..=2 => (
                        if t.zero == 0 {
                            "all_reduce"
                        } else {
                            "reduce_scatter+all_gather"
                        },
                        1.0,
                        2.0 * (nf - 1.0) / nf * grad,
                        ar.0,
                        ar.1,
                        ar.2,
                    ),
                    _ => (
                        "reduce_scatter+all_gather x2",
                        1.0,
                        3.0 * (nf - 1.0) / nf * grad,
                        1.5 * ar.0,
                        1.5 * ar.1,
                        1.5 * ar.2,
                    ),
                };
                let bucket = sim_ms(
                    &sub,
                    Collective::AllReduce,
                    t.dp_bucket_bytes.min(grad),
                    t.grad_bytes,
                    t.dp_compress,
                )?
                .0;
                let (exp, rule) = match t.overlap_of(d) {
                    Some(f) => (
                        (1.0 - f) * time,
                        format!("override: {:.0}% hidden", f * 100.0),
                    ),
                    None if t.zero == 3 => {
                        let first = sim_ms(
                            &sub,
                            Collective::AllGather,
                            grad / (t.layers / t.pp) as f64,
                            t.grad_bytes,
                            None,
                        )?
                        .0;
                        let e = bucket + first + (time - backward_ms).max(0.0);
                        (e.min(time), "ZeRO-3: gathers prefetched except the first layer's, last gradient bucket exposed".into())
                    }
                    None => (
                        (bucket + (time - bucket - backward_ms).max(0.0)).min(time),
                        "overlapped with backward except the last bucket".to_string(),
                    ),
                };
                (
                    coll.to_string(),
                    ops,
                    grad,
                    vol,
                    time,
                    intra,
                    inter,
                    ar.3,
                    exp,
                    rule,
                )
            }
            Dim::Tp => {
                let per_layer = 4.0 + if t.recompute { 2.0 } else { 0.0 };
                let ops = per_layer * (t.layers / t.pp) as f64 * gaf;
                let (time1, intra1, inter1, algo) = if t.sequence_parallel {
                    let rs = sim_ms(&sub, Collective::ReduceScatter, act, t.act_bytes, None)?;
                    let ag = sim_ms(&sub, Collective::AllGather, act, t.act_bytes, None)?;
                    (rs.0 + ag.0, rs.1 + ag.1, rs.2 + ag.2, rs.3)
                } else {
                    sim_ms(&sub, Collective::AllReduce, act, t.act_bytes, None)?
                };
                let time = ops * time1;
                let coll = if t.sequence_parallel {
                    "reduce_scatter+all_gather"
                } else {
                    "all_reduce"
                };
                let exp = t.overlap_of(d).map_or(time, |f| (1.0 - f) * time);
                (
                    coll.into(),
                    ops,
                    act,
                    ops * 2.0 * (nf - 1.0) / nf * act,
                    time,
                    ops * intra1,
                    ops * inter1,
                    algo,
                    exp,
                    "exposed".into(),
                )
            }
            Dim::Pp => {
                let msg = if t.sequence_parallel {
                    act / t.tp as f64
                } else {
                    act
                };
                let dirs = if t.pp > 2 { 2.0 } else { 1.0 };
                let ops = dirs * gaf;
                let tier = if per_node > 1 { cl.intra } else { sub.inter };
                let one = (tier.latency_us + msg / (tier.bytes_per_s / 1e6)) / 1e3;
                let time = ops * one;
                bubble_ms = t.step_compute_ms * (t.pp as f64 - 1.0) / gaf;
                let exp = t.overlap_of(d).map_or(time, |f| (1.0 - f) * time);
                let (intra, inter) = if per_node > 1 {
                    (ops * msg, 0.0)
                } else {
                    (0.0, ops * msg)
                };
                (
                    "send/recv".into(),
                    ops,
                    msg,
                    ops * msg,
                    time,
                    intra,
                    inter,
                    "p2p".into(),
                    exp,
                    "exposed, plus the 1F1B bubble (pp-1)/micro-batches x compute".into(),
                )
            }
            Dim::Ep => {
                let moe_ops =
                    4.0 * (t.layers / t.pp) as f64 * gaf * if t.recompute { 1.5 } else { 1.0 };
                let tokens = (t.seq * t.micro_batch) as f64;
                let buf = tokens * t.top_k as f64 * t.capacity_factor * h * t.act_bytes as f64;
                let a2a = sim_alltoall(&sub, buf)?;
                let time = moe_ops * a2a.0;
                let exp = t.overlap_of(d).map_or(time, |f| (1.0 - f) * time);
                (
                    "alltoall".into(),
                    moe_ops,
                    buf,
                    moe_ops * (nf - 1.0) / nf * buf,
                    time,
                    moe_ops * a2a.1,
                    moe_ops * a2a.2,
                    "pairwise".into(),
                    exp,
                    "exposed".into(),
                )
            }
        };
        // Tier split of the volume: the simulator's proportions applied to
        // the formula's bytes (they agree for rings; ZeRO-3 and p2p scale).
        // A compressed DP all-reduce: the split of the uncompressed bytes,
        // then its cross-node part at the codec's share.
        let ratio = match d {
            Dim::Dp => t.dp_compress.unwrap_or(1.0),
            _ => 1.0,
        };
        let inter_plain = inter / ratio;
        let split = intra + inter_plain;
        let (bi, bx) = if split > 0.0 {
            (sent * intra / split, sent * inter_plain / split * ratio)
        } else {
            (sent, 0.0)
        };
        let sent = bi + bx;
        dims.push(DimCost {
            dim: d,
            degree: deg_true.max(degree.min(deg_true)),
            per_node,
            nodes,
            collective,
            ops,
            op_bytes,
            bytes_per_rank: sent,
            intra_bytes: bi,
            inter_bytes: bx,
            time_ms: time,
            exposed_ms: exposed,
            rule,
            algo,
        });
    }
    let exposed: f64 = dims.iter().map(|d| d.exposed_ms).sum::<f64>() + bubble_ms;
    let total: f64 = dims.iter().map(|d| d.bytes_per_rank).sum();
    let inter: f64 = dims.iter().map(|d| d.inter_bytes).sum();
    let per_step = exposed / 3.6e6 * t.price_per_hour * cl.nranks() as f64;
    Ok(StepCost {
        mapping: map.text(),
        dims,
        micro_batches: ga,
        compute_ms: t.step_compute_ms,
        bubble_ms,
        exposed_ms: exposed,
        utilisation: t.step_compute_ms / (t.step_compute_ms + exposed),
        cross_domain_share: if total > 0.0 { inter / total } else { 0.0 },
        waiting_cost_per_step: per_step,
        waiting_cost_per_run: per_step * t.steps,
    })
}

/// All-to-all of `buf` bytes per rank: every rank sends buf/n to each other
/// rank at once; time from the simulator's pairwise schedule.
fn sim_alltoall(c: &Cluster, buf: f64) -> Result<(f64, f64, f64)> {
    let n = c.nranks();
    if n <= 1 {
        return Ok((0.0, 0.0, 0.0));
    }
    let mut r = Request::new(Collective::AllToAll, None, (buf / n as f64) as usize);
    r.elem = 1;
    let p = simulate(c, &r)?;
    Ok((
        p.time_us / 1e3,
        p.intra_bytes / n as f64,
        p.inter_bytes / n as f64,
    ))
}

/// Ranks mappings by exposed time; returns them best first and a one-line reason.
pub fn compare(t: &Training, maps: &[Mapping], cl: &Cluster) -> Result<(Vec<StepCost>, String)> {
    let mut v = maps
        .iter()
        .map(|m| step_cost(t, m, cl))
        .collect::<Result<Vec<_>>>()?;
    v.sort_by(|a, b| a.exposed_ms.total_cmp(&b.exposed_ms));
    let reason = match v.as_slice() {
        [] => String::new(),
        [only] => format!("{}: the only mapping given", only.mapping),
        [best, next, ..] => {
            let worst_dim = |s: &StepCost| {
                s.dims
                    .iter()
                    .max_by(|a, b| a.exposed_ms.total_cmp(&b.exposed_ms))
                    .map(|d| {
                        (
                            d.dim.name(),
                            d.exposed_ms,
                            d.inter_bytes / d.bytes_per_rank.max(1.0),
                        )
                    })
            };
            let (wd, we, wx) = worst_dim(next).unwrap_or(("-", 0.0, 0.0));
            format!(
                "recommend {}: exposed {:.1} ms/step vs {:.1} ms for {} (utilisation {:.3} vs {:.3}); there {} costs {:.1} ms with {:.0}% of its bytes across nodes",
                best.mapping, best.exposed_ms, next.exposed_ms, next.mapping, best.utilisation,
                next.utilisation, wd, we, wx * 100.0
            )
        }
    };
    Ok((v, reason))
}

#[cfg(test)]
mod tests;
