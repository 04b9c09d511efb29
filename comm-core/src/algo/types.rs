//! The algorithm module's vocabulary, read by every builder, the table and
//! the planner: the algorithm families ([`Algorithm`]), what a builder is
//! given ([`Input`]: [`Params`], the placement and [`Blocks`]), and two
//! small helpers of the builders.

use crate::topo::Topology;

/// Algorithm families, named as `SNCL_ALGO` names them. Which collectives
/// each implements, how it is built and priced, is [`ALGORITHMS`](super::ALGORITHMS).
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
    /// Every family.
    pub const ALL: [Algorithm; 6] = [
        Algorithm::Ring,
        Algorithm::FlatRing,
        Algorithm::Hier,
        Algorithm::Tree,
        Algorithm::Rd,
        Algorithm::Pairwise,
    ];

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
        Algorithm::ALL.into_iter().find(|a| a.name() == s)
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

/// Per-rank counts and displacements (elements) of all_gatherv / alltoallv;
/// all_gatherv reads only the receive side.
#[derive(Clone, Copy, Debug)]
pub struct VarCounts<'a> {
    /// Elements sent to each rank.
    pub send_counts: &'a [usize],
    /// Where each rank's block starts in the input.
    pub send_displs: &'a [usize],
    /// Elements received from each rank.
    pub recv_counts: &'a [usize],
    /// Where each rank's block lands in the output.
    pub recv_displs: &'a [usize],
}

/// One transfer of a point-to-point group: the k-th transfer moves `len`
/// elements of the group's k-th buffer ([`crate::schedule::BufId::Peer`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transfer {
    /// The other rank.
    pub peer: usize,
    /// Send (true) or receive (false).
    pub is_send: bool,
    /// Elements.
    pub len: usize,
}

/// How the data of an operation is laid out beyond [`Params`].
#[derive(Clone, Copy, Debug, Default)]
pub enum Blocks<'a> {
    /// Every block holds [`Params::count`] elements (variable-count
    /// collectives then behave as their uniform forms; a point-to-point group
    /// has no transfers).
    #[default]
    Uniform,
    /// all_gatherv / alltoallv counts.
    Var(VarCounts<'a>),
    /// The transfers of a point-to-point group.
    P2p(&'a [Transfer]),
}

/// Everything a schedule builder reads.
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    /// Ranks, rank, count, root, chunk.
    pub p: Params,
    /// Where the ranks are placed.
    pub topo: &'a Topology,
    /// Variable counts or transfers, where the collective has them.
    pub blocks: Blocks<'a>,
    /// Rooted collectives start with the ranks' argument check
    /// ([`arguments_checked_first`](super::arguments_checked_first); `SNCL_CHECK_ROOTS`).
    pub check_roots: bool,
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
