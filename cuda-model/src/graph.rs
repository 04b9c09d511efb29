//! Stream capture and graphs.
//!
//! Rules (CUDA C++ Programming Guide, "CUDA Graphs / Creating a Graph
//! Using Stream Capture", "Prohibited and Unhandled Operations",
//! "Invalidation"; Driver API `cuStreamBeginCapture`, `CUstreamCaptureMode`):
//! * work issued to a capturing stream is recorded, not run; `cuGraphLaunch`
//!   of the instantiated graph replays it, in order, on a stream;
//! * querying or synchronising a capturing stream (`cuStreamQuery`,
//!   `cuStreamSynchronize`) is `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and
//!   invalidates the capture; so is a synchronous copy into it;
//! * `cuEventQuery` / `cuEventSynchronize` of an event last recorded in a
//!   capture is `CUDA_ERROR_CAPTURED_EVENT`;
//! * issuing to the legacy stream while a blocking stream of its context
//!   captures is `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` and invalidates it;
//! * "potentially unsafe API calls" (the model: every implicitly
//!   synchronising call, [`crate::sync`]) fail with
//!   `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` while a GLOBAL capture runs
//!   in any thread, or a THREAD_LOCAL one in the calling thread; RELAXED
//!   captures prohibit nothing;
//! * a wait on an event recorded outside the capture is
//!   `CUDA_ERROR_STREAM_CAPTURE_ISOLATION`; work that cannot be captured
//!   (a copy from pageable memory) is `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`;
//! * `cuStreamEndCapture` of an invalidated capture is
//!   `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`; ending a non-relaxed capture
//!   from another thread is `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD`.

use std::sync::{Arc, Mutex, OnceLock};
use std::thread::ThreadId;

use crate::event::Event;
use crate::handles::{lock, Table};
use crate::stream::{Kind, Op, Stream, STREAMS};
use crate::{context, CUresult, Res};

/// `CUstreamCaptureMode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Prohibits unsafe calls in every thread.
    Global,
    /// Prohibits unsafe calls in the capturing thread.
    ThreadLocal,
    /// Prohibits nothing.
    Relaxed,
}

/// A capture in progress on a stream.
pub struct Capture {
    mode: Mode,
    thread: ThreadId,
    ops: Vec<Op>,
    invalidated: Option<CUresult>,
    id: u64,
}

/// A graph: operations in order.
pub struct Graph {
    ops: Vec<Op>,
}

/// Every live graph and executable graph.
pub static GRAPHS: Table<Graph> = Table::new(0x0a0a_0000_0000);
/// Every live executable graph.
pub static EXECS: Table<Graph> = Table::new(0x0b0b_0000_0000);

/// An active capture: (stream handle, mode, thread, id).
type Active = (u64, Mode, ThreadId, u64);

/// Active captures.
fn active() -> &'static Mutex<Vec<Active>> {
    static A: OnceLock<Mutex<Vec<Active>>> = OnceLock::new();
    A.get_or_init(|| Mutex::new(Vec::new()))
}

fn clone_op(op: &Op) -> Op {
    Op {
        what: op.what,
        deps: Vec::new(),
        work: op.work.clone(),
        capturable: op.capturable,
    }
}

/// Whether `s` is capturing.
pub fn is_capturing(s: &Stream) -> bool {
    lock(&s.capture).is_some()
}

/// The capture status and id of `s` (for `cuStreamGetCaptureInfo`):
/// 0 none, 1 active, 2 invalidated.
pub fn status(s: &Stream) -> (u32, u64) {
    match &*lock(&s.capture) {
        None => (0, 0),
        Some(c) if c.invalidated.is_some() => (2, c.id),
        Some(c) => (1, c.id),
    }
}

fn invalidate(s: &Stream, why: CUresult) {
    if let Some(c) = lock(&s.capture).as_mut() {
        c.invalidated.get_or_insert(why);
    }
}

fn invalidate_handle(h: u64, why: CUresult) {
    if let Ok(s) = STREAMS.get(h) {
        invalidate(&s, why);
    }
}

