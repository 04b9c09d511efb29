//! Deterministic reductions (`SNCL_DETERMINISTIC=1`): schedules whose
//! every element is reduced in one canonical order, whatever the
//! algorithm, the chunk size, the transport or the placement.
//!
//! The canonical order is a fixed binary tree over the ranks in rank
//! order ([`canonical_split`]): the range `[lo, hi)` of `s ≥ 2` ranks
//! combines `[lo, lo + 2^(⌈log2 s⌉-1))` with the rest, so 8 ranks reduce as
//! `((x0+x1)+(x2+x3))+((x4+x5)+(x6+x7))` and 6 as
//! `((x0+x1)+(x2+x3))+(x4+x5)`. Each node's value is rounded to the data
//! type, as every reduction of the library rounds (fp16 and bf16 combine in
//! f32 and round once per node), and `Avg` divides the root's value once.
//!
//! The schedules only decide *where* each node of the tree is computed:
//! any rank may combine a node's two children, because IEEE addition and
//! multiplication are commutative bit for bit, so the cost is a placement
//! and an order, never a gather to one rank. Placements:
//! - *sharded*: the vector is cut in `n` shards, shard `j` is reduced over
//!   its own tree whose root lands on rank `j`, the other nodes on ranks
//!   that spread the work — for a power of two this is recursive halving
//!   (the bytes of a ring reduce-scatter, in ⌈log2 n⌉ steps), and on nodes of
//!   2^k ranks in rank order the cross-node hops pair equal local ranks;
//! - *whole*: the vector, pipelined in chunks, goes up one tree to a root;
//! - *butterfly*: every rank computes every node on its path (recursive
//!   doubling for a power of two), for small vectors.
//!
//! Results then spread without arithmetic (ring all-gather, or the trees
//! reversed), which cannot change a bit.

use super::ceil_log2;
use super::ring::{push_ring_all_gather, Part};
use crate::schedule::{chunk_bounds, BufId, Op, Region, Schedule};

/// Where the canonical tree splits the ranks `[lo, hi)` (`hi - lo ≥ 2`):
/// the left child is `[lo, split)`, the largest power of two smaller than
/// the range, the right child `[split, hi)`.
pub fn canonical_split(lo: usize, hi: usize) -> usize {
    debug_assert!(hi >= lo + 2, "a split needs two ranks");
    lo + (1 << (ceil_log2(hi - lo) - 1))
}

/// One combine of a canonical tree that involves the rank a schedule is
/// built for: at `step`, `from` sends the partial of one child to `to`,
/// which holds the other child's and combines them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Hop {
    step: usize,
    from: usize,
    to: usize,
    /// The tree's root: after it `to` holds the whole reduction.
    root: bool,
}

/// The hops of the canonical tree over `[0, n)` whose result lands on
/// `root` that involve rank `r`, in step order (at most one per step).
///
/// Placement: a node is computed where its parent is when the parent lies
/// in it; otherwise, for a node `C` whose parent `B` is computed on `h`, on
/// `C.start + (h - B.start) mod |C|`, which for equal halves is `h`'s
/// partner at distance `|C|` (recursive halving).
fn hops(n: usize, root: usize, r: usize) -> Vec<Hop> {
    let mut out = Vec::new();
    let (mut lo, mut hi, mut host) = (0, n, root);
    while hi - lo > 1 {
        let mid = canonical_split(lo, hi);
        let (mine, other) = if host < mid {
            ((lo, mid), (mid, hi))
        } else {
            ((mid, hi), (lo, mid))
        };
        let other_host = other.0 + (host - lo) % (other.1 - other.0);
        if r == host || r == other_host {
            out.push(Hop {
                step: ceil_log2(hi - lo) - 1,
                from: other_host,
                to: host,
                root: hi - lo == n,
            });
        }
        if (mine.0..mine.1).contains(&r) {
            (lo, hi) = mine;
        } else {
            (lo, hi) = other;
            host = other_host;
        }
    }
    out.reverse();
    out
}

/// A part of the vector reduced over its own canonical tree.
#[derive(Clone, Copy, Debug)]
struct Piece {
    /// This rank's input.
    leaf: Region,
    /// Where this rank keeps the piece's partials (and the result, on the
    /// root).
    acc: Region,
    /// The rank the result lands on.
    root: usize,
    /// Steps after the schedule's start the tree's first combine runs
    /// (pipelining pieces of one tree).
    delay: usize,
}

