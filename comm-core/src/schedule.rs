//! Schedules are pure data: for one rank, a list of steps, each a set of
//! operations that progress concurrently. The executor walks them over real
//! connections; the checker ([`crate::check`]) walks them symbolically.
//!
//! Semantics of one step: its `Copy` operations run first, then every
//! communication operation progresses concurrently (piece by piece), then its
//! `Finalize` operations run. The next step starts when all of them are done.
//! Messages between two ranks are matched in order: the k-th `Send` from a to
//! b feeds the k-th receiving op at b from a. Regions are in elements of the
//! operation's data type.

/// Which buffer a region lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BufId {
    /// The caller's input buffer.
    Send,
    /// The caller's output buffer (the same memory as `Send` when in place).
    Recv,
    /// Communicator-owned scratch of [`Schedule::scratch_elems`] elements.
    Scratch,
    /// The k-th caller buffer of a point-to-point group.
    Peer(u16),
}

/// A contiguous range of elements in one buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Region {
    /// The buffer.
    pub buf: BufId,
    /// First element.
    pub offset: usize,
    /// Number of elements.
    pub len: usize,
}

impl Region {
    /// Shorthand constructor.
    pub const fn new(buf: BufId, offset: usize, len: usize) -> Region {
        Region { buf, offset, len }
    }

    /// One past the last element.
    pub const fn end(&self) -> usize {
        self.offset + self.len
    }

    /// Whether two regions share an element (same buffer id only).
    pub fn overlaps(&self, other: &Region) -> bool {
        self.buf == other.buf
            && self.len > 0
            && other.len > 0
            && self.offset < other.end()
            && other.offset < self.end()
    }
}

/// One operation of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Send `src` to `peer`.
    Send {
        /// Destination rank.
        peer: usize,
        /// Data sent.
        src: Region,
    },
    /// Receive from `peer` into `dst`.
    Recv {
        /// Source rank.
        peer: usize,
        /// Where the data lands.
        dst: Region,
    },
    /// Receive from `peer` and store `local ⊕ incoming` into `dst`
    /// (`local` and `dst` may be the same region). The reduction reads the
    /// incoming data where the transport holds it.
    RecvReduce {
        /// Source rank.
        peer: usize,
        /// This rank's operand.
        local: Region,
        /// Result.
        dst: Region,
    },
    /// Local copy, run at the start of the step.
    Copy {
        /// From.
        src: Region,
        /// To.
        dst: Region,
    },
    /// Apply the operator's final step (division by the rank count for
    /// `Avg`; nothing otherwise) at the end of the step.
    Finalize {
        /// The fully reduced region.
        region: Region,
    },
}

impl Op {
    /// The peer this op talks to, if any.
    pub fn peer(&self) -> Option<usize> {
        match *self {
            Op::Send { peer, .. } | Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } => {
                Some(peer)
            }
            Op::Copy { .. } | Op::Finalize { .. } => None,
        }
    }
}

/// One step: operations that progress together.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Step {
    /// The operations.
    pub ops: Vec<Op>,
}

/// One rank's part of a collective.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Ranks in the communicator.
    pub nranks: usize,
    /// This rank.
    pub rank: usize,
    /// The steps, in order.
    pub steps: Vec<Step>,
    /// Scratch elements the schedule uses.
    pub scratch_elems: usize,
}

impl Schedule {
    /// An empty schedule.
    pub fn new(nranks: usize, rank: usize) -> Schedule {
        Schedule {
            nranks,
            rank,
            steps: Vec::new(),
            scratch_elems: 0,
        }
    }

    /// Appends a step, dropping empty data ops (zero-length sends and
    /// receives are kept: they carry synchronisation). Empty steps vanish.
    pub fn push(&mut self, ops: Vec<Op>) {
        let ops: Vec<Op> = ops
            .into_iter()
            .filter(|op| match op {
                Op::Copy { src, .. } => src.len > 0,
                Op::Finalize { region } => region.len > 0,
                _ => true,
            })
            .collect();
        for op in &ops {
            if let Op::RecvReduce { local, dst, .. } | Op::Copy { src: local, dst } = op {
                if let Region {
                    buf: BufId::Scratch,
                    ..
                } = dst
                {
                    self.scratch_elems = self.scratch_elems.max(dst.end());
                }
                if local.buf == BufId::Scratch {
                    self.scratch_elems = self.scratch_elems.max(local.end());
                }
            }
            if let Op::Recv { dst, .. } = op {
                if dst.buf == BufId::Scratch {
                    self.scratch_elems = self.scratch_elems.max(dst.end());
                }
            }
        }
        if !ops.is_empty() {
            self.steps.push(Step { ops });
        }
    }
}

/// What running a schedule over memory the host cannot read needs beside
/// the operation's buffers, in elements ([`Schedule::staging_needs`]).
/// For every algorithm of the collectives the device path runs, each need
/// is at most the operation's footprint (the larger of its send and receive
/// extents): `tests/staging_needs.rs` walks them, and the device path sizes
/// the staging it allocates at bind by that bound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StagingNeeds {
    /// Scratch elements ([`Schedule::scratch_elems`]).
    pub scratch: usize,
    /// The most elements one step sends, each distinct region counted once
    /// (what its send staging holds at a time).
    pub step_sends: usize,
    /// The longest region any op reads or writes (a received piece, or a
    /// copy between overlapping regions, never exceeds it).
    pub region: usize,
}

impl Schedule {
    /// The staging this schedule needs (see [`StagingNeeds`]).
    pub fn staging_needs(&self) -> StagingNeeds {
        let mut needs = StagingNeeds {
            scratch: self.scratch_elems,
            ..StagingNeeds::default()
        };
        let mut sent: Vec<Region> = Vec::new();
        for step in &self.steps {
            sent.clear();
            for op in &step.ops {
                let longest = match *op {
                    Op::Send { src, .. } => {
                        if !sent.contains(&src) {
                            sent.push(src);
                        }
                        src.len
                    }
                    Op::Recv { dst, .. } | Op::Finalize { region: dst } => dst.len,
                    Op::RecvReduce { local, dst, .. } => local.len.max(dst.len),
                    Op::Copy { src, dst } => src.len.max(dst.len),
                };
                needs.region = needs.region.max(longest);
            }
            let step_sends = sent.iter().map(|r| r.len).sum();
            needs.step_sends = needs.step_sends.max(step_sends);
        }
        needs
    }
}

/// Splits `count` elements into `parts` nearly equal contiguous chunks:
/// returns `(offset, len)` of chunk `i` (the first `count % parts` chunks are
/// one longer).
pub fn chunk_bounds(count: usize, parts: usize, i: usize) -> (usize, usize) {
    let base = count / parts;
    let extra = count % parts;
    let len = base + usize::from(i < extra);
    let offset = i * base + i.min(extra);
    (offset, len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_everything() {
        for count in [0, 1, 7, 64, 1000] {
            for parts in 1..10 {
                let mut next = 0;
                for i in 0..parts {
                    let (o, l) = chunk_bounds(count, parts, i);
                    assert_eq!(o, next);
                    next = o + l;
                }
                assert_eq!(next, count);
            }
        }
    }
}