/// Records `op` when `s` captures (true), else leaves it to be issued.
pub fn capture_op(s: &Stream, op: &mut Op) -> Res<bool> {
    let mut cap = lock(&s.capture);
    let Some(c) = cap.as_mut() else {
        return Ok(false);
    };
    if !op.capturable {
        c.invalidated
            .get_or_insert(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    c.ops.push(clone_op(op));
    Ok(true)
}

/// Refuses a call on a capturing stream that the capture forbids
/// (`cuStreamQuery`, `cuStreamSynchronize`), invalidating the capture.
pub fn refuse_on_capturing(s: &Stream) -> Res<()> {
    if is_capturing(s) {
        invalidate(s, CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    Ok(())
}

/// Issuing to the legacy stream while a blocking stream of its context
/// captures: `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`.
pub fn check_implicit(s: &Stream) -> Res<()> {
    if s.kind != Kind::Legacy {
        return Ok(());
    }
    let caps: Vec<Active> = lock(active()).clone();
    let mut hit = false;
    for (h, mode, _, _) in caps {
        if mode == Mode::Relaxed {
            continue;
        }
        if let Ok(o) = STREAMS.get(h) {
            if o.context == s.context && o.kind.blocking() {
                invalidate(&o, CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
                hit = true;
            }
        }
    }
    if hit {
        Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
    } else {
        Ok(())
    }
}

/// Refuses a potentially unsafe call (`call`) during a capture that
/// prohibits it, invalidating that capture.
pub fn check_unsafe_call(call: &'static str) -> Res<()> {
    let me = std::thread::current().id();
    let caps: Vec<Active> = lock(active()).clone();
    let mut hit = false;
    for (h, mode, thread, _) in caps {
        let prohibits = match mode {
            Mode::Global => true,
            Mode::ThreadLocal => thread == me,
            Mode::Relaxed => false,
        };
        if prohibits {
            invalidate_handle(h, CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
            hit = true;
        }
    }
    if hit {
        crate::trace_line(|| format!("{call}: not permitted while a stream is capturing"));
        return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    Ok(())
}

/// An event record inside a capture: a node that orders nothing more.
pub fn capture_event_record(_s: &Stream) -> Res<()> {
    Ok(())
}

/// A wait on `e` inside a capture: fine for an event recorded in a
/// capture, `CUDA_ERROR_STREAM_CAPTURE_ISOLATION` for one from outside.
pub fn capture_event_wait(s: &Stream, e: &Event) -> Res<()> {
    if *lock(&e.captured) || lock(&e.last).is_none() {
        return Ok(());
    }
    invalidate(s, CUresult::CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
    Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_ISOLATION)
}

/// `cuStreamBeginCapture`.
pub fn begin(stream: u64, mode: u32) -> Res<()> {
    let s = crate::stream::resolve(stream)?;
    if s.kind == Kind::Legacy {
        return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    let mode = match mode {
        0 => Mode::Global,
        1 => Mode::ThreadLocal,
        2 => Mode::Relaxed,
        _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    };
    let mut cap = lock(&s.capture);
    if cap.is_some() {
        return Err(CUresult::CUDA_ERROR_ILLEGAL_STATE);
    }
    static IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let id = IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let thread = std::thread::current().id();
    *cap = Some(Capture {
        mode,
        thread,
        ops: Vec::new(),
        invalidated: None,
        id,
    });
    lock(active()).push((s.handle, mode, thread, id));
    Ok(())
}

/// `cuStreamEndCapture`: the graph's handle.
pub fn end(stream: u64) -> Res<u64> {
    let s = crate::stream::resolve(stream)?;
    let mut cap = lock(&s.capture);
    let Some(c) = cap.as_ref() else {
        return Err(CUresult::CUDA_ERROR_ILLEGAL_STATE);
    };
    if c.mode != Mode::Relaxed && c.thread != std::thread::current().id() {
        return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
    }
    let c = cap.take().expect("checked above");
    lock(active()).retain(|(_, _, _, id)| *id != c.id);
    if c.invalidated.is_some() {
        return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    }
    Ok(GRAPHS.insert(Arc::new(Graph { ops: c.ops })))
}

/// `cuGraphInstantiate`.
pub fn instantiate(graph: u64) -> Res<u64> {
    context::current()?;
    let g = GRAPHS.get(graph)?;
    Ok(EXECS.insert(Arc::new(Graph {
        ops: g.ops.iter().map(clone_op).collect(),
    })))
}

/// `cuGraphLaunch`: the graph's operations, in order, on `stream`.
pub fn launch(exec: u64, stream: u64) -> Res<()> {
    let g = EXECS.get(exec)?;
    let s = crate::stream::resolve(stream)?;
    for op in &g.ops {
        s.issue(clone_op(op))?;
    }
    Ok(())
}

/// `cuGraphDestroy`.
pub fn destroy(graph: u64) -> Res<()> {
    GRAPHS.remove(graph).map(|_| ())
}

/// `cuGraphExecDestroy`.
pub fn exec_destroy(exec: u64) -> Res<()> {
    EXECS.remove(exec).map(|_| ())
}
