//! The planner: picks an algorithm and a pipeline chunk per operation from an
//! alpha-beta cost model of the slowest transport the communicator uses.
//! Overrides come from [`Config::algo`]. Every rank holds the same config
//! (rank 0's, adopted at init), so every rank derives the same plan.

use crate::algo::{ceil_log2, Algorithm};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::wire::Collective;

/// Alpha-beta cost of one link: a message of `b` bytes takes
/// `alpha_us + b / bytes_per_us` microseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkCost {
    /// Per-message latency, µs.
    pub alpha_us: f64,
    /// Bandwidth, bytes per µs.
    pub bytes_per_us: f64,
}

impl LinkCost {
    /// Host shared memory on one node (measured here: ~1 µs, ~4 GB/s per copy).
    pub const SHM: LinkCost = LinkCost {
        alpha_us: 1.0,
        bytes_per_us: 4000.0,
    };
    /// TCP (loopback ~15 µs, a few GB/s; across nodes the link rate).
    pub const TCP: LinkCost = LinkCost {
        alpha_us: 15.0,
        bytes_per_us: 1000.0,
    };

    fn msg(&self, bytes: f64) -> f64 {
        self.alpha_us + bytes / self.bytes_per_us
    }
}

/// What the planner decided for one operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The algorithm.
    pub algo: Algorithm,
    /// Pipeline chunk in elements.
    pub chunk_elems: usize,
}

/// What the planner knows about the communicator: its size, its nodes and
/// the cost of each tier.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    /// Ranks.
    pub nranks: usize,
    /// Nodes.
    pub nnodes: usize,
    /// Most ranks on one node.
    pub max_local: usize,
    /// Link cost between ranks of one node.
    pub intra: LinkCost,
    /// Link cost between nodes.
    pub inter: LinkCost,
}

impl Shape {
    /// All ranks on one node, linked by `link`.
    pub fn flat(nranks: usize, link: LinkCost) -> Shape {
        Shape {
            nranks,
            nnodes: 1,
            max_local: nranks,
            intra: link,
            inter: link,
        }
    }

    /// The slowest link a flat algorithm crosses.
    fn slowest(&self) -> LinkCost {
        if self.nnodes > 1 {
            self.inter
        } else {
            self.intra
        }
    }
}

/// Predicted time in µs of `algo` for `coll` moving `bytes` per rank.
pub fn predict(coll: Collective, algo: Algorithm, sh: &Shape, bytes: usize, chunk: usize) -> f64 {
    let n = sh.nranks;
    let nf = n as f64;
    let b = bytes as f64;
    let l = ceil_log2(n) as f64;
    let k = (bytes.div_ceil(chunk.max(1))).max(1) as f64;
    let link = sh.slowest();
    let (nn, ll) = (sh.nnodes as f64, sh.max_local as f64);
    match (coll, algo) {
        (Collective::AllReduce, Algorithm::Ring | Algorithm::FlatRing) => {
            let blocks = (bytes.div_ceil(chunk.max(1) * n)).max(1) as f64;
            2.0 * (nf - 1.0) * (blocks * link.alpha_us + b / nf / link.bytes_per_us)
        }
        (Collective::AllReduce, Algorithm::Hier) => {
            let intra = 2.0 * (ll - 1.0) * (sh.intra.alpha_us + b / ll / sh.intra.bytes_per_us);
            let inter = 2.0 * (nn - 1.0) * (sh.inter.alpha_us + b / nn / sh.inter.bytes_per_us);
            intra + inter
        }
        (
            Collective::ReduceScatter | Collective::AllGather,
            Algorithm::Ring | Algorithm::FlatRing,
        ) => (nf - 1.0) * link.msg(b / nf),
        (Collective::ReduceScatter | Collective::AllGather, Algorithm::Hier) => {
            (ll - 1.0) * sh.intra.msg(b / ll) + (nn - 1.0) * sh.inter.msg(b / nn)
        }
        (Collective::AllReduce, Algorithm::Tree) => 2.0 * (l + k - 1.0) * link.msg(b / k),
        (Collective::AllReduce, Algorithm::Rd) => {
            let extra = if n.is_power_of_two() { 0.0 } else { 2.0 };
            (l + extra) * link.msg(b)
        }
        (Collective::Broadcast | Collective::Reduce, Algorithm::Tree) => {
            // Per step the root sends one message per level in flight.
            (l + k - 1.0) * link.msg(b / k) * l.min(k).max(1.0)
        }
        (Collective::Broadcast | Collective::Reduce, Algorithm::Ring) => {
            (nf - 1.0 + k - 1.0) * link.msg(b / k)
        }
        (Collective::Broadcast | Collective::Reduce, Algorithm::Hier) => {
            let li = ceil_log2(sh.nnodes) as f64;
            let la = ceil_log2(sh.max_local) as f64;
            (li + k - 1.0) * sh.inter.msg(b / k) * li.max(1.0)
                + (la + k - 1.0) * sh.intra.msg(b / k) * la.max(1.0)
        }
        _ => 0.0,
    }
}

/// Chooses the algorithm and chunk for one operation. A forced algorithm
/// the collective does not implement is an error. `flat-ring` is never
/// chosen unless forced; `hier` only with several nodes of several ranks.
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

/// [`plan`] with its inputs spelled out: `forced` is the algorithm forced
/// for `coll` (if any), `chunk_bytes` the pipeline chunk.
pub fn choose(
    coll: Collective,
    forced: Option<Algorithm>,
    sh: &Shape,
    bytes: usize,
    elem_size: usize,
    chunk_bytes: usize,
) -> Result<Plan> {
    let chunk_elems = (chunk_bytes / elem_size.max(1)).max(1);
    let avail = Algorithm::available(coll);
    if let Some(a) = forced {
        if !avail.contains(&a) {
            return Err(Error::Config(format!(
                "{} has no {} algorithm",
                coll.name(),
                a.name()
            )));
        }
        return Ok(Plan {
            algo: a,
            chunk_elems,
        });
    }
    let hier_useful = sh.nnodes > 1 && sh.max_local > 1;
    let mut best: Option<(f64, Algorithm)> = None;
    for &a in avail {
        if a == Algorithm::FlatRing || (a == Algorithm::Hier && !hier_useful) {
            continue;
        }
        let t = predict(coll, a, sh, bytes, chunk_bytes);
        if best.map(|(bt, _)| t < bt).unwrap_or(true) {
            best = Some((t, a));
        }
    }
    let algo = best.map(|(_, a)| a).unwrap_or(avail[0]);
    Ok(Plan { algo, chunk_elems })
}

#[cfg(test)]
mod tests {
    use super::*;

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
