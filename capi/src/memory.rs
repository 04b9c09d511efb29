//! The `extern "C"` device-memory functions of `sncl.h`: `snclMemAlloc` /
//! `snclMemFree` (NCCL's), and sncl extensions for programs without the
//! CUDA runtime and for the emulated device: choosing the backend and the
//! current device, device streams and blocking copies.

use std::ffi::{c_char, c_int, c_void, CStr};

use ::device::{Backend, DevicePtr};

use super::args::*;
use super::devmem::{self, Mem};
use super::error::{guard, CError};
use super::types::*;

/// Chooses the device backend of this process (sncl extension): `"cuda"`
/// (the default) or `"emu"`, the emulated device (host memory standing in
/// for a GPU, in builds with the `emu` test feature only). Call it before
/// any other sncl call that touches buffers; choosing another backend
/// afterwards is `snclInvalidUsage`.
///
/// # Safety
/// `name` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn snclSetDeviceBackend(name: *const c_char) -> snclResult_t {
    guard(|| {
        if name.is_null() {
            return Err(CError::invalid("name is NULL"));
        }
        // SAFETY: checked non-NULL; the caller passes a NUL-terminated string.
        let s = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        let b = Backend::from_name(&s).ok_or_else(|| {
            CError::invalid(format!(
                "unknown device backend {s:?}; expected \"cuda\" or \"emu\""
            ))
        })?;
        devmem::set_backend(b).map(|_| OK)
    })
}

/// Makes `device` the calling thread's current device (sncl extension, as
/// `cudaSetDevice`; on CUDA it also makes that device's primary context
/// current): `snclMemAlloc`, `snclDeviceStreamCreate` and a NULL stream
/// in `snclStreamSynchronize` use it. Without it: the device of the
/// current CUDA context, else 0.
#[no_mangle]
pub extern "C" fn snclSetDevice(device: c_int) -> snclResult_t {
    guard(|| {
        let d = usize::try_from(device)
            .map_err(|_| CError::invalid(format!("device {device} is negative")))?;
        devmem::set_current(d).map(|_| OK)
    })
}

/// Writes the calling thread's current device (see `snclSetDevice`) to
/// `*device` (sncl extension).
///
/// # Safety
/// `device` points to a writable int.
#[no_mangle]
pub unsafe extern "C" fn snclGetDevice(device: *mut c_int) -> snclResult_t {
    guard(|| {
        if device.is_null() {
            return Err(CError::invalid("device is NULL"));
        }
        let d = devmem::current()?;
        let d = c_int::try_from(d).map_err(|_| CError::internal("device ordinal overflows int"))?;
        // SAFETY: checked non-NULL; the caller passes a writable int.
        unsafe { device.write(d) };
        Ok(OK)
    })
}

/// Allocates `size` bytes of device memory on the current device, as
/// `ncclMemAlloc`: memory other processes can open (CUDA IPC; shared
/// memory on the emulated device) and operations take as device buffers.
/// Release it with `snclMemFree`. The contents are undefined.
///
/// # Safety
/// `ptr` points to writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn snclMemAlloc(ptr: *mut *mut c_void, size: usize) -> snclResult_t {
    guard(|| {
        if ptr.is_null() {
            return Err(CError::invalid("ptr is NULL"));
        }
        let p = devmem::alloc(size)?;
        // SAFETY: checked non-NULL; the caller provides storage. The value
        // is a device address, never dereferenced by the host.
        unsafe { ptr.write(p as *mut c_void) };
        Ok(OK)
    })
}

/// Frees memory from `snclMemAlloc` after the work queued before on its
/// device's default stream (NULL) has completed. A pointer that is not a
/// live allocation of `snclMemAlloc` is `snclInvalidArgument`; NULL is a
/// no-op.
///
/// # Safety
/// No operation queued on another stream still uses `ptr`.
#[no_mangle]
pub unsafe extern "C" fn snclMemFree(ptr: *mut c_void) -> snclResult_t {
    guard(|| {
        if ptr.is_null() {
            return Ok(OK);
        }
        let addr = ptr as u64;
        if let Some(win) = super::window::holding(addr) {
            return Err(CError::usage(format!(
                "{addr:#x} is registered in window {win:#x} (snclCommWindowRegister); deregister \
                 it with snclCommWindowDeregister before snclMemFree"
            )));
        }
        if let Some(reg) = super::register::holding(addr) {
            return Err(CError::usage(format!(
                "{addr:#x} is registered ({reg:#x}, snclCommRegister); deregister it with \
                 snclCommDeregister before snclMemFree"
            )));
        }
        devmem::free(addr).map(|_| OK)
    })
}

