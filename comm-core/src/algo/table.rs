//! The algorithm table: one row per (collective, algorithm) with its
//! schedule builder, its cost function and the conditions under which the
//! planner may pick it by itself. Everything that lists, parses, checks,
//! plans or documents algorithms reads [`ALGORITHMS`]; adding an algorithm
//! is adding a row (and its builder and cost function).

use super::cost::{self, CostFn};
use super::{
    alltoallv, barrier, chain_broadcast, chain_reduce, displacements, gather, hier_all_gather,
    hier_all_reduce, hier_broadcast, hier_reduce, hier_reduce_scatter, p2p_group, rd_all_reduce,
    ring_all_gatherv_ordered, ring_all_reduce_ordered, ring_reduce_scatter_ordered, scatter,
    tree_all_reduce, tree_broadcast, tree_reduce, Algorithm, Blocks, Input,
};
use crate::cluster::Shape;
use crate::schedule::Schedule;
use crate::topo::Topology;
use crate::wire::Collective;

/// A condition on the communicator's shape under which the planner may
/// choose a row by itself. Every row's schedule is correct on every shape
/// (the symbolic checker runs each on every placement), so a forced
/// algorithm always runs; these only keep the planner from choices that
/// cannot pay off or exist for comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Constraint {
    /// Never chosen by the planner: only when forced (`SNCL_ALGO`,
    /// `force_algorithm`, `commbench --algo`).
    ForcedOnly,
    /// At least this many nodes.
    MinNodes(usize),
    /// Some node holds at least this many ranks.
    MinRanksPerNode(usize),
}

impl Constraint {
    /// Whether the planner may choose a row with this constraint on `sh`.
    pub fn holds(self, sh: &Shape) -> bool {
        match self {
            Constraint::ForcedOnly => false,
            Constraint::MinNodes(k) => sh.nnodes >= k,
            Constraint::MinRanksPerNode(k) => sh.max_local >= k,
        }
    }

    /// A short description for the docs and `--help`.
    pub fn describe(self) -> String {
        match self {
            Constraint::ForcedOnly => "forced only".into(),
            Constraint::MinNodes(k) => format!("≥ {k} nodes"),
            Constraint::MinRanksPerNode(k) => format!("a node of ≥ {k} ranks"),
        }
    }
}

/// One (collective, algorithm) pair.
#[derive(Clone, Copy)]
pub struct Row {
    /// The collective.
    pub coll: Collective,
    /// The algorithm.
    pub algo: Algorithm,
    /// Builds one rank's schedule (chunk ≥ 1 guaranteed by the caller).
    pub build: fn(&Input<'_>) -> Schedule,
    /// Predicted time in µs for `bytes` per rank and a chunk of `chunk` bytes.
    pub cost: CostFn,
    /// When the planner may choose it without being forced (all must hold).
    pub auto: &'static [Constraint],
}

impl Row {
    /// Whether the planner may choose this row by itself on `sh`.
    pub fn eligible(&self, sh: &Shape) -> bool {
        self.auto.iter().all(|c| c.holds(sh))
    }

    /// `name` or `name (constraints)`, as the docs and `--help` list it.
    pub fn describe(&self) -> String {
        if self.auto.is_empty() {
            return self.algo.name().to_string();
        }
        let c: Vec<String> = self.auto.iter().map(|c| c.describe()).collect();
        format!("{} ({})", self.algo.name(), c.join(", "))
    }
}

impl std::fmt::Debug for Row {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Row")
            .field("coll", &self.coll)
            .field("algo", &self.algo)
            .field("auto", &self.auto)
            .finish_non_exhaustive()
    }
}

use Algorithm::{FlatRing, Hier, Pairwise, Rd, Ring, Tree};
use Collective::{
    AllGather, AllGatherV, AllReduce, AllToAll, AllToAllV, Barrier, Broadcast, Gather, Reduce,
    ReduceScatter, Scatter, SendRecv,
};

/// The planner may always choose it.
const ANY: &[Constraint] = &[];
/// Hierarchical: only worth it across several nodes of several ranks.
const MULTI_NODE: &[Constraint] = &[Constraint::MinNodes(2), Constraint::MinRanksPerNode(2)];
/// For comparison: never chosen unless forced.
const FORCED: &[Constraint] = &[Constraint::ForcedOnly];

