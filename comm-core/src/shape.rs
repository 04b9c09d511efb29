//! One description of an operation's shape: the collective, its element
//! type, count, world and root, and from them every rank's buffer extents,
//! the in-place layout and the checks (root range, addressable size). The
//! Rust API, the runtime's checks, the C ABI and commbench all read extents
//! from here instead of working them out themselves.
//!
//! [`OpShape::fingerprint`] is what every piece of the operation carries
//! on the wire, so peers that disagree on any of it find out.
//!
//! `count` is what NCCL's signatures count: the elements of one rank's
//! block for the collectives whose buffers hold one block per rank
//! ([`OpShape::per_rank`]: all-gather's `sendcount`, reduce-scatter's
//! `recvcount`, all-to-all, gather and scatter), else of the whole buffer.

use crate::wire::{Collective, Fingerprint};
use crate::{DataType, ReduceOp};

/// Why an operation's shape is not acceptable. The texts are the ones users
/// see inside the caller's error (which names the rank and the operation).
/// The largest buffer one operation reads or writes, in bytes (512 GiB:
/// more than any accelerator's memory). A larger count is refused before
/// anything is planned or allocated, so a wrong count (a corrupted
/// argument, an element count passed as bytes twice over) is an error, not
/// gigabytes of schedule.
pub const MAX_MESSAGE_BYTES: usize = 1 << 39;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    /// A rooted collective's root is not a rank of the communicator.
    #[error("root {root} is out of range for {nranks} ranks")]
    RootOutOfRange {
        /// The root given.
        root: usize,
        /// Ranks in the communicator.
        nranks: usize,
    },
    /// A buffer of `count × mult` elements would exceed
    /// [`MAX_MESSAGE_BYTES`] (or not be addressable).
    #[error("{what} of {count} × {mult} elements is too large: one operation moves at most {MAX_MESSAGE_BYTES} bytes (512 GiB) per buffer")]
    TooLarge {
        /// The count's name ([`OpShape::count_name`]).
        what: &'static str,
        /// The count.
        count: usize,
        /// Blocks per buffer (the rank count, or 1).
        mult: usize,
    },
    /// A buffer does not hold the elements the shape needs on this rank.
    #[error("{what} has {got} elements, expected {want}")]
    Length {
        /// Which buffer (`send`, `recv`).
        what: &'static str,
        /// Its length.
        got: usize,
        /// The extent the shape needs.
        want: usize,
    },
}

/// Where an in-place operation reads and writes inside its one buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InPlace {
    /// The buffer's length in elements.
    pub elems: usize,
    /// Where this rank's input starts (all-gather: its block).
    pub input_at: usize,
    /// Where this rank's output starts (reduce-scatter: its block).
    pub output_at: usize,
}

/// The shape of one collective operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OpShape {
    /// The collective.
    pub coll: Collective,
    /// Element type.
    pub dtype: DataType,
    /// Element count (see the module documentation).
    pub count: usize,
    /// Ranks in the communicator.
    pub nranks: usize,
    /// Root (rooted collectives; 0 otherwise).
    pub root: usize,
}

impl OpShape {
    /// A shape with root 0.
    pub fn new(coll: Collective, dtype: DataType, count: usize, nranks: usize) -> OpShape {
        OpShape {
            coll,
            dtype,
            count,
            nranks,
            root: 0,
        }
    }

    /// The same shape with `root`.
    pub fn with_root(self, root: usize) -> OpShape {
        OpShape { root, ..self }
    }

    /// Whether `count` is one rank's block of a buffer that holds one block
    /// per rank.
    pub fn per_rank(&self) -> bool {
        matches!(
            self.coll,
            Collective::AllGather
                | Collective::ReduceScatter
                | Collective::AllToAll
                | Collective::Gather
                | Collective::Scatter
        )
    }

