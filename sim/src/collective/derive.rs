//! Programs derived from others instead of built: rotations of rank 0's
//! (rings and `hier`, under either placement) and the tree's classes. Each
//! derivation is checked against built programs of a few ranks and
//! dropped (every rank is built) when one differs.

use comm_core::algo::Algorithm;

use super::Exec;
use crate::program::Program;
use crate::Result;

/// Same runs, peers and directions, bytes within 2 % plus two elements.
pub(super) fn alike(a: &Program, b: &Program, elem: f64) -> bool {
    let close = |x: f64, y: f64| (x - y).abs() <= 0.02 * x.max(y) + 2.0 * elem;
    a.runs.len() == b.runs.len()
        && a.runs.iter().zip(&b.runs).all(|(x, y)| {
            x.repeat == y.repeat
                && close(x.local_bytes, y.local_bytes)
                && close(x.reduce_bytes, y.reduce_bytes)
                && x.msgs.len() == y.msgs.len()
                && x.msgs
                    .iter()
                    .zip(&y.msgs)
                    .all(|(m, k)| m.peer == k.peer && m.send == k.send && close(m.bytes, k.bytes))
        })
}

/// `p` with every peer moved by `d` ranks (modulo `n`).
pub(super) fn shifted(p: &Program, d: i64, n: usize) -> Program {
    if d == 0 {
        return p.clone();
    }
    let n = n as i64;
    Program {
        runs: p
            .runs
            .iter()
            .map(|run| crate::program::Run {
                msgs: run
                    .msgs
                    .iter()
                    .map(|m| crate::program::Msg {
                        peer: (i64::from(m.peer) + d).rem_euclid(n) as u32,
                        ..*m
                    })
                    .collect(),
                ..run.clone()
            })
            .collect(),
    }
}

