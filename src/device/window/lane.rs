//! The kernel path ("lane"): a collective on device buffers runs as one
//! kernel launch on the caller's stream, NCCL-style, with no host thread
//! between its stream's work and its peers'. At a rank's first device
//! collective every rank opens an internal window of
//! `SNCL_DEVICE_LANE_BYTES` (not offered to users' operations; 0: no
//! lane). An eligible all-reduce then enqueues, on the caller's stream, the
//! staged direct kernel (`device::direct::Staged`; all-reduce here, the
//! other collectives alike): round by round it
//! copies a lane's worth of the caller's input into this rank's lane
//! buffer, folds every rank's lane buffer where it lies (one-shot: all of
//! it; two-shot: this rank's slice, published back in its lane for the
//! peers to copy) into the caller's output, synchronised with its peers by
//! the lane's flags; then avg's divide. One-shot or two-shot is the
//! planner's choice by the whole size (`comm_core::tune::choose_direct`).
//! The epochs (one per round) are derived on the device from the lane's
//! own flags (epoch 0), so the same launches replay correctly from a CUDA
//! graph. The lane folds in rank order: its result is the same on every
//! rank and in every run, and may differ in the last bits from the
//! host-driven algorithms' (another order of the same sum), as NCCL's
//! algorithms differ from each other. Half-precision folds (f16, bf16)
//! accumulate in f32 and round once, where the host-driven algorithms
//! round after each pairwise step: more accurate, and the same on every
//! rank.
//!
//! Ranks that call different operations (another collective, type, op,
//! count or root) are caught by the kernel itself: each launch carries the
//! call's `Fingerprint::digest`, publishes it with its first "ready" and
//! compares its peers' before writing anything; every rank then stops and
//! fails the operation naming a differing peer (as the host path's
//! fingerprints do), where the lane used to fold mismatched counts into a
//! wrong result and report success.
//!
//! The host only watches: an event recorded after the kernels lets the
//! progress thread, in the operation's turn, wait with the communicator's
//! deadline, abort and liveness probes, and set the kernel's abort word
//! when it gives up (the kernel then ends and the stream goes on); the
//! work handle reports the outcome.
//!
//! Ordering. Lane operations of one communicator run one at a time: each
//! waits for the previous one where it is on another stream (its
//! completion event). Under stream capture nothing is recorded or waited
//! for (an event recorded outside the capture cannot be waited for inside
//! it), so the caller orders a graph's launches against the
//! communicator's other lane operations, as it orders a communicator's
//! operations for NCCL: launch the graph on the stream the eager ones use,
//! or synchronise between them. With ranks as threads of one process on
//! one device, each rank's kernel spins on the others', so their streams
//! must not share a hardware queue behind a later operation: keep the
//! streams in use at once within `CUDA_DEVICE_MAX_CONNECTIONS` (8 by
//! default).
//!
//! Eligible: an all-reduce, reduce-scatter or reduce of at least one
//! element of a type of 2 or more bytes whose dtype and op the direct
//! kernels reduce, or an all-gather, broadcast, all-to-all (its buffers
//! never overlap: refused at enqueue), gather or scatter of any type, on a
//! communicator whose lane opened (2 to 8 ranks on one node, a backend
//! with IPC and the direct kernels). Every rank decides alike from the
//! same arguments. Where two processes share a device without MPS the
//! kernels would spin on kernels that cannot start: there the same
//! collectives go through the lane in rounds ordered between the
//! processes by IPC events instead (`ipc_events.rs`; not capturable), or,
//! on a backend without interprocess events, stay on the host-driven path.

use std::sync::Arc;

use ::device::direct::{self, DirectAlgo, DirectAllReduce, Staged, StagedCollective};
use comm_core::wire::{Collective, Fingerprint};
use comm_core::{DataType, Error, ReduceOp, Result};
use sncl_runtime::exec;

use super::ipc_events::{IpcEventLane, LaneOf};
use super::{
    device_error, next_id, open_window, opening_fingerprint, Binding, DevicePtr, EventHandle,
    WindowCore,
};
use crate::comm::Inner;

/// Completion events made ready when the lane opens: lane operations in
/// flight at once without an event created at enqueue (more are created
/// as needed).
const LANE_EVENTS: usize = 64;

