//! `-G N` (nccl-tests' CUDA graph mode): the timed iterations are captured
//! from the rank's stream into a CUDA graph, which is then launched N
//! times. The driver calls, through cudarc's raw bindings, live here.

use sncl::cudarc::driver::sys::{self, CUgraph, CUgraphExec, CUresult, CUstream};
use sncl::device::StreamHandle;

/// A captured and instantiated graph; destroyed on drop.
pub struct Graph {
    graph: CUgraph,
    exec: CUgraphExec,
}

fn check(call: &str, r: CUresult) -> Result<(), String> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call} failed: {r:?}"))
    }
}

fn raw(stream: StreamHandle) -> CUstream {
    stream.0 as usize as CUstream
}

/// Captures what `record` enqueues on `stream` (global capture mode, as
/// nccl-tests) and instantiates it. The stream's device context is current
/// on this thread (the device calls before this made it so).
pub fn capture(
    stream: StreamHandle,
    record: impl FnOnce() -> Result<(), String>,
) -> Result<Graph, String> {
    let s = raw(stream);
    // SAFETY: `s` is a live stream of the current context.
    check("cuStreamBeginCapture", unsafe {
        sys::cuStreamBeginCapture_v2(s, sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)
    })?;
    let recorded = record();
    let mut graph: CUgraph = std::ptr::null_mut();
    // SAFETY: ends the capture begun above; `graph` is a live out-pointer.
    let ended = check("cuStreamEndCapture", unsafe {
        sys::cuStreamEndCapture(s, &mut graph)
    });
    ended?;
    if let Err(e) = recorded {
        // SAFETY: created by the capture above, destroyed once.
        unsafe { sys::cuGraphDestroy(graph) };
        return Err(e);
    }
    let mut exec: CUgraphExec = std::ptr::null_mut();
    // SAFETY: `graph` was just captured; `exec` is a live out-pointer.
    let made = check("cuGraphInstantiate", unsafe {
        sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0)
    });
    if let Err(e) = made {
        // SAFETY: created by the capture above, destroyed once.
        unsafe { sys::cuGraphDestroy(graph) };
        return Err(e);
    }
    Ok(Graph { graph, exec })
}

impl Graph {
    /// Launches the graph on `stream` (asynchronously).
    pub fn launch(&self, stream: StreamHandle) -> Result<(), String> {
        // SAFETY: `exec` is a live instantiated graph; the stream is live.
        check("cuGraphLaunch", unsafe {
            sys::cuGraphLaunch(self.exec, raw(stream))
        })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: both were created in `capture`, destroyed once here; the
        // caller synchronised the streams that launched the graph.
        unsafe {
            sys::cuGraphExecDestroy(self.exec);
            sys::cuGraphDestroy(self.graph);
        }
    }
}
