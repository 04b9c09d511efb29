//! Executing an operation: its sequence number and fingerprint, buffers
//! and scratch space, the executor, and what a failure does.

use comm_core::exec::{self, Buffers, OpContext};
use comm_core::wire::{Collective, Fingerprint};
use comm_core::{Error, ReduceOp, Result};

use super::{Inner, RawOp, State};

impl Inner {
    /// Executes one operation now (the caller holds its turn).
    ///
    /// # Safety
    /// See [`Inner::run_ordered`].
    pub unsafe fn run(&self, op: &RawOp) -> Result<()> {
        self.validate(op)?;
        let mut guard = self.lock();
        let st = &mut *guard;
        // An abort requested while another operation held the state.
        self.finish_abort(st);
        if let Some(reason) = &st.aborted {
            return Err(Error::Aborted {
                rank: self.rank,
                reason: Some(reason.clone()),
            });
        }
        let rest;
        let op = if op.coll == Collective::SendRecv && op.p2p.iter().any(|p| p.peer == self.rank) {
            // SAFETY: forwarded from the caller; validated above.
            rest = unsafe { self.copy_to_self(op) };
            if rest.p2p.is_empty() {
                *st.ops.entry(op.coll).or_insert(0) += 1;
                return Ok(());
            }
            &rest
        } else {
            op
        };
        // Point-to-point groups involve only some ranks: they do not take a
        // collective sequence number (their pieces carry 0 and the
        // sendrecv fingerprint, so a mix-up with a collective is still caught).
        let seq = if op.coll == Collective::SendRecv {
            0
        } else {
            st.seq += 1;
            st.seq
        };
        let fingerprint = Fingerprint {
            collective: op.coll,
            dtype: op.dtype,
            op: if op.coll.is_reducing() {
                op.op
            } else {
                ReduceOp::Sum
            },
            root: if op.coll.is_rooted() {
                op.root as i32
            } else {
                -1
            },
            count: match op.coll {
                Collective::AllGatherV
                | Collective::AllToAllV
                | Collective::SendRecv
                | Collective::Barrier => 0,
                _ => op.count as u64,
            },
        };
        let (sched, algo) = self.schedule(st, op)?;
        if sched.steps.is_empty() {
            return Ok(());
        }
        let esize = op.dtype.size();
        let (send_elems, recv_elems) = self.extents(op);
        // A rejected operation gives its sequence number back.
        let reject = |st: &mut State, detail: String| {
            if op.coll != Collective::SendRecv {
                st.seq -= 1;
            }
            Err(self.invalid(op.coll.name(), detail))
        };
        if (send_elems > 0 && op.send.is_null())
            || (recv_elems > 0 && op.recv.is_null())
            || op.p2p.iter().any(|p| p.count > 0 && p.ptr.is_null())
        {
            return reject(st, "a buffer is NULL".into());
        }
        let Some(scratch_bytes) = sched
            .scratch_elems
            .checked_mul(esize)
            .filter(|&b| b <= isize::MAX as usize)
        else {
            let detail = format!(
                "{} elements of scratch space are more than memory can address",
                sched.scratch_elems
            );
            return reject(st, detail);
        };
        if st.scratch.len() < scratch_bytes {
            let more = scratch_bytes - st.scratch.len();
            if let Err(e) = st.scratch.try_reserve_exact(more) {
                let detail = format!("cannot allocate {scratch_bytes} bytes of scratch space: {e}");
                return reject(st, detail);
            }
            st.scratch.resize(scratch_bytes, 0);
        }
        // SAFETY: the caller lends send/recv for the counts that `extents`
        // derives from; scratch is ours and sized above; p2p buffers are
        // lent by the caller for their counts.
        let bufs = unsafe {
            let b = Buffers::new(
                if send_elems == 0 {
                    std::ptr::NonNull::dangling().as_ptr()
                } else {
                    op.send
                },
                send_elems * esize,
                if recv_elems == 0 {
                    std::ptr::NonNull::dangling().as_ptr()
                } else {
                    op.recv
                },
                recv_elems * esize,
                st.scratch.as_mut_ptr(),
                scratch_bytes,
            );
            b.with_peer_buffers(op.p2p.iter().map(|p| (p.ptr, p.count * esize)).collect())
        };
        let ctx = OpContext {
            rank: self.rank,
            nranks: self.nranks,
            comm_id: self.comm_id,
            seq,
            fingerprint,
            dtype: op.dtype,
            op: op.op,
            timeout: self.config.timeout,
            spin: self.spin,
        };
        *st.ops.entry(op.coll).or_insert(0) += 1;
        let started = std::time::Instant::now();
        let flight_id = self.flight.start_at(
            comm_core::flight::OpRecord {
                seq,
                op: op.coll.name(),
                dtype: op.dtype.name(),
                reduce: fingerprint.op.name(),
                count: op.count as u64,
                bytes: (send_elems.max(recv_elems) * esize) as u64,
                root: fingerprint.root.into(),
                algo: algo.name(),
            },
            started,
        );
        let result = exec::execute(
            &sched,
            &ctx,
            &bufs,
            &mut st.conns,
            Some(&mut st.traffic),
            Some(&self.abort_flag),
        );
        let ended = std::time::Instant::now();
        st.busy += ended - started;
        self.flight
            .finish_at(flight_id, ended, result.as_ref().err().map(|e| e as _));
        match &result {
            Err(e) if !self.abort_requested() => self.fail(st, e),
            // Stopped by (or finished despite) an abort from another thread:
            // the peers are told that this rank aborted.
            _ => self.finish_abort(st),
        }
        result
    }

