//! Rings over any ordered group of ranks and any partition of a region:
//! reduce-scatter, all-gather and all-reduce. The flat collectives use the
//! group of all ranks in a given order; hierarchical ones use node-local
//! rings and cross-node rings over shards. Large messages are pipelined in
//! blocks of `ring length × chunk` so a block is still in cache when its
//! all-gather half sends it on.

use crate::schedule::{chunk_bounds, BufId, Op, Region, Schedule};

/// A part of a region: `(offset, len)` in elements.
pub type Part = (usize, usize);

fn position(ring: &[usize], rank: usize) -> usize {
    ring.iter()
        .position(|&x| x == rank)
        .expect("rank is a member of the ring")
}

/// Appends a ring reduce-scatter over `ring` (ranks in ring order): at the
/// end, ring position p holds `parts[p]` reduced over the ring in `acc`.
/// Inputs are read from `input`; partial sums live in `acc` at the same
/// offsets. With `finalize`, each owner finalizes its part.
pub fn push_ring_reduce_scatter(
    s: &mut Schedule,
    ring: &[usize],
    parts: &[Part],
    input: BufId,
    acc: BufId,
    finalize: bool,
) {
    let parts: Vec<Vec<Part>> = parts.iter().map(|p| vec![*p]).collect();
    push_ring_reduce_scatter_multi(s, ring, &parts, input, acc, finalize);
}

/// Appends a ring all-gather over `ring`: position p starts with `parts[p]`
/// in `buf` and ends with every part.
pub fn push_ring_all_gather(s: &mut Schedule, ring: &[usize], parts: &[Part], buf: BufId) {
    let parts: Vec<Vec<Part>> = parts.iter().map(|p| vec![*p]).collect();
    push_ring_all_gather_multi(s, ring, &parts, buf);
}

/// Ring reduce-scatter where ring position p owns several parts (each
/// moved as its own message); see [`push_ring_reduce_scatter`].
pub fn push_ring_reduce_scatter_multi(
    s: &mut Schedule,
    ring: &[usize],
    parts: &[Vec<Part>],
    input: BufId,
    acc: BufId,
    finalize: bool,
) {
    let m = ring.len();
    let p = position(ring, s.rank);
    let regs = |i: usize, buf: BufId| -> Vec<Region> {
        parts[i]
            .iter()
            .filter(|(_, l)| *l > 0)
            .map(|&(o, l)| Region::new(buf, o, l))
            .collect()
    };
    if m == 1 {
        let mut ops: Vec<Op> = regs(0, input)
            .into_iter()
            .zip(regs(0, acc))
            .map(|(src, dst)| Op::Copy { src, dst })
            .collect();
        if finalize {
            ops.extend(
                regs(0, acc)
                    .into_iter()
                    .map(|region| Op::Finalize { region }),
            );
        }
        s.push(ops);
        return;
    }
    let next = ring[(p + 1) % m];
    let prev = ring[(p + m - 1) % m];
    for step in 0..m - 1 {
        let sc = (p + 2 * m - step - 1) % m;
        let rc = (p + 2 * m - step - 2) % m;
        let mut ops = Vec::new();
        for src in regs(sc, if step == 0 { input } else { acc }) {
            ops.push(Op::Send { peer: next, src });
        }
        for (local, dst) in regs(rc, input).into_iter().zip(regs(rc, acc)) {
            ops.push(Op::RecvReduce {
                peer: prev,
                local,
                dst,
            });
            if finalize && step == m - 2 {
                ops.push(Op::Finalize { region: dst });
            }
        }
        s.push(ops);
    }
}

/// Ring all-gather where ring position p holds several parts of `buf`.
pub fn push_ring_all_gather_multi(
    s: &mut Schedule,
    ring: &[usize],
    parts: &[Vec<Part>],
    buf: BufId,
) {
    let m = ring.len();
    if m == 1 {
        return;
    }
    let p = position(ring, s.rank);
    let next = ring[(p + 1) % m];
    let prev = ring[(p + m - 1) % m];
    let regs = |i: usize| -> Vec<Region> {
        parts[i]
            .iter()
            .filter(|(_, l)| *l > 0)
            .map(|&(o, l)| Region::new(buf, o, l))
            .collect()
    };
    for step in 0..m - 1 {
        let mut ops = Vec::new();
        for src in regs((p + m - step) % m) {
            ops.push(Op::Send { peer: next, src });
        }
        for dst in regs((p + 2 * m - step - 1) % m) {
            ops.push(Op::Recv { peer: prev, dst });
        }
        s.push(ops);
    }
}

/// Appends a pipelined ring all-reduce over `ring` of the region
/// `[offset, offset + count)`: reads `input`, leaves the result in `out`.
#[allow(clippy::too_many_arguments)]
pub fn push_ring_all_reduce(
    s: &mut Schedule,
    ring: &[usize],
    offset: usize,
    count: usize,
    chunk: usize,
    input: BufId,
    out: BufId,
    finalize: bool,
) {
    let m = ring.len();
    let block = m.saturating_mul(chunk.max(1));
    let mut base = 0;
    while base < count {
        let blen = block.min(count - base);
        let parts: Vec<Part> = (0..m)
            .map(|i| {
                let (o, l) = chunk_bounds(blen, m, i);
                (offset + base + o, l)
            })
            .collect();
        push_ring_reduce_scatter(s, ring, &parts, input, out, finalize);
        push_ring_all_gather(s, ring, &parts, out);
        base += blen;
    }
}

