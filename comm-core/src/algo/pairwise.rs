//! Direct exchanges: pairwise all-to-all, gather, scatter, and the
//! dissemination barrier.

use super::{ceil_log2, Transfer};
use crate::schedule::{BufId, Op, Region, Schedule};

/// Pairwise all-to-all with per-peer counts: at step k rank r sends its block
/// for `r + k` and receives the block of `r - k`.
pub fn alltoallv(
    n: usize,
    r: usize,
    send_counts: &[usize],
    send_displs: &[usize],
    recv_counts: &[usize],
    recv_displs: &[usize],
) -> Schedule {
    let mut s = Schedule::new(n, r);
    s.push(vec![Op::Copy {
        src: Region::new(BufId::Send, send_displs[r], send_counts[r]),
        dst: Region::new(BufId::Recv, recv_displs[r], recv_counts[r]),
    }]);
    for k in 1..n {
        let to = (r + k) % n;
        let from = (r + n - k) % n;
        let mut ops = Vec::with_capacity(2);
        if send_counts[to] > 0 {
            ops.push(Op::Send {
                peer: to,
                src: Region::new(BufId::Send, send_displs[to], send_counts[to]),
            });
        }
        if recv_counts[from] > 0 {
            ops.push(Op::Recv {
                peer: from,
                dst: Region::new(BufId::Recv, recv_displs[from], recv_counts[from]),
            });
        }
        s.push(ops);
    }
    s
}

/// Gather to `root`: rank i's `count` elements land at `i × count`.
pub fn gather(n: usize, r: usize, root: usize, count: usize) -> Schedule {
    let mut s = Schedule::new(n, r);
    if count == 0 {
        return s;
    }
    if r == root {
        let mut ops = vec![Op::Copy {
            src: Region::new(BufId::Send, 0, count),
            dst: Region::new(BufId::Recv, r * count, count),
        }];
        for k in 1..n {
            let peer = (r + k) % n;
            ops.push(Op::Recv {
                peer,
                dst: Region::new(BufId::Recv, peer * count, count),
            });
        }
        s.push(ops);
    } else {
        s.push(vec![Op::Send {
            peer: root,
            src: Region::new(BufId::Send, 0, count),
        }]);
    }
    s
}

/// Scatter from `root`: rank i receives the root's block `i × count`.
pub fn scatter(n: usize, r: usize, root: usize, count: usize) -> Schedule {
    let mut s = Schedule::new(n, r);
    if count == 0 {
        return s;
    }
    if r == root {
        let mut ops = vec![Op::Copy {
            src: Region::new(BufId::Send, r * count, count),
            dst: Region::new(BufId::Recv, 0, count),
        }];
        for k in 1..n {
            let peer = (r + k) % n;
            ops.push(Op::Send {
                peer,
                src: Region::new(BufId::Send, peer * count, count),
            });
        }
        s.push(ops);
    } else {
        s.push(vec![Op::Recv {
            peer: root,
            dst: Region::new(BufId::Recv, 0, count),
        }]);
    }
    s
}

/// Dissemination barrier: ⌈log2 n⌉ rounds of empty messages to `r + 2^k`.
pub fn barrier(n: usize, r: usize) -> Schedule {
    let mut s = Schedule::new(n, r);
    for k in 0..ceil_log2(n) {
        let d = 1usize << k;
        let empty = Region::new(BufId::Send, 0, 0);
        s.push(vec![
            Op::Send {
                peer: (r + d) % n,
                src: empty,
            },
            Op::Recv {
                peer: (r + n - d) % n,
                dst: Region::new(BufId::Recv, 0, 0),
            },
        ]);
    }
    s
}

/// A point-to-point group as one step: every transfer progresses at once,
/// the k-th on the group's k-th buffer.
pub fn p2p_group(n: usize, r: usize, transfers: &[Transfer]) -> Schedule {
    let mut s = Schedule::new(n, r);
    let ops = transfers
        .iter()
        .enumerate()
        .map(|(k, t)| {
            let reg = Region::new(BufId::Peer(k as u16), 0, t.len);
            if t.is_send {
                Op::Send {
                    peer: t.peer,
                    src: reg,
                }
            } else {
                Op::Recv {
                    peer: t.peer,
                    dst: reg,
                }
            }
        })
        .collect();
    s.push(ops);
    s
}
