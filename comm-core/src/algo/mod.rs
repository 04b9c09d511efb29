//! Pure schedule builders, one function per (collective, algorithm). Each is
//! a function of `(nranks, rank, counts, root, chunk)` only: no I/O, no
//! global state, so every rank derives the same plan and the checker can run
//! them all symbolically.

mod pairwise;
mod rd;
mod ring;
mod tree;

pub use pairwise::{alltoallv, barrier, gather, scatter};
pub use rd::rd_all_reduce;
pub use ring::{ring_all_gatherv, ring_all_reduce, ring_reduce_scatter};
pub use tree::{chain_broadcast, chain_reduce, tree_all_reduce, tree_broadcast, tree_reduce};

use crate::schedule::Schedule;
use crate::wire::Collective;

/// Algorithm families, named as `SNCL_ALGO` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Ring (pipelined chain for broadcast / reduce).
    Ring,
    /// Binomial tree, pipelined over chunks.
    Tree,
    /// Recursive doubling (dissemination for barrier).
    Rd,
    /// Direct pairwise exchange.
    Pairwise,
}

impl Algorithm {
    /// The name used in `SNCL_ALGO` and commbench output.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::Tree => "tree",
            Algorithm::Rd => "rd",
            Algorithm::Pairwise => "pairwise",
        }
    }

    /// Parses a name.
    pub fn from_name(s: &str) -> Option<Algorithm> {
        match s {
            "ring" => Some(Algorithm::Ring),
            "tree" => Some(Algorithm::Tree),
            "rd" => Some(Algorithm::Rd),
            "pairwise" => Some(Algorithm::Pairwise),
            _ => None,
        }
    }

    /// The algorithms implemented for a collective.
    pub fn available(coll: Collective) -> &'static [Algorithm] {
        use Algorithm::*;
        match coll {
            Collective::AllReduce => &[Ring, Tree, Rd],
            Collective::ReduceScatter => &[Ring],
            Collective::AllGather | Collective::AllGatherV => &[Ring],
            Collective::Broadcast | Collective::Reduce => &[Tree, Ring],
            Collective::AllToAll | Collective::AllToAllV => &[Pairwise],
            Collective::Gather | Collective::Scatter | Collective::SendRecv => &[Pairwise],
            Collective::Barrier => &[Rd],
        }
    }
}

/// What a uniform-count collective needs to build a schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// Ranks.
    pub nranks: usize,
    /// This rank.
    pub rank: usize,
    /// The count as NCCL defines it per collective (elements per rank for
    /// all_gather / reduce_scatter / gather / scatter / alltoall blocks).
    pub count: usize,
    /// Root for rooted collectives.
    pub root: usize,
    /// Pipeline chunk in elements (≥ 1).
    pub chunk: usize,
}

/// Builds the schedule of a uniform-count collective with `algo`.
/// Returns `None` when the algorithm does not implement the collective.
pub fn build(coll: Collective, algo: Algorithm, p: &Params) -> Option<Schedule> {
    let Params {
        nranks: n,
        rank: r,
        count,
        root,
        chunk,
    } = *p;
    let chunk = chunk.max(1);
    let s = match (coll, algo) {
        (Collective::AllReduce, Algorithm::Ring) => ring_all_reduce(n, r, count, chunk),
        (Collective::AllReduce, Algorithm::Tree) => tree_all_reduce(n, r, count, chunk),
        (Collective::AllReduce, Algorithm::Rd) => rd_all_reduce(n, r, count),
        (Collective::ReduceScatter, Algorithm::Ring) => ring_reduce_scatter(n, r, count, chunk),
        (Collective::AllGather, Algorithm::Ring) => {
            let counts = vec![count; n];
            ring_all_gatherv(n, r, &counts, &displacements(&counts), chunk)
        }
        (Collective::Broadcast, Algorithm::Tree) => tree_broadcast(n, r, root, count, chunk),
        (Collective::Broadcast, Algorithm::Ring) => chain_broadcast(n, r, root, count, chunk),
        (Collective::Reduce, Algorithm::Tree) => tree_reduce(n, r, root, count, chunk),
        (Collective::Reduce, Algorithm::Ring) => chain_reduce(n, r, root, count, chunk),
        (Collective::AllToAll, Algorithm::Pairwise) => {
            let counts = vec![count; n];
            let displs = displacements(&counts);
            alltoallv(n, r, &counts, &displs, &counts, &displs)
        }
        (Collective::Gather, Algorithm::Pairwise) => gather(n, r, root, count),
        (Collective::Scatter, Algorithm::Pairwise) => scatter(n, r, root, count),
        (Collective::Barrier, Algorithm::Rd) => barrier(n, r),
        _ => return None,
    };
    Some(s)
}

/// Prefix sums: the displacement of each block when blocks are packed.
pub fn displacements(counts: &[usize]) -> Vec<usize> {
    let mut acc = 0;
    counts
        .iter()
        .map(|c| {
            let d = acc;
            acc += c;
            d
        })
        .collect()
}

/// ⌈log2 n⌉ (0 for n ≤ 1).
pub fn ceil_log2(n: usize) -> usize {
    if n <= 1 {
        0
    } else {
        (usize::BITS - (n - 1).leading_zeros()) as usize
    }
}