/// Every algorithm of every collective. Per collective, rows are in the
/// planner's order of preference among equal costs; the first row is its
/// choice when no row is eligible.
#[rustfmt::skip]
pub const ALGORITHMS: &[Row] = &[
    // all_reduce
    def(AllReduce, Ring, |i| ring_all_reduce_ordered(&ring(i.topo), i.p.rank, i.p.count, i.p.chunk), cost::ring_all_reduce, ANY),
    def(AllReduce, Tree, |i| tree_all_reduce(i.p.nranks, i.p.rank, &ring(i.topo), i.p.count, i.p.chunk), cost::tree_all_reduce, ANY),
    def(AllReduce, Rd, |i| rd_all_reduce(i.p.nranks, i.p.rank, i.p.count), cost::rd_all_reduce, ANY),
    def(AllReduce, Hier, |i| hier_all_reduce(i.topo, i.p.rank, i.p.count, i.p.chunk), cost::hier_all_reduce, MULTI_NODE),
    def(AllReduce, FlatRing, |i| ring_all_reduce_ordered(&identity(i), i.p.rank, i.p.count, i.p.chunk), cost::ring_all_reduce, FORCED),
    // reduce_scatter
    def(ReduceScatter, Ring, |i| ring_reduce_scatter_ordered(&ring(i.topo), i.p.rank, i.p.count, i.p.chunk), cost::ring_one_pass, ANY),
    def(ReduceScatter, Hier, |i| hier_reduce_scatter(i.topo, i.p.rank, i.p.count, i.p.chunk), cost::hier_one_pass, MULTI_NODE),
    def(ReduceScatter, FlatRing, |i| ring_reduce_scatter_ordered(&identity(i), i.p.rank, i.p.count, i.p.chunk), cost::ring_one_pass, FORCED),
    // all_gather
    def(AllGather, Ring, |i| all_gatherv(i, &ring(i.topo)), cost::ring_one_pass, ANY),
    def(AllGather, Hier, |i| hier_all_gather(i.topo, i.p.rank, i.p.count, i.p.chunk), cost::hier_one_pass, MULTI_NODE),
    def(AllGather, FlatRing, |i| all_gatherv(i, &identity(i)), cost::ring_one_pass, FORCED),
    // all_gatherv
    def(AllGatherV, Ring, |i| all_gatherv(i, &ring(i.topo)), cost::unmodelled, ANY),
    def(AllGatherV, FlatRing, |i| all_gatherv(i, &identity(i)), cost::unmodelled, FORCED),
    // broadcast
    def(Broadcast, Tree, |i| tree_broadcast(i.p.nranks, i.p.rank, &rooted(i), i.p.count, i.p.chunk), cost::tree_rooted, ANY),
    def(Broadcast, Ring, |i| chain_broadcast(i.p.nranks, i.p.rank, i.p.root, i.p.count, i.p.chunk), cost::chain_rooted, ANY),
    def(Broadcast, Hier, |i| hier_broadcast(i.topo, i.p.rank, i.p.root, i.p.count, i.p.chunk), cost::hier_rooted, MULTI_NODE),
    // reduce
    def(Reduce, Tree, |i| tree_reduce(i.p.nranks, i.p.rank, &rooted(i), i.p.count, i.p.chunk), cost::tree_rooted, ANY),
    def(Reduce, Ring, |i| chain_reduce(i.p.nranks, i.p.rank, i.p.root, i.p.count, i.p.chunk), cost::chain_rooted, ANY),
    def(Reduce, Hier, |i| hier_reduce(i.topo, i.p.rank, i.p.root, i.p.count, i.p.chunk), cost::hier_rooted, MULTI_NODE),
    // direct exchanges
    def(AllToAll, Pairwise, all_to_allv, cost::unmodelled, ANY),
    def(AllToAllV, Pairwise, all_to_allv, cost::unmodelled, ANY),
    def(Gather, Pairwise, |i| gather(i.p.nranks, i.p.rank, i.p.root, i.p.count), cost::unmodelled, ANY),
    def(Scatter, Pairwise, |i| scatter(i.p.nranks, i.p.rank, i.p.root, i.p.count), cost::unmodelled, ANY),
    def(SendRecv, Pairwise, |i| p2p_group(i.p.nranks, i.p.rank, match i.blocks { Blocks::P2p(t) => t, _ => &[] }), cost::unmodelled, ANY),
    def(Barrier, Rd, |i| barrier(i.p.nranks, i.p.rank), cost::unmodelled, ANY),
];

const fn def(
    coll: Collective,
    algo: Algorithm,
    build: fn(&Input<'_>) -> Schedule,
    cost: CostFn,
    auto: &'static [Constraint],
) -> Row {
    Row {
        coll,
        algo,
        build,
        cost,
        auto,
    }
}

/// The rows of one collective, in table order.
pub(super) fn rows(coll: Collective) -> impl Iterator<Item = &'static Row> {
    ALGORITHMS.iter().filter(move |r| r.coll == coll)
}

