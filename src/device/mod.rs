//! The device path of the runtime: collectives on device memory.
//!
//! A communicator binds to one device ([`crate::Communicator::bind_device`]).
//! A device collective is checked on the caller's thread, then queued on the
//! communicator's progress thread like a non-blocking host operation, and
//! returns at once with a work handle. Stream semantics (as NCCL's):
//!
//! * at enqueue an event is recorded on the caller's stream; the progress
//!   thread waits for it (polling, with the communicator's timeout as the
//!   deadline) before the operation touches the buffers, so the operation
//!   sees the work already on that stream;
//! * also at enqueue, a [`Device::stream_wait_u32`] on a flag in pinned
//!   host memory is put on the caller's stream, so the stream does not run
//!   past the collective until the progress thread writes the flag: after
//!   the result is on the device, or after a failure was marked (so a
//!   stream never hangs on a failed operation).
//!
//! Small all-reduces take the kernel path instead (`window/lane.rs`): kernels
//! on the caller's stream with no host-released wait, capturable into CUDA
//! graphs; the progress thread only watches them.
//!
//! Nothing inside an operation allocates, frees, loads a module or opens
//! an IPC mapping (each may synchronise the device, which deadlocks while
//! a caller's stream waits on the host): binding loads every kernel and
//! allocates the staging (`SNCL_DEVICE_STAGING_BYTES` per buffer; larger
//! operations run in segments, `segment.rs`), and a rank's first device
//! collective publishes and maps the device links' inboxes around a host
//! barrier, on the caller's thread.
//!
//! The executor reaches device memory through `DeviceMemory` (`memory.rs`), an
//! implementation of `sncl_runtime::exec::Memory` that keeps the data on the
//! device (the host never dereferences a [`DevicePtr`]).
//!
//! The device layer's types are re-exported here: `sncl::device::open`,
//! `sncl::device::DeviceBuffer`, ...

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use ::device::{
    current_device, device_count, open, Arch, Backend, Device, DeviceBuffer, DeviceError,
    DevicePtr, EventHandle, PinnedBuffer, StreamHandle,
};
use comm_core::{Error, Result};

pub use crate::buffer::{DeviceSlice, DeviceSliceMut};

use crate::comm::{Inner, RawOp};
use crate::work::WorkState;

mod api;
#[cfg(feature = "cuda")]
mod cudarc_slices;
mod memory;
mod offer;
mod segment;
mod window;

pub use api::DeviceOp;
pub(crate) use memory::{DeviceMemory, OpIds, Staging};
pub use offer::DirectCounts;
pub(crate) use segment::Segments;
pub(crate) use window::WindowCore;
pub use window::{DeviceWindow, DirectAlgo, DirectChoice};

/// How many checked allocations a binding remembers.
const CHECKED_ALLOCATIONS: usize = 64;

/// A communicator's device: the device, the operations' internal stream,
/// the pinned flag callers' streams wait on, and staging reused across
/// operations.
pub(crate) struct Binding {
    pub dev: Arc<dyn Device>,
    /// The stream every device collective of this communicator runs on.
    pub stream: StreamHandle,
    /// A `u32` the callers' streams wait on (`>=` the operation's value).
    flag: PinnedBuffer,
    /// The value the next operation's callers wait for.
    next_flag: AtomicU32,
    /// Every rank of the communicator has bound its device (the barrier
    /// at this rank's first device collective passed).
    pub(crate) peers_bound: AtomicBool,
    /// Held while the first device collective joins the peers.
    pub(crate) joining: Mutex<()>,
    /// Events that operations recorded on callers' streams, done with and
    /// reused (one fewer driver call per collective on the caller's
    /// thread); destroyed with the binding.
    events: Mutex<Vec<EventHandle>>,
    /// Device allocations (base, end) that collectives' buffers were
    /// checked against ([`Binding::check_buffer`]), newest last, at most
    /// [`CHECKED_ALLOCATIONS`].
    checked: Mutex<Vec<(u64, u64)>>,
    staging: Mutex<Staging>,
    /// Live device windows and the offer records (`offer.rs`).
    windows: Mutex<offer::Registry>,
    /// Direct all-reduces run: one-shot, two-shot, on the kernel path.
    direct: [AtomicU64; 3],
}

impl std::fmt::Debug for Binding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Binding")
            .field("device", &self.dev.name())
            .field("ordinal", &self.dev.ordinal())
            .finish()
    }
}