/// Copies `bytes` from `src` to `dst` and returns when the copy is done
/// (sncl extension, as `cudaMemcpy` with `cudaMemcpyDefault`): either
/// may be host memory or device memory (both on one device). Device copies
/// run on the device's default stream, after the work queued there before
/// (e.g. operations issued with a NULL stream).
///
/// # Safety
/// `src` holds `bytes` readable bytes and `dst` `bytes` writable ones; they
/// do not overlap.
#[no_mangle]
pub unsafe extern "C" fn snclMemcpy(
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
) -> snclResult_t {
    guard(|| {
        if bytes == 0 {
            return Ok(OK);
        }
        if dst.is_null() || src.is_null() {
            return Err(CError::invalid("dst or src is NULL"));
        }
        let (dk, sk) = (
            devmem::kind("dst", dst as *const u8)?,
            devmem::kind("src", src as *const u8)?,
        );
        let (d, s) = (DevicePtr(dst as u64), DevicePtr(src as u64));
        let (dev, r) = match (dk, sk) {
            (Mem::Host, Mem::Host) => {
                // SAFETY: the caller's contract: valid, non-overlapping.
                unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, bytes) };
                return Ok(OK);
            }
            // The device ranges were classified as live memory of this
            // device; each copy completes (synchronized below) before this
            // returns.
            (Mem::Device(x), Mem::Host) => {
                // SAFETY: the caller's contract (see above).
                let r = unsafe {
                    x.dev
                        .copy_h2d_async(d, src as *const u8, bytes, x.default_stream)
                };
                (x, r)
            }
            (Mem::Host, Mem::Device(x)) => {
                // SAFETY: the caller's contract (see above).
                let r = unsafe {
                    x.dev
                        .copy_d2h_async(dst as *mut u8, s, bytes, x.default_stream)
                };
                (x, r)
            }
            (Mem::Device(x), Mem::Device(y)) => {
                if !std::sync::Arc::ptr_eq(&x, &y) {
                    return Err(CError::invalid(format!(
                        "dst is memory of {} and src of {}; snclMemcpy copies within one device",
                        x.label(),
                        y.label()
                    )));
                }
                // SAFETY: the caller's contract (see above).
                let r = unsafe { x.dev.copy_d2d_async(d, s, bytes, x.default_stream) };
                (x, r)
            }
        };
        r.map_err(|e| devmem::dev_error(&format!("copying {bytes} bytes on {}", dev.label()), e))?;
        dev.synchronize(dev.default_stream).map(|_| OK)
    })
}

/// Creates a device stream on the current device (sncl extension, as
/// `cudaStreamCreate`; on the emulated device the only way to get a stream
/// other than NULL). Operations take it as their stream; wait for it with
/// `snclStreamSynchronize` and release it with `snclStreamDestroy`.
///
/// # Safety
/// `stream` points to writable storage for a handle.
#[no_mangle]
pub unsafe extern "C" fn snclDeviceStreamCreate(stream: *mut snclStream_t) -> snclResult_t {
    guard(|| {
        if stream.is_null() {
            return Err(CError::invalid("stream is NULL"));
        }
        let d = devmem::device(devmem::current()?)?;
        let h = d
            .dev
            .create_stream()
            .map_err(|e| devmem::dev_error(&format!("creating a stream on {}", d.label()), e))?;
        let c = devmem::add_device_stream(h, d.dev.ordinal());
        // SAFETY: checked non-NULL; the caller provides storage.
        unsafe { stream.write(c) };
        Ok(OK)
    })
}