/// Ring all-reduce of `count` elements over the ring `order` (all ranks).
pub fn ring_all_reduce_ordered(order: &[usize], r: usize, count: usize, chunk: usize) -> Schedule {
    let mut s = Schedule::new(order.len(), r);
    push_ring_all_reduce(
        &mut s,
        order,
        0,
        count,
        chunk,
        BufId::Send,
        BufId::Recv,
        true,
    );
    s
}

/// Ring all-reduce of `count` elements over ranks in their given order.
pub fn ring_all_reduce(n: usize, r: usize, count: usize, chunk: usize) -> Schedule {
    let order: Vec<usize> = (0..n).collect();
    ring_all_reduce_ordered(&order, r, count, chunk)
}

/// Ring reduce-scatter over the ring `order`: the input holds one block of
/// `recv_count` elements per rank (in rank order); rank r receives block r.
pub fn ring_reduce_scatter_ordered(
    order: &[usize],
    r: usize,
    recv_count: usize,
    chunk: usize,
) -> Schedule {
    let n = order.len();
    let mut s = Schedule::new(n, r);
    if n == 1 {
        s.push(vec![
            Op::Copy {
                src: Region::new(BufId::Send, 0, recv_count),
                dst: Region::new(BufId::Recv, 0, recv_count),
            },
            Op::Finalize {
                region: Region::new(BufId::Recv, 0, recv_count),
            },
        ]);
        return s;
    }
    let p = position(order, r);
    let next = order[(p + 1) % n];
    let prev = order[(p + n - 1) % n];
    let chunk = chunk.max(1);
    let mut base = 0;
    while base < recv_count {
        let blen = chunk.min(recv_count - base);
        // Partial sums alternate between two scratch halves.
        let scratch = |step: usize| Region::new(BufId::Scratch, (step % 2) * blen, blen);
        let block_of = |pos: usize| order[pos] * recv_count + base;
        for step in 0..n - 1 {
            let sc = (p + 2 * n - step - 1) % n;
            let rc = (p + 2 * n - step - 2) % n;
            let src = if step == 0 {
                Region::new(BufId::Send, block_of(sc), blen)
            } else {
                scratch(step - 1)
            };
            let dst = if step == n - 2 {
                Region::new(BufId::Recv, base, blen)
            } else {
                scratch(step)
            };
            let mut ops = vec![
                Op::Send { peer: next, src },
                Op::RecvReduce {
                    peer: prev,
                    local: Region::new(BufId::Send, block_of(rc), blen),
                    dst,
                },
            ];
            if step == n - 2 {
                ops.push(Op::Finalize { region: dst });
            }
            s.push(ops);
        }
        base += blen;
    }
    s
}

/// Ring reduce-scatter over ranks in their given order.
pub fn ring_reduce_scatter(n: usize, r: usize, recv_count: usize, chunk: usize) -> Schedule {
    let order: Vec<usize> = (0..n).collect();
    ring_reduce_scatter_ordered(&order, r, recv_count, chunk)
}

/// Ring all-gather with per-rank counts over the ring `order`: rank i
/// contributes `counts[i]` elements placed at `displs[i]` of the output.
pub fn ring_all_gatherv_ordered(
    order: &[usize],
    r: usize,
    counts: &[usize],
    displs: &[usize],
    chunk: usize,
) -> Schedule {
    let n = order.len();
    let mut s = Schedule::new(n, r);
    let own = Op::Copy {
        src: Region::new(BufId::Send, 0, counts[r]),
        dst: Region::new(BufId::Recv, displs[r], counts[r]),
    };
    if n == 1 {
        s.push(vec![own]);
        return s;
    }
    let p = position(order, r);
    let next = order[(p + 1) % n];
    let prev = order[(p + n - 1) % n];
    let chunk = chunk.max(1);
    let longest = counts.iter().copied().max().unwrap_or(0);
    let mut base = 0;
    let mut first = true;
    while base < longest || first {
        let piece = |pos: usize, own_buf: bool| {
            let i = order[pos];
            let start = base.min(counts[i]);
            let len = (counts[i] - start).min(chunk);
            if own_buf {
                Region::new(BufId::Send, start, len)
            } else {
                Region::new(BufId::Recv, displs[i] + start, len)
            }
        };
        for step in 0..n - 1 {
            let sc = (p + n - step) % n;
            let rc = (p + 2 * n - step - 1) % n;
            let src = piece(sc, sc == p);
            let dst = piece(rc, false);
            let mut ops = Vec::with_capacity(3);
            if first && step == 0 {
                ops.push(own);
            }
            if src.len > 0 {
                ops.push(Op::Send { peer: next, src });
            }
            if dst.len > 0 {
                ops.push(Op::Recv { peer: prev, dst });
            }
            s.push(ops);
        }
        first = false;
        base += chunk;
    }
    s
}

/// Ring all-gather with per-rank counts over ranks in their given order.
pub fn ring_all_gatherv(
    n: usize,
    r: usize,
    counts: &[usize],
    displs: &[usize],
    chunk: usize,
) -> Schedule {
    let order: Vec<usize> = (0..n).collect();
    ring_all_gatherv_ordered(&order, r, counts, displs, chunk)
}