    /// The count's name as NCCL's signature calls it (in error texts).
    pub fn count_name(&self) -> &'static str {
        match self.coll {
            Collective::AllGather => "sendcount",
            Collective::ReduceScatter => "recvcount",
            _ => "count",
        }
    }

    /// Checks the root (rooted collectives) and that the largest buffer
    /// (`count`, or `nranks × count` per rank) is addressable in bytes.
    pub fn check(&self) -> Result<(), ShapeError> {
        if self.coll.is_rooted() && self.root >= self.nranks {
            return Err(ShapeError::RootOutOfRange {
                root: self.root,
                nranks: self.nranks,
            });
        }
        let mult = if self.per_rank() { self.nranks } else { 1 };
        self.count
            .checked_mul(mult)
            .and_then(|e| e.checked_mul(self.dtype.size()))
            .filter(|&b| b <= MAX_MESSAGE_BYTES)
            .map(|_| ())
            .ok_or(ShapeError::TooLarge {
                what: self.count_name(),
                count: self.count,
                mult,
            })
    }

    /// The fingerprint every piece of the operation carries, with the
    /// reduction `op` (reducing collectives; `Sum` stands for none). The
    /// count is 0 where the counts are per peer (the V collectives,
    /// point-to-point groups) or there is none (barrier); the root is -1
    /// for collectives without one.
    pub fn fingerprint(&self, op: ReduceOp) -> Fingerprint {
        Fingerprint {
            collective: self.coll,
            dtype: self.dtype,
            op: if self.coll.is_reducing() {
                op
            } else {
                ReduceOp::Sum
            },
            root: if self.coll.is_rooted() {
                i32::try_from(self.root).unwrap_or(i32::MAX)
            } else {
                -1
            },
            count: match self.coll {
                Collective::AllGatherV
                | Collective::AllToAllV
                | Collective::SendRecv
                | Collective::Barrier => 0,
                _ => self.count as u64,
            },
            settings: 0,
        }
    }

    fn all(&self) -> usize {
        self.count.saturating_mul(self.nranks)
    }

    /// Elements of the send buffer `rank` reads (0 where it reads none:
    /// broadcast and scatter off the root; the V collectives, point-to-point
    /// and barrier, whose extents come from their counts).
    pub fn send_elems(&self, rank: usize) -> usize {
        if !self.uses_send(rank) {
            return 0;
        }
        match self.coll {
            Collective::AllReduce
            | Collective::AllGather
            | Collective::Reduce
            | Collective::Gather
            | Collective::Broadcast => self.count,
            Collective::ReduceScatter | Collective::AllToAll | Collective::Scatter => self.all(),
            _ => 0,
        }
    }

    /// Elements of the receive buffer `rank` writes (0 where it writes
    /// none: reduce and gather off the root; as [`OpShape::send_elems`]
    /// for the V collectives, point-to-point and barrier).
    pub fn recv_elems(&self, rank: usize) -> usize {
        if !self.uses_recv(rank) {
            return 0;
        }
        match self.coll {
            Collective::AllReduce
            | Collective::ReduceScatter
            | Collective::Broadcast
            | Collective::Scatter
            | Collective::Reduce => self.count,
            Collective::AllGather | Collective::AllToAll | Collective::Gather => self.all(),
            _ => 0,
        }
    }

    /// Whether `rank` reads its send buffer.
    pub fn uses_send(&self, rank: usize) -> bool {
        !(matches!(self.coll, Collective::Broadcast | Collective::Scatter) && rank != self.root)
    }

    /// Whether `rank` writes its receive buffer.
    pub fn uses_recv(&self, rank: usize) -> bool {
        !(matches!(self.coll, Collective::Reduce | Collective::Gather) && rank != self.root)
    }

    /// The layout of the in-place form on `rank` (one buffer for input and
    /// output), for the collectives that have one: all-reduce, broadcast
    /// and reduce use the whole buffer; reduce-scatter reads `nranks ×
    /// count` and leaves this rank's block at `rank × count`; all-gather
    /// takes this rank's block from `rank × count`.
    pub fn in_place(&self, rank: usize) -> Option<InPlace> {
        let (c, block) = (self.count, rank.saturating_mul(self.count));
        let (elems, input_at, output_at) = match self.coll {
            Collective::AllReduce | Collective::Broadcast | Collective::Reduce => (c, 0, 0),
            Collective::ReduceScatter => (self.all(), 0, block),
            Collective::AllGather => (self.all(), block, 0),
            _ => return None,
        };
        Some(InPlace {
            elems,
            input_at,
            output_at,
        })
    }

    /// Checks the lengths of the buffers `rank` uses against the shape
    /// (exactly: a longer buffer is as likely a mistake as a shorter one).
    pub fn check_buffers(
        &self,
        rank: usize,
        send_len: usize,
        recv_len: usize,
    ) -> Result<(), ShapeError> {
        for (what, used, got, want) in [
            (
                "send",
                self.uses_send(rank),
                send_len,
                self.send_elems(rank),
            ),
            (
                "recv",
                self.uses_recv(rank),
                recv_len,
                self.recv_elems(rank),
            ),
        ] {
            if used && got != want {
                return Err(ShapeError::Length { what, got, want });
            }
        }
        Ok(())
    }
}

