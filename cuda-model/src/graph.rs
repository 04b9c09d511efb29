//! Stream capture and graphs: beginning and ending a capture, instantiating
//! and launching graphs (the capture state of a stream and the checks it
//! makes are [`crate::stream`]'s).
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

use std::sync::Arc;

use crate::handles::{lock, Table};
use crate::stream::{active, clone_op, Capture, Kind, Mode};
use crate::{context, CUresult, Res};

/// A graph: operations in order.
pub struct Graph {
    ops: Vec<crate::stream::Op>,
}

/// Every live graph and executable graph.
pub static GRAPHS: Table<Graph> = Table::new(0x0a0a_0000_0000);
/// Every live executable graph.
pub static EXECS: Table<Graph> = Table::new(0x0b0b_0000_0000);

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
