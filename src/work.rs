//! Non-blocking operations: a per-communicator progress thread runs queued
//! operations in stream order; [`Scope`] lends buffers to them and waits for
//! all of them before it returns (as `std::thread::scope` does), so a
//! forgotten [`Work`] can never outlive the buffers it uses.

use std::marker::PhantomData;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam::channel::{unbounded, Sender};

use comm_core::{Error, Result};

use crate::comm::{Inner, P2p, RawOp};
use crate::Communicator;

#[derive(Default)]
pub(crate) struct WorkState {
    done: Mutex<Option<Result<()>>>,
    cv: Condvar,
}

impl WorkState {
    pub(crate) fn complete(&self, r: Result<()>) {
        let mut g = self.done.lock().unwrap_or_else(|e| e.into_inner());
        *g = Some(r);
        self.cv.notify_all();
    }

    /// Waits up to `timeout` (forever when None). Returns whether it is done.
    fn wait(&self, timeout: Option<Duration>) -> bool {
        let mut g = self.done.lock().unwrap_or_else(|e| e.into_inner());
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        while g.is_none() {
            let step = match deadline {
                Some(d) => {
                    let now = std::time::Instant::now();
                    if now >= d {
                        return false;
                    }
                    (d - now).min(Duration::from_millis(50))
                }
                None => Duration::from_millis(50),
            };
            g = self
                .cv
                .wait_timeout(g, step)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// The result of a completed operation. An error is handed out once in
    /// full; later calls report that it was already returned (the state
    /// stays completed, so waiters never block again).
    fn take(&self) -> Result<()> {
        let mut g = self.done.lock().unwrap_or_else(|e| e.into_inner());
        match g.as_mut() {
            Some(Ok(())) => Ok(()),
            Some(r @ Err(_)) => {
                let rank = r.as_ref().err().and_then(Error::rank).unwrap_or(0);
                let seen = Err(Error::Aborted {
                    rank,
                    reason: Some("this operation failed; its error was returned earlier".into()),
                });
                std::mem::replace(r, seen)
            }
            None => unreachable!("take before completion"),
        }
    }
}

/// What a queued job runs: a host operation, or a device operation (see
/// [`crate::device`]).
pub(crate) enum JobKind {
    Host(RawOp),
    Device(Box<dyn DeviceRun>),
}

/// A device operation the progress thread runs in its turn (the device
/// path's jobs: `src/device/job.rs`); it completes `state`.
pub(crate) trait DeviceRun: Send {
    fn run(self: Box<Self>, inner: &Inner, ticket: u64, state: &WorkState);
}

/// What builds a device operation's job in stream order (see
/// `Communicator::prepare_device`).
pub(crate) type DeviceJobMaker = Box<dyn FnOnce(u64) -> JobKind>;

struct Job {
    ticket: u64,
    kind: JobKind,
    state: Arc<WorkState>,
}

/// The progress thread of one communicator, started on first use.
pub(crate) struct Worker {
    inner: Arc<Inner>,
    tx: Mutex<Option<(Sender<Job>, JoinHandle<()>)>>,
}

impl Worker {
    pub fn new(inner: Arc<Inner>) -> Worker {
        Worker {
            inner,
            tx: Mutex::new(None),
        }
    }

    fn submit(&self, op: RawOp) -> Arc<WorkState> {
        self.submit_with(|_| JobKind::Host(op))
    }

    /// Queues the job `make` builds; `make` runs with the job's ticket
    /// before anyone can take the next one (so what it enqueues on device
    /// streams follows the stream order of the communicator).
    pub(crate) fn submit_with(&self, make: impl FnOnce(u64) -> JobKind) -> Arc<WorkState> {
        let state = Arc::new(WorkState::default());
        let mut g = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let (tx, _) = g.get_or_insert_with(|| {
            let (tx, rx) = unbounded::<Job>();
            let inner = self.inner.clone();
            let h = std::thread::Builder::new()
                .name(format!("sncl-progress-{}", inner.rank))
                .spawn(move || {
                    for job in rx {
                        match job.kind {
                            JobKind::Host(op) => {
                                // SAFETY: the job's buffers are lent by a Scope
                                // (or an unsafe caller) until it completes.
                                let r = unsafe { inner.run_ordered(job.ticket, &op) };
                                job.state.complete(r);
                            }
                            JobKind::Device(d) => d.run(&inner, job.ticket, &job.state),
                        }
                    }
                })
                .expect("spawning the sncl progress thread");
            (tx, h)
        });
        let st = state.clone();
        self.inner.ticket_with(|ticket| {
            tx.send(Job {
                ticket,
                kind: make(ticket),
                state: st,
            })
            .expect("progress thread alive while the communicator is");
        });
        state
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let taken = self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some((tx, h)) = taken {
            drop(tx);
            let _ = h.join();
        }
    }
}

/// A handle to a non-blocking operation started with
/// [`Communicator::enqueue_raw`] (or a raw device collective); the caller
/// keeps the buffers alive until it reports completion.
pub struct RawWork {
    state: Arc<WorkState>,
}

impl RawWork {
    pub(crate) fn from_state(state: Arc<WorkState>) -> RawWork {
        RawWork { state }
    }
}

impl RawWork {
    /// Blocks until the operation completes and returns its result.
    pub fn wait(&self) -> Result<()> {
        self.state.wait(None);
        self.state.take()
    }

    /// Whether the operation has completed.
    pub fn test(&self) -> bool {
        self.state.wait(Some(Duration::ZERO))
    }

    /// Waits up to `timeout`; `Ok(true)` when completed successfully.
    pub fn wait_timeout(&self, timeout: Duration) -> Result<bool> {
        if !self.state.wait(Some(timeout)) {
            return Ok(false);
        }
        self.state.take().map(|_| true)
    }
}

impl Communicator {
    /// Runs a raw operation to completion on the caller's thread, in stream order.
    ///
    /// # Safety
    /// Every buffer `op` points to must be valid for the extent its counts
    /// give (reads for inputs, exclusive writes for outputs) until this returns.
    pub unsafe fn run_raw(&self, op: &RawOp) -> Result<()> {
        let t = self.inner.ticket();
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.run_ordered(t, op) }
    }

    /// Queues a raw operation on the progress thread, in stream order.
    ///
    /// # Safety
    /// As [`Communicator::run_raw`], until the returned handle reports
    /// completion (also if it is dropped early).
    pub unsafe fn enqueue_raw(&self, op: RawOp) -> RawWork {
        RawWork {
            state: self.worker.submit(op),
        }
    }
}

/// A handle to a non-blocking operation started in a [`Scope`].
#[must_use = "an operation's result is only seen through wait()"]
pub struct Work<'scope> {
    state: Arc<WorkState>,
    _scope: PhantomData<&'scope ()>,
}

