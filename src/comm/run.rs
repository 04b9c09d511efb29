//! Executing an operation: its sequence number and fingerprint, buffers
//! and scratch space, the executor, and what a failure does.

use comm_core::algo::Algorithm;
use comm_core::schedule::Schedule;
use comm_core::wire::{Collective, Fingerprint};
use comm_core::{Error, Result};
use sncl_runtime::exec::{self, Buffers};

use super::{Inner, RawOp, State};

impl Inner {
    /// With the state held: finishes an abort requested while another
    /// operation held the state, and refuses to run on an aborted
    /// communicator.
    pub(crate) fn check_not_aborted(&self, st: &mut State) -> Result<()> {
        self.finish_abort(st);
        match &st.aborted {
            Some(reason) => Err(Error::Aborted {
                rank: self.rank,
                reason: Some(reason.clone()),
            }),
            None => Ok(()),
        }
    }

    /// Executes one operation now (the caller holds its turn). The op's
    /// checks ([`Inner::prepare`]) come first, then the schedule and the
    /// scratch space; the sequence number is taken only once nothing can
    /// refuse the op any more, so a refused op leaves the numbering as it
    /// was and the next op still matches the peers'.
    ///
    /// # Safety
    /// See [`Inner::run_ordered`].
    pub unsafe fn run(&self, op: &RawOp) -> Result<()> {
        let prepared = self.prepared(op)?;
        let esize = op.dtype.size();
        let (send_elems, recv_elems) = (prepared.send_elems, prepared.recv_elems);
        if (send_elems > 0 && op.send.is_null())
            || (recv_elems > 0 && op.recv.is_null())
            || op.p2p.iter().any(|p| p.count > 0 && p.ptr.is_null())
        {
            return Err(self.invalid(op.coll.name(), "a buffer is NULL".into()));
        }
        // Host memory: the call's settings may not ask for a protocol.
        op.config.check(self.rank, op.coll, false)?;
        let mut guard = self.lock();
        let st = &mut *guard;
        self.check_not_aborted(st)?;
        self.check_not_suspended(st, op.coll.name())?;
        // The lanes are an algorithm of their own: a call that names its
        // algorithm or chunk runs the schedule it asked for.
        if op.config.planned() && self.takes_lanes(st, op.coll, op.count * op.dtype.size()) {
            // SAFETY: forwarded from the caller; the buffers are non-NULL
            // (above) and hold `count` elements (`prepared`).
            return unsafe { self.run_lane(st, op, prepared.fingerprint) };
        }
        let rest;
        let op = if op.coll == Collective::SendRecv && op.p2p.iter().any(|p| p.peer == self.rank) {
            // SAFETY: forwarded from the caller; checked by `prepared`.
            rest = unsafe { self.copy_to_self(op) };
            if rest.p2p.is_empty() {
                st.count_op(op.coll);
                return Ok(());
            }
            &rest
        } else {
            op
        };
        let (sched, algo) = self.schedule(st, op, false)?;
        // Point-to-point groups involve only some ranks: they do not take a
        // collective sequence number (their pieces carry 0 and the
        // sendrecv fingerprint, so a mix-up with a collective is still
        // caught).
        let take_seq = |st: &mut State| {
            if op.coll == Collective::SendRecv {
                0
            } else {
                st.take_seq()
            }
        };
        if sched.steps.is_empty() {
            // Nothing to exchange, but the peers (with the same arguments)
            // count it too, and where windows are in use they wait for this
            // rank's offer.
            let seq = take_seq(st);
            self.offer_nothing(seq);
            return Ok(());
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
            return Err(self.invalid(op.coll.name(), detail));
        };
        if st.scratch.len() < scratch_bytes {
            let more = scratch_bytes - st.scratch.len();
            if let Err(e) = st.scratch.try_reserve_exact(more) {
                let detail = format!("cannot allocate {scratch_bytes} bytes of scratch space: {e}");
                return Err(self.invalid(op.coll.name(), detail));
            }
            st.scratch.resize(scratch_bytes, 0);
        }
        let seq = take_seq(st);
        // SAFETY: the caller lends send/recv for the extents `prepared`
        // derived from the counts; scratch is ours and sized above; p2p
        // buffers are lent by the caller for their counts.
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
            b.with_peer_buffers(op.p2p.iter().map(|p| (p.ptr, p.bytes())).collect())
        };
        let bytes = (send_elems.max(recv_elems) * esize) as u64;
        st.count_op(op.coll);
        self.execute_op(
            st,
            op,
            (seq, prepared.fingerprint),
            (&sched, algo),
            &bufs,
            bytes,
            |r| r,
        )
    }

    /// Runs a planned operation over `mem` (host buffers or device memory)
    /// with the state held (the caller counts the operation): the flight
    /// recorder, the executor,
    /// `finish` (device memory waits for its device work there), and on a
    /// failure aborts the communicator so every peer fails fast.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn execute_op<M: exec::Memory>(
        &self,
        st: &mut State,
        op: &RawOp,
        (seq, fingerprint): (u64, Fingerprint),
        (sched, algo): (&Schedule, Algorithm),
        mem: &M,
        bytes: u64,
        finish: impl FnOnce(Result<()>) -> Result<()>,
    ) -> Result<()> {
        self.recorded_op(st, op, (seq, fingerprint), algo.name(), bytes, |st, ctx| {
            // Peers connected at first use: those the schedule talks to.
            let peers = sched
                .steps
                .iter()
                .flat_map(|s| s.ops.iter().filter_map(|o| o.peer()));
            if let Err(e) = self.connect_lazily(st, ctx, peers) {
                return finish(Err(e));
            }
            // Where windows are in use, every rank offers its buffers first
            // and all decide alike whether the op runs directly over window
            // memory.
            let result = match self.window_decision(st, op, ctx) {
                Ok(Some(direct)) => self.run_direct(st, op, ctx, &direct),
                Ok(None) => exec::execute(
                    sched,
                    ctx,
                    mem,
                    &mut st.conns,
                    Some(&mut st.traffic),
                    Some(&self.abort_flag),
                ),
                Err(e) => Err(e),
            };
            finish(result)
        })
    }

    /// Runs `body`, the data movement of operation `seq` (its algorithm
    /// named `algo`), with the state held (the caller counts the
    /// operation): the flight recorder around it, its busy time, and on a
    /// failure the abort of the communicator so every peer fails fast.
    pub(crate) fn recorded_op(
        &self,
        st: &mut State,
        op: &RawOp,
        (seq, fingerprint): (u64, Fingerprint),
        algo: &'static str,
        bytes: u64,
        body: impl FnOnce(&mut State, &exec::OpContext) -> Result<()>,
    ) -> Result<()> {
        let ctx = self.op_context(seq, fingerprint, op.op, self.spin);
        let record = sncl_runtime::flight::OpRecord {
            seq,
            op: op.coll.name(),
            dtype: op.dtype.name(),
            reduce: fingerprint.op.name(),
            count: op.count as u64,
            bytes,
            root: fingerprint.root.into(),
            algo,
            tag: op.config.tag,
        };
        let result = self.recorded(st, record, |st| body(st, &ctx));
        match &result {
            Err(e) if !self.abort_requested() => self.fail(st, e),
            // Stopped by (or finished despite) an abort from another thread:
            // the peers are told that this rank aborted.
            _ => self.finish_abort(st),
        }
        result
    }

    /// Runs `body` as the operation `record` describes: the flight
    /// recorder around it, its busy time, and its tag's count and time.
    fn recorded(
        &self,
        st: &mut State,
        record: sncl_runtime::flight::OpRecord,
        body: impl FnOnce(&mut State) -> Result<()>,
    ) -> Result<()> {
        let tag = record.tag;
        let started = sncl_runtime::clock::Instant::now();
        let flight_id = self.flight.start_at(record, started);
        let result = body(st);
        let took = started.elapsed();
        st.busy += took;
        if tag != 0 {
            let (ops, busy) = st.tagged.entry(tag).or_default();
            *ops += 1;
            *busy += took;
        }
        self.flight
            .finish_after(flight_id, took, result.as_ref().err().map(|e| e as _));
        result
    }

    /// In an operation's turn (the caller holds it), with the state held:
    /// refuses on an aborted communicator, else takes the next sequence
    /// number, counts a `coll` and runs `f` with the operation's context,
    /// recorded as `(algo, bytes, tag)` in the flight recorder and the
    /// statistics; a failure fails the communicator. For operations whose
    /// data moves outside the executor (the device kernel path's watch).
    pub(crate) fn run_counted(
        &self,
        coll: Collective,
        fingerprint: Fingerprint,
        (algo, bytes, tag): (&'static str, u64, u64),
        f: impl FnOnce(&mut State, &exec::OpContext, &exec::AbortFlag) -> Result<()>,
    ) -> Result<()> {
        let mut guard = self.lock();
        let st = &mut *guard;
        self.check_not_aborted(st)?;
        self.check_not_suspended(st, coll.name())?;
        let seq = st.take_seq();
        st.count_op(coll);
        let ctx = self.op_context(seq, fingerprint, fingerprint.op, self.spin);
        let record = sncl_runtime::flight::OpRecord {
            seq,
            op: coll.name(),
            dtype: fingerprint.dtype.name(),
            reduce: fingerprint.op.name(),
            count: fingerprint.count,
            bytes,
            root: fingerprint.root.into(),
            algo,
            tag,
        };
        let r = self.recorded(st, record, |st| f(st, &ctx, &self.abort_flag));
        if let Err(e) = &r {
            self.fail(st, e);
        }
        r
    }

    /// Connects those of `peers` that wait for their first use
    /// (`SNCL_RUNTIME_CONNECT=1`; `crate::setup::lazy`), within `ctx`'s
    /// timeout.
    pub(crate) fn connect_lazily(
        &self,
        st: &mut State,
        ctx: &exec::OpContext,
        peers: impl IntoIterator<Item = usize>,
    ) -> Result<()> {
        let State { lazy, conns, .. } = st;
        match lazy.as_mut().filter(|l| l.pending() > 0) {
            Some(l) => l.connect(&self.config, conns, peers, ctx, &self.abort_flag),
            None => Ok(()),
        }
    }

    /// After a failed operation: logs it and aborts every connection, so
    /// every peer fails fast and names the rank blamed.
    pub(crate) fn fail(&self, st: &mut State, e: &Error) {
        tracing::error!(rank = self.rank, error = %e, "operation failed; aborting the communicator");
        // A dead peer is named as failed; a timeout does not prove the
        // awaited peer is the culprit (it may wait on another), so it is
        // named as a suspect (survivors report it, do not count it as
        // failed); anything else (mismatch, local abort) started on this
        // rank.
        use comm_core::transport::{AbortCause, TransportError};
        let cause = match e {
            Error::Timeout { waiting_on, .. } => {
                waiting_on.first().map(|&r| AbortCause::Suspect(r).encode())
            }
            // Arguments that differ: nobody failed; peers name the rank.
            Error::Mismatch { peer, .. } => Some(AbortCause::Mismatch(*peer).encode()),
            // Passed on from a peer: keep its verdict (possibly none).
            Error::PeerFailed {
                source: TransportError::PeerAborted { cause, .. },
                ..
            } => *cause,
            _ => e
                .failed_rank()
                .or(Some(self.rank))
                .map(|r| AbortCause::Failed(r).encode()),
        };
        // Only a peer proven gone (or blamed by the peer that saw it go)
        // counts as failed; a timeout is not proof.
        let proven = matches!(e, Error::PeerFailed { .. });
        if let Some(p) = e
            .failed_rank()
            .filter(|&p| proven && p != self.rank && p < self.nranks)
        {
            self.recovery.note_failed(p);
        }
        st.aborted = Some(e.to_string());
        self.abort_reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(|| e.to_string());
        for c in st.conns.iter_mut().flatten() {
            c.abort(cause);
        }
        if let Some(lazy) = &st.lazy {
            lazy.note_abort(cause);
        }
        self.auto_dump(&e.to_string());
    }

    /// Runs the transfers of a point-to-point group to this rank itself as
    /// local copies; returns the group without them.
    ///
    /// # Safety
    /// As [`Inner::run`]; `op` passed [`Inner::prepare`].
    pub(super) unsafe fn copy_to_self(&self, op: &RawOp) -> RawOp {
        let me = self.rank;
        let sends = op.p2p.iter().filter(|p| p.peer == me && p.is_send);
        let recvs = op.p2p.iter().filter(|p| p.peer == me && !p.is_send);
        for (s, r) in sends.zip(recvs) {
            if s.bytes() > 0 {
                // SAFETY: the caller lends both buffers for their counts
                // (checked the same size in bytes and non-NULL by
                // `prepared`) until the group completes; `copy` allows them
                // to overlap.
                unsafe { std::ptr::copy(s.ptr as *const u8, r.ptr, s.bytes()) };
            }
        }
        let mut rest = op.clone();
        rest.p2p.retain(|p| p.peer != me);
        rest
    }
}

