//! Binomial trees (pipelined over chunks) and chains for broadcast, reduce
//! and latency-bound all-reduce.
//!
//! Pipelining: with K chunks and L tree levels, step t carries level
//! `t - k` of chunk k for every chunk in flight, so a rank never talks to the
//! same peer twice in one step and chunks stream down (or up) the tree.

use super::ceil_log2;
use crate::schedule::{BufId, Op, Region, Schedule};

#[derive(Clone, Copy)]
enum Action {
    Idle,
    /// Receive from this virtual rank.
    From(usize),
    /// Send to this virtual rank.
    To(usize),
}

/// Reduce-tree action of virtual rank `vr` at level `l` (mask `1 << l`).
fn reduce_action(n: usize, vr: usize, level: usize) -> Action {
    let mask = 1usize << level;
    if vr & (mask - 1) != 0 {
        Action::Idle // already sent at a lower level
    } else if vr & mask != 0 {
        Action::To(vr - mask)
    } else if vr + mask < n {
        Action::From(vr + mask)
    } else {
        Action::Idle
    }
}

/// Broadcast-tree action of `vr` at level `j` (masks descend).
fn bcast_action(n: usize, vr: usize, levels: usize, j: usize) -> Action {
    let mask = 1usize << (levels - 1 - j);
    if vr.is_multiple_of(2 * mask) {
        if vr + mask < n {
            Action::To(vr + mask)
        } else {
            Action::Idle
        }
    } else if vr.is_multiple_of(mask) {
        Action::From(vr - mask)
    } else {
        Action::Idle
    }
}

fn chunks(count: usize, chunk: usize) -> Vec<(usize, usize)> {
    let chunk = chunk.max(1);
    let mut v = Vec::new();
    let mut o = 0;
    while o < count {
        let l = chunk.min(count - o);
        v.push((o, l));
        o += l;
    }
    v
}

/// Appends a pipelined binomial reduce over `group` toward `group[0]`:
/// inputs are read from `input`, partial sums accumulate in `acc`, and the
/// root's result lands in its `acc`. With `finalize` the root finalizes.
#[allow(clippy::too_many_arguments)]
pub fn push_tree_reduce(
    s: &mut Schedule,
    group: &[usize],
    count: usize,
    chunk: usize,
    input: BufId,
    acc: BufId,
    finalize: bool,
) {
    let n = group.len();
    let vr = group
        .iter()
        .position(|&x| x == s.rank)
        .expect("member of the tree");
    let real = |v: usize| group[v];
    let levels = ceil_log2(n);
    let cs = chunks(count, chunk);
    // Whether this rank has received into `acc` for the chunk yet: all
    // chunks share the same pattern, so it only depends on the level.
    let received_before =
        |level: usize| (0..level).any(|l| matches!(reduce_action(n, vr, l), Action::From(_)));
    let last_recv_level = (0..levels)
        .rev()
        .find(|&l| matches!(reduce_action(n, vr, l), Action::From(_)));
    if levels == 0 {
        let mut ops = vec![Op::Copy {
            src: Region::new(input, 0, count),
            dst: Region::new(acc, 0, count),
        }];
        if finalize {
            ops.push(Op::Finalize {
                region: Region::new(acc, 0, count),
            });
        }
        s.push(ops);
        return;
    }
    for t in 0..cs.len() + levels - 1 {
        let mut ops = Vec::new();
        for (k, &(off, len)) in cs.iter().enumerate() {
            if t < k || t - k >= levels {
                continue;
            }
            let level = t - k;
            let mine = |buf| Region::new(buf, off, len);
            let have = received_before(level);
            match reduce_action(n, vr, level) {
                Action::Idle => {}
                Action::From(c) => {
                    let dst = mine(acc);
                    ops.push(Op::RecvReduce {
                        peer: real(c),
                        local: if have { dst } else { mine(input) },
                        dst,
                    });
                    if finalize && vr == 0 && Some(level) == last_recv_level {
                        ops.push(Op::Finalize { region: dst });
                    }
                }
                Action::To(p) => ops.push(Op::Send {
                    peer: real(p),
                    src: if have { mine(acc) } else { mine(input) },
                }),
            }
        }
        s.push(ops);
    }
}

/// Appends a pipelined binomial broadcast over `group` from `group[0]`,
/// which sends from `src`; every other member receives into `buf` and
/// forwards from there.
pub fn push_tree_broadcast(
    s: &mut Schedule,
    group: &[usize],
    count: usize,
    chunk: usize,
    src: BufId,
    buf: BufId,
) {
    let n = group.len();
    let vr = group
        .iter()
        .position(|&x| x == s.rank)
        .expect("member of the tree");
    let real = |v: usize| group[v];
    let levels = ceil_log2(n);
    let cs = chunks(count, chunk);
    if levels == 0 {
        return;
    }
    for t in 0..cs.len() + levels - 1 {
        let mut ops = Vec::new();
        for (k, &(off, len)) in cs.iter().enumerate() {
            if t < k || t - k >= levels {
                continue;
            }
            match bcast_action(n, vr, levels, t - k) {
                Action::Idle => {}
                Action::From(p) => ops.push(Op::Recv {
                    peer: real(p),
                    dst: Region::new(buf, off, len),
                }),
                Action::To(c) => ops.push(Op::Send {
                    peer: real(c),
                    src: Region::new(if vr == 0 { src } else { buf }, off, len),
                }),
            }
        }
        s.push(ops);
    }
}

