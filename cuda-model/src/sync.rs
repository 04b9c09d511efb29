//! Implicit device-wide synchronisation: the calls the driver may make wait
//! until every stream of the device is idle.
//!
//! Rules, from the CUDA documentation (quotes in docs/CUDA-MODEL.md):
//! * CUDA C++ Programming Guide, "Implicit Synchronization" (CUDA 11/12
//!   guides): two commands from different streams cannot run concurrently
//!   if "a page-locked host memory allocation, a device memory allocation,
//!   a device memory set, a memory copy between two addresses to the same
//!   device memory, any CUDA command to the NULL stream" is issued in
//!   between — the model makes `cuMemAlloc`, `cuMemAllocHost` /
//!   `cuMemHostAlloc`, and their frees, wait for the device;
//! * Driver API, `cuMemFree`: "Note that this function may also return
//!   error codes from previous, asynchronous launches" and the "API
//!   synchronization behavior" page: a free "may perform implicit
//!   synchronization";
//! * CUDA C++ Programming Guide, "Lazy Loading", "Possible Issues when
//!   Adopting Lazy Loading / Concurrent Execution": "Loading kernels might
//!   require context synchronization ... there is a possibility of a
//!   deadlock" — module and function loading wait for the device
//!   ([`crate::module`]);
//! * `cuCtxSynchronize`: "Blocks until the device has completed all
//!   preceding requested tasks".
//!
//! The model waits where the driver *may*: a program that is correct only
//! because a real driver happens not to synchronise on some call is not
//! correct.

use std::sync::Arc;

use crate::context::{self, Context};
use crate::stream::{self, Stream};
use crate::{report, watch, Res};

/// Waits, as `call` does on the driver, until every stream of every
/// context of device `d` has completed the work issued before the call.
pub fn device(d: usize, call: &'static str) -> Res<()> {
    stream::check_unsafe_call(call)?;
    let mut targets: Vec<(Arc<Stream>, u64)> = Vec::new();
    for c in context::of_device(d) {
        for s in stream::of_context(c.handle) {
            let n = s.enqueued();
            targets.push((s, n));
        }
    }
    wait_all(call, targets)
}

/// Waits until every stream of `ctx` has completed its issued work.
pub fn context(ctx: &Context, call: &'static str) -> Res<()> {
    let targets = stream::of_context(ctx.handle)
        .into_iter()
        .map(|s| {
            let n = s.enqueued();
            (s, n)
        })
        .collect();
    wait_all(call, targets)
}

fn wait_all(call: &'static str, mut targets: Vec<(Arc<Stream>, u64)>) -> Res<()> {
    report::synchronising_call(call, watch::some_stream_parked());
    targets.retain(|(s, n)| s.completed() < *n);
    if targets.is_empty() {
        return Ok(());
    }
    let _guard = watch::blocked(call, targets.clone());
    for (s, n) in &targets {
        s.wait_for(*n, None);
    }
    Ok(())
}

/// Blocks the calling thread until every operation issued to `s` so far
/// has completed (`call` names the API for the detector).
pub fn stream(s: &Arc<Stream>, call: &'static str) -> Res<()> {
    let n = s.enqueued();
    if s.completed() < n {
        let _guard = watch::blocked(call, vec![(s.clone(), n)]);
        s.wait_for(n, None);
    }
    match s.error() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