    /// After a failed operation: logs it and aborts every connection, so
    /// every peer fails fast and names the rank blamed.
    pub(super) fn fail(&self, st: &mut State, e: &Error) {
        tracing::error!(rank = self.rank, error = %e, "operation failed; aborting the communicator");
        // A dead peer is named; a timeout does not prove the awaited peer
        // is the culprit (it may wait on another), so it names nobody;
        // anything else (mismatch, local abort) started on this rank.
        let cause = match e {
            Error::Timeout { .. } => None,
            // Passed on from a peer: keep its verdict (possibly none).
            Error::PeerFailed {
                source: comm_core::transport::TransportError::PeerAborted { .. },
                ..
            } => e.failed_rank(),
            _ => e.failed_rank().or(Some(self.rank)),
        };
        // Only a peer proven gone (or blamed by the peer that saw it go)
        // counts as failed; a timeout is not proof.
        let proven = matches!(e, Error::PeerFailed { .. });
        if let Some(p) = e
            .failed_rank()
            .filter(|&p| proven && p != self.rank && p < self.nranks)
        {
            self.failed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(p);
        }
        st.aborted = Some(e.to_string());
        self.abort_reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(|| e.to_string());
        for c in st.conns.iter_mut().flatten() {
            c.abort(cause);
        }
        self.auto_dump(&e.to_string());
    }

    /// Runs the transfers of a point-to-point group to this rank itself as
    /// local copies; returns the group without them.
    ///
    /// # Safety
    /// As [`Inner::run`]; `op` passed [`Inner::validate`].
    pub(super) unsafe fn copy_to_self(&self, op: &RawOp) -> RawOp {
        let me = self.rank;
        let sends = op.p2p.iter().filter(|p| p.peer == me && p.is_send);
        let recvs = op.p2p.iter().filter(|p| p.peer == me && !p.is_send);
        for (s, r) in sends.zip(recvs) {
            if s.count > 0 {
                // SAFETY: the caller lends both buffers for `count` bytes
                // (checked equal and non-NULL by validate) until the group
                // completes; `copy` allows them to overlap.
                unsafe { std::ptr::copy(s.ptr as *const u8, r.ptr, s.count) };
            }
        }
        let mut rest = op.clone();
        rest.p2p.retain(|p| p.peer != me);
        rest
    }
}
