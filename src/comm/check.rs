//! Argument checks of an operation before it runs: roots, counts and
//! buffers, self-transfers of point-to-point groups, and the extents the
//! executor bounds its accesses by.

use comm_core::shape::{v_extent, OpShape};
use comm_core::wire::Collective;
use comm_core::Result;

use super::{Inner, P2p, RawOp};

impl Inner {
    pub(super) fn validate(&self, op: &RawOp) -> Result<()> {
        let name = op.coll.name();
        let n = self.nranks;
        self.shape(op)
            .check()
            .map_err(|e| self.invalid(name, e.to_string()))?;
        if op.coll.is_reducing() {
            kernels::check_supported(op.dtype, op.op)
                .map_err(|e| self.invalid(name, e.to_string()))?;
        }
        if let Some(v) = &op.v {
            for (what, c) in [
                ("send counts", &v.send_counts),
                ("send displacements", &v.send_displs),
                ("receive counts", &v.recv_counts),
                ("receive displacements", &v.recv_displs),
            ] {
                if c.len() != n && !(op.coll == Collective::AllGatherV && what.starts_with("send"))
                {
                    return Err(self.invalid(
                        name,
                        format!(
                            "{what} have {} entries, expected one per rank ({n})",
                            c.len()
                        ),
                    ));
                }
            }
        }
        for p in &op.p2p {
            if p.peer >= n {
                return Err(self.invalid(
                    if p.is_send { "send" } else { "recv" },
                    format!("peer {} is out of range for {n} ranks", p.peer),
                ));
            }
        }
        self.validate_self_pairs(&op.p2p)
    }

    /// Sends to this rank itself and receives from itself, paired in issue
    /// order: the k-th send to self feeds the k-th receive from self of the
    /// same group (as in NCCL). Without its partner in the group a transfer
    /// to self could never complete (NCCL would hang), so it is rejected.
    pub(super) fn validate_self_pairs(&self, p2p: &[P2p]) -> Result<()> {
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
            if s.count != r.count {
                return Err(self.invalid(
                    "send",
                    format!(
                        "a send of {} bytes to this rank ({me}) itself meets a receive of {} bytes",
                        s.count, r.count
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

    /// The operation's shape on this communicator.
    pub(super) fn shape(&self, op: &RawOp) -> OpShape {
        OpShape::new(op.coll, op.dtype, op.count, self.nranks).with_root(op.root)
    }

    /// Input and output extents in elements for the executor's bounds:
    /// [`OpShape`]'s, or the variable counts' for the V collectives.
    pub(super) fn extents(&self, op: &RawOp) -> (usize, usize) {
        let r = self.rank;
        match (op.coll, &op.v) {
            (Collective::AllGatherV, Some(v)) => {
                (v.recv_counts[r], v_extent(&v.recv_counts, &v.recv_displs))
            }
            (Collective::AllToAllV, Some(v)) => (
                v_extent(&v.send_counts, &v.send_displs),
                v_extent(&v.recv_counts, &v.recv_displs),
            ),
            _ => {
                let s = self.shape(op);
                (s.send_elems(r), s.recv_elems(r))
            }
        }
    }
}
