//! The exported driver entry points (`extern "C"`, the names cuda.h and
//! cudarc resolve). Each one runs its body under `catch_unwind` (nothing
//! unwinds across the C boundary), counts the call ([`crate::report`]) and
//! returns the body's `CUresult`.

use std::panic::AssertUnwindSafe;

use crate::{report, CUresult, Res};

pub mod device;
pub mod errors;
pub mod memory;
pub mod module;
pub mod stream;
pub mod stubs;

/// Runs an entry point's body: its result, a logged
/// `CUDA_ERROR_UNKNOWN` if it panicked.
pub fn run(api: &'static str, body: impl FnOnce() -> Res<()>) -> CUresult {
    let r = match std::panic::catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => CUresult::CUDA_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => {
            crate::log_line(&format!("{api}: internal error (a panic in the model)"));
            CUresult::CUDA_ERROR_UNKNOWN
        }
    };
    report::call(api, r);
    if r != CUresult::CUDA_SUCCESS && r != CUresult::CUDA_ERROR_NOT_READY {
        crate::trace_line(|| format!("{api} -> {r:?}"));
    }
    r
}

/// Stores `v` through the caller's out-pointer (null:
/// `CUDA_ERROR_INVALID_VALUE`).
pub(crate) fn out<T>(p: *mut T, v: T) -> Res<()> {
    if p.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the driver API's contract: a non-null out-pointer is valid
    // for a write of its type.
    unsafe { p.write(v) };
    Ok(())
}

/// A handle argument as a number.
pub(crate) fn h<T>(p: *mut T) -> u64 {
    p as usize as u64
}

/// A number as a handle.
pub(crate) fn ptr<T>(v: u64) -> *mut T {
    v as usize as *mut T
}
