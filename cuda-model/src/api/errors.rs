//! `cuGetErrorName` / `cuGetErrorString`.

use std::ffi::{c_char, CStr};

use crate::CUresult;

macro_rules! codes {
    ($($name:ident => $text:literal,)*) => {
        fn lookup(code: u32) -> Option<(&'static CStr, &'static CStr)> {
            $(
                if code == CUresult::$name as u32 {
                    return Some((
                        // SAFETY: a literal with one NUL at its end.
                        unsafe { CStr::from_bytes_with_nul_unchecked(concat!(stringify!($name), "\0").as_bytes()) },
                        // SAFETY: as above.
                        unsafe { CStr::from_bytes_with_nul_unchecked(concat!($text, "\0").as_bytes()) },
                    ));
                }
            )*
            None
        }
    };
}

codes! {
    CUDA_SUCCESS => "no error",
    CUDA_ERROR_INVALID_VALUE => "invalid argument",
    CUDA_ERROR_OUT_OF_MEMORY => "out of memory",
    CUDA_ERROR_NOT_INITIALIZED => "initialization error",
    CUDA_ERROR_DEINITIALIZED => "driver shutting down",
    CUDA_ERROR_NO_DEVICE => "no CUDA-capable device is detected",
    CUDA_ERROR_INVALID_DEVICE => "invalid device ordinal",
    CUDA_ERROR_INVALID_IMAGE => "device kernel image is invalid",
    CUDA_ERROR_INVALID_CONTEXT => "invalid device context",
    CUDA_ERROR_CONTEXT_ALREADY_CURRENT => "context already current",
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => "peer access is already enabled",
    CUDA_ERROR_PEER_ACCESS_NOT_ENABLED => "peer access has not been enabled",
    CUDA_ERROR_CONTEXT_IS_DESTROYED => "context is destroyed",
    CUDA_ERROR_INVALID_HANDLE => "invalid resource handle",
    CUDA_ERROR_ILLEGAL_STATE => "the operation cannot be performed in the present state",
    CUDA_ERROR_NOT_FOUND => "named symbol not found",
    CUDA_ERROR_NOT_READY => "device not ready",
    CUDA_ERROR_ILLEGAL_ADDRESS => "an illegal memory access was encountered",
    CUDA_ERROR_LAUNCH_FAILED => "unspecified launch failure",
    CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE => "too many blocks in cooperative launch",
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED => "part or all of the requested memory range is already mapped",
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED => "pointer does not correspond to a registered memory region",
    CUDA_ERROR_NOT_SUPPORTED => "operation not supported",
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED => "operation not permitted when stream is capturing",
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED => "operation failed due to a previous error during capture",
    CUDA_ERROR_STREAM_CAPTURE_ISOLATION => "operation would make the legacy stream depend on a capturing blocking stream",
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT => "operation would make the legacy stream depend on a capturing blocking stream",
    CUDA_ERROR_CAPTURED_EVENT => "operation not permitted on an event last recorded in a capturing stream",
    CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD => "attempt to terminate a thread-local capture sequence from another thread",
    CUDA_ERROR_UNKNOWN => "unknown error",
}

/// `cuGetErrorName`.
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(error: u32, out: *mut *const c_char) -> CUresult {
    match lookup(error) {
        Some((name, _)) if !out.is_null() => {
            // SAFETY: a non-null out-pointer from the caller.
            unsafe { out.write(name.as_ptr()) };
            CUresult::CUDA_SUCCESS
        }
        _ => CUresult::CUDA_ERROR_INVALID_VALUE,
    }
}

/// `cuGetErrorString`.
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(error: u32, out: *mut *const c_char) -> CUresult {
    match lookup(error) {
        Some((_, text)) if !out.is_null() => {
            // SAFETY: a non-null out-pointer from the caller.
            unsafe { out.write(text.as_ptr()) };
            CUresult::CUDA_SUCCESS
        }
        _ => CUresult::CUDA_ERROR_INVALID_VALUE,
    }
}
