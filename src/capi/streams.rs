//! The `extern "C"` host-stream functions of `sncl.h` (the streams
//! themselves are in `stream`).

use super::args::*;
use super::error::{guard, CError};
use super::stream;
use super::types::*;

/// Creates a host stream: a thread that runs the operations queued on it in
/// order.
///
/// # Safety
/// `stream` points to writable storage for a handle.
#[no_mangle]
pub unsafe extern "C" fn snclStreamCreate(stream: *mut snclStream_t) -> snclResult_t {
    guard(|| {
        if stream.is_null() {
            return Err(CError::invalid("stream is NULL"));
        }
        let s = Box::into_raw(Box::new(stream::create()?));
        // SAFETY: checked non-NULL; the caller provides storage.
        unsafe { stream.write(s) };
        Ok(OK)
    })
}

/// Waits until every operation queued on `stream` has completed; returns
/// the first error among them since the last synchronization (and
/// `snclGetLastError` explains it).
///
/// # Safety
/// `stream` is a live stream handle.
#[no_mangle]
pub unsafe extern "C" fn snclStreamSynchronize(stream: snclStream_t) -> snclResult_t {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let s = unsafe { stream_arg(stream) }.ok_or_else(|| CError::invalid("stream is NULL"))?;
        s.synchronize().map(|_| OK)
    })
}

/// `snclInProgress` while operations queued on `stream` are still running;
/// otherwise like `snclStreamSynchronize`.
///
/// # Safety
/// `stream` is a live stream handle.
#[no_mangle]
pub unsafe extern "C" fn snclStreamQuery(stream: snclStream_t) -> snclResult_t {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let s = unsafe { stream_arg(stream) }.ok_or_else(|| CError::invalid("stream is NULL"))?;
        s.query()
    })
}

/// Releases `stream` after its queued operations have run; returns the
/// first error among them not yet reported. The handle is invalid
/// afterwards in any case.
///
/// # Safety
/// `stream` is a live stream handle.
#[no_mangle]
pub unsafe extern "C" fn snclStreamDestroy(stream: snclStream_t) -> snclResult_t {
    guard(|| {
        if stream.is_null() {
            return Err(CError::invalid("stream is NULL"));
        }
        // SAFETY: a live handle made by Box::into_raw, released once.
        let s = unsafe { Box::from_raw(stream) };
        stream::destroy(*s).map(|_| OK)
    })
}