impl Exec<'_> {
    /// Programs derived from rank 0's, in either frame, under either
    /// placement. Rings (`ring` over the topology's ring order, node by
    /// node; `flat-ring` over rank order): the schedule is invariant under
    /// rotating the ring, so the rank at ring position i has the program
    /// of the rank at position 0 (rank 0) with every peer moved i
    /// positions along the ring. Rank r's parts are indexed by its
    /// position, so only their sizes (equal within a part's rounding)
    /// enter the program. `hier` (equal nodes): the rank with local index
    /// p on node k has rank 0's program with every peer moved p local
    /// indices along its own node (shard p's cross-node group is shard
    /// 0's moved so; the intra-node rings rotate) and k nodes on (the
    /// cross-node rings rotate); node-major, that is rank k L + p;
    /// round-robin, rank k + p N. Builds rank 0's and derives the others,
    /// after checking the derivation against built programs of ranks 1,
    /// L−1, L, N, N+1, n/2+1 and the last; `None` when a check fails or
    /// the schedule is neither (then all are built).
    pub(super) fn rotated(&self, count: usize, tolerance: f64) -> Result<Option<Vec<Program>>> {
        let hier = match self.algo {
            Algorithm::Ring | Algorithm::FlatRing => false,
            Algorithm::Hier => true,
            _ => return Ok(None),
        };
        if self.entities < 3 {
            return Ok(None);
        }
        let n = self.cl.nranks();
        let (l, nodes) = (self.cl.ranks_per_node, self.cl.nodes);
        let topo = self.cl.topology();
        if topo.nodes.len() != nodes || topo.nodes.iter().any(|v| v.len() != l) {
            return Ok(None);
        }
        // Ring: each rank's position along the ring and the rank at each
        // position. Hier: each rank's node and local index.
        let order: Vec<u32> = match self.algo {
            Algorithm::Ring => topo.ring_order().into_iter().map(|r| r as u32).collect(),
            _ => (0..n as u32).collect(),
        };
        let mut pos = vec![0u32; n];
        for (i, &r) in order.iter().enumerate() {
            pos[r as usize] = i as u32;
        }
        let mut local = vec![0u32; n];
        for ranks in &topo.nodes {
            for (i, &r) in ranks.iter().enumerate() {
                local[r] = i as u32;
            }
        }
        if order.first() != Some(&0) || topo.node_of[0] != 0 || local[0] != 0 {
            return Ok(None);
        }
        let moved = |peer: usize, r: usize| -> usize {
            if hier {
                let node = (topo.node_of[peer] + topo.node_of[r]) % nodes;
                topo.nodes[node][(local[peer] + local[r]) as usize % l]
            } else {
                order[(pos[peer] as usize + pos[r] as usize) % n] as usize
            }
        };
        let elem = self.req.elem.max(1);
        let prog = |r: usize| -> Result<Program> {
            Ok(Program::from_schedule(
                &self.build(r, count)?,
                elem,
                tolerance,
            ))
        };
        let p0 = prog(0)?;
        let shift = |r: usize| Program {
            runs: p0
                .runs
                .iter()
                .map(|run| crate::program::Run {
                    msgs: run
                        .msgs
                        .iter()
                        .map(|m| crate::program::Msg {
                            peer: moved(m.peer as usize, r) as u32,
                            ..*m
                        })
                        .collect(),
                    ..run.clone()
                })
                .collect(),
        };
        let mut checked = vec![1, l - 1, l, nodes, nodes + 1, n / 2 + 1, self.entities - 1];
        checked.retain(|&r| r > 0 && r < self.entities);
        checked.sort_unstable();
        checked.dedup();
        for r in checked {
            if !alike(&shift(r), &prog(r)?, elem as f64) {
                tracing::debug!(
                    rank = r,
                    algo = self.algo.name(),
                    "sim: programs are not rotations of rank 0's; building all"
                );
                return Ok(None);
            }
        }
        Ok(Some((0..self.entities).map(shift).collect()))
    }

    /// Trees over the identity order (node-major numbering): a rank's
    /// schedule depends on its position only through its action at each
    /// level (receive from `+2^l`, send to `−2^l`, idle — see
    /// `algo/tree.rs`), so ranks with the same actions have the same
    /// program with peers shifted by the difference of their ranks. Builds
    /// one program per class and shifts it; checks the shift against built
    /// programs of a few ranks (`None`, and every rank is built, when a
    /// check fails or the order is not the identity).
    pub(super) fn tree_classes(
        &self,
        topo: &comm_core::topo::Topology,
        build: &dyn Fn(usize) -> comm_core::schedule::Schedule,
        elem: usize,
        tolerance: f64,
    ) -> Option<Vec<Program>> {
        let n = self.cl.nranks();
        if n < 4 || topo.ring_order().iter().enumerate().any(|(i, &x)| i != x) {
            return None;
        }
        let levels = comm_core::algo::ceil_log2(n);
        if levels > 60 {
            return None;
        }
        // Two bits per level: reduce action, then broadcast action.
        let key = |vr: usize| -> (u64, u64) {
            let (mut red, mut bc) = (0u64, 0u64);
            for l in 0..levels {
                let m = 1usize << l;
                let a = if vr & (m - 1) != 0 {
                    0
                } else if vr & m != 0 {
                    1
                } else if vr + m < n {
                    2
                } else {
                    0
                };
                red |= a << (2 * l);
                let bm = 1usize << (levels - 1 - l);
                let b = if vr.is_multiple_of(2 * bm) {
                    if vr + bm < n {
                        1
                    } else {
                        0
                    }
                } else if vr.is_multiple_of(bm) {
                    2
                } else {
                    0
                };
                bc |= b << (2 * l);
            }
            (red, bc)
        };
        let mut reps: std::collections::HashMap<(u64, u64), (usize, Program)> =
            std::collections::HashMap::new();
        let mut progs = Vec::with_capacity(n);
        for r in 0..n {
            let (rep, p) = reps
                .entry(key(r))
                .or_insert_with(|| (r, Program::from_schedule(&build(r), elem, tolerance)));
            let d = r as i64 - *rep as i64;
            progs.push(shifted(p, d, n));
        }
        let elemf = elem as f64;
        for r in [1, 2, 3, n / 3, n / 2 + 1, n - 2, n - 1] {
            if !alike(
                &progs[r],
                &Program::from_schedule(&build(r), elem, tolerance),
                elemf,
            ) {
                tracing::debug!(
                    rank = r,
                    "sim: tree classes differ from the builder; building all"
                );
                return None;
            }
        }
        tracing::debug!(classes = reps.len(), "sim: tree programs from classes");
        Some(progs)
    }
}
