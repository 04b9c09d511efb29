//! The kernel path ("lane"): a small all-reduce on device buffers runs as
//! kernels on the caller's stream, NCCL-style, with no host thread between
//! its stream's work and its peers'. At a rank's first device collective
//! every rank opens an internal window of `SNCL_DEVICE_LANE_BYTES` (not
//! offered to users' operations; 0: no lane). An eligible all-reduce then enqueues, on the
//! caller's stream: a copy of its input into this rank's lane buffer, the
//! one-shot direct kernel (which reads every rank's lane buffer where it
//! lies and writes the caller's output, synchronised with its peers by
//! the lane's flags), and avg's divide. The epoch is derived on the device
//! from the lane's own flags (epoch 0), so the same launches replay
//! correctly from a CUDA graph. The lane folds in rank order: its result is
//! the same on every rank and in every run, and may differ in the last
//! bits from the host-driven algorithms' (another order of the same sum),
//! as NCCL's algorithms differ from each other.
//!
//! The host only watches: an event recorded after the kernels lets the
//! progress thread, in the operation's turn, wait with the communicator's
//! deadline, abort and liveness probes, and set the kernel's abort word
//! when it gives up (the kernel then ends and the stream goes on); the
//! work handle reports the outcome.
//!
//! Eligible: an all-reduce of 1 to `SNCL_DEVICE_LANE_BYTES` bytes of a type of 2 or
//! more bytes whose dtype and op the direct kernels reduce, on a communicator whose lane opened (2
//! to 8 ranks on one node, a backend with IPC and the direct kernels, and
//! no two processes sharing a device without MPS). Every rank decides
//! alike from the same arguments.

use std::sync::Arc;

use ::device::direct::{self, DirectAlgo, DirectAllReduce};
use comm_core::wire::{Collective, Fingerprint};
use comm_core::{DataType, ReduceOp, Result};

