//! Argument checks of an operation, once, before it takes a sequence
//! number: roots, counts and buffers, self-transfers of point-to-point
//! groups. An op that passed them is marked ([`Checked`]), and the planner
//! and the executor do not check it again; what the checks establish — the
//! operation's [`OpShape`], its fingerprint and this rank's buffer extents
//! ([`Prepared`]) — is arithmetic on the op's fields.

use comm_core::shape::{v_extent, OpShape};
use comm_core::wire::{Collective, Fingerprint};
use comm_core::Result;

use super::op::{Checked, Prepared};
use super::{Inner, P2p, RawOp};

impl Inner {
    /// Checks `op` on this communicator and marks it checked
    /// ([`RawOp::prepared`]): the checks do not run again up to the
    /// executor. An error names this rank, the operation and what was
    /// expected; no sequence number is taken.
    pub(crate) fn prepare(&self, op: &mut RawOp) -> Result<Prepared> {
        let p = self.prepared(op)?;
        op.prepared = Checked::of(op, self.nranks);
        Ok(p)
    }

    /// The op's [`Prepared`]: without the checks where [`Inner::prepare`]
    /// marked it and the mark still describes it, else checked now (a raw
    /// op from the C ABI or [`crate::Communicator::run_raw`]).
    pub(crate) fn prepared(&self, op: &RawOp) -> Result<Prepared> {
        let n = self.nranks;
        // A point-to-point group's own dtype and count are not used (each
        // transfer has its own, and the schedule counts bytes): the group
        // is planned and fingerprinted as bytes whatever they say.
        let (dtype, count) = match op.coll {
            Collective::SendRecv => (comm_core::DataType::Uint8, 0),
            _ => (op.dtype, op.count),
        };
        let shape = OpShape::new(op.coll, dtype, count, n).with_root(op.root);
        let checked = op.prepared.is_some() && op.prepared == Checked::of(op, n);
        if !checked {
            self.check(op, &shape)?;
        }
        let (send_elems, recv_elems) = match op.coll {
            Collective::AllGatherV | Collective::AllToAllV => self.v_extents(op)?,
            _ => (shape.send_elems(self.rank), shape.recv_elems(self.rank)),
        };
        Ok(Prepared {
            shape,
            fingerprint: Fingerprint {
                settings: op.config.schedule_digest(),
                ..shape.fingerprint(op.op)
            },
            send_elems,
            recv_elems,
        })
    }

    /// The checks of `op` (of `shape`) that [`Inner::prepared`] runs once.
    fn check(&self, op: &RawOp, shape: &OpShape) -> Result<()> {
        let name = op.coll.name();
        let n = self.nranks;
        shape
            .check()
            .map_err(|e| self.invalid(name, e.to_string()))?;
        if op.coll.is_reducing() {
            kernels::check_supported(op.dtype, op.op)
                .map_err(|e| self.invalid(name, e.to_string()))?;
        }
        for p in &op.p2p {
            let what = if p.is_send { "send" } else { "recv" };
            if p.peer >= n {
                return Err(self.invalid(
                    what,
                    format!("peer {} is out of range for {n} ranks", p.peer),
                ));
            }
            OpShape::new(Collective::SendRecv, p.dtype, p.count, n)
                .check()
                .map_err(|e| self.invalid(what, format!("with peer {}: {e}", p.peer)))?;
        }
        if op.coll == Collective::AllToAll {
            let bytes = shape.send_elems(self.rank) * op.dtype.size();
            let (send, recv) = (op.send as usize as u64, op.recv as usize as u64);
            self.check_ranges_apart(op.coll, (send, bytes), (recv, bytes))?;
        }
        self.validate_self_pairs(&op.p2p)
    }

    /// An all-to-all's (or alltoallv's) send and receive ranges (host or
    /// device addresses, lengths in bytes) may not overlap: a block would
    /// be overwritten before it is sent (NCCL leaves it undefined).
    pub(crate) fn check_ranges_apart(
        &self,
        coll: Collective,
        (send, send_bytes): (u64, usize),
        (recv, recv_bytes): (u64, usize),
    ) -> Result<()> {
        let (sb, rb) = (send_bytes as u64, recv_bytes as u64);
        if sb == 0 || rb == 0 || send == 0 || recv == 0 {
            return Ok(());
        }
        if send < recv.saturating_add(rb) && recv < send.saturating_add(sb) {
            return Err(self.invalid(
                coll.name(),
                format!(
                    "the send buffer ({send:#x}, {send_bytes} bytes) and the receive buffer \
                     ({recv:#x}, {recv_bytes} bytes) overlap; {} has no in-place form",
                    coll.name()
                ),
            ));
        }
        Ok(())
    }

    /// The variable counts' extents (send, receive) of an all_gatherv or
    /// alltoallv on this rank, after checking there is one count and one
    /// displacement per rank.
    fn v_extents(&self, op: &RawOp) -> Result<(usize, usize)> {
        let (name, n, r) = (op.coll.name(), self.nranks, self.rank);
        let v =
            op.v.as_ref()
                .ok_or_else(|| self.invalid(name, "variable counts are missing".into()))?;
        for (what, c) in [
            ("send counts", &v.send_counts),
            ("send displacements", &v.send_displs),
            ("receive counts", &v.recv_counts),
            ("receive displacements", &v.recv_displs),
        ] {
            if c.len() != n && !(op.coll == Collective::AllGatherV && what.starts_with("send")) {
                return Err(self.invalid(
                    name,
                    format!(
                        "{what} have {} entries, expected one per rank ({n})",
                        c.len()
                    ),
                ));
            }
        }
        let recv = v_extent(&v.recv_counts, &v.recv_displs);
        Ok(match op.coll {
            Collective::AllGatherV => (v.recv_counts[r], recv),
            _ => (v_extent(&v.send_counts, &v.send_displs), recv),
        })
    }

    /// Sends to this rank itself and receives from itself, paired in issue
    /// order: the k-th send to self feeds the k-th receive from self of the
    /// same group (as in NCCL). Without its partner in the group a transfer
    /// to self could never complete (NCCL would hang), so it is rejected.
    fn validate_self_pairs(&self, p2p: &[P2p]) -> Result<()> {
        let me = self.rank;
        let sends = p2p.iter().filter(|p| p.peer == me && p.is_send);
        let recvs = p2p.iter().filter(|p| p.peer == me && !p.is_send);
        let (ns, nr) = (sends.clone().count(), recvs.clone().count());
        if ns != nr {
            return Err(self.invalid(
                if ns > nr { "send" } else { "recv" },
                format!(
                    "{ns} send(s) to this rank ({me}) itself but {nr} receive(s) from itself \
                     in one group; a transfer to self completes only with its partner in the \
                     same group (use Communicator::group)"
                ),
            ));
        }
        for (s, r) in sends.zip(recvs) {
            if s.bytes() != r.bytes() {
                return Err(self.invalid(
                    "send",
                    format!(
                        "a send of {} {} elements ({} bytes) to this rank ({me}) itself meets \
                         a receive of {} {} elements ({} bytes)",
                        s.count,
                        s.dtype.name(),
                        s.bytes(),
                        r.count,
                        r.dtype.name(),
                        r.bytes()
                    ),
                ));
            }
            if s.count > 0 && (s.ptr.is_null() || r.ptr.is_null()) {
                return Err(self.invalid(
                    "send",
                    format!("a buffer of a send/receive to this rank ({me}) itself is NULL"),
                ));
            }
        }
        Ok(())
    }
}
