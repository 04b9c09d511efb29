//! Streams, events and the operations they run. Each stream is an ordered
//! queue run by its own worker thread, so operations on one stream run in
//! order and different streams run concurrently; a value wait blocks only
//! its stream's worker.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kernels::{DataType, ReduceOp};

use super::memory::{Pinned, Span};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// State every stream of one device shares: the sticky fault and the stop
/// flag of a device object going away.
#[derive(Debug, Default)]
pub(super) struct DevState {
    faulted: AtomicBool,
    fault: Mutex<Option<String>>,
    stop: AtomicBool,
}

impl DevState {
    /// The sticky fault, once an injected fault has run.
    pub(super) fn fault(&self) -> Option<String> {
        if self.faulted.load(Ordering::Acquire) {
            lock(&self.fault).clone()
        } else {
            None
        }
    }

    fn set_fault(&self, what: String) {
        let mut f = lock(&self.fault);
        if f.is_none() {
            *f = Some(what);
        }
        self.faulted.store(true, Ordering::Release);
    }

    /// Makes every worker drop its queue and leave its waits.
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// Whether workers should run nothing more.
    fn halted(&self) -> bool {
        self.faulted.load(Ordering::Acquire) || self.stop.load(Ordering::Acquire)
    }
}

/// Host memory an operation reads or writes, with what keeps it alive.
pub(super) struct Host {
    pub(super) ptr: *mut u8,
    pub(super) keep: Option<Span>,
}

impl From<Span> for Host {
    fn from(span: Span) -> Host {
        Host {
            ptr: span.host(),
            keep: Some(span),
        }
    }
}

/// One queued operation. All arguments were checked at enqueue time.
pub(super) enum Op {
    Copy {
        dst: Host,
        src: Host,
        bytes: usize,
    },
    ReduceCopy {
        dtype: DataType,
        op: ReduceOp,
        srcs: Vec<Span>,
        dsts: Vec<Span>,
        count: usize,
    },
    Divide {
        dtype: DataType,
        data: Span,
        count: usize,
        divisor: usize,
    },
    /// A codec plan with host addresses; `_keep` holds its ranges alive.
    Codec {
        launches: Vec<kernels::cuda_codec::Launch>,
        _keep: Vec<Span>,
    },
    WriteU32 {
        addr: *mut u32,
        value: u32,
        _keep: Arc<Pinned>,
    },
    WaitU32 {
        addr: *const u32,
        value: u32,
        _keep: Arc<Pinned>,
    },
    Record {
        event: Arc<Event>,
        generation: u64,
    },
    WaitEvent {
        event: Arc<Event>,
        generation: u64,
    },
    /// A direct all-reduce kernel: `args` holds host addresses inside the
    /// spans of `_keep` and the pinned block of `_control`.
    Direct {
        kernel: String,
        args: Box<crate::direct::DirectArgs>,
        grid: u32,
        _keep: Vec<Span>,
        _control: Arc<Pinned>,
    },
    /// An injected fault: makes the device faulted when it runs.
    Fault {
        what: String,
    },
}

// SAFETY: the raw pointers are host memory the Device contract keeps valid
// until the operation completes (caller memory for copies) or that the
// operation itself keeps alive (`Span`, `Arc<Pinned>`).
unsafe impl Send for Op {}

impl Op {
    /// Runs the operation. Returns false when a wait was abandoned because
    /// the device faulted or is going away.
    fn run(self, dev: &DevState) -> bool {
        match self {
            Op::Copy { dst, src, bytes } => {
                // SAFETY: both ranges were bounds-checked (device spans) or
                // promised valid by the caller (host memory); `copy` allows
                // the overlap of a d2d copy within one allocation.
                unsafe { std::ptr::copy(src.ptr, dst.ptr, bytes) };
                drop((dst.keep, src.keep));
            }
            Op::ReduceCopy {
                dtype,
                op,
                srcs,
                dsts,
                count,
            } => {
                let s: Vec<*const u8> = srcs.iter().map(|s| s.host() as *const u8).collect();
                let d: Vec<*mut u8> = dsts.iter().map(Span::host).collect();
                // SAFETY: checked at enqueue: 1..=8 of each, a supported
                // pair, every span `count` elements long, destinations equal
                // to a source or overlapping nothing.
                unsafe { super::hostkernels::reduce_copy(dtype, op, &s, &d, count) };
            }
            Op::Divide {
                dtype,
                data,
                count,
                divisor,
            } => {
                // SAFETY: the span holds `count` elements; divisor >= 1.
                unsafe { super::hostkernels::divide(dtype, data.host(), count, divisor) };
            }
            Op::Codec { launches, .. } => {
                // SAFETY: every address in the plan was bounds-checked at
                // enqueue against a span kept alive by `_keep`.
                let r =
                    unsafe { super::codecs::run_plan(&launches, super::codecs::PlanShape::EMU) };
                if let Err(e) = r {
                    // As a failed launch on a GPU: a sticky device error,
                    // so the operation fails rather than completing with
                    // whatever the buffers held.
                    tracing::error!(error = %e, "emulated codec not run");
                    dev.set_fault(format!("a codec kernel failed: {e}"));
                }
            }
            Op::Direct {
                kernel, args, grid, ..
            } => {
                // SAFETY: every address was bounds-checked at enqueue
                // against a span (or the pinned block) this op keeps alive.
                if let Err(e) = unsafe { super::hostkernels::direct(&kernel, &args, grid) } {
                    // A sticky device error, as above.
                    tracing::error!(error = %e, "emulated direct all-reduce not run");
                    dev.set_fault(format!("the direct kernel {kernel} failed: {e}"));
                }
            }
            Op::WriteU32 { addr, value, .. } => {
                // SAFETY: an aligned u32 inside a live pinned block (checked
                // at enqueue, kept alive by `_keep`); the host reads it
                // concurrently, hence the atomic.
                let word = unsafe { AtomicU32::from_ptr(addr) };
                word.store(value, Ordering::Release);
            }
            Op::WaitU32 { addr, value, .. } => {
                // SAFETY: as for WriteU32.
                let word = unsafe { AtomicU32::from_ptr(addr as *mut u32) };
                // Cyclic, as the driver's GEQ: `(int32_t)(*addr - value) >= 0`.
                return poll(dev, || {
                    (word.load(Ordering::Acquire).wrapping_sub(value) as i32) >= 0
                });
            }
            Op::Record { event, generation } => event.complete(generation),
            Op::WaitEvent { event, generation } => {
                return poll(dev, || event.done_through(generation));
            }
            Op::Fault { what } => dev.set_fault(what),
        }
        true
    }
}

