//! A communicator's device binding: the device, the operations' internal
//! stream, the pinned flag callers' streams wait on, the staging reused
//! across operations, and what the binding counts.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ::device::direct::DirectAlgo;
use ::device::{Device, DeviceBuffer, DeviceError, EventHandle, PinnedBuffer, StreamHandle};
use comm_core::transport::footprint::{FootprintReport, Purpose, Residence};
use comm_core::{Error, Result};

use super::errors::device_error;
use super::memory::Staging;

/// How many temporaries a binding keeps between operations.
pub const MAX_TEMPORARIES: usize = 32;

/// How many checked allocations a binding remembers.
const CHECKED_ALLOCATIONS: usize = 64;

/// A communicator's device: the device, the operations' internal stream,
/// the pinned flag callers' streams wait on, and staging reused across
/// operations.
pub struct Binding {
    /// The device.
    pub dev: Arc<dyn Device>,
    /// The stream every device collective of this communicator runs on.
    pub stream: StreamHandle,
    /// A `u32` the callers' streams wait on (`>=` the operation's value).
    flag: PinnedBuffer,
    /// The value the next operation's callers wait for.
    next_flag: AtomicU32,
    /// Every rank of the communicator has bound its device and the device
    /// links are up (the barrier of `connect_device`, or of this rank's
    /// first device collective, passed).
    pub peers_bound: AtomicBool,
    /// Held while the first device collective joins the peers.
    pub joining: Mutex<()>,
    /// Events that operations recorded on callers' streams, done with and
    /// reused (one fewer driver call per collective on the caller's
    /// thread); destroyed with the binding.
    events: Mutex<Vec<EventHandle>>,
    /// Device allocations (base, end) that collectives' buffers were
    /// checked against ([`Binding::check_buffer`]), newest last, at most
    /// [`CHECKED_ALLOCATIONS`].
    checked: Mutex<Vec<(u64, u64)>>,
    staging: Mutex<Staging>,
    /// Device temporaries of operations that need more than the staging
    /// (the compressed all-reduce's padded, gathered and decoded parts),
    /// kept for the next operation instead of freed: a free synchronises
    /// the device, and an operation never frees ([`Binding::take_temporaries`]).
    temporaries: Mutex<Vec<DeviceBuffer>>,
    /// Direct all-reduces run: one-shot, two-shot, on the kernel path, on
    /// the kernel path two-shot, on the kernel path LL; collectives on the
    /// kernel path ordered by IPC events.
    pub direct: [AtomicU64; 6],
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
    pub fn new(
        dev: Arc<dyn Device>,
        rank: usize,
        settings: &comm_core::config::DeviceSettings,
    ) -> Result<Binding> {
        let fail =
            |what: &str, e: DeviceError| device_error(rank, &dev, ("bind_device", None), what, e);
        dev.load_kernels(settings.cuda_include.as_deref())
            .map_err(|e| fail("loading the kernels", e))?;
        let staging = Staging::new(&dev, settings.staging_bytes)
            .map_err(|e| fail("allocating the staging", e))?;
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
            temporaries: Mutex::new(Vec::new()),
            direct: Default::default(),
            dev,
        })
    }

    /// The value the next operation's callers wait for (values follow the
    /// stream order: taken under the ticket lock).
    pub fn take_flag_value(&self) -> u32 {
        self.next_flag.fetch_add(1, Ordering::Relaxed)
    }

    /// The flag callers' streams wait on: an aligned `u32` at the start of
    /// the binding's pinned allocation, which lives as long as the binding
    /// (and is released to the last value handed out before it goes).
    pub fn flag_word(&self) -> *const u32 {
        self.flag.as_ptr() as *const u32
    }

    /// The flag as the host writes it.
    pub fn flag(&self) -> &AtomicU32 {
        // SAFETY: the flag's memory is aligned (checked in `new`), lives as
        // long as self, and is only accessed atomically by the host (the
        // device only reads it in stream waits).
        unsafe { AtomicU32::from_ptr(self.flag.as_ptr() as *mut u32) }
    }

    /// Lets callers' streams waiting for `value` (or an earlier value) go
    /// on. Values compare cyclically, as the driver's `GEQ` wait does
    /// (`(int32_t)(*addr - value) >= 0`), so they wrap past 2^32.
    pub fn release(&self, value: u32) {
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
    pub fn check_buffer(
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
    pub fn take_event(&self) -> ::device::Result<EventHandle> {
        let reused = self.events.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match reused {
            Some(ev) => Ok(ev),
            None => self.dev.create_event(),
        }
    }

    /// Fills the pool of [`Binding::take_event`] up to `n` events, so that
    /// up to `n` operations in flight take one without creating it on the
    /// caller's thread (one driver call fewer each).
    pub fn reserve_events(&self, n: usize) -> ::device::Result<()> {
        let mut pool = self.events.lock().unwrap_or_else(|e| e.into_inner());
        while pool.len() < n {
            pool.push(self.dev.create_event()?);
        }
        Ok(())
    }

    /// Gives back an event of [`Binding::take_event`] whose record the
    /// progress thread no longer waits on.
    pub fn give_back_event(&self, ev: EventHandle) {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ev);
    }

    /// Counts a direct all-reduce that completed.
    pub fn count_direct(&self, algo: DirectAlgo) {
        let i = usize::from(algo == DirectAlgo::TwoShot);
        self.direct[i].fetch_add(1, Ordering::Relaxed);
    }

    /// The direct all-reduces run so far.
    pub fn direct_counts(&self) -> DirectCounts {
        DirectCounts {
            one_shot: self.direct[0].load(Ordering::Relaxed),
            two_shot: self.direct[1].load(Ordering::Relaxed),
            kernel_path: self.direct[2].load(Ordering::Relaxed),
            kernel_path_two_shot: self.direct[3].load(Ordering::Relaxed),
            kernel_path_ll: self.direct[4].load(Ordering::Relaxed),
            kernel_path_ipc_events: self.direct[5].load(Ordering::Relaxed),
        }
    }

    /// Reports the memory this binding holds ([`Purpose::DeviceStaging`]):
    /// its staging buffers and the kept temporaries.
    pub fn footprint(&self, report: &mut FootprintReport<'_>) {
        let (pinned, device) = self
            .staging
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .held_bytes();
        let kept: usize = self
            .temporaries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|b| b.bytes())
            .sum();
        report(Purpose::DeviceStaging, Residence::Pinned, pinned as u64);
        report(
            Purpose::DeviceStaging,
            Residence::Device,
            (device + kept) as u64,
        );
    }

    /// The temporaries kept from earlier operations, for one operation to
    /// reuse (another running at the same time finds none and allocates
    /// its own); give them back with [`Binding::keep_temporaries`] once the
    /// stream has run everything that used them.
    pub fn take_temporaries(&self) -> Vec<DeviceBuffer> {
        std::mem::take(&mut *self.temporaries.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Keeps an operation's temporaries (the stream has run everything
    /// that used them) for later operations: at most
    /// [`MAX_TEMPORARIES`], the largest (the rest are freed, between
    /// operations rather than inside one).
    pub fn keep_temporaries(&self, mut bufs: Vec<DeviceBuffer>) {
        let mut kept = self.temporaries.lock().unwrap_or_else(|e| e.into_inner());
        bufs.append(&mut kept);
        bufs.sort_by_key(|b| std::cmp::Reverse(b.bytes()));
        bufs.truncate(MAX_TEMPORARIES);
        *kept = bufs;
    }

    /// The staging, locked for one operation.
    pub fn staging(&self) -> MutexGuard<'_, Staging> {
        self.staging.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A device error in operation `op` (`seq` once it has one) as an
    /// [`Error::Device`] that names the rank, the operation and the device.
    pub fn error(
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

/// How many all-reduces ran the direct kernels on this rank (device
/// windows' own all-reduces and ordinary device all-reduces routed to
/// them), by kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirectCounts {
    /// One-shot kernels run.
    pub one_shot: u64,
    /// Two-shot kernels run.
    pub two_shot: u64,
    /// Device collectives (all-reduce, reduce-scatter, all-gather,
    /// broadcast, reduce) the kernel path ran on callers' streams
    /// (`SNCL_DEVICE_LANE_BYTES`), watched to completion (launches replayed
    /// from a CUDA graph are not counted).
    pub kernel_path: u64,
    /// Of `kernel_path`, the all-reduces that ran two-shot.
    pub kernel_path_two_shot: u64,
    /// Of `kernel_path`, the all-reduces that ran the low-latency protocol
    /// (data and flag in one store; the smallest messages).
    pub kernel_path_ll: u64,
    /// Of `kernel_path`, the collectives of ranks whose processes share a
    /// device without MPS, ordered between the processes by IPC events
    /// (copies and fold kernels that spin on nothing).
    pub kernel_path_ipc_events: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::device::Backend;

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
        let b = Binding::new(
            dev,
            0,
            &comm_core::config::DeviceSettings {
                staging_bytes: 1 << 16,
                ..Default::default()
            },
        )
        .expect("binding");
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
