//! Ring reduce-scatter, all-gather and all-reduce, pipelined over blocks of
//! `nranks × chunk` elements so a block's data is still in cache when the
//! all-gather half sends it on.

use crate::schedule::{chunk_bounds, BufId, Op, Region, Schedule};

/// Ring all-reduce of `count` elements.
pub fn ring_all_reduce(n: usize, r: usize, count: usize, chunk: usize) -> Schedule {
    let mut s = Schedule::new(n, r);
    if n == 1 {
        s.push(vec![
            Op::Copy {
                src: Region::new(BufId::Send, 0, count),
                dst: Region::new(BufId::Recv, 0, count),
            },
            Op::Finalize {
                region: Region::new(BufId::Recv, 0, count),
            },
        ]);
        return s;
    }
    let next = (r + 1) % n;
    let prev = (r + n - 1) % n;
    let block = n.saturating_mul(chunk.max(1));
    let mut base = 0;
    while base < count {
        let blen = block.min(count - base);
        let part = |i: usize, buf: BufId| {
            let (o, l) = chunk_bounds(blen, n, i);
            Region::new(buf, base + o, l)
        };
        // Reduce-scatter: after n-1 steps rank r owns chunk r+1.
        for step in 0..n - 1 {
            let sc = (r + n - step) % n;
            let rc = (r + 2 * n - step - 1) % n;
            let src = part(sc, if step == 0 { BufId::Send } else { BufId::Recv });
            let dst = part(rc, BufId::Recv);
            let mut ops = Vec::with_capacity(3);
            if src.len > 0 {
                ops.push(Op::Send { peer: next, src });
            }
            if dst.len > 0 {
                ops.push(Op::RecvReduce {
                    peer: prev,
                    local: part(rc, BufId::Send),
                    dst,
                });
                if step == n - 2 {
                    ops.push(Op::Finalize { region: dst });
                }
            }
            s.push(ops);
        }
        // All-gather of the reduced chunks.
        for step in 0..n - 1 {
            let sc = (r + 1 + n - step) % n;
            let rc = (r + n - step) % n;
            let src = part(sc, BufId::Recv);
            let dst = part(rc, BufId::Recv);
            let mut ops = Vec::with_capacity(2);
            if src.len > 0 {
                ops.push(Op::Send { peer: next, src });
            }
            if dst.len > 0 {
                ops.push(Op::Recv { peer: prev, dst });
            }
            s.push(ops);
        }
        base += blen;
    }
    s
}

/// Ring reduce-scatter: the input holds `n × recv_count` elements, rank r
/// receives block r reduced over all ranks.
pub fn ring_reduce_scatter(n: usize, r: usize, recv_count: usize, chunk: usize) -> Schedule {
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
    let next = (r + 1) % n;
    let prev = (r + n - 1) % n;
    let chunk = chunk.max(1);
    let mut base = 0;
    while base < recv_count {
        let blen = chunk.min(recv_count - base);
        // Partial sums alternate between two scratch halves.
        let scratch = |step: usize| Region::new(BufId::Scratch, (step % 2) * blen, blen);
        for step in 0..n - 1 {
            let sc = (r + 2 * n - step - 1) % n;
            let rc = (r + 2 * n - step - 2) % n;
            let src = if step == 0 {
                Region::new(BufId::Send, sc * recv_count + base, blen)
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
                    local: Region::new(BufId::Send, rc * recv_count + base, blen),
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

/// Ring all-gather with per-rank counts: rank i contributes `counts[i]`
/// elements placed at `displs[i]` of the output.
pub fn ring_all_gatherv(
    n: usize,
    r: usize,
    counts: &[usize],
    displs: &[usize],
    chunk: usize,
) -> Schedule {
    let mut s = Schedule::new(n, r);
    let own = Op::Copy {
        src: Region::new(BufId::Send, 0, counts[r]),
        dst: Region::new(BufId::Recv, displs[r], counts[r]),
    };
    if n == 1 {
        s.push(vec![own]);
        return s;
    }
    let next = (r + 1) % n;
    let prev = (r + n - 1) % n;
    let chunk = chunk.max(1);
    let longest = counts.iter().copied().max().unwrap_or(0);
    let mut base = 0;
    let mut first = true;
    while base < longest || first {
        let piece = |i: usize, buf: BufId| {
            let start = base.min(counts[i]);
            let len = (counts[i] - start).min(chunk);
            match buf {
                BufId::Send => Region::new(BufId::Send, start, len),
                _ => Region::new(buf, displs[i] + start, len),
            }
        };
        for step in 0..n - 1 {
            let sc = (r + n - step) % n;
            let rc = (r + 2 * n - step - 1) % n;
            let src = piece(sc, if sc == r { BufId::Send } else { BufId::Recv });
            let dst = piece(rc, BufId::Recv);
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