/// Waits until `ready`, yielding then sleeping with a growing pause (at
/// most 1 ms); gives up when the device halts.
fn poll(dev: &DevState, ready: impl Fn() -> bool) -> bool {
    let mut pause = Duration::from_micros(10);
    for round in 0u32.. {
        if ready() {
            return true;
        }
        if dev.halted() {
            return false;
        }
        if round < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }
    false
}

/// An event: the generation of its last record and of its last completed
/// record, with the host time of that completion.
#[derive(Debug, Default)]
pub(super) struct Event {
    state: Mutex<EventState>,
}

#[derive(Debug, Default)]
struct EventState {
    recorded: u64,
    done: u64,
    at: Option<Instant>,
}

impl Event {
    /// Starts a new record; returns its generation.
    pub(super) fn next_record(&self) -> u64 {
        let mut s = lock(&self.state);
        s.recorded += 1;
        s.recorded
    }

    /// The generation of the last record (0: never recorded).
    pub(super) fn last_record(&self) -> u64 {
        lock(&self.state).recorded
    }

    fn complete(&self, generation: u64) {
        let mut s = lock(&self.state);
        if generation > s.done {
            s.done = generation;
            s.at = Some(Instant::now());
        }
    }

    fn done_through(&self, generation: u64) -> bool {
        lock(&self.state).done >= generation
    }

    /// Whether the last record has completed (true when never recorded).
    pub(super) fn is_done(&self) -> bool {
        let s = lock(&self.state);
        s.done >= s.recorded
    }

    /// When the last record completed, if it has.
    pub(super) fn completed_at(&self) -> Option<Instant> {
        let s = lock(&self.state);
        if s.recorded > 0 && s.done >= s.recorded {
            s.at
        } else {
            None
        }
    }
}

/// How far a stream has got: operations enqueued and finished (run or
/// dropped).
#[derive(Debug, Default)]
struct Progress {
    counts: Mutex<(u64, u64)>,
    changed: Condvar,
}

/// A stream and its worker.
#[derive(Debug)]
pub(super) struct Stream {
    tx: Mutex<Option<mpsc::Sender<Op>>>,
    progress: Arc<Progress>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

/// Why a synchronize did not succeed.
pub(super) enum SyncError {
    /// The deadline passed with `pending` operations not finished.
    Timeout { pending: u64 },
    /// The stream was shut down with work queued.
    Gone,
}

impl Stream {
    /// Starts a stream and its worker thread.
    pub(super) fn start(dev: Arc<DevState>, name: String) -> std::io::Result<Stream> {
        let (tx, rx) = mpsc::channel::<Op>();
        let progress = Arc::new(Progress::default());
        let p = progress.clone();
        let worker = std::thread::Builder::new().name(name).spawn(move || {
            for op in rx {
                if !dev.halted() {
                    op.run(&dev);
                }
                let mut counts = lock(&p.counts);
                counts.1 += 1;
                p.changed.notify_all();
            }
        })?;
        Ok(Stream {
            tx: Mutex::new(Some(tx)),
            progress,
            worker: Mutex::new(Some(worker)),
        })
    }

    /// Queues `op`; false when the stream has been shut down.
    pub(super) fn enqueue(&self, op: Op) -> bool {
        let tx = lock(&self.tx);
        let Some(tx) = tx.as_ref() else { return false };
        let mut counts = lock(&self.progress.counts);
        if tx.send(op).is_err() {
            return false;
        }
        counts.0 += 1;
        true
    }

    /// Waits until everything enqueued before this call has finished.
    pub(super) fn synchronize(&self, deadline: Instant) -> Result<(), SyncError> {
        let mut counts = lock(&self.progress.counts);
        let target = counts.0;
        while counts.1 < target {
            let now = Instant::now();
            if now >= deadline {
                return Err(SyncError::Timeout {
                    pending: target - counts.1,
                });
            }
            // Wake now and then: a worker that died would never notify.
            let wait = (deadline - now).min(Duration::from_millis(50));
            counts = self
                .progress
                .changed
                .wait_timeout(counts, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            if counts.1 < target && lock(&self.worker).as_ref().is_some_and(|w| w.is_finished()) {
                return Err(SyncError::Gone);
            }
        }
        Ok(())
    }

    /// Closes the queue: the worker finishes what is queued (or drops it when
    /// the device halts) and ends. Returns the worker to join.
    pub(super) fn close(&self) -> Option<JoinHandle<()>> {
        lock(&self.tx).take();
        lock(&self.worker).take()
    }
}