/// The extent of a variable-count buffer: the largest `counts[i] +
/// displs[i]` (saturating, so an overflowing pair fails any length check).
pub fn v_extent(counts: &[usize], displs: &[usize]) -> usize {
    counts
        .iter()
        .zip(displs)
        .map(|(c, d)| c.saturating_add(*d))
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const F32: DataType = DataType::Float32;

    #[test]
    fn extents_per_collective_and_rank() {
        let s = |coll| OpShape::new(coll, F32, 5, 4).with_root(2);
        let table = [
            (Collective::AllReduce, [(5, 5), (5, 5)]),
            (Collective::ReduceScatter, [(20, 5), (20, 5)]),
            (Collective::AllGather, [(5, 20), (5, 20)]),
            (Collective::Broadcast, [(5, 5), (0, 5)]),
            (Collective::Reduce, [(5, 5), (5, 0)]),
            (Collective::AllToAll, [(20, 20), (20, 20)]),
            (Collective::Gather, [(5, 20), (5, 0)]),
            (Collective::Scatter, [(20, 5), (0, 5)]),
            (Collective::Barrier, [(0, 0), (0, 0)]),
        ];
        for (coll, [root, other]) in table {
            let sh = s(coll);
            assert_eq!((sh.send_elems(2), sh.recv_elems(2)), root, "{coll:?} root");
            assert_eq!((sh.send_elems(1), sh.recv_elems(1)), other, "{coll:?}");
        }
    }

    #[test]
    fn checks_say_what_is_wrong() {
        let b = OpShape::new(Collective::Broadcast, F32, 5, 4).with_root(4);
        assert_eq!(
            b.check().unwrap_err().to_string(),
            "root 4 is out of range for 4 ranks"
        );
        // Non-rooted collectives ignore the root.
        OpShape::new(Collective::AllReduce, F32, 5, 4)
            .with_root(9)
            .check()
            .unwrap();
        let big = OpShape::new(Collective::AllGather, F32, usize::MAX / 8, 4);
        assert_eq!(
            big.check().unwrap_err().to_string(),
            format!(
                "sendcount of {} × 4 elements is too large: one operation moves at most \
                 {MAX_MESSAGE_BYTES} bytes (512 GiB) per buffer",
                usize::MAX / 8
            )
        );
        // The largest message passes; one element more does not.
        let at_max = OpShape::new(Collective::AllReduce, F32, MAX_MESSAGE_BYTES / 4, 4);
        at_max.check().unwrap();
        let past = OpShape::new(Collective::AllReduce, F32, MAX_MESSAGE_BYTES / 4 + 1, 4);
        assert!(past.check().is_err());
        let g = OpShape::new(Collective::Gather, F32, 3, 2).with_root(1);
        g.check_buffers(0, 3, 999).unwrap();
        assert_eq!(
            g.check_buffers(1, 3, 5).unwrap_err().to_string(),
            "recv has 5 elements, expected 6"
        );
        assert_eq!(
            g.check_buffers(0, 4, 0).unwrap_err().to_string(),
            "send has 4 elements, expected 3"
        );
    }

    #[test]
    fn fingerprints_keep_what_peers_must_agree_on() {
        let r = OpShape::new(Collective::Reduce, F32, 5, 4).with_root(2);
        let f = r.fingerprint(ReduceOp::Max);
        assert_eq!((f.root, f.count, f.op), (2, 5, ReduceOp::Max));
        let a = OpShape::new(Collective::AllGather, F32, 5, 4).with_root(3);
        let f = a.fingerprint(ReduceOp::Max);
        assert_eq!((f.root, f.count, f.op), (-1, 5, ReduceOp::Sum));
        let p = OpShape::new(Collective::SendRecv, DataType::Uint8, 7, 4);
        assert_eq!(p.fingerprint(ReduceOp::Sum).count, 0);
    }

    #[test]
    fn in_place_layouts() {
        let rs = OpShape::new(Collective::ReduceScatter, F32, 3, 4);
        assert_eq!(
            rs.in_place(2),
            Some(InPlace {
                elems: 12,
                input_at: 0,
                output_at: 6
            })
        );
        let ag = OpShape::new(Collective::AllGather, F32, 3, 4);
        assert_eq!(ag.in_place(1).map(|p| (p.elems, p.input_at)), Some((12, 3)));
        assert_eq!(
            OpShape::new(Collective::Gather, F32, 3, 4).in_place(0),
            None
        );
    }

    #[test]
    fn v_extents_saturate() {
        assert_eq!(v_extent(&[2, 3], &[0, 2]), 5);
        assert_eq!(v_extent(&[], &[]), 0);
        assert_eq!(v_extent(&[usize::MAX], &[1]), usize::MAX);
    }
}
