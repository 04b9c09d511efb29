//! Recursive doubling all-reduce for tiny messages: ⌈log2 n⌉ exchanges of the
//! whole vector. Ranks beyond the largest power of two first fold into a
//! partner and get the result back at the end.

use crate::schedule::{BufId, Op, Region, Schedule};

/// Recursive-doubling all-reduce of `count` elements (uses `count` scratch).
pub fn rd_all_reduce(n: usize, r: usize, count: usize) -> Schedule {
    let mut s = Schedule::new(n, r);
    let all = |buf| Region::new(buf, 0, count);
    let pow2 = if n == 0 {
        0
    } else {
        1usize << (usize::BITS - 1 - n.leading_zeros())
    };
    let rem = n - pow2;
    // Fold: among the first 2*rem ranks, even ones hand their data to the
    // odd neighbour and wait for the result.
    if r < 2 * rem && r.is_multiple_of(2) {
        s.push(vec![Op::Send {
            peer: r + 1,
            src: all(BufId::Send),
        }]);
        s.push(vec![Op::Recv {
            peer: r + 1,
            dst: all(BufId::Recv),
        }]);
        return s;
    }
    let newrank = if r < 2 * rem { r / 2 } else { r - rem };
    let real = |nr: usize| if nr < rem { nr * 2 + 1 } else { nr + rem };
    // Where the partial sum lies: the input itself until the first
    // exchange (no copy into the output first), or the output of the fold.
    let mut cur = BufId::Send;
    if r < 2 * rem {
        s.push(vec![Op::RecvReduce {
            peer: r - 1,
            local: all(BufId::Send),
            dst: all(BufId::Recv),
        }]);
        cur = BufId::Recv;
    }
    let mut mask = 1;
    while mask < pow2 {
        let partner = real(newrank ^ mask);
        // An exchange reads `cur` while it writes: never into the output
        // from the input (they are one buffer in place), so the sums
        // alternate scratch, output, scratch, ...
        let other = if cur == BufId::Scratch {
            BufId::Recv
        } else {
            BufId::Scratch
        };
        let mut ops = vec![
            Op::Send {
                peer: partner,
                src: all(cur),
            },
            Op::RecvReduce {
                peer: partner,
                local: all(cur),
                dst: all(other),
            },
        ];
        cur = other;
        mask <<= 1;
        if mask >= pow2 {
            ops.push(Op::Finalize { region: all(cur) });
        }
        s.push(ops);
    }
    let mut tail = Vec::new();
    if cur != BufId::Recv {
        tail.push(Op::Copy {
            src: all(cur),
            dst: all(BufId::Recv),
        });
    }
    if pow2 == 1 {
        // One rank: the copy runs first in the step, then the finalize.
        tail.push(Op::Finalize {
            region: all(BufId::Recv),
        });
    }
    if r < 2 * rem {
        tail.push(Op::Send {
            peer: r - 1,
            src: all(BufId::Recv),
        });
    }
    s.push(tail);
    s
}