/// Steps a set of pieces takes up one tree each.
fn span(n: usize, pieces: &[Piece]) -> usize {
    pieces
        .iter()
        .map(|p| p.delay + ceil_log2(n))
        .max()
        .unwrap_or(0)
}

/// Appends the reduction of every piece up its canonical tree; with
/// `finalize`, the root finalizes (`Avg`). Pieces of length 0 are skipped
/// (every rank skips the same ones).
fn push_reduce(s: &mut Schedule, pieces: &[Piece], finalize: bool) {
    let (n, r) = (s.nranks, s.rank);
    if n == 1 {
        let mut ops = Vec::new();
        for p in pieces {
            ops.push(Op::Copy {
                src: p.leaf,
                dst: p.acc,
            });
            if finalize {
                ops.push(Op::Finalize { region: p.acc });
            }
        }
        s.push(ops);
        return;
    }
    let mut steps: Vec<Vec<Op>> = vec![Vec::new(); span(n, pieces)];
    for p in pieces.iter().filter(|p| p.leaf.len > 0) {
        let mut at = p.leaf;
        for hop in hops(n, p.root, r) {
            let ops = &mut steps[p.delay + hop.step];
            if hop.from == r {
                ops.push(Op::Send {
                    peer: hop.to,
                    src: at,
                });
            } else {
                ops.push(Op::RecvReduce {
                    peer: hop.from,
                    local: at,
                    dst: p.acc,
                });
                at = p.acc;
                if hop.root && finalize {
                    ops.push(Op::Finalize { region: p.acc });
                }
            }
        }
    }
    for ops in steps {
        s.push(ops);
    }
}

/// Appends the reverse of [`push_reduce`] without arithmetic: each
/// piece's result travels from its root down the same tree, landing in
/// `acc` on every rank.
fn push_spread(s: &mut Schedule, pieces: &[Piece]) {
    let (n, r) = (s.nranks, s.rank);
    if n == 1 {
        return;
    }
    let last = span(n, pieces);
    let mut steps: Vec<Vec<Op>> = vec![Vec::new(); last];
    for p in pieces.iter().filter(|p| p.leaf.len > 0) {
        for hop in hops(n, p.root, r) {
            let ops = &mut steps[last - 1 - (p.delay + hop.step)];
            if hop.to == r {
                ops.push(Op::Send {
                    peer: hop.from,
                    src: p.acc,
                });
            } else {
                ops.push(Op::Recv {
                    peer: hop.to,
                    dst: p.acc,
                });
            }
        }
    }
    for ops in steps {
        s.push(ops);
    }
}

/// Shard `j` of a vector of `count` elements cut in `n` shards.
fn shard(count: usize, n: usize, j: usize) -> Part {
    chunk_bounds(count, n, j)
}

/// Blocks `(base, len)` of `n * chunk` elements (the last shorter): the
/// sharded placements reduce and spread one block before the next, so a
/// block is still in cache when its results are sent on (as the ring
/// algorithm does).
fn blocks(count: usize, n: usize, chunk: usize) -> Vec<Part> {
    let block = n.saturating_mul(chunk.max(1));
    (0..count.div_ceil(block))
        .map(|k| (k * block, block.min(count - k * block)))
        .collect()
}

/// Pieces of the sharded placement of an all-reduce over the block
/// `(base, len)`: shard `j` of the block lands on rank `j`, every rank keeps
/// partials in its output.
fn all_reduce_shards(n: usize, (base, len): Part) -> Vec<Piece> {
    (0..n)
        .map(|j| {
            let (o, l) = shard(len, n, j);
            Piece {
                leaf: Region::new(BufId::Send, base + o, l),
                acc: Region::new(BufId::Recv, base + o, l),
                root: j,
                delay: 0,
            }
        })
        .collect()
}

/// Pieces of the whole placement: the vector in chunks of `chunk`
/// elements, each a step behind the one before, all landing on `root`;
/// partials in `acc` (`BufId::Recv` on the root).
fn whole(count: usize, chunk: usize, root: usize, acc: BufId) -> Vec<Piece> {
    let chunk = chunk.max(1);
    (0..count.div_ceil(chunk))
        .map(|k| {
            let o = k * chunk;
            let l = chunk.min(count - o);
            Piece {
                leaf: Region::new(BufId::Send, o, l),
                acc: Region::new(acc, o, l),
                root,
                delay: k,
            }
        })
        .collect()
}

