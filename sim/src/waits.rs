//! Who waited for their peers, and where: the per-rank waits of a
//! [`Prediction`] (`wait_us`) ranked and summed up by node, small enough to
//! print, write and draw for 65,664 ranks (`commbench sim --json`,
//! `--chrome`).
//!
//! A rank's wait is the time its steps sat posted with their messages not
//! yet started because a peer was not ready (the engine's `wait_us`). In
//! the symmetric frame `wait_us` holds one entry per local position, which
//! is every node's rank at that position; the summary spreads it so.

use crate::collective::Prediction;
use crate::model::Cluster;

/// Ranks [`summary`] keeps by default: the longest waits drawn.
pub const LONGEST_DRAWN: usize = 16;

/// One rank's wait.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RankWait {
    /// The rank.
    pub rank: usize,
    /// Its node.
    pub node: usize,
    /// Time it waited for peers, µs.
    pub us: f64,
}

/// The waits of one node's ranks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NodeWait {
    /// The node.
    pub node: usize,
    /// Mean wait of its ranks, µs.
    pub mean_us: f64,
    /// Longest wait of one of its ranks, µs.
    pub max_us: f64,
    /// The rank that waited longest (the lowest such rank).
    pub max_rank: usize,
}

/// The waits of one prediction, ranked and by node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Waits {
    /// The ranks that waited longest, longest first (ties: lower rank
    /// first), at most the number asked for; ranks that did not wait are
    /// left out.
    pub longest: Vec<RankWait>,
    /// Every node, in node order.
    pub per_node: Vec<NodeWait>,
}

impl Waits {
    /// The nodes by mean wait, longest first (ties: lower node first),
    /// at most `k`, leaving out nodes whose ranks did not wait.
    pub fn nodes_by_mean(&self, k: usize) -> Vec<NodeWait> {
        let mut v: Vec<NodeWait> = self
            .per_node
            .iter()
            .copied()
            .filter(|w| w.mean_us > 0.0)
            .collect();
        v.sort_by(|a, b| b.mean_us.total_cmp(&a.mean_us).then(a.node.cmp(&b.node)));
        v.truncate(k);
        v
    }
}

/// Rank `r`'s wait in `p` (per rank, or its local position's in the
/// symmetric frame).
fn rank_wait(cl: &Cluster, p: &Prediction, r: usize) -> f64 {
    let w = &p.wait_us;
    if w.len() == cl.nranks() {
        w[r]
    } else if w.is_empty() {
        0.0
    } else {
        // The symmetric frame: node-major numbering, one entry per position.
        w[(r % cl.ranks_per_node) % w.len()]
    }
}

/// `p`'s waits on `cl`: the `top` ranks that waited longest and every
/// node's mean and longest wait.
pub fn summary(cl: &Cluster, p: &Prediction, top: usize) -> Waits {
    let n = cl.nranks();
    let mut per_node: Vec<NodeWait> = (0..cl.nodes)
        .map(|node| NodeWait {
            node,
            mean_us: 0.0,
            max_us: 0.0,
            max_rank: usize::MAX,
        })
        .collect();
    let mut all: Vec<RankWait> = Vec::with_capacity(n);
    for r in 0..n {
        let us = rank_wait(cl, p, r);
        let node = cl.node_of(r);
        let s = &mut per_node[node];
        s.mean_us += us;
        if us > s.max_us || s.max_rank == usize::MAX {
            s.max_us = us;
            s.max_rank = r;
        }
        if us > 0.0 {
            all.push(RankWait { rank: r, node, us });
        }
    }
    for s in &mut per_node {
        s.mean_us /= cl.ranks_per_node.max(1) as f64;
    }
    let order = |a: &RankWait, b: &RankWait| b.us.total_cmp(&a.us).then(a.rank.cmp(&b.rank));
    if all.len() > top && top > 0 {
        all.select_nth_unstable_by(top - 1, order);
    }
    all.truncate(top);
    all.sort_by(order);
    Waits {
        longest: all,
        per_node,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::{simulate, Frame, Request};
    use crate::model::Slowdown;
    use comm_core::algo::Algorithm;
    use comm_core::wire::Collective;

    fn cluster(nodes: usize, rpn: usize) -> Cluster {
        Cluster::per_rank_test(nodes, rpn)
    }

    fn hier(frame: Frame) -> Request {
        Request {
            frame,
            ..Request::new(Collective::AllReduce, Some(Algorithm::Hier), 64 << 20)
        }
    }

    /// A straggler: the other nodes' ranks wait on it, the longest waits
    /// are theirs and ranked, and the summary agrees with `wait_us`.
    #[test]
    fn the_ranks_that_wait_on_a_straggler_are_ranked_and_summed_by_node() {
        let mut cl = cluster(8, 16);
        cl.slowdowns.push(Slowdown::straggler(5, 3.0));
        let p = simulate(&cl, &hier(Frame::PerRank)).unwrap();
        let w = summary(&cl, &p, LONGEST_DRAWN);
        assert_eq!(w.longest.len(), LONGEST_DRAWN, "{w:?}");
        assert!(w.longest.windows(2).all(|x| x[0].us >= x[1].us));
        assert_eq!(w.longest[0].us, p.wait_max_us);
        for x in &w.longest {
            assert_eq!(x.us, p.wait_us[x.rank]);
            assert_eq!(x.node, cl.node_of(x.rank));
            assert!(x.us > 0.0);
        }
        // Nobody outside the top waited longer than its last.
        let last = w.longest.last().unwrap().us;
        let above = p.wait_us.iter().filter(|&&u| u > last).count();
        assert!(above < LONGEST_DRAWN, "{above} ranks above {last}");
        assert_eq!(w.per_node.len(), 8);
        let mean: f64 = w.per_node.iter().map(|s| s.mean_us).sum::<f64>() / 8.0;
        assert!((mean - p.wait_mean_us).abs() <= 1e-9 * p.wait_mean_us.max(1.0));
        // The fast nodes wait on the straggler: they wait longer than it.
        let slow = w.per_node[5].mean_us;
        let fast = w.nodes_by_mean(8);
        assert!(fast[0].node != 5 && fast[0].mean_us > slow, "{fast:?}");
        assert!(w.per_node.iter().filter(|s| s.mean_us > 0.0).count() >= 7);
        let quiet = simulate(&cluster(8, 16), &hier(Frame::PerRank)).unwrap();
        assert!(p.wait_max_us > quiet.wait_max_us, "{p:?}");
    }

    #[test]
    fn the_symmetric_frame_spreads_each_positions_wait_over_the_nodes() {
        let cl = cluster(4, 8);
        let p = simulate(&cl, &hier(Frame::Symmetric)).unwrap();
        assert!(p.symmetric && p.wait_us.len() == 8);
        let w = summary(&cl, &p, 1000);
        for x in &w.longest {
            assert_eq!(x.us, p.wait_us[x.rank % 8]);
        }
        for s in &w.per_node {
            assert_eq!(s.mean_us, w.per_node[0].mean_us);
        }
    }
}
