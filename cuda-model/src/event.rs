//! Events: a marker in a stream, its completion and time.
//!
//! Rules (Driver API, "Event Management"): `cuEventQuery` answers
//! `CUDA_ERROR_NOT_READY` until the work recorded before the event has
//! completed (success for an event never recorded); `cuStreamWaitEvent`
//! makes later work on a stream wait for the event's last record (none:
//! no wait); `cuEventElapsedTime` needs both events recorded and complete
//! (`CUDA_ERROR_NOT_READY` / `CUDA_ERROR_INVALID_HANDLE`) and timing
//! enabled (`CU_EVENT_DISABLE_TIMING`: `CUDA_ERROR_INVALID_HANDLE`); an
//! event for IPC needs `CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING`.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::handles::{lock, Table};
use crate::stream::{self, Dep, Op, Stream};
use crate::{context, watch, CUresult, Res};

/// `CU_EVENT_DISABLE_TIMING`.
pub const DISABLE_TIMING: u32 = 0x2;
/// `CU_EVENT_INTERPROCESS`.
pub const INTERPROCESS: u32 = 0x4;

/// One record: the stream, the operation number, and when it ran.
#[derive(Clone)]
pub struct Record {
    /// The stream recorded on.
    pub stream: Arc<Stream>,
    /// Its operation number.
    pub seq: u64,
    /// When the record ran on the stream.
    pub at: Arc<Mutex<Option<Instant>>>,
}

/// An event.
pub struct Event {
    /// Its flags.
    pub flags: u32,
    /// The device of its context.
    pub device: usize,
    /// Its last record (none yet: `None`).
    pub last: Mutex<Option<Record>>,
    /// Whether its last record happened inside a stream capture.
    pub captured: Mutex<bool>,
    /// The shared counter of an interprocess event.
    pub shared: Option<Arc<crate::ipc::SharedEvent>>,
}

/// Every live event.
pub static EVENTS: Table<Event> = Table::new(0x0e0e_0000_0000);

/// `cuEventCreate`.
pub fn create(flags: u32) -> Res<u64> {
    let ctx = context::current()?;
    const KNOWN: u32 = 0x1 | DISABLE_TIMING | INTERPROCESS;
    if flags & !KNOWN != 0 || (flags & INTERPROCESS != 0 && flags & DISABLE_TIMING == 0) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let shared = if flags & INTERPROCESS != 0 {
        Some(Arc::new(crate::ipc::SharedEvent::create()?))
    } else {
        None
    };
    Ok(EVENTS.insert(Arc::new(Event {
        flags,
        device: ctx.device,
        last: Mutex::new(None),
        captured: Mutex::new(false),
        shared,
    })))
}

/// `cuEventRecord`.
pub fn record(h: u64, stream: u64) -> Res<()> {
    let e = EVENTS.get(h)?;
    let s = crate::stream::resolve(stream)?;
    if stream::is_capturing(&s) {
        // In a capture, a record is a node that orders nothing more.
        *lock(&e.captured) = true;
        return Ok(());
    }
    *lock(&e.captured) = false;
    let at = Arc::new(Mutex::new(None));
    let slot = at.clone();
    let shared = e.shared.clone();
    let ticket = shared.as_ref().map(|sh| sh.next_ticket());
    let seq = s.issue(Op::new("cuEventRecord", move |_st: &Stream| {
        *lock(&slot) = Some(Instant::now());
        if let (Some(sh), Some(t)) = (&shared, ticket) {
            sh.complete(t);
        }
        Ok(())
    }))?;
    *lock(&e.last) = Some(Record { stream: s, seq, at });
    Ok(())
}

/// `cuEventQuery`: done or `CUDA_ERROR_NOT_READY`.
pub fn query(h: u64) -> Res<()> {
    let e = EVENTS.get(h)?;
    if *lock(&e.captured) {
        return Err(CUresult::CUDA_ERROR_CAPTURED_EVENT);
    }
    if let Some(sh) = &e.shared {
        return if sh.done() {
            Ok(())
        } else {
            Err(CUresult::CUDA_ERROR_NOT_READY)
        };
    }
    let last = lock(&e.last).clone();
    match last {
        Some(r) if r.stream.completed() < r.seq => Err(CUresult::CUDA_ERROR_NOT_READY),
        _ => Ok(()),
    }
}

/// `cuEventSynchronize`.
pub fn synchronize(h: u64) -> Res<()> {
    let e = EVENTS.get(h)?;
    if let Some(r) = lock(&e.last).clone() {
        if r.stream.completed() < r.seq {
            let _g = watch::blocked("cuEventSynchronize", vec![(r.stream.clone(), r.seq)]);
            r.stream.wait_for(r.seq, None);
        }
    }
    Ok(())
}

/// `cuStreamWaitEvent`.
pub fn stream_wait(stream: u64, h: u64) -> Res<()> {
    let e = EVENTS.get(h)?;
    let s = crate::stream::resolve(stream)?;
    let dep = if let Some(sh) = &e.shared {
        Some(Dep::Shared(sh.clone(), sh.target()))
    } else {
        lock(&e.last)
            .clone()
            .map(|r| Dep::Stream(r.stream.clone(), r.seq))
    };
    let Some(dep) = dep else { return Ok(()) };
    if stream::is_capturing(&s) {
        // A wait inside a capture: fine for an event recorded in a
        // capture, `CUDA_ERROR_STREAM_CAPTURE_ISOLATION` for one from
        // outside.
        if *lock(&e.captured) || lock(&e.last).is_none() {
            return Ok(());
        }
        stream::invalidate(&s, CUresult::CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
        return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
    }
    let mut op = Op::new("cuStreamWaitEvent", |_st: &Stream| Ok(()));
    op.deps.push(dep);
    s.issue(op).map(|_| ())
}

/// `cuEventElapsedTime` in milliseconds.
pub fn elapsed(start: u64, end: u64) -> Res<f32> {
    let (a, b) = (EVENTS.get(start)?, EVENTS.get(end)?);
    if a.flags & DISABLE_TIMING != 0 || b.flags & DISABLE_TIMING != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
    }
    // cuda.h, cuEventElapsedTime: "If cuEventRecord() has not been called
    // on either event then CUDA_ERROR_INVALID_HANDLE is returned. If
    // cuEventRecord() has been called on both events but one or both of
    // them has not yet been completed ... CUDA_ERROR_NOT_READY".
    let record = |e: &Event| {
        lock(&e.last)
            .clone()
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
    };
    let (ra, rb) = (record(&a)?, record(&b)?);
    let when = |r: &Record| -> Res<Instant> { lock(&r.at).ok_or(CUresult::CUDA_ERROR_NOT_READY) };
    let (ta, tb) = (when(&ra)?, when(&rb)?);
    let ms = if tb >= ta {
        (tb - ta).as_secs_f64() * 1e3
    } else {
        -((ta - tb).as_secs_f64() * 1e3)
    };
    Ok(ms as f32)
}

/// `cuEventDestroy`.
pub fn destroy(h: u64) -> Res<()> {
    EVENTS.remove(h).map(|_| ())
}