impl WindowCore {
    /// Opens the lane where the communicator allows one (see the module
    /// docs); `None` where it does not. Collective (every rank's first
    /// device collective calls it); runs in the communicator's turn.
    pub(crate) fn open_lane(
        inner: &Arc<Inner>,
        binding: &Arc<Binding>,
    ) -> Result<Option<Arc<WindowCore>>> {
        let n = inner.nranks;
        let bytes = inner.config.device.lane_bytes;
        // Deterministic mode: the lane's kernel folds in rank order, not
        // in the canonical tree (docs/DETERMINISM.md).
        if bytes == 0
            || inner.config.deterministic
            || !(2..=kernels::cuda::DIRECT_MAX_RANKS).contains(&n)
            || inner.topo.nnodes() != 1
            || inner.store.is_none()
        {
            return Ok(None);
        }
        let id = next_id(inner.comm_id, inner.rank);
        let core = inner.run_in_turn(opening_fingerprint(bytes), |_, _, _| {
            let sizes = (bytes, direct::LANE_FLAG_BYTES);
            let mut core =
                open_window(inner, binding, (id, "device collective lane"), sizes, None)?;
            if core.no_direct.is_some() {
                core.ipc_events = IpcEventLane::open(inner, binding, id)?;
            }
            Ok(core)
        })?;
        if let Some(why) = &core.no_direct {
            if core.ipc_events.is_none() {
                tracing::info!(
                    rank = inner.rank,
                    "{why}: device collectives stay on the host-driven path"
                );
                return Ok(None);
            }
            tracing::info!(
                rank = inner.rank,
                "{why}: device collectives are ordered between the processes by IPC events"
            );
        }
        // Each lane operation in flight holds a completion event.
        binding.reserve_events(LANE_EVENTS).map_err(|e| {
            device_error(
                inner.rank,
                &binding.dev,
                ("lane", None),
                "creating events",
                e,
            )
        })?;
        Ok(Some(Arc::new(core)))
    }

    /// The staged collective `coll` (root `root`) of `count` elements of
    /// `dtype` with `op` runs as on this lane, or `None` where it stays on
    /// the host-driven path (the same answer on every rank for the same
    /// call). Any count from one element: the kernel goes through the lane
    /// in rounds of a lane buffer's elements.
    pub(crate) fn lane_collective(
        &self,
        coll: Collective,
        root: usize,
        (dtype, op, count): (DataType, ReduceOp, usize),
    ) -> Option<StagedCollective> {
        let staged = match coll {
            Collective::AllReduce => StagedCollective::AllReduce,
            Collective::AllGather => StagedCollective::AllGather,
            Collective::ReduceScatter => StagedCollective::ReduceScatter,
            Collective::Broadcast => StagedCollective::Broadcast { root },
            Collective::Reduce => StagedCollective::Reduce { root },
            Collective::AllToAll => StagedCollective::AllToAll,
            Collective::Gather => StagedCollective::Gather { root },
            Collective::Scatter => StagedCollective::Scatter { root },
            _ => return None,
        };
        // Folds of fp8 (and 1-byte integers with them) stay on the
        // host-driven path: with 3 mantissa bits the lane's rank-order
        // fold rounds visibly differently from the planner's algorithms.
        // Copies take every type.
        let folds = staged.reduces();
        let op = if folds { op } else { ReduceOp::Sum };
        (count >= 1
            && (!folds || dtype.size() >= 2)
            && root < self.inner.nranks
            && self.lane_chunk(staged, dtype) > 0
            && kernels::cuda::direct_kernel(dtype, op).is_some())
        .then_some(staged)
    }

    /// The kernel an all-reduce of `count` elements of `dtype` runs on the
    /// lane with at most `max_ctas` blocks (0: no cap): the planner's
    /// choice by its whole size (rounds of a large one run two-shot even
    /// where a round alone would run one-shot; the smallest, where the LL
    /// region holds their lines, LL). The same on every rank.
    pub(crate) fn lane_algo(&self, dtype: DataType, count: usize, max_ctas: u32) -> DirectAlgo {
        let chunk = self.lane_chunk(StagedCollective::AllReduce, dtype);
        let (grid, block) = self.lane_grid(dtype, count.min(chunk), max_ctas);
        super::algo_of(comm_core::tune::choose_lane(
            count.saturating_mul(dtype.size()),
            self.inner.nranks,
            self.inner.device_shape.intra,
            direct::ll_fits(dtype.size(), count, grid, block),
        ))
    }

    /// (blocks, threads a block) of a lane launch whose rounds hold
    /// `round` elements of `dtype`, at most `max_ctas` blocks (0: no cap).
    fn lane_grid(&self, dtype: DataType, round: usize, max_ctas: u32) -> (u32, u32) {
        let (block, max_blocks) = direct::launch_limits(self.binding.dev.backend());
        let cap = super::blocks_limit(max_blocks.min(self.grid_cap), max_ctas);
        (direct::grid(dtype, round, block, cap), block)
    }

