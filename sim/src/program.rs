//! Compact programs: a rank's [`Schedule`] reduced to what costs time —
//! per step, the messages (peer, bytes, direction), the bytes copied
//! locally (done before the step's messages, as the executor does) and the
//! bytes reduced on receipt (done piece by piece as the data arrives, so
//! overlapped with the transfer) — with consecutive alike steps stored once
//! with a repeat count.

use comm_core::schedule::{Op, Schedule};

/// One message of a step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Msg {
    /// The other rank.
    pub peer: u32,
    /// Bytes carried.
    pub bytes: f64,
    /// Whether this rank sends (else receives).
    pub send: bool,
}

/// Consecutive alike steps: `repeat` times the messages `msgs`.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    /// Messages of one step (bytes are the mean over the merged steps).
    pub msgs: Vec<Msg>,
    /// Bytes copied locally (`Copy`) in one step, before its messages.
    pub local_bytes: f64,
    /// Bytes reduced on receipt (`RecvReduce`) in one step, overlapped
    /// with the step's transfers.
    pub reduce_bytes: f64,
    /// How many steps.
    pub repeat: u32,
}

/// A compact program.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Program {
    /// Runs in order.
    pub runs: Vec<Run>,
}

impl Program {
    /// Steps in all.
    pub fn steps(&self) -> u64 {
        self.runs.iter().map(|r| u64::from(r.repeat)).sum()
    }

    /// From a schedule of elements of `elem` bytes. Steps merge when their
    /// messages have the same peers and directions and their sizes differ by
    /// at most `tolerance` (relative) plus one element; `tolerance < 0` merges
    /// only identical steps.
    pub fn from_schedule(s: &Schedule, elem: usize, tolerance: f64) -> Program {
        let e = elem as f64;
        let mut runs: Vec<Run> = Vec::new();
        // Running sums of the current run's message bytes, for the mean.
        let mut sums: Vec<f64> = Vec::new();
        for step in &s.steps {
            let mut msgs = Vec::new();
            let mut local = 0.0;
            let mut reduce = 0.0;
            for op in &step.ops {
                match *op {
                    Op::Send { peer, src } => msgs.push(Msg {
                        peer: peer as u32,
                        bytes: src.len as f64 * e,
                        send: true,
                    }),
                    Op::Recv { peer, dst } => msgs.push(Msg {
                        peer: peer as u32,
                        bytes: dst.len as f64 * e,
                        send: false,
                    }),
                    Op::RecvReduce { peer, dst, .. } => {
                        msgs.push(Msg {
                            peer: peer as u32,
                            bytes: dst.len as f64 * e,
                            send: false,
                        });
                        reduce += dst.len as f64 * e;
                    }
                    Op::Copy { src, .. } => local += src.len as f64 * e,
                    Op::Finalize { .. } => {}
                }
            }
            let alike = |r: &Run| {
                r.msgs.len() == msgs.len()
                    && (r.local_bytes - local).abs() <= tolerance.max(0.0) * local + e
                    && (r.reduce_bytes - reduce).abs() <= tolerance.max(0.0) * reduce + e
                    && (tolerance >= 0.0 || (r.local_bytes == local && r.reduce_bytes == reduce))
                    && r.msgs.iter().zip(&msgs).all(|(a, b)| {
                        a.peer == b.peer
                            && a.send == b.send
                            && if tolerance < 0.0 {
                                a.bytes == b.bytes
                            } else {
                                (a.bytes - b.bytes).abs() <= tolerance * a.bytes.max(b.bytes) + e
                            }
                    })
            };
            match runs.last_mut() {
                Some(r) if alike(r) => {
                    r.repeat += 1;
                    for (s, m) in sums.iter_mut().zip(&msgs) {
                        *s += m.bytes;
                    }
                    let k = f64::from(r.repeat);
                    for (m, s) in r.msgs.iter_mut().zip(&sums) {
                        m.bytes = s / k;
                    }
                }
                _ => {
                    sums = msgs.iter().map(|m| m.bytes).collect();
                    runs.push(Run {
                        msgs,
                        local_bytes: local,
                        reduce_bytes: reduce,
                        repeat: 1,
                    });
                }
            }
        }
        Program { runs }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use comm_core::algo::ring_all_reduce;

    #[test]
    fn ring_steps_merge_and_keep_bytes() {
        let s = ring_all_reduce(4, 1, 1003, 1 << 20);
        let exact = Program::from_schedule(&s, 4, -1.0);
        let merged = Program::from_schedule(&s, 4, 0.02);
        assert_eq!(exact.steps(), merged.steps());
        assert!(merged.runs.len() < exact.runs.len() || exact.runs.len() <= 2);
        let total = |p: &Program| -> f64 {
            p.runs
                .iter()
                .map(|r| r.msgs.iter().map(|m| m.bytes).sum::<f64>() * f64::from(r.repeat))
                .sum()
        };
        assert!((total(&exact) - total(&merged)).abs() < 1e-6);
        // 2 (n-1) steps of one send and one receive of ~count/n elements.
        assert_eq!(exact.steps(), 6);
        assert!((total(&exact) - 2.0 * 6.0 * 1003.0 / 4.0 * 4.0).abs() < 64.0);
    }
}
