//! The critical path of a per-rank run: the chain of steps, transfers and
//! local work that ends at the last rank to finish, walked back through
//! whoever each step waited for. It names the rank, node and link that
//! bound the collective (a straggler node, a degraded link).
//!
//! The engine records every executed step ([`StepRec`]): when the rank
//! entered it, when it posted its messages, when it ended and which flow
//! ended its transfers. A flow starts when the later of its two ranks posts
//! it; if that was the peer, this rank waited and the path continues on the
//! peer, else on this rank's previous step.

use crate::model::Cluster;

/// What ended a step.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Bound {
    /// Local work only (a step without messages).
    #[default]
    Local,
    /// The step's last flow to end.
    Flow {
        /// Sending rank.
        from: u32,
        /// Receiving rank.
        to: u32,
        /// The rank whose post matched the message (the later one).
        late: u32,
        /// Whether it crossed nodes.
        inter: bool,
        /// When it was matched, µs.
        matched: f64,
    },
}

/// One executed step of one rank.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepRec {
    /// Entered the step (before its copies), µs.
    pub from: f64,
    /// Posted its messages, µs.
    pub posted: f64,
    /// Ended, µs.
    pub end: f64,
    /// What ended its transfers.
    pub bound: Bound,
    /// Local work after the transfers ended (or the whole step's, without
    /// messages), µs.
    pub local_extra: f64,
}

/// What a stretch of the critical path was spent on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Part {
    /// Copies or reductions on `rank`.
    Local {
        /// The rank.
        rank: u32,
    },
    /// A message in flight (latency and transfer).
    Transfer {
        /// Sending rank.
        from: u32,
        /// Receiving rank.
        to: u32,
        /// Whether it crossed nodes.
        inter: bool,
    },
}

/// One stretch of the critical path.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Segment {
    /// What it was spent on.
    pub part: Part,
    /// How long, µs.
    pub us: f64,
}

/// The critical path, last segment first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CriticalPath {
    /// Its stretches, from the end of the collective backwards.
    pub segments: Vec<Segment>,
    /// The rank that finished last (where the walk started).
    pub last_rank: u32,
}

/// What bound the collective, summed over the critical path.
#[derive(Clone, Debug, PartialEq)]
pub struct Bottleneck {
    /// The node with the most critical-path time (its ranks' local work and
    /// the transfers that touch it; a transfer between nodes counts for the
    /// one with the slower NIC, for both when they are alike), and that
    /// time, µs.
    pub node: (usize, f64),
    /// The rank with the most critical-path time, and that time, µs.
    pub rank: (u32, f64),
    /// The link (sender, receiver, crosses nodes) with the most transfer
    /// time on the path, and that time, µs.
    pub link: ((u32, u32, bool), f64),
    /// The whole path, µs.
    pub path_us: f64,
    /// Time on the path per node (index: node), µs.
    pub per_node_us: Vec<f64>,
}

const EPS: f64 = 1e-6;

/// Walks the critical path back from the rank that finished last.
/// `steps[r]` are rank r's recorded steps (the per-rank frame's entities).
pub fn walk(steps: &[Vec<StepRec>], finish_us: &[f64]) -> CriticalPath {
    let mut path = CriticalPath::default();
    let Some((last, _)) = finish_us
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
    else {
        return path;
    };
    path.last_rank = last as u32;
    let mut push = |part: Part, us: f64| {
        if us > EPS {
            path.segments.push(Segment { part, us });
        }
    };
    let (mut e, mut k) = (last, steps[last].len());
    // Each iteration moves to an earlier step (of this rank or of a peer),
    // so the walk ends; the bound keeps a malformed record from looping.
    let mut budget: usize = steps.iter().map(Vec::len).sum::<usize>() + 1;
    while k > 0 && budget > 0 {
        budget -= 1;
        let rec = steps[e][k - 1];
        let rank = e as u32;
        match rec.bound {
            Bound::Local => {
                push(Part::Local { rank }, rec.end - rec.from);
                k -= 1;
            }
            Bound::Flow {
                from,
                to,
                late,
                inter,
                matched,
            } => {
                push(Part::Local { rank }, rec.local_extra);
                push(
                    Part::Transfer { from, to, inter },
                    rec.end - rec.local_extra - matched,
                );
                let peer = if from == rank { to } else { from } as usize;
                if late as usize == peer && matched > rec.posted + EPS {
                    // This rank waited: the peer's step holding the message
                    // is the latest one it posted by then.
                    let j = steps[peer].partition_point(|s| s.posted <= matched + EPS);
                    if j == 0 {
                        break;
                    }
                    let held = steps[peer][j - 1];
                    push(Part::Local { rank: peer as u32 }, held.posted - held.from);
                    e = peer;
                    k = j - 1;
                } else {
                    push(Part::Local { rank }, rec.posted - rec.from);
                    k -= 1;
                }
            }
        }
    }
    path
}

