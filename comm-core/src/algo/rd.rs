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
    if r < 2 * rem {
        s.push(vec![Op::RecvReduce {
            peer: r - 1,
            local: all(BufId::Send),
            dst: all(BufId::Recv),
        }]);
    } else {
        s.push(vec![Op::Copy {
            src: all(BufId::Send),
            dst: all(BufId::Recv),
        }]);
    }
    let mut cur = BufId::Recv;
    let mut mask = 1;
    while mask < pow2 {
        let partner = real(newrank ^ mask);
        let other = if cur == BufId::Recv {
            BufId::Scratch
        } else {
            BufId::Recv
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
    if pow2 == 1 {
        s.push(vec![Op::Finalize {
            region: all(BufId::Recv),
        }]);
    }
    let mut tail = Vec::new();
    if cur != BufId::Recv {
        tail.push(Op::Copy {
            src: all(cur),
            dst: all(BufId::Recv),
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
