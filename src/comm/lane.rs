//! The smallest all-reduces over lanes (`comm_core::transport::lane`): on a
//! communicator whose every pair of ranks is given a kind with lanes (shm;
//! decided from the published records, so every rank alike), an all-reduce
//! of at most [`LANE_PAYLOAD_BYTES`] writes this rank's contribution into
//! one line per peer and folds every rank's line in rank order — one-shot,
//! no schedule, executor, piece header or FIFO flow control (the 8-byte
//! all-reduce, docs/perf-notes/NOTEBOOK.md §30). Every rank folds the same
//! values in the same order, so all get bit-identical results.
//!
//! Lanes serve only where the planner's choice is free: not where an
//! all-reduce algorithm is forced (`SNCL_ALGO`, `force_algorithm`), in
//! deterministic mode (its canonical fold order is a tree), with checksums
//! (lane lines carry none) or once windows exist (every operation then
//! starts with an offer). Mismatches still fail fast: lines carry the
//! fingerprint, a rank waiting on lanes looks at its peers' ordinary pieces,
//! and a rank waiting in another operation looks at its peers' lines
//! (`sncl_runtime::exec` `check_lanes`).

use std::sync::atomic::Ordering;

use comm_core::transport::lane::{lanes_fit, Lane, LANE_PAYLOAD_BYTES, MAX_LANE_RANKS};
use comm_core::transport::Connection;
use comm_core::wire::{Collective, Fingerprint};
use comm_core::{Error, ReduceOp, Result};
use sncl_runtime::exec::{self, OpContext};

use super::memo::LaneChoice;
use super::{Inner, RawOp, State};

/// The name flight records and [`Inner::algorithm_for`] give a lane
/// all-reduce.
pub(super) const LANE_ALGORITHM: &str = "one-shot";

/// How many polling rounds of a lane wait pass between two looks at the
/// peers' ordinary pieces (a peer in another operation).
const PIECE_LOOK_EVERY: u32 = 64;

/// The lane of the connection to `peer`, or an error naming it (lanes were
/// chosen because every peer has one).
fn lane_of<'a>(
    ctx: &OpContext,
    conns: &'a mut [Option<Box<dyn Connection>>],
    peer: usize,
) -> Result<&'a mut dyn Lane> {
    conns
        .get_mut(peer)
        .and_then(|c| c.as_deref_mut())
        .and_then(|c| c.lane())
        .ok_or_else(|| Error::InvalidArgument {
            rank: ctx.rank,
            op: ctx.fingerprint.collective.name(),
            detail: format!("no lane to rank {peer}"),
        })
}

fn mismatch(ctx: &OpContext, peer: usize, theirs: Fingerprint) -> Error {
    Error::Mismatch {
        rank: ctx.rank,
        peer,
        seq: ctx.seq,
        ours: ctx.fingerprint,
        their_seq: ctx.seq,
        theirs,
    }
}

impl Inner {
    /// Whether a `coll` of `bytes` runs over the lanes.
    pub(super) fn takes_lanes(&self, st: &mut State, coll: Collective, bytes: usize) -> bool {
        if coll != Collective::AllReduce || bytes == 0 || bytes > LANE_PAYLOAD_BYTES {
            return false;
        }
        let epoch = self.forced_epoch.load(Ordering::Acquire);
        if st.lanes.epoch != Some(epoch) {
            st.lanes = LaneChoice {
                epoch: Some(epoch),
                on: self.lanes_serve(),
            };
        }
        st.lanes.on
    }

