//! Device operations on the progress thread: a queued device job waits
//! for the caller's stream, runs in its turn (through device windows where
//! every rank offers them, else in segments through the staging) and
//! releases the caller's stream; a lane job is watched to completion.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::device::{DeviceError, DevicePtr, EventHandle};
use comm_core::{Error, Result};

use super::offer::Attachment;
use super::window::WindowCore;
use crate::comm::{Inner, RawOp};
use crate::work::{DeviceRun, WorkState};
use sncl_runtime::device::binding::Binding;
use sncl_runtime::device::memory::{DeviceMemory, OpIds};
use sncl_runtime::device::segment::Segments;

/// One queued device operation.
pub(crate) struct DeviceJob {
    /// The communicator's device attachment.
    pub attached: Arc<Attachment>,
    /// The operation's shape (its host pointers are null).
    pub raw: RawOp,
    pub send: DevicePtr,
    pub recv: DevicePtr,
    /// Recorded on the caller's stream at enqueue.
    pub event: Option<EventHandle>,
    /// The flag value the caller's stream waits for.
    pub flag_value: u32,
    /// A device call at enqueue failed: the operation fails on every rank.
    pub enqueue_error: Option<Error>,
}

impl DeviceJob {
    /// Waits until the work before the operation on the caller's stream is
    /// done, up to `timeout`, giving up on an abort.
    pub(crate) fn wait_caller(
        &self,
        b: &Binding,
        rank: usize,
        timeout: Duration,
        abort: &AtomicBool,
    ) -> Result<()> {
        let Some(ev) = self.event else { return Ok(()) };
        let name = self.raw.coll.name();
        let start = Instant::now();
        let mut rounds = 0u32;
        loop {
            match b.dev.event_done(ev) {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => {
                    return Err(b.error(
                        rank,
                        name,
                        None,
                        "the work before it on the caller's stream",
                        e,
                    ))
                }
            }
            if abort.load(Ordering::Relaxed) {
                return Err(Error::Aborted {
                    rank,
                    reason: Some(format!(
                        "{name} interrupted by abort while waiting for the caller's stream"
                    )),
                });
            }
            let waited = start.elapsed();
            if waited >= timeout {
                let e = DeviceError::Timeout {
                    ordinal: b.dev.ordinal(),
                    what: "the work before the collective on the caller's stream".into(),
                    ms: timeout.as_millis() as u64,
                };
                return Err(b.error(rank, name, None, "waiting for the caller's stream", e));
            }
            rounds += 1;
            if rounds < 64 {
                std::hint::spin_loop();
            } else if waited < Duration::from_millis(20) {
                std::thread::sleep(Duration::from_micros(20));
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }
}

/// A lane all-reduce (`window/lane.rs`) already on the caller's stream:
/// the progress thread watches it in its turn.
pub(crate) struct LaneJob {
    pub lane: Arc<WindowCore>,
    pub binding: Arc<Binding>,
    pub fingerprint: comm_core::wire::Fingerprint,
    /// Recorded after its kernels; `None` under stream capture (nothing to
    /// watch: the work runs at each replay).
    pub done: Option<EventHandle>,
    /// The all-reduce kernel it ran (`None`: another collective, or
    /// `ipc_ordered`).
    pub algo: Option<::device::direct::DirectAlgo>,
    /// A collective ordered between processes by IPC events
    /// (`window/ipc_events.rs`), no lane kernel.
    pub ipc_ordered: bool,
    /// How the flight recorder and the statistics record it: the kernel
    /// (`lane one-shot`, `lane two-shot`, `lane ll`, `lane`), the bytes, the tag.
    pub recorded_as: (&'static str, u64, u64),
    /// Enqueueing on the caller's stream failed: the operation fails (and
    /// with it the communicator, so that the peers' kernels stop).
    pub enqueue_error: Option<Error>,
}

impl DeviceRun for LaneJob {
    fn run(self: Box<Self>, inner: &Inner, ticket: u64, state: &WorkState) {
        run_lane_job(inner, ticket, *self, state)
    }
}

impl DeviceRun for DeviceJob {
    fn run(self: Box<Self>, inner: &Inner, ticket: u64, state: &WorkState) {
        run_job(inner, ticket, *self, state)
    }
}

/// Watches a lane job in its turn and completes its work handle.
fn run_lane_job(inner: &Inner, ticket: u64, job: LaneJob, state: &WorkState) {
    inner.order.wait_turn(ticket);
    let r = match (job.enqueue_error, job.done) {
        (Some(e), _) => {
            // The kernel may be on the stream already (a later enqueue step
            // failed): stop it, so the caller's stream goes on.
            job.lane.stop_lane_kernels();
            let mut st = inner.lock();
            inner.fail(&mut st, &e);
            Err(e)
        }
        (None, Some(done)) => {
            let r = job
                .lane
                .watch_lane(inner, job.fingerprint, job.recorded_as, done);
            if r.is_err() {
                // Also when the communicator had failed before this turn:
                // the kernel waits on peers that will not come.
                job.lane.stop_lane_kernels();
            }
            if r.is_ok() {
                job.binding.direct[2].fetch_add(1, Ordering::Relaxed);
                let by_algo = match job.algo {
                    Some(::device::direct::DirectAlgo::TwoShot) => Some(3),
                    Some(::device::direct::DirectAlgo::LowLatency) => Some(4),
                    _ if job.ipc_ordered => Some(5),
                    _ => None,
                };
                if let Some(i) = by_algo {
                    job.binding.direct[i].fetch_add(1, Ordering::Relaxed);
                }
            }
            r
        }
        (None, None) => Ok(()),
    };
    inner.order.finish();
    if let Some(ev) = job.done {
        job.binding.give_back_event(ev);
    }
    state.complete(r);
}

/// Runs a device job on the progress thread and releases the caller's
/// stream: after the result is on the device, or after the failure is
/// marked on the work handle.
fn run_job(inner: &Inner, ticket: u64, mut job: DeviceJob, state: &WorkState) {
    let r = inner.run_ordered_device(ticket, &mut job);
    let b = job.attached.binding.clone();
    if let Some(ev) = job.event {
        // Taken at enqueue for this job only; recording it again for a
        // later job is allowed even if this record were pending
        // (`cuEventRecord` overwrites what the event captured).
        b.give_back_event(ev);
    }
    match r {
        Ok(()) => {
            b.release(job.flag_value);
            state.complete(Ok(()));
        }
        Err(e) => {
            state.complete(Err(e));
            b.release(job.flag_value);
        }
    }
}

impl Inner {
    /// Runs a device operation when its ticket's turn comes.
    fn run_ordered_device(&self, ticket: u64, job: &mut DeviceJob) -> Result<()> {
        self.order.wait_turn(ticket);
        let r = self.run_device(job);
        self.order.finish();
        r
    }

    fn run_device(&self, job: &mut DeviceJob) -> Result<()> {
        let binding = job.attached.binding.clone();
        // A device failure before the operation started (at enqueue, or in
        // the work before it on the caller's stream) fails it on every rank.
        // The wait runs without the state held: the caller's thread may
        // still be enqueueing what follows this operation (a compressed
        // all-reduce enqueues several), and its checks take the state; with
        // it held here the caller's stream would never be released.
        {
            let mut st = self.lock();
            self.check_not_aborted(&mut st)?;
        }
        let ready = match job.enqueue_error.take() {
            Some(e) => Err(e),
            None => job.wait_caller(&binding, self.rank, self.config.timeout, &self.abort_flag),
        };
        let op = &job.raw;
        let mut guard = self.lock();
        let st = &mut *guard;
        self.check_not_aborted(st)?;
        self.check_not_suspended(st, op.coll.name())?;
        let binding = &binding;
        if let Err(e) = ready {
            self.fail(st, &e);
            return Err(e);
        }
        if op.coll == comm_core::wire::Collective::SendRecv {
            return self.run_device_p2p(st, binding, op);
        }
        let prepared = self.prepared(op)?;
        // nvlink version 2: an all-reduce over device windows that every
        // rank offers alike runs the direct kernel (src/device/offer.rs).
        let turn = (st.next_seq(), self.spin, &self.abort_flag);
        let offered = (&*job.attached, op, (job.send, job.recv));
        // A call with its own algorithm or chunk runs that schedule, not
        // the direct kernel (every rank passes the same settings).
        let direct = op
            .config
            .planned()
            .then(|| self.run_device_window(st, offered, prepared.fingerprint, turn))
            .flatten();
        if let Some(r) = direct {
            st.take_seq();
            st.count_op(op.coll);
            return r.inspect_err(|e| self.fail(st, e));
        }
        let esize = op.dtype.size();
        let mut staging = binding.staging();
        let segments = Segments::cut(
            op.coll,
            (op.count, esize, self.nranks),
            (prepared.send_elems, prepared.recv_elems),
            staging.bytes(),
        )
        .map_err(|detail| self.invalid(op.coll.name(), detail))
        .inspect_err(|e| self.fail(st, e))?;
        let caller = (job.send, job.recv);
        let segment_buffers = staging.segment_buffers();
        let mut ran = false;
        let mut scattered = false;
        for i in 0..segments.len() {
            let (_, len) = segments.bounds(i);
            let mut sub = RawOp::new(op.coll, op.dtype, len);
            sub.op = op.op;
            sub.root = op.root;
            sub.config = op.config;
            let (sched, algo) = self.schedule(st, &sub, true)?;
            if sched.steps.is_empty() {
                continue;
            }
            let part = self.prepared(&sub)?;
            let scratch_bytes = sched.scratch_elems.saturating_mul(esize);
            if scratch_bytes > staging.bytes() {
                let e = self.invalid(
                    op.coll.name(),
                    format!(
                        "the {} schedule needs {scratch_bytes} bytes of scratch, more than the \
                         {}-byte device staging (a segment's needs stay within its footprint: \
                         comm-core/tests/staging_needs.rs)",
                        algo.name(),
                        staging.bytes()
                    ),
                );
                self.fail(st, &e);
                return Err(e);
            }
            let (send, recv) = segments.buffers(i, caller, segment_buffers);
            let gathers = segments.gather_sends(i, job.send, segment_buffers.0);
            if let Err(e) = copy_on_stream(binding, &gathers) {
                let e = binding.error(self.rank, op.coll.name(), None, "gathering a segment", e);
                self.fail(st, &e);
                return Err(e);
            }
            // The sequence number is taken only now, after every check.
            let seq = st.take_seq();
            if !ran {
                st.count_op(op.coll);
                ran = true;
            }
            let mem = DeviceMemory::new(
                (&binding.dev, binding.stream),
                &mut staging,
                OpIds {
                    rank: self.rank,
                    op: op.coll.name(),
                    seq,
                },
                (send, part.send_elems * esize),
                (recv, part.recv_elems * esize),
                self.config.timeout,
            );
            let bytes = (part.send_elems.max(part.recv_elems) * esize) as u64;
            self.execute_op(
                st,
                &sub,
                (seq, part.fingerprint),
                (&sched, algo),
                &mem,
                bytes,
                |r| {
                    // The result must be on the device (and the staging
                    // free) before the caller's stream goes on, also after
                    // a failure.
                    let done = mem.finish();
                    r.and(done)
                },
            )?;
            drop(mem);
            let scatters = segments.scatter_recvs(i, job.recv, segment_buffers.1);
            scattered |= !scatters.is_empty();
            if let Err(e) = copy_on_stream(binding, &scatters) {
                let e = binding.error(
                    self.rank,
                    op.coll.name(),
                    Some(seq),
                    "scattering a segment",
                    e,
                );
                self.fail(st, &e);
                return Err(e);
            }
        }
        if scattered {
            // The last segment's scatter copies, before the caller's stream
            // goes on.
            let deadline = std::time::Instant::now() + self.config.timeout;
            if let Err(e) = binding.dev.synchronize(binding.stream, deadline) {
                let e = binding.error(
                    self.rank,
                    op.coll.name(),
                    Some(st.seq()),
                    "scattering the last segment",
                    e,
                );
                self.fail(st, &e);
                return Err(e);
            }
        }
        Ok(())
    }
}

/// Enqueues device-to-device `copies` (destination, source, bytes) on the
/// binding's stream.
pub(super) fn copy_on_stream(
    b: &Binding,
    copies: &[(DevicePtr, DevicePtr, usize)],
) -> std::result::Result<(), DeviceError> {
    for &(dst, src, bytes) in copies {
        // SAFETY: `Segments` derives both ranges from the caller's live
        // device buffers (extents checked at enqueue) and the staging's
        // segment buffers (a segment's footprint fits them); the stream
        // orders them with the segment's own work.
        unsafe { b.dev.copy_d2d_async(dst, src, bytes, b.stream)? };
    }
    Ok(())
}
