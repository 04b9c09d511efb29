//! Pure schedule builders, one function per (collective, algorithm). Each is
//! a function of `(nranks, rank, counts, root, chunk)` only: no I/O, no
//! global state, so every rank derives the same plan and the checker can run
//! them all symbolically.

mod hier;
mod pairwise;
mod rd;
mod ring;
mod tree;

pub use hier::{
    hier_all_gather, hier_all_reduce, hier_broadcast, hier_reduce, hier_reduce_scatter,
};
pub use pairwise::{alltoallv, barrier, gather, scatter};
pub use rd::rd_all_reduce;
pub use ring::{
    push_ring_all_gather, push_ring_all_gather_multi, push_ring_all_reduce,
    push_ring_reduce_scatter, push_ring_reduce_scatter_multi, ring_all_gatherv,
    ring_all_gatherv_ordered, ring_all_reduce, ring_all_reduce_ordered, ring_reduce_scatter,
    ring_reduce_scatter_ordered, Part,
};
pub use tree::{chain_broadcast, chain_reduce, tree_all_reduce, tree_broadcast, tree_reduce};

use crate::schedule::Schedule;
use crate::topo::Topology;
use crate::wire::Collective;

/// Algorithm families, named as `SNCL_ALGO` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Ring in topology order: ranks grouped by node, so the ring crosses
    /// each node boundary once (pipelined chain for broadcast / reduce).
    Ring,
    /// Ring in the given rank order, ignoring topology (for comparison).
    FlatRing,
    /// Hierarchical: intra-node phases around a cross-node phase.
    Hier,
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
            Algorithm::FlatRing => "flat-ring",
            Algorithm::Hier => "hier",
            Algorithm::Tree => "tree",
            Algorithm::Rd => "rd",
            Algorithm::Pairwise => "pairwise",
        }
    }

    /// Parses a name.
    pub fn from_name(s: &str) -> Option<Algorithm> {
        match s {
            "ring" => Some(Algorithm::Ring),
            "flat-ring" => Some(Algorithm::FlatRing),
            "hier" => Some(Algorithm::Hier),
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
            Collective::AllReduce => &[Ring, Tree, Rd, Hier, FlatRing],
            Collective::ReduceScatter | Collective::AllGather => &[Ring, Hier, FlatRing],
            Collective::AllGatherV => &[Ring, FlatRing],
            Collective::Broadcast | Collective::Reduce => &[Tree, Ring, Hier],
            Collective::AllToAll | Collective::AllToAllV => &[Pairwise],
            Collective::Gather
            | Collective::Scatter
            | Collective::SendRecv
            | Collective::Tagged => &[Pairwise],
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

/// Builds the schedule of a uniform-count collective with `algo` for ranks
/// placed as `topo` says. Returns `None` when the algorithm does not
/// implement the collective.
pub fn build(coll: Collective, algo: Algorithm, p: &Params, topo: &Topology) -> Option<Schedule> {
    let Params {
        nranks: n,
        rank: r,
        count,
        root,
        chunk,
    } = *p;
    let chunk = chunk.max(1);
    let identity: Vec<usize> = (0..n).collect();
    let order = topo.ring_order();
    // Topology-aware rooted group: the root, then the others node by node.
    let rooted: Vec<usize> = std::iter::once(root)
        .chain(order.iter().copied().filter(|&x| x != root))
        .collect();
    let s = match (coll, algo) {
        (Collective::AllReduce, Algorithm::Ring) => {
            ring_all_reduce_ordered(&order, r, count, chunk)
        }
        (Collective::AllReduce, Algorithm::FlatRing) => {
            ring_all_reduce_ordered(&identity, r, count, chunk)
        }
        (Collective::AllReduce, Algorithm::Hier) => hier_all_reduce(topo, r, count, chunk),
        (Collective::AllReduce, Algorithm::Tree) => tree_all_reduce(n, r, &order, count, chunk),
        (Collective::AllReduce, Algorithm::Rd) => rd_all_reduce(n, r, count),
        (Collective::ReduceScatter, Algorithm::Ring) => {
            ring_reduce_scatter_ordered(&order, r, count, chunk)
        }
        (Collective::ReduceScatter, Algorithm::FlatRing) => {
            ring_reduce_scatter_ordered(&identity, r, count, chunk)
        }
        (Collective::ReduceScatter, Algorithm::Hier) => hier_reduce_scatter(topo, r, count),
        (Collective::AllGather, Algorithm::Ring | Algorithm::FlatRing) => {
            let counts = vec![count; n];
            let ord = if algo == Algorithm::Ring {
                &order
            } else {
                &identity
            };
            ring_all_gatherv_ordered(ord, r, &counts, &displacements(&counts), chunk)
        }
        (Collective::AllGather, Algorithm::Hier) => hier_all_gather(topo, r, count),
        (Collective::Broadcast, Algorithm::Tree) => tree_broadcast(n, r, &rooted, count, chunk),
        (Collective::Broadcast, Algorithm::Ring) => chain_broadcast(n, r, root, count, chunk),
        (Collective::Broadcast, Algorithm::Hier) => hier_broadcast(topo, r, root, count, chunk),
        (Collective::Reduce, Algorithm::Tree) => tree_reduce(n, r, &rooted, count, chunk),
        (Collective::Reduce, Algorithm::Ring) => chain_reduce(n, r, root, count, chunk),
        (Collective::Reduce, Algorithm::Hier) => hier_reduce(topo, r, root, count, chunk),
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
