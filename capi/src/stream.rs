//! Host streams: a thread per stream running queued tasks in order.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crossbeam::channel::{unbounded, Sender};

use super::error::{catch, CError};
use super::types::snclResult_t;

/// A host stream made by `snclStreamCreate` (opaque; C sees it only as a
/// `snclStream_t`).
pub(crate) struct snclStream {
    pub(crate) shared: Arc<StreamShared>,
    pub(crate) thread: Option<std::thread::JoinHandle<()>>,
}

/// Work queued on a stream.
pub(crate) type Task = Box<dyn FnOnce() -> Result<(), CError> + Send>;

#[derive(Default)]
struct State {
    queued: usize,
    error: Option<CError>,
}

/// The part of a stream that queued work and handles share.
pub(crate) struct StreamShared {
    tx: Mutex<Option<Sender<Task>>>,
    state: Mutex<State>,
    cv: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl StreamShared {
    /// Queues `task` behind everything queued before.
    pub fn enqueue(&self, task: Task) -> Result<(), CError> {
        let tx = lock(&self.tx);
        let Some(tx) = tx.as_ref() else {
            return Err(CError::usage("the stream has been destroyed"));
        };
        lock(&self.state).queued += 1;
        if tx.send(task).is_err() {
            lock(&self.state).queued -= 1;
            return Err(CError::internal("the stream's thread is gone"));
        }
        Ok(())
    }

    /// Waits until everything queued has run; returns (and forgets) the
    /// first error since the last synchronization.
    pub fn synchronize(&self) -> Result<(), CError> {
        let mut g = lock(&self.state);
        while g.queued > 0 {
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        match g.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// `snclInProgress` while work is queued, else like `synchronize`.
    pub fn query(&self) -> Result<snclResult_t, CError> {
        let mut g = lock(&self.state);
        if g.queued > 0 {
            return Ok(snclResult_t::snclInProgress);
        }
        match g.error.take() {
            Some(e) => Err(e),
            None => Ok(snclResult_t::snclSuccess),
        }
    }
}

/// Creates a stream and its thread.
pub(crate) fn create() -> Result<snclStream, CError> {
    let (tx, rx) = unbounded::<Task>();
    let shared = Arc::new(StreamShared {
        tx: Mutex::new(Some(tx)),
        state: Mutex::new(State::default()),
        cv: Condvar::new(),
    });
    let s = shared.clone();
    let thread = std::thread::Builder::new()
        .name("sncl-stream".into())
        .spawn(move || {
            for task in rx {
                let r = catch(task);
                let mut g = lock(&s.state);
                if let Err(e) = r {
                    if g.error.is_none() {
                        g.error = Some(e);
                    }
                }
                g.queued -= 1;
                s.cv.notify_all();
            }
        })
        .map_err(|e| {
            CError::new(
                snclResult_t::snclSystemError,
                format!("starting a stream thread: {e}"),
            )
        })?;
    Ok(snclStream {
        shared,
        thread: Some(thread),
    })
}

/// Closes the stream once its queued work has run; returns the first error
/// not yet reported.
pub(crate) fn destroy(mut s: snclStream) -> Result<(), CError> {
    lock(&s.shared.tx).take();
    if let Some(t) = s.thread.take() {
        let _ = t.join();
    }
    let e = lock(&s.shared.state).error.take();
    match e {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
