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

/// Predicted time in µs of `algo` for `coll` moving `bytes` per rank.
pub fn predict(
    coll: Collective,
    algo: Algorithm,
    n: usize,
    bytes: usize,
    chunk: usize,
    link: LinkCost,
) -> f64 {
    let nf = n as f64;
    let b = bytes as f64;
    let l = ceil_log2(n) as f64;
    let k = (bytes.div_ceil(chunk.max(1))).max(1) as f64;
    match (coll, algo) {
        (Collective::AllReduce, Algorithm::Ring) => {
            let blocks = (bytes.div_ceil(chunk.max(1) * n)).max(1) as f64;
            2.0 * (nf - 1.0) * (blocks * link.alpha_us + b / nf / link.bytes_per_us)
        }
        (Collective::AllReduce, Algorithm::Tree) => 2.0 * (l + k - 1.0) * link.msg(b / k),
        (Collective::AllReduce, Algorithm::Rd) => {
            let extra = if n.is_power_of_two() { 0.0 } else { 2.0 };
            (l + extra) * link.msg(b)
        }
        (Collective::Broadcast | Collective::Reduce, Algorithm::Tree) => {
            (l + k - 1.0) * link.msg(b / k) * l.max(1.0)
        }
        (Collective::Broadcast | Collective::Reduce, Algorithm::Ring) => {
            (nf - 1.0 + k - 1.0) * link.msg(b / k)
        }
        _ => 0.0,
    }
}

/// Chooses the algorithm and chunk for one operation. A forced algorithm
/// the collective does not implement is an error.
pub fn plan(
    cfg: &Config,
    coll: Collective,
    n: usize,
    bytes: usize,
    elem_size: usize,
    link: LinkCost,
) -> Result<Plan> {
    let chunk_elems = (cfg.chunk_bytes / elem_size.max(1)).max(1);
    let avail = Algorithm::available(coll);
    if let Some(a) = cfg.forced(coll) {
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
    let algo = if avail.len() == 1 {
        avail[0]
    } else {
        let mut best = (f64::INFINITY, avail[0]);
        for &a in avail {
            let t = predict(coll, a, n, bytes, cfg.chunk_bytes, link);
            if t < best.0 {
                best = (t, a);
            }
        }
        best.1
    };
    Ok(Plan { algo, chunk_elems })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_messages_use_rd_large_use_ring() {
        let c = Config::default();
        let p = plan(&c, Collective::AllReduce, 2, 8, 4, LinkCost::SHM).unwrap();
        assert_eq!(p.algo, Algorithm::Rd);
        let p = plan(&c, Collective::AllReduce, 8, 64 << 20, 4, LinkCost::SHM).unwrap();
        assert_eq!(p.algo, Algorithm::Ring);
        let p = plan(&c, Collective::Broadcast, 8, 64 << 20, 4, LinkCost::TCP).unwrap();
        assert_eq!(p.algo, Algorithm::Ring);
        let p = plan(&c, Collective::Broadcast, 8, 64, 4, LinkCost::TCP).unwrap();
        assert_eq!(p.algo, Algorithm::Tree);
    }

    #[test]
    fn override_wins() {
        let c = Config {
            algo: vec![(Collective::AllReduce, Algorithm::Tree)],
            ..Default::default()
        };
        let p = plan(&c, Collective::AllReduce, 4, 1 << 20, 4, LinkCost::SHM).unwrap();
        assert_eq!(p.algo, Algorithm::Tree);
    }
}
