//! Pure schedule builders, one function per (collective, algorithm). Each is
//! a function of `(nranks, rank, counts, root, chunk)` and the placement
//! only: no I/O, no global state, so every rank derives the same plan and
//! the checker can run them all symbolically. [`ALGORITHMS`] is the one
//! table of what exists: per (collective, algorithm) its builder, its cost
//! and when the planner may pick it; the planner, `SNCL_ALGO`, commbench
//! and the docs all read it.

mod canonical;
mod hier;
mod pairwise;
mod rd;
mod ring;
mod tree;

pub use canonical::{
    canonical_all_reduce_butterfly, canonical_all_reduce_halving, canonical_all_reduce_ring,
    canonical_all_reduce_tree, canonical_reduce_scatter, canonical_reduce_sharded,
    canonical_reduce_tree, canonical_split,
};
pub use hier::{
    hier_all_gather, hier_all_reduce, hier_broadcast, hier_reduce, hier_reduce_scatter,
};
pub use pairwise::{alltoallv, barrier, gather, p2p_group, scatter};
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

mod cost;
mod table;
mod types;

pub use table::{Constraint, Row, ALGORITHMS};
pub use types::{ceil_log2, displacements, Algorithm, Blocks, Input, Params, Transfer, VarCounts};

impl Algorithm {
    /// The algorithms implemented for a collective, in the table's order
    /// (the planner's order of preference among equal costs).
    pub fn available(coll: Collective) -> Vec<Algorithm> {
        table::rows(coll).map(|r| r.algo).collect()
    }

    /// Parses the name of an algorithm of `coll`: an unknown name, or one
    /// the collective does not implement, is an error listing the names it
    /// has (from [`ALGORITHMS`]).
    pub fn parse_for(coll: Collective, name: &str) -> Result<Algorithm, String> {
        match Algorithm::from_name(name) {
            Some(a) if table::row(coll, a).is_some() => Ok(a),
            Some(a) => Err(unavailable(coll, a)),
            None => Err(format!(
                "unknown algorithm {name:?} for {}; expected one of {}",
                coll.name(),
                names(coll)
            )),
        }
    }
}

/// The names of `coll`'s algorithms, comma-separated, in table order.
pub fn names(coll: Collective) -> String {
    table::rows(coll)
        .map(|r| r.algo.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The error text for `algo` forced on a collective that lacks it.
pub fn unavailable(coll: Collective, algo: Algorithm) -> String {
    format!(
        "{} has no {} algorithm; available: {}",
        coll.name(),
        algo.name(),
        names(coll)
    )
}

/// The table's row for `(coll, algo)`, if the collective implements it.
pub fn row(coll: Collective, algo: Algorithm) -> Option<&'static Row> {
    table::row(coll, algo)
}

/// The table's rows of one collective, in order.
pub fn rows(coll: Collective) -> impl Iterator<Item = &'static Row> {
    table::rows(coll)
}

/// Builds the schedule of a uniform-count collective with `algo` for ranks
/// placed as `topo` says, rooted ones with their argument check (the
/// default). Returns `None` when the algorithm does not implement the
/// collective.
pub fn build(coll: Collective, algo: Algorithm, p: &Params, topo: &Topology) -> Option<Schedule> {
    build_input(
        coll,
        algo,
        &Input {
            p: *p,
            topo,
            blocks: Blocks::Uniform,
            check_roots: true,
        },
    )
}

/// Builds the schedule of any collective from its table row. Returns `None`
/// when the algorithm does not implement the collective.
pub fn build_input(coll: Collective, algo: Algorithm, input: &Input<'_>) -> Option<Schedule> {
    let row = table::row(coll, algo)?;
    let mut input = *input;
    input.p.chunk = input.p.chunk.max(1);
    let schedule = (row.build)(&input);
    Some(if coll.is_rooted() && input.check_roots {
        arguments_checked_first(schedule)
    } else {
        schedule
    })
}

/// Builds the schedule of `coll` with `algo` in deterministic mode
/// (`SNCL_DETERMINISTIC`): all-reduce, reduce and reduce-scatter reduce
/// every element in the canonical order ([`canonical_split`]) whatever the
/// algorithm, which only chooses where the tree's nodes are computed and
/// how results spread (module `canonical`); the other collectives move
/// bytes without arithmetic and build as [`build_input`] does. `None` when
/// the algorithm does not implement the collective.
pub fn build_deterministic(
    coll: Collective,
    algo: Algorithm,
    input: &Input<'_>,
) -> Option<Schedule> {
    if !coll.is_reducing() {
        return build_input(coll, algo, input);
    }
    table::row(coll, algo)?;
    let p = input.p;
    let (n, r, count, chunk) = (p.nranks, p.rank, p.count, p.chunk.max(1));
    let schedule = match (coll, algo) {
        (Collective::AllReduce, Algorithm::Ring) => {
            canonical_all_reduce_ring(&input.topo.ring_order(), r, count, chunk)
        }
        (Collective::AllReduce, Algorithm::FlatRing) => {
            canonical_all_reduce_ring(&(0..n).collect::<Vec<_>>(), r, count, chunk)
        }
        (Collective::AllReduce, Algorithm::Hier) => {
            canonical_all_reduce_halving(n, r, count, chunk)
        }
        (Collective::AllReduce, Algorithm::Tree) => canonical_all_reduce_tree(n, r, count, chunk),
        (Collective::AllReduce, _) => canonical_all_reduce_butterfly(n, r, count),
        (Collective::ReduceScatter, _) => canonical_reduce_scatter(n, r, count, chunk),
        (Collective::Reduce, Algorithm::Tree) => canonical_reduce_tree(n, r, p.root, count, chunk),
        (Collective::Reduce, _) => canonical_reduce_sharded(n, r, p.root, count, chunk),
        _ => return build_input(coll, algo, input),
    };
    Some(if coll.is_rooted() && input.check_roots {
        arguments_checked_first(schedule)
    } else {
        schedule
    })
}

/// A rooted collective's schedule behind a dissemination exchange of empty
/// messages, which does not depend on the root: every message's first piece
/// carries the operation's fingerprint (root included) and the receiver
/// compares it with its own, and after ⌈log2 n⌉ rounds every rank has heard,
/// directly or through ranks that would have failed and aborted instead of
/// passing on, from every other. So ranks that disagree on the root (or the
/// count, type or collective) fail on every rank in this operation, before
/// any data reaches a user buffer — where without it a rank that believes it
/// is the root only sends and returns, and ranks that each wait for the
/// other's data wait until the timeout. The cost, ⌈log2 n⌉ empty hops, is
/// paid by rooted collectives only.
pub fn arguments_checked_first(schedule: Schedule) -> Schedule {
    let mut checked = barrier(schedule.nranks, schedule.rank);
    checked.steps.extend(schedule.steps);
    checked.scratch_elems = schedule.scratch_elems;
    checked
}
