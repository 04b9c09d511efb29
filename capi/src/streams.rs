//! The `extern "C"` stream functions of `sncl.h`: sncl's host streams (the
//! streams themselves are in `stream`), and synchronizing device streams.

use super::args::*;
use super::devmem::{self, StreamArg};
use super::error::{guard, CError};
use super::stream;
use super::stream::snclStream;
use super::types::*;

/// Creates a host stream: a thread that runs the operations queued on it in
/// order. sncl records the handle, which is how the operations tell it
/// from a CUDA stream; host streams take host buffers only.
///
/// # Safety
/// `stream` points to writable storage for a handle.
#[no_mangle]
pub unsafe extern "C" fn snclStreamCreate(stream: *mut snclStream_t) -> snclResult_t {
    guard(|| {
        if stream.is_null() {
            return Err(CError::invalid("stream is NULL"));
        }
        let s = Box::into_raw(Box::new(stream::create()?)) as snclStream_t;
        devmem::add_host_stream(s);
        // SAFETY: checked non-NULL; the caller provides storage.
        unsafe { stream.write(s) };
        Ok(OK)
    })
}

/// Waits until every operation queued on `stream` has completed; returns
/// the first error among them since the last synchronization (and
/// `snclGetLastError` explains it).
///
/// sncl extension: `stream` may also be a device stream (a CUDA stream, or
/// one from `snclDeviceStreamCreate`: waits for its work, up to
/// `SNCL_TIMEOUT_MS`), or NULL: the default stream of the current device
/// (so a program without the CUDA runtime, or on the emulated device, can
/// wait for operations it queued with NULL on device buffers).
///
/// # Safety
/// `stream` is NULL or a live stream handle.
#[no_mangle]
pub unsafe extern "C" fn snclStreamSynchronize(stream: snclStream_t) -> snclResult_t {
    guard(|| {
        // SAFETY: forwarded from the caller.
        match unsafe { devmem::stream_arg(stream) } {
            StreamArg::Host(s) => s.synchronize().map(|_| OK),
            StreamArg::Null => {
                let d = devmem::device(devmem::current()?)?;
                d.synchronize(d.default_stream).map(|_| OK)
            }
            StreamArg::Device(h) => {
                let (o, real) = devmem::resolve_stream(h, None)?;
                devmem::device(o)?.synchronize(real).map(|_| OK)
            }
        }
    })
}

/// `snclInProgress` while operations queued on `stream` are still running;
/// otherwise like `snclStreamSynchronize`. Host streams only.
///
/// # Safety
/// `stream` is a live stream handle.
#[no_mangle]
pub unsafe extern "C" fn snclStreamQuery(stream: snclStream_t) -> snclResult_t {
    guard(|| {
        // SAFETY: forwarded from the caller.
        match unsafe { devmem::stream_arg(stream) } {
            StreamArg::Host(s) => s.query(),
            StreamArg::Null => Err(CError::invalid("stream is NULL")),
            StreamArg::Device(_) => Err(CError::invalid(
                "snclStreamQuery takes a host stream of snclStreamCreate; ask CUDA about a \
                 CUDA stream (cudaStreamQuery)",
            )),
        }
    })
}

/// Releases `stream` after its queued operations have run; returns the
/// first error among them not yet reported. The handle is invalid
/// afterwards in any case. Takes host streams and (sncl extension) the
/// streams of `snclDeviceStreamCreate`; CUDA streams are released with
/// CUDA.
///
/// # Safety
/// `stream` is a live stream handle.
#[no_mangle]
pub unsafe extern "C" fn snclStreamDestroy(stream: snclStream_t) -> snclResult_t {
    guard(|| {
        if stream.is_null() {
            return Err(CError::invalid("stream is NULL"));
        }
        if devmem::remove_host_stream(stream) {
            // SAFETY: a live host stream made by Box::into_raw (it was in
            // the registry), released once (removed from it above).
            let s = unsafe { Box::from_raw(stream as *mut snclStream) };
            return stream::destroy(*s).map(|_| OK);
        }
        let Some((ordinal, h)) = devmem::remove_device_stream(stream) else {
            return Err(CError::invalid(format!(
                "stream {stream:?} is neither a host stream of snclStreamCreate nor a stream of \
                 snclDeviceStreamCreate (destroyed already?); release CUDA streams with CUDA"
            )));
        };
        let d = devmem::device(ordinal)?;
        let synced = d.synchronize(h);
        // SAFETY: made by snclDeviceStreamCreate on this device and removed
        // from the registry above, so destroyed once; the caller enqueues
        // nothing on it afterwards.
        let r = unsafe { d.dev.destroy_stream(h) }
            .map_err(|e| devmem::dev_error(&format!("destroying a stream of {}", d.label()), e));
        synced.and(r).map(|_| OK)
    })
}
