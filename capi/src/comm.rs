//! The state behind a `snclComm_t`: the communicator (possibly still being
//! created), its issue order, its custom operators and its last error.

use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use super::error::CError;
use super::types::snclResult_t;
use sncl_rs::binding::IssueOrder;
pub(crate) use sncl_rs::binding::Ticket;
use sncl_rs::{Communicator, DataType, RawWork};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

enum InitState {
    Pending,
    Ready,
    Failed(CError),
}

/// Where a pre-multiplying operator's scalar is.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Scalar {
    /// Copied at creation (little room: at most 8 bytes).
    Immediate([u8; 8]),
    /// Read at execution (a host address).
    Pointer(usize),
}

/// A communicator (opaque). `snclComm_t` points to one.
pub struct snclComm {
    pub(crate) shared: Arc<CommShared>,
}

/// Handle to a communicator, like `ncclComm_t`.
pub type snclComm_t = *mut snclComm;

/// A custom operator made by `snclRedOpCreatePreMulSum`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PreMul {
    pub dtype: DataType,
    pub scalar: Scalar,
}

/// Everything a `snclComm` owns; operations in flight keep it alive.
pub(crate) struct CommShared {
    state: Mutex<InitState>,
    cv: Condvar,
    comm: OnceLock<Communicator>,
    /// An address whose route tells this host's address towards the job
    /// (the unique id's root), for the ids `snclCommSplit` makes.
    pub route: OnceLock<SocketAddr>,
    /// Whether init and split on it block (`snclConfig_t::blocking`).
    pub blocking: bool,
    /// Issue order: every C call on it takes a ticket when it is issued
    /// and runs when the ticket's turn comes, so operations queued on
    /// streams, run by groups and run inline keep the order in which the
    /// application issued them (the same on every rank). Dropping a ticket
    /// unrun passes its turn on.
    order: Arc<IssueOrder>,
    redops: Mutex<Vec<Option<PreMul>>>,
    last_error: Mutex<Option<String>>,
    async_code: Mutex<Option<snclResult_t>>,
    /// The thread whose `snclGroupEnd` will create it, while it waits.
    deferred_by: Mutex<Option<std::thread::ThreadId>>,
    /// Device operations queued and not yet seen complete.
    device_work: Mutex<Vec<RawWork>>,
}

impl CommShared {
    /// A communicator still being created.
    pub fn pending(blocking: bool) -> Arc<CommShared> {
        Arc::new(CommShared {
            state: Mutex::new(InitState::Pending),
            cv: Condvar::new(),
            comm: OnceLock::new(),
            route: OnceLock::new(),
            blocking,
            order: Arc::new(IssueOrder::new()),
            redops: Mutex::new(Vec::new()),
            last_error: Mutex::new(None),
            async_code: Mutex::new(None),
            deferred_by: Mutex::new(None),
            device_work: Mutex::new(Vec::new()),
        })
    }

    /// A created communicator.
    pub fn ready(c: Communicator, blocking: bool, route: Option<SocketAddr>) -> Arc<CommShared> {
        let s = CommShared::pending(blocking);
        if let Some(r) = route {
            let _ = s.route.set(r);
        }
        s.finish(Ok(c));
        s
    }

    /// Marks it as created by this thread's `snclGroupEnd`.
    pub fn defer_to_group_end(&self) {
        *lock(&self.deferred_by) = Some(std::thread::current().id());
    }

    /// Ends creation, successfully or not.
    pub fn finish(&self, r: Result<Communicator, CError>) {
        lock(&self.deferred_by).take();
        let mut g = lock(&self.state);
        *g = match r {
            Ok(c) => {
                let _ = self.comm.set(c);
                InitState::Ready
            }
            Err(e) => {
                self.set_error(&e.msg);
                InitState::Failed(CError::new(
                    e.code,
                    format!("communicator initialization failed: {}", e.msg),
                ))
            }
        };
        self.cv.notify_all();
    }

