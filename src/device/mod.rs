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
//! The executor reaches device memory through [`DeviceMemory`], an
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

use crate::comm::{Inner, RawOp};
use crate::work::WorkState;

mod api;
#[cfg(feature = "cuda")]
mod cudarc_slices;
mod memory;
mod offer;
mod window;

pub use api::DeviceOp;
pub(crate) use memory::{DeviceMemory, OpIds, Staging};
pub use offer::DirectCounts;
pub use window::{DeviceWindow, DirectAlgo, DirectChoice};

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
    staging: Mutex<Staging>,
    /// Live device windows and the offer records (`offer.rs`).
    windows: Mutex<offer::Registry>,
    /// Direct all-reduces run: one-shot, two-shot.
    direct: [AtomicU64; 2],
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
    /// Creates the internal stream and the flag on `dev`.
    pub(crate) fn new(dev: Arc<dyn Device>, rank: usize) -> Result<Binding> {
        let fail =
            |what: &str, e: DeviceError| device_error(rank, &dev, ("bind_device", None), what, e);
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
            stream,
            staging: Mutex::new(Staging::default()),
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

    /// Lets callers' streams waiting for `value` (or less) go on.
    fn release(&self, value: u32) {
        self.flag().fetch_max(value, Ordering::Release);
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
        // SAFETY: created in `new`, destroyed once here; every operation
        // that enqueued on it has completed (the worker joined first).
        if let Err(e) = unsafe { self.dev.destroy_stream(self.stream) } {
            tracing::warn!(error = %e, "destroying the collectives' stream failed");
        }
        // Never leave a caller's stream waiting.
        self.release(u32::MAX);
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

/// Runs a device job on the progress thread and releases the caller's
/// stream: after the result is on the device, or after the failure is
/// marked on the work handle.
pub(crate) fn run_job(inner: &Inner, ticket: u64, mut job: DeviceJob, state: &WorkState) {
    let r = inner.run_ordered_device(ticket, &mut job);
    let binding = inner.device.get();
    if let (Some(b), Some(ev)) = (binding, job.event) {
        // SAFETY: created at enqueue for this job only; not used after this.
        if let Err(e) = unsafe { b.dev.destroy_event(ev) } {
            tracing::warn!(error = %e, "destroying a collective's event failed");
        }
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