impl Work<'_> {
    /// Blocks until the operation completes and returns its result.
    pub fn wait(self) -> Result<()> {
        self.state.wait(None);
        self.state.take()
    }

    /// Whether the operation has completed (successfully or not).
    pub fn test(&self) -> bool {
        self.state.wait(Some(Duration::ZERO))
    }

    /// Waits up to `timeout`. `Ok(true)`: completed successfully;
    /// `Ok(false)`: still running; `Err`: it failed.
    pub fn wait_timeout(&self, timeout: Duration) -> Result<bool> {
        if !self.state.wait(Some(timeout)) {
            return Ok(false);
        }
        self.state.take().map(|_| true)
    }
}

/// Lends buffers to non-blocking operations; see [`Communicator::scope`].
pub struct Scope<'scope, 'env: 'scope> {
    pub(crate) comm: &'scope Communicator,
    pending: Mutex<Vec<Arc<WorkState>>>,
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

impl<'scope> Scope<'scope, '_> {
    /// Queues `op` (whose buffers are borrowed for `'scope`).
    pub(crate) fn enqueue(&'scope self, op: RawOp) -> Work<'scope> {
        self.enqueue_with(|_| JobKind::Host(op))
    }

    /// Queues the job `make` builds (see [`Worker::submit_with`]).
    pub(crate) fn enqueue_with(&'scope self, make: impl FnOnce(u64) -> JobKind) -> Work<'scope> {
        let state = self.comm.worker.submit_with(make);
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(state.clone());
        Work {
            state,
            _scope: PhantomData,
        }
    }
}

impl Communicator {
    /// Runs `f`, in which non-blocking operations may be started on this
    /// communicator with buffers borrowed for the scope; returns after every
    /// one of them has completed.
    ///
    /// ```no_run
    /// # let comm = sncl::Communicator::from_env()?;
    /// let mut a = vec![1.0f32; 1024];
    /// let mut b = vec![2.0f32; 1024];
    /// comm.scope(|s| {
    ///     let wa = s.all_reduce_in_place(&mut a, sncl::ReduceOp::Sum)?;
    ///     let wb = s.all_reduce_in_place(&mut b, sncl::ReduceOp::Sum)?;
    ///     // ... compute while they run ...
    ///     wa.wait()?;
    ///     wb.wait()
    /// })?;
    /// # Ok::<(), sncl::Error>(())
    /// ```
    pub fn scope<'env, F, R>(&'env self, f: F) -> R
    where
        F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> R,
    {
        let scope = Scope {
            comm: self,
            pending: Mutex::new(Vec::new()),
            _scope: PhantomData,
            _env: PhantomData,
        };
        struct WaitAll<'a, 'b, 'c>(&'a Scope<'b, 'c>);
        impl Drop for WaitAll<'_, '_, '_> {
            fn drop(&mut self) {
                let pending =
                    std::mem::take(&mut *self.0.pending.lock().unwrap_or_else(|e| e.into_inner()));
                for w in pending {
                    w.wait(None);
                }
            }
        }
        let guard = WaitAll(&scope);
        let r = f(guard.0);
        drop(guard);
        r
    }
}

/// Point-to-point operations that progress together and complete together
/// (like NCCL's group calls); see [`Communicator::group`].
pub struct Group<'a> {
    pub(crate) ops: Vec<P2p>,
    /// Transfers of device buffers (a group is all host or all device).
    pub(crate) device_ops: Vec<crate::buffer::GroupDeviceOp<'a>>,
    pub(crate) error: Option<Error>,
    pub(crate) _bufs: PhantomData<&'a mut ()>,
}