    /// The communicator, waiting for its creation to end.
    pub fn get(&self) -> Result<&Communicator, CError> {
        let mut g = lock(&self.state);
        loop {
            match &*g {
                InitState::Pending => {
                    if *lock(&self.deferred_by) == Some(std::thread::current().id()) {
                        return Err(CError::usage(
                            "the communicator is created by the enclosing group's \
                             snclGroupEnd; use it after that",
                        ));
                    }
                    g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner())
                }
                InitState::Ready => return Ok(self.comm.get().expect("ready")),
                InitState::Failed(e) => return Err(e.clone()),
            }
        }
    }

    /// `snclInProgress` while being created, the creation's error, or
    /// the error that aborted it.
    pub fn async_code(&self) -> snclResult_t {
        match &*lock(&self.state) {
            InitState::Pending => return snclResult_t::snclInProgress,
            InitState::Failed(e) => return e.code,
            InitState::Ready => {}
        }
        self.settle_device(false);
        // Not Communicator::async_error: it waits for a running operation.
        lock(&self.async_code).unwrap_or(snclResult_t::snclSuccess)
    }

    /// Keeps a queued device operation, whose failure (found when it
    /// completes) becomes this communicator's error.
    pub fn add_device_work(&self, w: RawWork) {
        self.settle_device(false);
        lock(&self.device_work).push(w);
    }

    /// Records the failures of completed device operations and forgets
    /// them; with `wait`, waits for all of them first (each fails within
    /// the communicator's timeout rather than hanging).
    pub fn settle_device(&self, wait: bool) {
        let works: Vec<RawWork> = {
            let mut g = lock(&self.device_work);
            if wait {
                std::mem::take(&mut *g)
            } else {
                let (done, pending) = std::mem::take(&mut *g).into_iter().partition(RawWork::test);
                *g = pending;
                done
            }
        };
        for w in works {
            if let Err(e) = w.wait() {
                let e = CError::from(e);
                tracing::warn!(error = %e.msg, "a device operation of the C ABI failed");
                self.record(&CError { fatal: true, ..e });
            }
        }
    }

    /// Takes the next place in the issue order.
    pub fn ticket(&self) -> Ticket {
        self.order.ticket()
    }

    /// Records a failure of an operation on this communicator; a fatal one
    /// becomes its asynchronous error.
    pub fn record(&self, e: &CError) {
        self.set_error(&e.msg);
        if e.fatal {
            let mut g = lock(&self.async_code);
            if g.is_none() {
                *g = Some(e.code);
            }
        }
    }

    /// `r`, its failure (if any) recorded on this communicator first.
    pub fn recorded<T>(&self, r: Result<T, CError>) -> Result<T, CError> {
        if let Err(e) = &r {
            self.record(e);
        }
        r
    }

    fn set_error(&self, msg: &str) {
        *lock(&self.last_error) = Some(msg.to_string());
    }

    /// The last failure on this communicator.
    pub fn last_error(&self) -> Option<String> {
        lock(&self.last_error).clone()
    }

    /// Registers a custom operator; returns its value.
    pub fn add_redop(&self, p: PreMul) -> Result<i32, CError> {
        let mut ops = lock(&self.redops);
        let slot = match ops.iter().position(Option::is_none) {
            Some(i) => {
                ops[i] = Some(p);
                i
            }
            None => {
                ops.push(Some(p));
                ops.len() - 1
            }
        };
        i32::try_from(slot + 5).map_err(|_| CError::internal("too many custom operators"))
    }

    /// The custom operator `op`.
    pub fn redop(&self, op: i32) -> Option<PreMul> {
        let i = usize::try_from(op.checked_sub(5)?).ok()?;
        lock(&self.redops).get(i).copied().flatten()
    }

    /// Removes the custom operator `op`; false if there is none.
    pub fn remove_redop(&self, op: i32) -> bool {
        let Some(i) = op.checked_sub(5).and_then(|i| usize::try_from(i).ok()) else {
            return false;
        };
        let mut ops = lock(&self.redops);
        match ops.get_mut(i) {
            Some(slot @ Some(_)) => {
                *slot = None;
                true
            }
            _ => false,
        }
    }
}