    /// Whether lanes serve at all now (see the module's text).
    fn lanes_serve(&self) -> bool {
        let forced = self
            .forced
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|(c, _)| *c == Collective::AllReduce);
        // Every rank's answer must be the same, so it comes from the
        // published records: a rank's own connections could all have lanes
        // while a peer's do not (a peer given a device kind to a third).
        // Lane kinds connect at setup, never lazily: a pair the records
        // give one has its lane (else `lane_of` names the peer).
        let on = lanes_fit(self.nranks)
            && self.every_pair_has_lanes
            && !forced
            && !self.config.deterministic
            && !self.config.checksum
            && !self.has_windows();
        tracing::debug!(rank = self.rank, on, "small all-reduces over lanes");
        on
    }

    /// Runs the all-reduce `op` (checked by [`Inner::prepared`], which
    /// [`Inner::takes_lanes`]) over the lanes, with the state held.
    ///
    /// # Safety
    /// As [`Inner::run`]: `send` and `recv` are lent for `op.count`
    /// elements (checked non-NULL by the caller).
    pub(super) unsafe fn run_lane(
        &self,
        st: &mut State,
        op: &RawOp,
        fingerprint: Fingerprint,
    ) -> Result<()> {
        let bytes = op.count * op.dtype.size();
        let mut lines = [[0u8; LANE_PAYLOAD_BYTES]; MAX_LANE_RANKS];
        // SAFETY: the caller lends `send` for `bytes`; read before `recv`
        // (which may be the same memory) is written.
        let mine = unsafe { std::slice::from_raw_parts(op.send, bytes) };
        lines[self.rank][..bytes].copy_from_slice(mine);
        let seq = st.take_seq();
        st.count_op(op.coll);
        let (me, n) = (self.rank, self.nranks);
        self.recorded_op(
            st,
            op,
            (seq, fingerprint),
            LANE_ALGORITHM,
            bytes as u64,
            |st, ctx| {
                self.lane_exchange(st, ctx, &mut lines[..n], bytes)?;
                let (dtype, reduce) = (op.dtype, op.op);
                let mut acc = lines[0];
                for line in &lines[1..n] {
                    kernels::reduce_inplace(dtype, reduce, &mut acc[..bytes], &line[..bytes]);
                }
                if reduce == ReduceOp::Avg {
                    kernels::divide(dtype, &mut acc[..bytes], n);
                }
                // SAFETY: the caller lends `recv` for `bytes`, and nothing else
                // refers to it now (`mine` was last read above).
                let out = unsafe { std::slice::from_raw_parts_mut(op.recv, bytes) };
                out.copy_from_slice(&acc[..bytes]);
                let t = &mut st.traffic;
                for v in [&mut t.sent, &mut t.received] {
                    if v.len() < n {
                        v.resize(n, 0);
                    }
                    for (p, b) in v.iter_mut().enumerate() {
                        if p != me {
                            *b += bytes as u64;
                        }
                    }
                }
                Ok(())
            },
        )
    }

    /// Posts this rank's line (`lines[rank]`) to every peer and takes every
    /// peer's into `lines[peer]`, within the operation's deadline.
    fn lane_exchange(
        &self,
        st: &mut State,
        ctx: &OpContext,
        lines: &mut [[u8; LANE_PAYLOAD_BYTES]],
        bytes: usize,
    ) -> Result<()> {
        let (me, n, seq) = (self.rank, self.nranks, ctx.seq);
        let mut posted = [false; MAX_LANE_RANKS];
        let mut taken = [false; MAX_LANE_RANKS];
        posted[me] = true;
        taken[me] = true;
        let mine = lines[me];
        let mut rounds = 0u32;
        let failed = |e| exec::peer_failed(ctx, e);
        let doing = "a small all-reduce over lanes";
        exec::wait_on_ranks_with(ctx, &mut st.conns, Some(&self.abort_flag), doing, |conns| {
            rounds = rounds.wrapping_add(1);
            let mut waiting_on = None;
            for (p, done) in posted.iter_mut().enumerate().take(n) {
                if !*done {
                    *done = lane_of(ctx, conns, p)?
                        .post(seq, &ctx.fingerprint, &mine[..bytes])
                        .map_err(failed)?;
                    if !*done {
                        waiting_on.get_or_insert(p);
                    }
                }
            }
            for p in 0..n {
                if taken[p] {
                    continue;
                }
                let lane = lane_of(ctx, conns, p)?;
                match lane.take(seq, &mut lines[p][..bytes]).map_err(failed)? {
                    Some(theirs) if theirs != ctx.fingerprint => {
                        return Err(mismatch(ctx, p, theirs))
                    }
                    Some(_) => taken[p] = true,
                    None => {
                        if rounds.is_multiple_of(PIECE_LOOK_EVERY) {
                            let piece = lane.next_piece().filter(|h| h.seq == seq);
                            if let Some(theirs) = piece.and_then(|h| h.fingerprint) {
                                return Err(mismatch(ctx, p, theirs));
                            }
                        }
                        waiting_on.get_or_insert(p);
                    }
                }
            }
            Ok(waiting_on)
        })
    }
}