/// Deterministic all-reduce: per block of `n * chunk` elements, a sharded
/// canonical reduce-scatter, then a ring all-gather along `order` (the
/// ring algorithm's placement).
pub fn canonical_all_reduce_ring(
    order: &[usize],
    r: usize,
    count: usize,
    chunk: usize,
) -> Schedule {
    let n = order.len();
    let mut s = Schedule::new(n, r);
    for block in blocks(count, n, chunk) {
        push_reduce(&mut s, &all_reduce_shards(n, block), true);
        if n > 1 {
            let parts: Vec<Part> = order
                .iter()
                .map(|&j| {
                    let (o, l) = shard(block.1, n, j);
                    (block.0 + o, l)
                })
                .collect();
            push_ring_all_gather(&mut s, order, &parts, BufId::Recv);
        }
    }
    s
}

/// Deterministic all-reduce: per block of `n * chunk` elements, a sharded
/// canonical reduce-scatter, then the same trees reversed (recursive
/// doubling for a power of two), so that on nodes of 2^k ranks in rank
/// order only equal local ranks talk across nodes (the hierarchical
/// placement).
pub fn canonical_all_reduce_halving(n: usize, r: usize, count: usize, chunk: usize) -> Schedule {
    let mut s = Schedule::new(n, r);
    for block in blocks(count, n, chunk) {
        let pieces = all_reduce_shards(n, block);
        push_reduce(&mut s, &pieces, true);
        push_spread(&mut s, &pieces);
    }
    s
}

/// Deterministic all-reduce: the whole vector up one canonical tree to
/// rank 0, pipelined in chunks, and back down it (the tree placement).
pub fn canonical_all_reduce_tree(n: usize, r: usize, count: usize, chunk: usize) -> Schedule {
    let mut s = Schedule::new(n, r);
    let pieces = whole(count, chunk, 0, BufId::Recv);
    push_reduce(&mut s, &pieces, true);
    push_spread(&mut s, &pieces);
    s
}

/// Deterministic all-reduce for small vectors: every rank computes every
/// node of the canonical tree on its path, ⌈log2 n⌉ exchanges (recursive
/// doubling for a power of two; a smaller sibling's ranks send to several
/// ranks of the larger one). Uses `count` scratch.
pub fn canonical_all_reduce_butterfly(n: usize, r: usize, count: usize) -> Schedule {
    let mut s = Schedule::new(n, r);
    let all = |buf| Region::new(buf, 0, count);
    if n == 1 {
        s.push(vec![
            Op::Copy {
                src: all(BufId::Send),
                dst: all(BufId::Recv),
            },
            Op::Finalize {
                region: all(BufId::Recv),
            },
        ]);
        return s;
    }
    // The nodes on this rank's path, root first: (node, this rank's child,
    // the sibling).
    let mut path = Vec::new();
    let (mut lo, mut hi) = (0, n);
    while hi - lo > 1 {
        let mid = canonical_split(lo, hi);
        let (mine, other) = if r < mid {
            ((lo, mid), (mid, hi))
        } else {
            ((mid, hi), (lo, mid))
        };
        path.push(((lo, hi), mine, other));
        (lo, hi) = mine;
    }
    let mut steps: Vec<Vec<Op>> = vec![Vec::new(); ceil_log2(n)];
    // An exchange reads `cur` while it writes, and in place the input is
    // the output: sums alternate scratch, output, scratch, ...
    let mut cur = BufId::Send;
    for &((lo, hi), mine, other) in path.iter().rev() {
        let ops = &mut steps[ceil_log2(hi - lo) - 1];
        let (mine_len, other_len) = (mine.1 - mine.0, other.1 - other.0);
        let offset = r - mine.0;
        let mut q = other.0 + offset;
        while q < other.1 {
            ops.push(Op::Send {
                peer: q,
                src: all(cur),
            });
            q += mine_len;
        }
        let next = if cur == BufId::Scratch {
            BufId::Recv
        } else {
            BufId::Scratch
        };
        ops.push(Op::RecvReduce {
            peer: other.0 + offset % other_len,
            local: all(cur),
            dst: all(next),
        });
        cur = next;
        if hi - lo == n {
            ops.push(Op::Finalize { region: all(cur) });
        }
    }
    for ops in steps {
        s.push(ops);
    }
    if cur != BufId::Recv {
        s.push(vec![Op::Copy {
            src: all(cur),
            dst: all(BufId::Recv),
        }]);
    }
    s
}