impl Binding {
    /// Creates the internal stream and the flag on `dev`, loads every
    /// kernel and allocates the staging (`staging_bytes` per buffer): after
    /// this, no operation loads, allocates or frees (each may synchronise
    /// the device).
    pub(crate) fn new(dev: Arc<dyn Device>, rank: usize, staging_bytes: usize) -> Result<Binding> {
        let fail =
            |what: &str, e: DeviceError| device_error(rank, &dev, ("bind_device", None), what, e);
        dev.load_kernels()
            .map_err(|e| fail("loading the kernels", e))?;
        let staging =
            Staging::new(&dev, staging_bytes).map_err(|e| fail("allocating the staging", e))?;
        let flag =
            PinnedBuffer::new(&dev, 64).map_err(|e| fail("allocating the stream flag", e))?;
        if !(flag.as_ptr() as usize).is_multiple_of(std::mem::align_of::<AtomicU32>()) {
            return Err(Error::InvalidArgument {
                rank,
                op: "bind_device",
                detail: "the device's pinned memory is not aligned for a u32 flag".into(),
            });
        }
        // SAFETY: 64 bytes of pinned host memory owned by `flag`, aligned
        // (checked above); nothing else uses it yet.
        unsafe { flag.as_ptr().write_bytes(0, 64) };
        let stream = dev
            .create_stream()
            .map_err(|e| fail("creating the collectives' stream", e))?;
        Ok(Binding {
            flag,
            next_flag: AtomicU32::new(1),
            peers_bound: AtomicBool::new(false),
            joining: Mutex::new(()),
            events: Mutex::new(Vec::new()),
            checked: Mutex::new(Vec::new()),
            stream,
            staging: Mutex::new(staging),
            windows: Mutex::new(offer::Registry::default()),
            direct: Default::default(),
            dev,
        })
    }

    fn flag(&self) -> &AtomicU32 {
        // SAFETY: the flag's memory is aligned (checked in `new`), lives as
        // long as self, and is only accessed atomically by the host (the
        // device only reads it in stream waits).
        unsafe { AtomicU32::from_ptr(self.flag.as_ptr() as *mut u32) }
    }

    /// Lets callers' streams waiting for `value` (or an earlier value) go
    /// on. Values compare cyclically, as the driver's `GEQ` wait does
    /// (`(int32_t)(*addr - value) >= 0`), so they wrap past 2^32.
    fn release(&self, value: u32) {
        release_cyclic(self.flag(), value);
    }

    /// Checks that `bytes` at `addr` (a collective's `what`, e.g. "send
    /// buffer") lie in one live allocation of this binding's device, before
    /// anything is enqueued: host memory, another device's memory, a freed
    /// or too short allocation are an `InvalidArgument` naming `what`.
    /// Each allocation is looked up once (about three driver calls) and
    /// remembered; an allocation freed and replaced at the same address by
    /// a shorter one is not seen again. Backends that cannot look pointers
    /// up check nothing here (the emulated device checks every access).
    pub(crate) fn check_buffer(
        &self,
        (rank, op): (usize, &'static str),
        what: &str,
        addr: u64,
        bytes: usize,
    ) -> Result<()> {
        let end = addr.saturating_add(bytes as u64);
        let mut checked = self.checked.lock().unwrap_or_else(|e| e.into_inner());
        if checked.iter().any(|&(b, e)| b <= addr && end <= e) {
            return Ok(());
        }
        let invalid = |detail: String| Error::InvalidArgument { rank, op, detail };
        let (base, len) = match self.dev.allocation_range(addr) {
            Ok(r) => r,
            Err(DeviceError::Unsupported { .. }) => return Ok(()),
            Err(DeviceError::InvalidArgument { detail, .. }) => {
                return Err(invalid(format!("the {what} is not usable: {detail}")))
            }
            Err(e) => return Err(self.error(rank, op, None, &format!("checking the {what}"), e)),
        };
        let mut alloc_end = base.0 + len as u64;
        // Memory mapped in chunks (cuMemCreate + cuMemMap, PyTorch's
        // expandable segments) answers one chunk per range: follow
        // contiguous ranges to the buffer's end.
        let mut chunks = 0;
        while end > alloc_end && chunks < 4096 {
            match self.dev.allocation_range(alloc_end) {
                Ok((next, next_len)) if next.0 == alloc_end && next_len > 0 => {
                    alloc_end += next_len as u64;
                    chunks += 1;
                }
                _ => break,
            }
        }
        if end > alloc_end {
            return Err(invalid(format!(
                "the {what} at {addr:#x} needs {bytes} bytes, but its allocation (from {:#x}) \
                 ends {} bytes after it",
                base.0,
                alloc_end - addr
            )));
        }
        if checked.len() == CHECKED_ALLOCATIONS {
            checked.remove(0);
        }
        checked.push((base.0, alloc_end));
        Ok(())
    }

    /// An event for a caller's stream: a reused one, else a new one.
    pub(crate) fn take_event(&self) -> ::device::Result<EventHandle> {
        let reused = self.events.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match reused {
            Some(ev) => Ok(ev),
            None => self.dev.create_event(),
        }
    }

    /// Gives back an event of [`Binding::take_event`] whose record the
    /// progress thread no longer waits on.
    pub(crate) fn give_back_event(&self, ev: EventHandle) {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ev);
    }