    /// Elements of `dtype` per round and piece through the lane: its
    /// buffer's (a collective with a side of pieces, reduce-scatter,
    /// all-to-all and scatter: its buffer's over the rank count, one share
    /// per piece), a whole number of 16-byte packs (0 where a share is
    /// under a pack).
    fn lane_chunk(&self, staged: StagedCollective, dtype: DataType) -> usize {
        let pieces = if staged.has_pieces() {
            self.inner.nranks
        } else {
            1
        };
        (self.bytes / pieces / 16) * 16 / dtype.size()
    }

    /// The error of a lane operation whose kernel found that `peer`
    /// called another operation (another collective, type, op, count or
    /// root: their fingerprints differ), as the host path reports a
    /// mismatch. Every rank's kernel stops before writing a result.
    pub(crate) fn lane_mismatch(&self, ctx: &exec::OpContext, peer: usize) -> Error {
        Error::InvalidArgument {
            rank: self.inner.rank,
            op: ctx.fingerprint.collective.name(),
            detail: format!(
                "the ranks called different operations: this rank called {} (seq {}), peer \
                 rank {peer} another (its collective, type, op, count or root differs); the \
                 kernel path stopped before writing a result",
                ctx.fingerprint, ctx.seq
            ),
        }
    }

    /// Sets the lane kernels' abort word: every lane kernel running or
    /// still to run on any stream (a captured graph's too) gives up at its
    /// next wait and ends, so no caller's stream waits on peers that will
    /// not come; on the IPC-event lane, the peers' host waits for this rank
    /// end at once. The communicator has failed or aborted by then; a lane
    /// operation after it fails before anything is enqueued.
    pub(crate) fn stop_lane_kernels(&self) {
        self.broken
            .store(true, std::sync::atomic::Ordering::Release);
        self.control_words()[0].store(1, std::sync::atomic::Ordering::Release);
        if let Some(ordered) = &self.ipc_events {
            ordered.mark_failed(self.inner.rank);
        }
    }