impl CriticalPath {
    /// Total time on the path, µs.
    pub fn total_us(&self) -> f64 {
        self.segments.iter().map(|s| s.us).sum()
    }

    /// Sums the path by node, rank and link; `None` for an empty path.
    pub fn bottleneck(&self, cl: &Cluster) -> Option<Bottleneck> {
        if self.segments.is_empty() {
            return None;
        }
        let mut per_node = vec![0.0; cl.nodes];
        let mut per_rank: std::collections::HashMap<u32, f64> = Default::default();
        let mut per_link: std::collections::HashMap<(u32, u32, bool), f64> = Default::default();
        for s in &self.segments {
            match s.part {
                Part::Local { rank } => {
                    per_node[cl.node_of(rank as usize)] += s.us;
                    *per_rank.entry(rank).or_default() += s.us;
                }
                Part::Transfer { from, to, inter } => {
                    // A transfer between nodes counts for the node whose
                    // NIC is slower (both when they are alike).
                    let (a, b) = (cl.node_of(from as usize), cl.node_of(to as usize));
                    let (slow_a, slow_b) = (cl.slowdown_of(a).1, cl.slowdown_of(b).1);
                    if a == b || slow_a >= slow_b {
                        per_node[a] += s.us;
                    }
                    if b != a && slow_b >= slow_a {
                        per_node[b] += s.us;
                    }
                    *per_rank.entry(from).or_default() += s.us;
                    *per_rank.entry(to).or_default() += s.us;
                    *per_link.entry((from, to, inter)).or_default() += s.us;
                }
            }
        }
        let node = per_node
            .iter()
            .copied()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))?;
        let rank = top(&per_rank)?;
        let link = top(&per_link).unwrap_or(((0, 0, false), 0.0));
        Some(Bottleneck {
            node,
            rank,
            link,
            path_us: self.total_us(),
            per_node_us: per_node,
        })
    }
}

/// The entry with the largest value (the smallest key among equals, so the
/// answer does not depend on the map's order).
fn top<K: Copy + Ord>(m: &std::collections::HashMap<K, f64>) -> Option<(K, f64)> {
    m.iter()
        .map(|(k, v)| (*k, *v))
        .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(from: u32, to: u32, late: u32, matched: f64) -> Bound {
        Bound::Flow {
            from,
            to,
            late,
            inter: false,
            matched,
        }
    }

    #[test]
    fn the_walk_follows_the_rank_that_was_waited_for() {
        // Rank 1 computes 10 µs, then sends to rank 0, which posted at 0
        // and waited: the path is rank 1's work, then the transfer.
        let steps = vec![
            vec![StepRec {
                from: 0.0,
                posted: 0.0,
                end: 13.0,
                bound: flow(1, 0, 1, 10.0),
                local_extra: 0.0,
            }],
            vec![
                StepRec {
                    from: 0.0,
                    posted: 0.0,
                    end: 10.0,
                    bound: Bound::Local,
                    local_extra: 10.0,
                },
                StepRec {
                    from: 10.0,
                    posted: 10.0,
                    end: 13.0,
                    bound: flow(1, 0, 1, 10.0),
                    local_extra: 0.0,
                },
            ],
        ];
        let path = walk(&steps, &[13.0, 12.9]);
        assert_eq!(path.last_rank, 0);
        assert_eq!(
            path.segments,
            vec![
                Segment {
                    part: Part::Transfer {
                        from: 1,
                        to: 0,
                        inter: false
                    },
                    us: 3.0
                },
                Segment {
                    part: Part::Local { rank: 1 },
                    us: 10.0
                },
            ]
        );
        assert!((path.total_us() - 13.0).abs() < 1e-9);
    }
}
