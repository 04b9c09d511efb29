//! A progress thread per NIC (issue 36, risk 10).
//!
//! A NIC moves data by itself, but the host side of the protocol moves only
//! when somebody polls: completions retire staging slots and lent writes,
//! receive completions announce pieces, consumed slots turn into credits,
//! GPUDirect payloads whose device copy finished wait to be posted, and the
//! strict emulation's DMA steps (`emu/dma.rs`) advance. Before this module
//! only the communicator's executor polled, and only while it was inside an
//! operation on that connection: a peer waiting for a credit or a payload
//! from a rank whose executor was reducing, on another step, or between
//! operations waited for it. NCCL runs a proxy thread per device for the
//! same reason (`ncclProxyProgress`).
//!
//! Here each device context (`context.rs`, one per port per process) has a
//! [`Driver`]: a thread that, while any of its connections has work
//! outstanding ([`ConnState::outstanding`]) and its executor has not driven
//! it for [`GAP`], takes the connection's lock without waiting
//! (`try_lock`: an executor inside a call is never blocked by it) and
//! progresses it ([`ConnState::background`]). The executor keeps driving
//! what it is waiting on, so the thread fills the gaps only; it parks while
//! nothing is outstanding and exits once its last connection is gone.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::conn::ConnState;
use crate::locks::lock;

/// How long after an executor's last call on a connection the thread may
/// drive it (below this, the executor is around and polls by itself).
pub(crate) const GAP: Duration = Duration::from_millis(1);
/// The longest the thread waits to look at a connection its executor keeps
/// calling.
const PATIENCE: Duration = Duration::from_millis(16);
/// How often the thread polls a connection it drives (its executor away),
/// and the shortest sleep between sweeps.
const TICK: Duration = Duration::from_micros(100);
/// How long a parked thread waits before looking again (a kick wakes it
/// sooner; the thread also notices its connections are gone this way).
const PARK: Duration = Duration::from_millis(100);

/// Nanoseconds since the first use (a monotonic clock an atomic can hold).
fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// A connection's state as both the executor and the thread reach it.
pub(crate) struct Cell {
    /// `None` once the executor dropped the connection (its resources went
    /// with it, on the executor's thread).
    state: Mutex<Option<ConnState>>,
    /// When the executor last called (`now_ns`).
    touched: AtomicU64,
    /// Whether work was outstanding after the last call or sweep.
    busy: AtomicBool,
    /// Sweeps in which the thread drove this connection (tests, logs).
    driven: AtomicU64,
    /// How long after the executor's last call the thread looks next: from
    /// [`GAP`], doubled (to [`PATIENCE`]) each time it finds the executor
    /// still calling, so a long operation costs the thread few wakeups.
    patience: AtomicU64,
    /// The thread panicked driving it: the executor alone drives it.
    abandoned: AtomicBool,
    /// Sweeps in a row in which driving it moved nothing.
    idle_sweeps: AtomicU64,
}

impl Cell {
    /// Runs `f` on the state for the executor, records the call, and wakes
    /// the thread if `f` left work outstanding.
    pub(crate) fn with<R>(&self, driver: &Driver, f: impl FnOnce(&mut ConnState) -> R) -> R {
        let mut guard = lock(&self.state);
        let state = guard
            .as_mut()
            .expect("a connection's state lives as long as its handle");
        let r = f(state);
        let busy = state.outstanding();
        // Stored under the lock, so a sweep in between cannot be
        // overwritten by this call's older verdict.
        self.touched.store(now_ns(), Ordering::Relaxed);
        self.busy.store(busy, Ordering::SeqCst);
        drop(guard);
        if busy {
            driver.kick();
        }
        r
    }

    /// Reads the state without counting as a call (diagnostics).
    pub(crate) fn peek<R>(&self, f: impl FnOnce(&ConnState) -> R) -> R {
        f(lock(&self.state)
            .as_ref()
            .expect("a connection's state lives as long as its handle"))
    }

    /// Takes the state out, so that it is dropped by the caller (the
    /// executor), never by the thread.
    pub(crate) fn take(&self) -> Option<ConnState> {
        lock(&self.state).take()
    }

    /// Whether work is outstanding and the thread still drives it.
    fn wants_driving(&self) -> bool {
        self.busy.load(Ordering::SeqCst) && !self.abandoned.load(Ordering::SeqCst)
    }

    /// Leaves the connection to its executor for good.
    fn abandon(&self) {
        self.abandoned.store(true, Ordering::SeqCst);
        self.busy.store(false, Ordering::SeqCst);
    }

    /// Sweeps in which the thread drove this connection.
    pub(crate) fn driven(&self) -> u64 {
        self.driven.load(Ordering::Relaxed)
    }