    /// Enqueues `staged` (from [`WindowCore::lane_collective`]) of
    /// `count` elements a piece from `send` to `recv` (device buffers of
    /// the bound device, NCCL's extents, in place allowed) on `stream`: the
    /// staged direct kernel (rounds through the lane; at most `max_ctas`
    /// blocks where the call set it, `CollConfig::max_ctas`), or the
    /// IPC-event lane's rounds (`ipc_events.rs`), then avg's divide,
    /// and `done` recorded after them (`None`: nothing recorded, as under
    /// stream capture). `fingerprint` (the call's; its
    /// [`Fingerprint::digest`] goes to the kernel) lets every rank's kernel
    /// stop where a peer called another operation
    /// ([`WindowCore::lane_mismatch`] then names it). `algo` is an
    /// all-reduce's kernel ([`WindowCore::lane_algo`], which the caller
    /// also records; `None`: another collective, one protocol each).
    ///
    /// # Safety
    /// `send` and `recv` hold their extents of `dtype` until the work
    /// enqueued here completes on `stream` (a broadcast's non-root and a
    /// reduce's non-root need only `recv`, resp. `send`).
    pub(crate) unsafe fn enqueue_lane(
        &self,
        stream: ::device::StreamHandle,
        (staged, send, recv): (StagedCollective, DevicePtr, DevicePtr),
        (count, dtype, op): (usize, DataType, ReduceOp),
        (max_ctas, fingerprint, algo): (u32, &Fingerprint, Option<DirectAlgo>),
        done: Option<EventHandle>,
    ) -> Result<()> {
        let (me, n) = (self.inner.rank, self.inner.nranks);
        let dev = &self.binding.dev;
        let name = staged.name();
        let fail = |what: &str, e| device_error(me, dev, (name, None), what, e);
        // Lane operations run in issue order whatever their streams: one on
        // another stream than the last waits for it (not under capture,
        // where `done` is None: a graph's launches are ordered by its
        // stream).
        let mut last = self.lane_last.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(_), Some((other, order))) = (done, *last) {
            if other != stream {
                dev.stream_wait_event(stream, order)
                    .map_err(|e| fail("ordering after the previous lane collective", e))?;
            }
        }
        // The buffers a rank does not use stand in for each other.
        let (source, result) = match staged {
            StagedCollective::Broadcast { root } | StagedCollective::Scatter { root }
                if root != me =>
            {
                (recv, recv)
            }
            StagedCollective::Reduce { root } | StagedCollective::Gather { root } if root != me => {
                (send, send)
            }
            _ => (send, recv),
        };
        let chunk = self.lane_chunk(staged, dtype);
        if let Some(ordered) = &self.ipc_events {
            let lane = LaneOf {
                inner: &self.inner,
                buffers: &self.buffers,
                broken: &self.broken,
            };
            // SAFETY: the caller's contract; `chunk` elements a piece fit
            // a lane buffer (lane_chunk).
            unsafe {
                ordered.enqueue(
                    &lane,
                    stream,
                    (staged, source, result),
                    (count, dtype, op, chunk),
                    fingerprint,
                )
            }?;
        } else {
            // SAFETY: the caller's contract.
            unsafe {
                self.launch_lane_kernel(
                    stream,
                    (staged, source, result),
                    (count, dtype, op),
                    (max_ctas, fingerprint.digest(), algo),
                    chunk,
                )
            }?;
        }
        let divided = match staged {
            StagedCollective::AllReduce | StagedCollective::ReduceScatter => Some(recv),
            StagedCollective::Reduce { root } if root == me => Some(recv),
            _ => None,
        };
        if let (ReduceOp::Avg, Some(out)) = (op, divided) {
            // SAFETY: the output holds `count` elements (the caller's
            // contract).
            unsafe { dev.divide(stream, dtype, out, count, n) }
                .map_err(|e| fail("enqueueing avg's divide", e))?;
        }
        if let Some(ev) = done {
            dev.record_event(ev, stream)
                .map_err(|e| fail("recording the lane kernel's completion", e))?;
            *last = Some((stream, ev));
        }
        Ok(())
    }

    /// The staged direct kernel of [`WindowCore::enqueue_lane`] on
    /// `stream`: `staged` from `source` to `result` (the buffers the rank
    /// uses), rounds of `chunk` elements through the lane, with the call's
    /// fingerprint digest and all-reduce kernel.
    ///
    /// # Safety
    /// As [`WindowCore::enqueue_lane`]'s.
    unsafe fn launch_lane_kernel(
        &self,
        stream: ::device::StreamHandle,
        (staged, source, result): (StagedCollective, DevicePtr, DevicePtr),
        (count, dtype, op): (usize, DataType, ReduceOp),
        (max_ctas, fingerprint, algo): (u32, u64, Option<DirectAlgo>),
        chunk: usize,
    ) -> Result<()> {
        let me = self.inner.rank;
        let dev = &self.binding.dev;
        let fail = |what: &str, e| device_error(me, dev, (staged.name(), None), what, e);
        // The other collectives ignore it (one protocol each).
        let algo = algo.unwrap_or(DirectAlgo::OneShot);
        let launch = DirectAllReduce {
            algo,
            dtype,
            op,
            count,
            rank: me,
            inputs: &self.buffers,
            outputs: &self.buffers,
            flags: &self.flags,
            scratch: None,
            control: self.control.as_ptr() as *mut u32,
            epoch: 0,
            grid: self.lane_grid(dtype, count.min(chunk), max_ctas).0,
            staged: Some(Staged {
                collective: staged,
                source,
                result,
                chunk,
                fingerprint,
            }),
        };
        // SAFETY: every lane buffer is a live allocation (or open IPC
        // mapping) of `self.bytes`, at least a round's share of every
        // piece (lane_chunk); the flag areas LANE_FLAG_BYTES (open_lane),
        // the control block CONTROL_WORDS pinned words; `source` and
        // `result` hold their extents (the caller's contract). The kernel
        // copies into this rank's lane only after the previous lane kernel
        // (ordered before it, on this stream or through `order`) ended,
        // which it does only once every peer has read the lane (its last
        // phase). Every rank launches the same collective, grid, algorithm
        // and chunk on the lane for the same call, so the device-derived
        // epochs agree.
        unsafe { dev.direct_all_reduce(stream, &launch) }
            .map_err(|e| fail("launching the lane kernel", e))?;
        Ok(())
    }

    /// On the progress thread, in the operation's turn: takes its sequence
    /// number (recorded as `(algo, bytes, tag)`) and waits for `done` with the communicator's deadline, abort
    /// and liveness probes (see [`WindowCore::wait_kernel`]). A failure
    /// marks the lane unusable and fails the communicator.
    pub(crate) fn watch_lane(
        &self,
        inner: &Inner,
        fingerprint: Fingerprint,
        recorded_as: (&'static str, u64, u64),
        done: EventHandle,
    ) -> Result<()> {
        inner.run_counted(
            fingerprint.collective,
            fingerprint,
            recorded_as,
            |st, ctx, abort| {
                let doing = format!("lane {} (seq {})", fingerprint.collective.name(), ctx.seq);
                self.wait_kernel(st, ctx, abort, done, &doing)
                    .inspect_err(|_| {
                        self.broken
                            .store(true, std::sync::atomic::Ordering::Release)
                    })
            },
        )
    }
}