/// The device path's checks at enqueue (its run is `src/device/job.rs`).
impl Inner {
    /// The collectives the device path runs.
    pub(crate) fn runs_on_device(c: Collective) -> bool {
        Collective::UNIFORM.contains(&c)
    }

    /// Refuses `coll` on device buffers where the device path does not run
    /// it.
    pub(crate) fn check_runs_on_device(&self, coll: Collective) -> Result<()> {
        if Inner::runs_on_device(coll) {
            return Ok(());
        }
        Err(self.invalid(
            coll.name(),
            "is not supported as a DeviceOp (all_reduce, reduce_scatter, all_gather, \
             broadcast, reduce, alltoall, gather and scatter are; point-to-point groups go \
             through send_recv_device_raw, all_gatherv and alltoallv through \
             enqueue_device_v)"
                .into(),
        ))
    }

    /// Checks a device operation at enqueue (before it takes a ticket or a
    /// sequence number) and keeps the result in it ([`Inner::prepare`]):
    /// as a host operation, plus the collectives the device path runs and
    /// the device path's bound on `count × nranks`. Returns the extents
    /// (send, receive) in elements.
    pub(crate) fn validate_device(&self, op: &mut RawOp) -> Result<(usize, usize)> {
        let name = op.coll.name();
        self.check_runs_on_device(op.coll)?;
        let p = self.prepare(op)?;
        let n = self.nranks;
        if op
            .count
            .checked_mul(n)
            .and_then(|e| e.checked_mul(op.dtype.size()))
            .is_none_or(|b| b > comm_core::shape::MAX_MESSAGE_BYTES)
        {
            return Err(self.invalid(
                name,
                format!(
                    "{} elements × {n} ranks are more than one operation moves ({} bytes)",
                    op.count,
                    comm_core::shape::MAX_MESSAGE_BYTES
                ),
            ));
        }
        Ok((p.send_elems, p.recv_elems))
    }
}