/// Deterministic reduce-scatter: block `j` (`count` elements at
/// `j * count` of the input) is reduced over its canonical tree onto rank
/// `j`, a chunk of every block at a time; partials of other ranks' chunks
/// live in scratch (`n * min(chunk, count)` elements at most, reused by
/// the next round once this one's steps are done).
pub fn canonical_reduce_scatter(n: usize, r: usize, count: usize, chunk: usize) -> Schedule {
    let mut s = Schedule::new(n, r);
    // A round's chunks are at most this long.
    let stride = chunk.max(1).min(count);
    for (o, l) in blocks(count, 1, chunk) {
        let pieces: Vec<Piece> = (0..n)
            .map(|j| Piece {
                leaf: Region::new(BufId::Send, j * count + o, l),
                acc: if j == r {
                    Region::new(BufId::Recv, o, l)
                } else {
                    Region::new(BufId::Scratch, j * stride, l)
                },
                root: j,
                delay: 0,
            })
            .collect();
        push_reduce(&mut s, &pieces, true);
    }
    s
}

/// Deterministic reduce: the whole vector up one canonical tree onto
/// `root`, pipelined in chunks (the tree placement).
pub fn canonical_reduce_tree(
    n: usize,
    r: usize,
    root: usize,
    count: usize,
    chunk: usize,
) -> Schedule {
    let mut s = Schedule::new(n, r);
    let acc = if r == root {
        BufId::Recv
    } else {
        BufId::Scratch
    };
    push_reduce(&mut s, &whole(count, chunk, root, acc), true);
    s
}

/// Deterministic reduce for large vectors: per block of `n * chunk`
/// elements, a sharded canonical reduce-scatter (shard `j` onto rank `j`,
/// in scratch off the root: a block's worth, reused by the next block),
/// then every rank sends its shard to `root`.
pub fn canonical_reduce_sharded(
    n: usize,
    r: usize,
    root: usize,
    count: usize,
    chunk: usize,
) -> Schedule {
    let mut s = Schedule::new(n, r);
    for (base, len) in blocks(count, n, chunk) {
        let bounds = |j: usize| {
            let (o, l) = shard(len, n, j);
            (base + o, l)
        };
        let at = |j: usize| {
            let (o, l) = bounds(j);
            if r == root {
                Region::new(BufId::Recv, o, l)
            } else {
                Region::new(BufId::Scratch, o - base, l)
            }
        };
        let pieces: Vec<Piece> = (0..n)
            .map(|j| {
                let (o, l) = bounds(j);
                Piece {
                    leaf: Region::new(BufId::Send, o, l),
                    acc: at(j),
                    root: j,
                    delay: 0,
                }
            })
            .collect();
        push_reduce(&mut s, &pieces, true);
        let mut gather = Vec::new();
        for j in (0..n).filter(|&j| j != root && bounds(j).1 > 0) {
            if r == root {
                gather.push(Op::Recv {
                    peer: j,
                    dst: at(j),
                });
            } else if r == j {
                gather.push(Op::Send {
                    peer: root,
                    src: at(j),
                });
            }
        }
        s.push(gather);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tree_splits_at_the_largest_power_of_two_below_the_range() {
        assert_eq!(canonical_split(0, 2), 1);
        assert_eq!(canonical_split(0, 8), 4);
        assert_eq!(canonical_split(0, 6), 4);
        assert_eq!(canonical_split(0, 5), 4);
        assert_eq!(canonical_split(4, 7), 6);
        assert_eq!(canonical_split(0, 3), 2);
    }

    #[test]
    fn a_power_of_two_reduces_by_recursive_halving() {
        // 8 ranks, shard 5 onto rank 5: partners at distance 1, 2, 4.
        let h = hops(8, 5, 5);
        let partners: Vec<usize> = h.iter().map(|h| h.from).collect();
        assert_eq!(partners, vec![4, 7, 1]);
        assert!(h.iter().all(|h| h.to == 5));
        assert!(h.last().expect("a hop").root);
    }

    #[test]
    fn every_rank_takes_part_once_per_step_and_every_leaf_is_sent_once() {
        for n in 1..=20 {
            for root in 0..n {
                let mut sends = 0;
                for r in 0..n {
                    let h = hops(n, root, r);
                    let steps: Vec<usize> = h.iter().map(|h| h.step).collect();
                    assert!(steps.windows(2).all(|w| w[0] < w[1]), "{n} {root} {r}");
                    sends += h.iter().filter(|h| h.from == r).count();
                    // Everyone but the root sends exactly once.
                    let sent = h.iter().filter(|h| h.from == r).count();
                    assert_eq!(sent, usize::from(r != root), "{n} {root} {r}");
                }
                assert_eq!(sends, n - 1);
            }
        }
    }
}