/// Binomial-tree broadcast over `group` from `group[0]` (the root's input
/// is copied to its output). `n` is the communicator size.
pub fn tree_broadcast(n: usize, r: usize, group: &[usize], count: usize, chunk: usize) -> Schedule {
    let mut s = Schedule::new(n, r);
    if r == group[0] {
        s.push(vec![Op::Copy {
            src: Region::new(BufId::Send, 0, count),
            dst: Region::new(BufId::Recv, 0, count),
        }]);
    }
    push_tree_broadcast(&mut s, group, count, chunk, BufId::Send, BufId::Recv);
    s
}

/// Binomial-tree reduce over `group` to `group[0]`; other ranks accumulate
/// in scratch.
pub fn tree_reduce(n: usize, r: usize, group: &[usize], count: usize, chunk: usize) -> Schedule {
    let mut s = Schedule::new(n, r);
    let acc = if r == group[0] {
        BufId::Recv
    } else {
        BufId::Scratch
    };
    push_tree_reduce(&mut s, group, count, chunk, BufId::Send, acc, true);
    s
}

/// Tree all-reduce: binomial reduce to `group[0]`, then binomial broadcast.
pub fn tree_all_reduce(
    n: usize,
    r: usize,
    group: &[usize],
    count: usize,
    chunk: usize,
) -> Schedule {
    let mut s = Schedule::new(n, r);
    push_tree_reduce(&mut s, group, count, chunk, BufId::Send, BufId::Recv, true);
    push_tree_broadcast(&mut s, group, count, chunk, BufId::Recv, BufId::Recv);
    s
}

/// Pipelined chain broadcast (root → root+1 → ...), bandwidth-optimal for
/// large messages.
pub fn chain_broadcast(n: usize, r: usize, root: usize, count: usize, chunk: usize) -> Schedule {
    let mut s = Schedule::new(n, r);
    let vr = (r + n - root) % n;
    let next = (r + 1) % n;
    let prev = (r + n - 1) % n;
    let cs = chunks(count, chunk);
    if vr == 0 {
        s.push(vec![Op::Copy {
            src: Region::new(BufId::Send, 0, count),
            dst: Region::new(BufId::Recv, 0, count),
        }]);
    }
    if n == 1 {
        return s;
    }
    // vr receives chunk k at step k + vr - 1 and forwards it at step k + vr.
    for t in 0..cs.len() + n - 1 {
        let mut ops = Vec::new();
        if vr >= 1 && t + 1 >= vr && t + 1 - vr < cs.len() {
            let (o, l) = cs[t + 1 - vr];
            ops.push(Op::Recv {
                peer: prev,
                dst: Region::new(BufId::Recv, o, l),
            });
        }
        if vr + 1 < n && t >= vr && t - vr < cs.len() {
            let (o, l) = cs[t - vr];
            let buf = if vr == 0 { BufId::Send } else { BufId::Recv };
            ops.push(Op::Send {
                peer: next,
                src: Region::new(buf, o, l),
            });
        }
        s.push(ops);
    }
    s
}

/// Pipelined chain reduce toward `root` (root+1 → root+2 → ... → root).
pub fn chain_reduce(n: usize, r: usize, root: usize, count: usize, chunk: usize) -> Schedule {
    let mut s = Schedule::new(n, r);
    // Distance from the far end of the chain: the far end (root+1) has d = 0.
    let d = (r + n - root - 1) % n;
    let toward_root = (r + 1) % n;
    let from_far = (r + n - 1) % n;
    let acc = if r == root {
        BufId::Recv
    } else {
        BufId::Scratch
    };
    let cs = chunks(count, chunk);
    if n == 1 {
        s.push(vec![
            Op::Copy {
                src: Region::new(BufId::Send, 0, count),
                dst: Region::new(acc, 0, count),
            },
            Op::Finalize {
                region: Region::new(acc, 0, count),
            },
        ]);
        return s;
    }
    // Rank at distance d receives chunk k at step k + d - 1 and sends at k + d.
    for t in 0..cs.len() + n - 1 {
        let mut ops = Vec::new();
        if d >= 1 && t + 1 >= d && t + 1 - d < cs.len() {
            let (o, l) = cs[t + 1 - d];
            let dst = Region::new(acc, o, l);
            ops.push(Op::RecvReduce {
                peer: from_far,
                local: Region::new(BufId::Send, o, l),
                dst,
            });
            if r == root {
                ops.push(Op::Finalize { region: dst });
            }
        }
        if r != root && t >= d && t - d < cs.len() {
            let (o, l) = cs[t - d];
            let buf = if d == 0 { BufId::Send } else { acc };
            ops.push(Op::Send {
                peer: toward_root,
                src: Region::new(buf, o, l),
            });
        }
        s.push(ops);
    }
    s
}