    /// One sweep's look at this connection: when the thread should look
    /// again (`None`: nothing outstanding). A connection its executor
    /// called within [`GAP`] is left to it until `GAP` after that call.
    fn sweep(&self, now: u64) -> Option<u64> {
        let gap = GAP.as_nanos() as u64;
        if !self.wants_driving() {
            self.patience.store(gap, Ordering::Relaxed);
            return None;
        }
        let touched = self.touched.load(Ordering::Relaxed);
        let patience = self.patience.load(Ordering::Relaxed);
        let active = now.saturating_sub(touched) < gap;
        if active || now.saturating_sub(touched) < patience {
            if active {
                let longer = (patience * 2).min(PATIENCE.as_nanos() as u64);
                self.patience.store(longer, Ordering::Relaxed);
            }
            return Some(touched + self.patience.load(Ordering::Relaxed));
        }
        let mut guard = match self.state.try_lock() {
            Ok(g) => g,
            // A panic left the state as it was between calls (see `lock`).
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            // The executor is in a call: it drives the connection now.
            Err(std::sync::TryLockError::WouldBlock) => return Some(now + gap),
        };
        let state = guard.as_mut()?;
        let before = state.progress_mark();
        state.background();
        self.driven.fetch_add(1, Ordering::Relaxed);
        self.patience.store(gap, Ordering::Relaxed);
        let busy = state.outstanding();
        self.busy.store(busy, Ordering::SeqCst);
        // Nothing moved (a peer or a device that does not answer): look
        // again less often, up to `PATIENCE`; anything moving: every tick.
        let idle = if state.progress_mark() == before {
            (self.idle_sweeps.load(Ordering::Relaxed) + 1).min(8)
        } else {
            0
        };
        self.idle_sweeps.store(idle, Ordering::Relaxed);
        let wait = (TICK.as_nanos() as u64 * (1 << idle)).min(PATIENCE.as_nanos() as u64);
        busy.then_some(now + wait)
    }
}

/// The progress thread of one device context and the connections it drives.
pub(crate) struct Driver {
    conns: Mutex<Vec<Weak<Cell>>>,
    wake: Condvar,
    parked: AtomicBool,
    started: AtomicBool,
    /// The device, for the thread's name and logs.
    device: String,
}

impl Driver {
    /// A driver for the context of `device` (its thread starts with the
    /// first connection).
    pub(crate) fn new(device: String) -> Driver {
        Driver {
            conns: Mutex::new(Vec::new()),
            wake: Condvar::new(),
            parked: AtomicBool::new(false),
            started: AtomicBool::new(false),
            device,
        }
    }

    /// Registers `state` for driving and returns the cell both sides use.
    pub(crate) fn adopt(self: &Arc<Self>, state: ConnState) -> Arc<Cell> {
        let cell = Arc::new(Cell {
            state: Mutex::new(Some(state)),
            touched: AtomicU64::new(now_ns()),
            busy: AtomicBool::new(false),
            driven: AtomicU64::new(0),
            patience: AtomicU64::new(GAP.as_nanos() as u64),
            abandoned: AtomicBool::new(false),
            idle_sweeps: AtomicU64::new(0),
        });
        {
            let mut conns = lock(&self.conns);
            conns.retain(|c| c.strong_count() > 0);
            conns.push(Arc::downgrade(&cell));
        }
        if !self.started.swap(true, Ordering::SeqCst) {
            let weak = Arc::downgrade(self);
            let name = format!("sncl-rdma-{}", self.device);
            let spawned = std::thread::Builder::new()
                .name(name.chars().take(15).collect())
                .spawn(move || run(weak));
            if let Err(e) = spawned {
                // The executor still drives its connections: slower, not wrong.
                tracing::warn!(device = %self.device,
                    "rdma: no progress thread for the NIC (the executor alone drives its connections): {e}");
            }
        }
        cell
    }

    /// Wakes a parked thread (cheap when it is not parked).
    fn kick(&self) {
        if self.parked.load(Ordering::SeqCst) {
            let _guard = lock(&self.conns);
            self.wake.notify_one();
        }
    }

    /// The connections still alive.
    fn live(&self) -> Vec<Arc<Cell>> {
        let mut conns = lock(&self.conns);
        conns.retain(|c| c.strong_count() > 0);
        conns.iter().filter_map(Weak::upgrade).collect()
    }
}

/// The thread: sweeps while work is outstanding (sleeping until the
/// earliest time a connection may need it), parks while none is, and ends
/// once the driver is gone (its context's last connection dropped).
fn run(driver: Weak<Driver>) {
    loop {
        let Some(d) = driver.upgrade() else {
            return;
        };
        let now = now_ns();
        let next = d
            .live()
            .iter()
            .filter_map(|cell| {
                // A panic while driving a connection stops that connection's
                // driving, not the thread (the executor still drives it).
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cell.sweep(now)))
                    .unwrap_or_else(|_| {
                        tracing::error!(device = %d.device,
                            "rdma: the NIC's progress thread panicked driving a connection; \
                             its executor alone drives it from now on");
                        cell.abandon();
                        None
                    })
            })
            .min();
        if let Some(next) = next {
            drop(d);
            let wait = next.saturating_sub(now_ns()).max(TICK.as_nanos() as u64);
            std::thread::sleep(Duration::from_nanos(wait));
            continue;
        }
        // Park: marked first, then every connection looked at again under
        // the lock a kick takes, so a kick between the sweep and the wait
        // is not lost.
        let conns = lock(&d.conns);
        d.parked.store(true, Ordering::SeqCst);
        let busy = conns
            .iter()
            .filter_map(Weak::upgrade)
            .any(|c| c.wants_driving());
        if !busy {
            let (conns, _) = d
                .wake
                .wait_timeout(conns, PARK)
                .unwrap_or_else(|e| e.into_inner());
            drop(conns);
        } else {
            drop(conns);
        }
        d.parked.store(false, Ordering::SeqCst);
    }
}
