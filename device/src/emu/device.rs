//! The emulated device object and the checks its calls share; the calls
//! themselves are in `api.rs`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use kernels::DataType;

use super::memory::{Memory, Span};
use super::stream::{DevState, Event, Op, Stream};
use crate::{DeviceError, DevicePtr, EventHandle, Result, StreamHandle};

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One emulated device object.
#[derive(Debug)]
pub(super) struct Emu {
    pub(super) ordinal: usize,
    pub(super) state: Arc<DevState>,
    pub(super) memory: Memory,
    pub(super) streams: Mutex<HashMap<u64, Arc<Stream>>>,
    pub(super) events: Mutex<HashMap<u64, Arc<Event>>>,
    pub(super) next_handle: AtomicU64,
    /// A fault to put in place of the next enqueued operation.
    pub(super) pending_fault: Mutex<Option<String>>,
    /// Workers of destroyed streams, joined when the device goes away.
    pub(super) retired: Mutex<Vec<JoinHandle<()>>>,
    /// What this process sees of the emulated machine.
    pub(super) visibility: super::visibility::Visibility,
}

impl Emu {
    pub(super) fn new(ordinal: usize) -> Emu {
        Emu {
            ordinal,
            state: Arc::default(),
            memory: Memory::default(),
            streams: Mutex::default(),
            events: Mutex::default(),
            next_handle: AtomicU64::new(1),
            pending_fault: Mutex::default(),
            retired: Mutex::default(),
            visibility: super::visibility::Visibility::default(),
        }
    }

    pub(super) fn invalid(&self, call: &'static str, detail: String) -> DeviceError {
        DeviceError::InvalidArgument {
            ordinal: self.ordinal,
            call,
            detail,
        }
    }

    /// The sticky fault, if an injected fault has run.
    pub(super) fn check(&self) -> Result<()> {
        match self.state.fault() {
            Some(what) => Err(DeviceError::Fault {
                ordinal: self.ordinal,
                detail: format!(
                    "{what} (an injected fault; the emulated device stays faulted, like a CUDA \
                     sticky error)"
                ),
            }),
            None => Ok(()),
        }
    }

    pub(super) fn stream(&self, call: &'static str, stream: StreamHandle) -> Result<Arc<Stream>> {
        lock(&self.streams).get(&stream.0).cloned().ok_or_else(|| {
            self.invalid(
                call,
                format!("{stream:?} is not a live stream of this device"),
            )
        })
    }

    pub(super) fn event(&self, call: &'static str, event: EventHandle) -> Result<Arc<Event>> {
        lock(&self.events).get(&event.0).cloned().ok_or_else(|| {
            self.invalid(
                call,
                format!("{event:?} is not a live event of this device"),
            )
        })
    }

    pub(super) fn span(&self, call: &'static str, ptr: DevicePtr, bytes: usize) -> Result<Span> {
        self.memory
            .span(ptr, bytes)
            .map_err(|detail| self.invalid(call, detail))
    }

    /// Bytes of `count` elements of `dtype`.
    pub(super) fn elements(
        &self,
        call: &'static str,
        dtype: DataType,
        count: usize,
    ) -> Result<usize> {
        count.checked_mul(dtype.size()).ok_or_else(|| {
            self.invalid(call, format!("{count} {} elements overflow", dtype.name()))
        })
    }

    /// Queues `op` on `stream` (or the injected fault in its place).
    pub(super) fn enqueue(&self, call: &'static str, stream: StreamHandle, op: Op) -> Result<()> {
        self.check()?;
        let s = self.stream(call, stream)?;
        let op = match lock(&self.pending_fault).take() {
            Some(what) => {
                tracing::debug!(
                    ordinal = self.ordinal,
                    call,
                    what,
                    "injected fault enqueued"
                );
                Op::Fault {
                    what: format!("{call} on {stream:?}: {what}"),
                }
            }
            None => op,
        };
        if s.enqueue(op) {
            Ok(())
        } else {
            Err(self.invalid(call, format!("{stream:?} has been destroyed")))
        }
    }

    pub(super) fn new_handle(&self) -> u64 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }

    /// Releases happen even on a faulted device (so nothing leaks); the call
    /// still reports the fault.
    pub(super) fn after_release(&self, result: Result<()>) -> Result<()> {
        result?;
        self.check()
    }
}

impl Drop for Emu {
    fn drop(&mut self) {
        self.state.stop();
        let mut workers: Vec<_> = lock(&self.streams)
            .drain()
            .filter_map(|(_, s)| s.close())
            .collect();
        workers.append(&mut lock(&self.retired));
        for w in workers {
            // Workers leave their waits and drop their queues once stopped.
            let _ = w.join();
        }
        self.memory.clear();
        tracing::debug!(ordinal = self.ordinal, "closed an emulated device");
    }
}