    pub(crate) fn registry(&self) -> MutexGuard<'_, offer::Registry> {
        self.windows.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a direct all-reduce that completed.
    pub(crate) fn count_direct(&self, algo: DirectAlgo) {
        let i = usize::from(algo == DirectAlgo::TwoShot);
        self.direct[i].fetch_add(1, Ordering::Relaxed);
    }

    fn direct_counts(&self) -> DirectCounts {
        DirectCounts {
            one_shot: self.direct[0].load(Ordering::Relaxed),
            two_shot: self.direct[1].load(Ordering::Relaxed),
            kernel_path: self.direct[2].load(Ordering::Relaxed),
        }
    }

    pub(crate) fn staging(&self) -> MutexGuard<'_, Staging> {
        self.staging.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A device error in operation `op` (`seq` once it has one) as an
    /// [`Error::Device`] that names the rank, the operation and the device.
    pub(crate) fn error(
        &self,
        rank: usize,
        op: &'static str,
        seq: Option<u64>,
        what: &str,
        e: DeviceError,
    ) -> Error {
        device_error(rank, &self.dev, (op, seq), what, e)
    }
}

impl Drop for Binding {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        if let Err(e) = self.dev.synchronize(self.stream, deadline) {
            tracing::warn!(error = %e, "synchronizing the collectives' stream at unbind failed");
        }
        // Free staging and its events before the stream goes.
        self.staging
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .release(&*self.dev);
        for ev in self
            .events
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            // SAFETY: created by `take_event` on this device, destroyed
            // once here; no operation uses it any more.
            if let Err(e) = unsafe { self.dev.destroy_event(ev) } {
                tracing::warn!(error = %e, "destroying a collective's event failed");
            }
        }
        // SAFETY: created in `new`, destroyed once here; every operation
        // that enqueued on it has completed (the worker joined first).
        if let Err(e) = unsafe { self.dev.destroy_stream(self.stream) } {
            tracing::warn!(error = %e, "destroying the collectives' stream failed");
        }
        // Never leave a caller's stream waiting: release the last value
        // handed out (a larger one, e.g. u32::MAX, would not pass a cyclic
        // wait for a value more than 2^31 before it).
        self.release(self.next_flag.load(Ordering::Relaxed).wrapping_sub(1));
    }
}

/// Raises `word` to `value` unless it is already at or cyclically past it
/// (`value - word`, as a signed 32-bit difference, not positive).
fn release_cyclic(word: &AtomicU32, value: u32) {
    let mut cur = word.load(Ordering::Relaxed);
    while (value.wrapping_sub(cur) as i32) > 0 {
        match word.compare_exchange_weak(cur, value, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => return,
            Err(now) => cur = now,
        }
    }
}

/// A device error in operation `op` (with its sequence number once it has
/// one) as an [`Error::Device`] naming the rank, the backend and the device.
pub(crate) fn device_error(
    rank: usize,
    dev: &Arc<dyn Device>,
    (op, seq): (&'static str, Option<u64>),
    what: &str,
    e: DeviceError,
) -> Error {
    Error::Device {
        rank,
        op,
        seq,
        device: format!(
            "{} device {} ({})",
            dev.backend().name(),
            dev.ordinal(),
            dev.name()
        ),
        what: what.to_string(),
        detail: e.to_string(),
    }
}

/// One queued device operation.
pub(crate) struct DeviceJob {
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
    pub fingerprint: comm_core::wire::Fingerprint,
    /// Recorded after its kernels; `None` under stream capture (nothing to
    /// watch: the work runs at each replay).
    pub done: Option<EventHandle>,
    /// Enqueueing on the caller's stream failed: the operation fails (and
    /// with it the communicator, so that the peers' kernels stop).
    pub enqueue_error: Option<Error>,
}

/// Watches a lane job in its turn and completes its work handle.
pub(crate) fn run_lane_job(inner: &Inner, ticket: u64, job: LaneJob, state: &WorkState) {
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
            let r = job.lane.watch_lane(inner, job.fingerprint, done);
            if r.is_err() {
                // Also when the communicator had failed before this turn:
                // the kernel waits on peers that will not come.
                job.lane.stop_lane_kernels();
            }
            if let (Ok(()), Some(b)) = (&r, inner.device.get()) {
                b.direct[2].fetch_add(1, Ordering::Relaxed);
            }
            r
        }
        (None, None) => Ok(()),
    };
    inner.order.finish();
    if let (Some(b), Some(ev)) = (inner.device.get(), job.done) {
        b.give_back_event(ev);
    }
    state.complete(r);
}