use super::{
    device_error, next_id, open_window, opening_fingerprint, Binding, DevicePtr, EventHandle,
    WindowCore,
};
use crate::comm::Inner;

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
            open_window(inner, binding, (id, "device collective lane"), bytes, None)
        })?;
        if let Some(why) = &core.no_direct {
            tracing::info!(
                rank = inner.rank,
                "{why}: small device all-reduces stay on the host-driven path"
            );
            return Ok(None);
        }
        Ok(Some(Arc::new(core)))
    }

    /// Whether an all-reduce of `count` elements of `dtype` with `op` runs
    /// on this lane (the same answer on every rank for the same call).
    pub(crate) fn lane_takes(&self, dtype: DataType, op: ReduceOp, count: usize) -> bool {
        let bytes = count.saturating_mul(dtype.size());
        // fp8 (and 1-byte integers with them) stay on the host-driven
        // path: with 3 mantissa bits the lane's rank-order fold rounds
        // visibly differently from the planner's algorithms.
        dtype.size() >= 2
            && (1..=self.bytes).contains(&bytes)
            && kernels::cuda::direct_kernel(dtype, op).is_some()
    }

    /// Sets the lane kernels' abort word: every lane kernel running or
    /// still to run on any stream (a captured graph's too) gives up at its
    /// next wait and ends, so no caller's stream waits on peers that will
    /// not come. The communicator has failed or aborted by then; a lane
    /// operation after it fails before anything is enqueued.
    pub(crate) fn stop_lane_kernels(&self) {
        self.broken
            .store(true, std::sync::atomic::Ordering::Release);
        self.control_words()[0].store(1, std::sync::atomic::Ordering::Release);
    }

    /// Enqueues an all-reduce of `count` elements from `send` to `recv`
    /// (device buffers of the bound device, in place allowed) on `stream`:
    /// the copy into this rank's lane buffer, the one-shot kernel, avg's
    /// divide, and `done` recorded after them (`None`: nothing recorded,
    /// as under stream capture).
    ///
    /// # Safety
    /// `send` and `recv` hold `count` elements of `dtype` until the work
    /// enqueued here completes on `stream`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn enqueue_lane(
        &self,
        stream: ::device::StreamHandle,
        (send, recv): (DevicePtr, DevicePtr),
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        done: Option<EventHandle>,
    ) -> Result<()> {
        let (me, n) = (self.inner.rank, self.inner.nranks);
        let dev = &self.binding.dev;
        let fail = |what: &str, e| device_error(me, dev, ("all_reduce", None), what, e);
        let bytes = count * dtype.size();
        // Lane operations run in issue order whatever their streams: one on
        // another stream than the last waits for it (not under capture,
        // where `done` is None: a graph's launches are ordered by its
        // stream).
        let mut last = self.lane_last.lock().unwrap_or_else(|e| e.into_inner());
        let order = self.events[0];
        if done.is_some() && last.is_some_and(|s| s != stream) {
            dev.stream_wait_event(stream, order)
                .map_err(|e| fail("ordering after the previous lane all-reduce", e))?;
        }
        // SAFETY: the caller's `send` holds `bytes`; the lane buffer holds
        // at least that (lane_takes), and no kernel of this rank reads it
        // now: the previous lane kernel (ordered before this copy, on this
        // stream or through `order`) ended only after every peer had read
        // it (its phase 3), and this copy is ordered after the caller's
        // earlier work.
        unsafe { dev.copy_d2d_async(self.buffers[me], send, bytes, stream) }
            .map_err(|e| fail("copying the input into the lane", e))?;
        let mut outputs = self.buffers.clone();
        outputs[me] = recv;
        let (block, max_blocks) = direct::launch_limits(dev.backend());
        let launch = DirectAllReduce {
            algo: DirectAlgo::OneShot,
            dtype,
            op,
            count,
            rank: me,
            inputs: &self.buffers,
            outputs: &outputs,
            flags: &self.flags,
            scratch: None,
            control: self.control.as_ptr() as *mut u32,
            epoch: 0,
            grid: direct::grid(dtype, count, block, max_blocks),
        };
        // SAFETY: every lane buffer is a live allocation (or open IPC
        // mapping) of at least `bytes` (lane_takes), the flag areas FLAG_BYTES, the
        // control block CONTROL_WORDS pinned words; `recv` holds `count`
        // elements (the caller's contract); one-shot out of place writes
        // only `recv`. Every rank launches the same grid on the lane for
        // the same call, so the device-derived epochs agree.
        unsafe { dev.direct_all_reduce(stream, &launch) }
            .map_err(|e| fail("launching the lane all-reduce", e))?;
        if op == ReduceOp::Avg {
            // SAFETY: `recv` holds `count` elements (the caller's contract).
            unsafe { dev.divide(stream, dtype, recv, count, n) }
                .map_err(|e| fail("enqueueing avg's divide", e))?;
        }
        if let Some(ev) = done {
            dev.record_event(ev, stream)
                .and_then(|()| dev.record_event(order, stream))
                .map_err(|e| fail("recording the lane all-reduce's completion", e))?;
            *last = Some(stream);
        }
        Ok(())
    }

    /// On the progress thread, in the operation's turn: takes its sequence
    /// number and waits for `done` with the communicator's deadline, abort
    /// and liveness probes (see [`WindowCore::wait_kernel`]). A failure
    /// marks the lane unusable and fails the communicator.
    pub(crate) fn watch_lane(
        &self,
        inner: &Inner,
        fingerprint: Fingerprint,
        done: EventHandle,
    ) -> Result<()> {
        inner.run_counted(Collective::AllReduce, fingerprint, |st, ctx, abort| {
            let doing = format!("lane all-reduce (seq {})", ctx.seq);
            self.wait_kernel(st, ctx, abort, done, &doing)
                .inspect_err(|_| {
                    self.broken
                        .store(true, std::sync::atomic::Ordering::Release)
                })
        })
    }
}