/// The row of `(coll, algo)`.
pub(super) fn row(coll: Collective, algo: Algorithm) -> Option<&'static Row> {
    ALGORITHMS.iter().find(|r| r.coll == coll && r.algo == algo)
}

/// Topology order: ranks grouped by node.
fn ring(topo: &Topology) -> Vec<usize> {
    topo.ring_order()
}

/// Rank order, ignoring topology.
fn identity(i: &Input<'_>) -> Vec<usize> {
    (0..i.p.nranks).collect()
}

/// Topology-aware rooted group: the root, then the others node by node.
fn rooted(i: &Input<'_>) -> Vec<usize> {
    std::iter::once(i.p.root)
        .chain(ring(i.topo).into_iter().filter(|&x| x != i.p.root))
        .collect()
}

/// Ring all-gather(v) along `order`, uniform blocks unless counts are given.
fn all_gatherv(i: &Input<'_>, order: &[usize]) -> Schedule {
    match i.blocks {
        Blocks::Var(v) => {
            ring_all_gatherv_ordered(order, i.p.rank, v.recv_counts, v.recv_displs, i.p.chunk)
        }
        _ => {
            let counts = vec![i.p.count; i.p.nranks];
            ring_all_gatherv_ordered(order, i.p.rank, &counts, &displacements(&counts), i.p.chunk)
        }
    }
}

/// Pairwise all-to-all(v), uniform blocks unless counts are given.
fn all_to_allv(i: &Input<'_>) -> Schedule {
    let (n, r) = (i.p.nranks, i.p.rank);
    match i.blocks {
        Blocks::Var(v) => alltoallv(
            n,
            r,
            v.send_counts,
            v.send_displs,
            v.recv_counts,
            v.recv_displs,
        ),
        _ => {
            let counts = vec![i.p.count; n];
            let displs = displacements(&counts);
            alltoallv(n, r, &counts, &displs, &counts, &displs)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_collective_has_rows_and_no_pair_repeats() {
        for coll in Collective::ALL.into_iter().filter(|c| c.is_scheduled()) {
            let algos: Vec<Algorithm> = rows(coll).map(|r| r.algo).collect();
            assert!(!algos.is_empty(), "{} has no algorithm", coll.name());
            for (i, a) in algos.iter().enumerate() {
                assert!(
                    !algos[i + 1..].contains(a),
                    "{} / {} appears twice",
                    coll.name(),
                    a.name()
                );
            }
            // The fallback (first row) is one the planner may pick anywhere.
            let first = rows(coll).next().expect("non-empty");
            assert!(
                first.auto.is_empty(),
                "{}: first row is constrained",
                coll.name()
            );
        }
        for a in Algorithm::ALL {
            assert!(
                ALGORITHMS.iter().any(|r| r.algo == a),
                "{} is in no row",
                a.name()
            );
            assert_eq!(Algorithm::from_name(a.name()), Some(a));
        }
    }

    #[test]
    fn constraints_gate_the_planner() {
        let flat = Shape::flat(8, crate::cluster::LinkCost::SHM);
        let two_tier = Shape {
            nnodes: 4,
            max_local: 2,
            ..flat
        };
        let one_per_node = Shape {
            nnodes: 8,
            max_local: 1,
            ..flat
        };
        let hier = row(Collective::AllReduce, Algorithm::Hier).expect("hier");
        assert!(!hier.eligible(&flat));
        assert!(hier.eligible(&two_tier));
        assert!(!hier.eligible(&one_per_node));
        let flat_ring = row(Collective::AllReduce, Algorithm::FlatRing).expect("flat-ring");
        assert!(!flat_ring.eligible(&two_tier));
        assert_eq!(flat_ring.describe(), "flat-ring (forced only)");
    }

    #[test]
    fn names_and_errors_come_from_the_table() {
        assert_eq!(
            super::super::names(Collective::AllReduce),
            "ring, tree, rd, hier, flat-ring"
        );
        let e = Algorithm::parse_for(Collective::Barrier, "ring").unwrap_err();
        assert!(
            e.contains("barrier has no ring") && e.contains("available: rd"),
            "{e}"
        );
        let e = Algorithm::parse_for(Collective::Gather, "nope").unwrap_err();
        assert!(e.contains("\"nope\"") && e.contains("pairwise"), "{e}");
        assert_eq!(
            Algorithm::parse_for(Collective::AllGatherV, "flat-ring"),
            Ok(Algorithm::FlatRing)
        );
    }
}