/// Runs a device job on the progress thread and releases the caller's
/// stream: after the result is on the device, or after the failure is
/// marked on the work handle.
pub(crate) fn run_job(inner: &Inner, ticket: u64, mut job: DeviceJob, state: &WorkState) {
    let r = inner.run_ordered_device(ticket, &mut job);
    let binding = inner.device.get();
    if let (Some(b), Some(ev)) = (binding, job.event) {
        // Taken at enqueue for this job only; recording it again for a
        // later job is allowed even if this record were pending
        // (`cuEventRecord` overwrites what the event captured).
        b.give_back_event(ev);
    }
    match r {
        Ok(()) => {
            if let Some(b) = binding {
                b.release(job.flag_value);
            }
            state.complete(Ok(()));
        }
        Err(e) => {
            state.complete(Err(e));
            if let Some(b) = binding {
                b.release(job.flag_value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_is_cyclic_across_the_wrap() {
        let word = AtomicU32::new(u32::MAX - 1);
        release_cyclic(&word, u32::MAX);
        assert_eq!(word.load(Ordering::Relaxed), u32::MAX);
        // Past the wrap: 0 and 3 come after u32::MAX.
        release_cyclic(&word, 3);
        assert_eq!(word.load(Ordering::Relaxed), 3);
        // An older value never lowers it, also across the wrap.
        release_cyclic(&word, u32::MAX);
        assert_eq!(word.load(Ordering::Relaxed), 3);
        release_cyclic(&word, 2);
        assert_eq!(word.load(Ordering::Relaxed), 3);
        // u32::MAX does not pass a wait for 5 (the driver's GEQ), which is
        // why a binding releases its last value, not u32::MAX, at drop.
        let passes = |word: u32, value: u32| (word.wrapping_sub(value) as i32) >= 0;
        assert!(!passes(u32::MAX, 5));
        assert!(passes(3, u32::MAX));
    }

    /// The binding's flag handed out across the 2^32 wrap: each caller-side
    /// wait parks the stream until its value is released, then passes
    /// (the emulated device's wait compares cyclically, as the driver's).
    #[test]
    fn stream_waits_pass_across_the_wrap() {
        let dev = ::device::open(Backend::Emu, 0).expect("emulated device");
        let b = Binding::new(dev, 0, 1 << 16).expect("binding");
        // As after 2^32 - 3 operations: the word holds the last released
        // value, the next one handed out is one more.
        b.next_flag.store(u32::MAX - 2, Ordering::Relaxed);
        b.flag().store(u32::MAX - 3, Ordering::Relaxed);
        let event = b.dev.create_event().expect("event");
        for _ in 0..5 {
            let value = b.next_flag.fetch_add(1, Ordering::Relaxed);
            // SAFETY: the flag lives as long as `b`, which outlives the
            // synchronisation below.
            unsafe {
                b.dev
                    .stream_wait_u32(b.stream, b.flag.as_ptr() as *const u32, value)
            }
            .expect("wait");
            b.dev.record_event(event, b.stream).expect("record");
            std::thread::sleep(Duration::from_millis(20));
            assert!(
                !b.dev.event_done(event).expect("query"),
                "the stream ran past an unreleased wait for {value}"
            );
            b.release(value);
            b.dev
                .synchronize(b.stream, Instant::now() + Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("released {value}, yet the stream is parked: {e}"));
        }
        assert_eq!(b.next_flag.load(Ordering::Relaxed), 2);
        // SAFETY: recorded on a synchronised stream; not used again.
        unsafe { b.dev.destroy_event(event) }.expect("destroy");
    }
}
