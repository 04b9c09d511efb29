//! Argument checks of an operation before it runs: roots, counts and
//! buffers, self-transfers of point-to-point groups, and the extents the
//! executor bounds its accesses by.

use comm_core::wire::Collective;
use comm_core::Result;

use super::{Inner, P2p, RawOp};

impl Inner {
    pub(super) fn validate(&self, op: &RawOp) -> Result<()> {
        let name = op.coll.name();
        let n = self.nranks;
        if op.coll.is_rooted() && op.root >= n {
            return Err(self.invalid(
                name,
                format!("root {} is out of range for {n} ranks", op.root),
            ));
        }
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

    /// Input and output extents in elements for the executor's bounds.
    pub(super) fn extents(&self, op: &RawOp) -> (usize, usize) {
        let (n, r, c) = (self.nranks, self.rank, op.count);
        let extent = |counts: &[usize], displs: &[usize]| {
            counts
                .iter()
                .zip(displs)
                .map(|(c, d)| c + d)
                .max()
                .unwrap_or(0)
        };
        match op.coll {
            Collective::AllReduce => (c, c),
            Collective::ReduceScatter => (n * c, c),
            Collective::AllGather => (c, n * c),
            Collective::Broadcast => (if r == op.root { c } else { 0 }, c),
            Collective::Reduce => (c, if r == op.root { c } else { 0 }),
            Collective::AllToAll => (n * c, n * c),
            Collective::Gather => (c, if r == op.root { n * c } else { 0 }),
            Collective::Scatter => (if r == op.root { n * c } else { 0 }, c),
            Collective::AllGatherV => {
                let v = op.v.as_ref().expect("v counts");
                (v.recv_counts[r], extent(&v.recv_counts, &v.recv_displs))
            }
            Collective::AllToAllV => {
                let v = op.v.as_ref().expect("v counts");
                (
                    extent(&v.send_counts, &v.send_displs),
                    extent(&v.recv_counts, &v.recv_displs),
                )
            }
            Collective::SendRecv | Collective::Barrier | Collective::Tagged => (0, 0),
        }
    }
}
