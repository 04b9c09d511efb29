//! Thin wrappers over the CUDA driver calls the backend makes (through
//! cudarc's `driver::sys`), each returning a [`DeviceError`] that names the
//! call. All of the backend's driver FFI is here.
//!
//! cudarc resolves each driver symbol on its first call and panics if the
//! symbol is missing, so [`missing_symbols`] checks every symbol used here
//! once, when a device is opened.

use std::ffi::{c_char, c_uint, c_void, CStr};

use cudarc::driver::sys::{
    self, CUcontext, CUdevice, CUdevice_attribute, CUdeviceptr, CUevent, CUfunction, CUmodule,
    CUresult, CUstream,
};

use crate::{DeviceError, Result};

/// Every driver symbol the backend calls (as cudarc resolves them with the
/// `cuda-12080` bindings); all exist in CUDA 12.0 and newer drivers.
pub(crate) const SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuCtxGetDevice",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemHostGetDevicePointer_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamQuery",
    "cuStreamIsCapturing",
    "cuStreamWaitValue32_v2",
    "cuStreamWriteValue32_v2",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventElapsedTime",
    "cuIpcGetMemHandle",
    "cuDeviceGetPCIBusId",
    "cuDeviceGetByPCIBusId",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuLaunchKernel",
    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
];

/// Whether a driver library can be loaded (cudarc's probe: `libcuda.so`,
/// `libcuda.so.1`, ...).
pub(crate) fn driver_present() -> bool {
    // SAFETY: the probe only tries to open and then closes the library.
    unsafe { sys::is_culib_present() }
}

/// The driver symbols of [`SYMBOLS`] the loaded library lacks. Call only
/// after [`driver_present`] returned true.
pub(crate) fn missing_symbols() -> Vec<&'static str> {
    // SAFETY: the library is present (checked by the caller), so `culib`
    // finds it rather than panicking; looking a symbol up calls nothing.
    let lib = unsafe { sys::culib() };
    SYMBOLS
        .iter()
        .copied()
        // SAFETY: as above; the looked-up address is not used.
        .filter(|name| unsafe { lib.get::<*const c_void>(name.as_bytes()) }.is_err())
        .collect()
}

/// The driver's name and text for `r` ("CUDA_ERROR_INVALID_VALUE: invalid
/// argument").
pub(crate) fn describe(r: CUresult) -> String {
    let mut name: *const c_char = std::ptr::null();
    let mut text: *const c_char = std::ptr::null();
    // SAFETY: both out-pointers are live; the driver stores pointers to
    // static strings (or leaves them null for an unknown code).
    unsafe {
        sys::cuGetErrorName(r, &mut name);
        sys::cuGetErrorString(r, &mut text);
    }
    let s = |p: *const c_char| {
        if p.is_null() {
            None
        } else {
            // SAFETY: non-null pointers from the driver are static
            // NUL-terminated strings.
            Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        }
    };
    match (s(name), s(text)) {
        (Some(n), Some(t)) => format!("{n}: {t}"),
        (Some(n), None) => n,
        _ => format!("{r:?}"),
    }
}

/// `Ok` for `CUDA_SUCCESS`, else [`DeviceError::Call`].
pub(crate) fn check(ordinal: usize, call: &'static str, r: CUresult) -> Result<()> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(DeviceError::Call {
            ordinal,
            call,
            detail: describe(r),
        })
    }
}

/// The raw result of `cuInit(0)` (the caller maps `CUDA_ERROR_NO_DEVICE`).
pub(crate) fn init() -> CUresult {
    // SAFETY: cuInit takes flags (must be 0) and no pointers.
    unsafe { sys::cuInit(0) }
}

pub(crate) fn driver_version(ordinal: usize) -> Result<i32> {
    let mut v = 0;
    // SAFETY: `v` is a live out-pointer.
    check(ordinal, "cuDriverGetVersion", unsafe {
        sys::cuDriverGetVersion(&mut v)
    })?;
    Ok(v)
}

pub(crate) fn device_count(ordinal: usize) -> Result<usize> {
    let mut n = 0;
    // SAFETY: `n` is a live out-pointer.
    check(ordinal, "cuDeviceGetCount", unsafe {
        sys::cuDeviceGetCount(&mut n)
    })?;
    Ok(usize::try_from(n).unwrap_or(0))
}

pub(crate) fn device_get(ordinal: usize) -> Result<CUdevice> {
    let ord = i32::try_from(ordinal).map_err(|_| DeviceError::NoDevice { ordinal, count: 0 })?;
    let mut dev = 0;
    // SAFETY: `dev` is a live out-pointer.
    check(ordinal, "cuDeviceGet", unsafe {
        sys::cuDeviceGet(&mut dev, ord)
    })?;
    Ok(dev)
}

/// `cuDeviceGetPCIBusId` of device `ordinal` (`"0000:1B:00.0"`).
pub(crate) fn pci_bus_id(ordinal: usize) -> Result<String> {
    let dev = device_get(ordinal)?;
    let mut buf = [0 as c_char; 64];
    // SAFETY: `buf` is live and writable for its length, which is passed;
    // the driver writes a NUL-terminated string of at most that length.
    check(ordinal, "cuDeviceGetPCIBusId", unsafe {
        sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev)
    })?;
    // SAFETY: NUL-terminated within `buf` (the driver's contract, and the
    // last byte was zero before the call and 64 bytes exceed any id).
    let id = unsafe { CStr::from_ptr(buf.as_ptr()) };
    Ok(id.to_string_lossy().into_owned())
}

/// `cuDeviceGetByPCIBusId`: the ordinal of the device with `bus_id` in this
/// process, `None` where it is not visible here (`CUDA_ERROR_INVALID_DEVICE`
/// or `CUDA_ERROR_INVALID_VALUE` for an id of no visible device).
pub(crate) fn ordinal_of_pci_bus_id(ordinal: usize, bus_id: &str) -> Result<Option<usize>> {
    let Ok(id) = std::ffi::CString::new(bus_id) else {
        return Ok(None);
    };
    let mut dev: CUdevice = 0;
    // SAFETY: `dev` is a live out-pointer; `id` is NUL-terminated.
    let r = unsafe { sys::cuDeviceGetByPCIBusId(&mut dev, id.as_ptr()) };
    if matches!(
        r,
        CUresult::CUDA_ERROR_INVALID_DEVICE | CUresult::CUDA_ERROR_INVALID_VALUE
    ) {
        return Ok(None);
    }
    check(ordinal, "cuDeviceGetByPCIBusId", r)?;
    Ok(usize::try_from(dev).ok())
}

/// `cuDeviceCanAccessPeer` between ordinals `ordinal` and `peer`.
pub(crate) fn can_access_peer(ordinal: usize, peer: usize) -> Result<bool> {
    let (dev, peer_dev) = (device_get(ordinal)?, device_get(peer)?);
    let mut can = 0;
    // SAFETY: `can` is a live out-pointer; both devices came from cuDeviceGet.
    check(ordinal, "cuDeviceCanAccessPeer", unsafe {
        sys::cuDeviceCanAccessPeer(&mut can, dev, peer_dev)
    })?;
    Ok(can != 0)
}

/// `cuCtxEnablePeerAccess` from the current context to `peer`'s primary
/// context (retained for the life of the process: peer access lasts as
/// long as that context). Already enabled is success.
pub(crate) fn enable_peer_access(ordinal: usize, peer: usize) -> Result<()> {
    let peer_ctx = primary_retain(ordinal, device_get(peer)?)?;
    // SAFETY: `peer_ctx` is a live retained primary context.
    let r = unsafe { sys::cuCtxEnablePeerAccess(peer_ctx, 0) };
    if r == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
        return Ok(());
    }
    check(ordinal, "cuCtxEnablePeerAccess", r)
}

pub(crate) fn device_name(ordinal: usize, dev: CUdevice) -> Result<String> {
    let mut buf = [0 as c_char; 256];
    // SAFETY: the buffer holds `len` bytes; the driver NUL-terminates.
    check(ordinal, "cuDeviceGetName", unsafe {
        sys::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as i32, dev)
    })?;
    // SAFETY: the driver wrote a NUL-terminated string into `buf` (the last
    // byte stays 0 in any case since the driver writes at most len bytes
    // including the NUL).
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}

pub(crate) fn attribute(ordinal: usize, dev: CUdevice, attr: CUdevice_attribute) -> Result<i32> {
    let mut v = 0;
    // SAFETY: `v` is a live out-pointer.
    check(ordinal, "cuDeviceGetAttribute", unsafe {
        sys::cuDeviceGetAttribute(&mut v, attr, dev)
    })?;
    Ok(v)
}

pub(crate) fn primary_retain(ordinal: usize, dev: CUdevice) -> Result<CUcontext> {
    let mut ctx = std::ptr::null_mut();
    // SAFETY: `ctx` is a live out-pointer.
    check(ordinal, "cuDevicePrimaryCtxRetain", unsafe {
        sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
    })?;
    Ok(ctx)
}

pub(crate) fn primary_release(ordinal: usize, dev: CUdevice) -> Result<()> {
    // SAFETY: called once per successful retain, by the owner.
    check(ordinal, "cuDevicePrimaryCtxRelease", unsafe {
        sys::cuDevicePrimaryCtxRelease_v2(dev)
    })
}

pub(crate) fn set_current(ordinal: usize, ctx: CUcontext) -> Result<()> {
    // SAFETY: `ctx` is a live context held by the caller.
    check(ordinal, "cuCtxSetCurrent", unsafe {
        sys::cuCtxSetCurrent(ctx)
    })
}

pub(crate) fn mem_alloc(ordinal: usize, bytes: usize) -> Result<CUdeviceptr> {
    let mut p = 0;
    // SAFETY: `p` is a live out-pointer.
    let r = unsafe { sys::cuMemAlloc_v2(&mut p, bytes) };
    if r == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        return Err(DeviceError::OutOfMemory { ordinal, bytes });
    }
    check(ordinal, "cuMemAlloc", r)?;
    Ok(p)
}

/// # Safety
/// `p` came from [`mem_alloc`] and is freed once, with no work using it.
pub(crate) unsafe fn mem_free(ordinal: usize, p: CUdeviceptr) -> Result<()> {
    // SAFETY: the caller's contract.
    check(ordinal, "cuMemFree", unsafe { sys::cuMemFree_v2(p) })
}

pub(crate) fn host_alloc(ordinal: usize, bytes: usize, flags: c_uint) -> Result<*mut c_void> {
    let mut p = std::ptr::null_mut();
    // SAFETY: `p` is a live out-pointer.
    let r = unsafe { sys::cuMemHostAlloc(&mut p, bytes, flags) };
    if r == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        return Err(DeviceError::OutOfMemory { ordinal, bytes });
    }
    check(ordinal, "cuMemHostAlloc", r)?;
    Ok(p)
}

/// # Safety
/// `p` came from [`host_alloc`] and is freed once, with no work using it.
pub(crate) unsafe fn host_free(ordinal: usize, p: *mut c_void) -> Result<()> {
    // SAFETY: the caller's contract.
    check(ordinal, "cuMemFreeHost", unsafe { sys::cuMemFreeHost(p) })
}

/// The allocation holding device address `p`: (base, bytes).
pub(crate) fn address_range(ordinal: usize, p: CUdeviceptr) -> Result<(CUdeviceptr, usize)> {
    let (mut base, mut size): (CUdeviceptr, usize) = (0, 0);
    // SAFETY: both out-pointers are live; the driver only looks `p` up.
    check(ordinal, "cuMemGetAddressRange", unsafe {
        sys::cuMemGetAddressRange_v2(&mut base, &mut size, p)
    })?;
    Ok((base, size))
}

/// The device address of pinned host memory at `p` (which may point inside
/// an allocation).
pub(crate) fn host_device_ptr(ordinal: usize, p: *mut c_void) -> Result<CUdeviceptr> {
    let mut d = 0;
    // SAFETY: `d` is a live out-pointer; the driver only looks `p` up.
    check(ordinal, "cuMemHostGetDevicePointer", unsafe {
        sys::cuMemHostGetDevicePointer_v2(&mut d, p, 0)
    })?;
    Ok(d)
}

/// # Safety
/// As for `Device::copy_h2d_async`.
pub(crate) unsafe fn copy_h2d(
    ordinal: usize,
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
    s: CUstream,
) -> Result<()> {
    // SAFETY: the caller's contract.
    check(ordinal, "cuMemcpyHtoDAsync", unsafe {
        sys::cuMemcpyHtoDAsync_v2(dst, src, bytes, s)
    })
}

/// # Safety
/// As for `Device::copy_d2h_async`.
pub(crate) unsafe fn copy_d2h(
    ordinal: usize,
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
    s: CUstream,
) -> Result<()> {
    // SAFETY: the caller's contract.
    check(ordinal, "cuMemcpyDtoHAsync", unsafe {
        sys::cuMemcpyDtoHAsync_v2(dst, src, bytes, s)
    })
}

/// # Safety
/// As for `Device::copy_d2d_async`.
pub(crate) unsafe fn copy_d2d(
    ordinal: usize,
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
    s: CUstream,
) -> Result<()> {
    // SAFETY: the caller's contract.
    check(ordinal, "cuMemcpyDtoDAsync", unsafe {
        sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, s)
    })
}

pub(crate) fn stream_create(ordinal: usize) -> Result<CUstream> {
    let mut s = std::ptr::null_mut();
    let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint;
    // SAFETY: `s` is a live out-pointer.
    check(ordinal, "cuStreamCreate", unsafe {
        sys::cuStreamCreate(&mut s, flags)
    })?;
    Ok(s)
}

/// # Safety
/// `s` came from [`stream_create`], is destroyed once and not used after.
pub(crate) unsafe fn stream_destroy(ordinal: usize, s: CUstream) -> Result<()> {
    // SAFETY: the caller's contract.
    check(ordinal, "cuStreamDestroy", unsafe {
        sys::cuStreamDestroy_v2(s)
    })
}

/// Whether all work on `s` has completed.
pub(crate) fn stream_done(ordinal: usize, s: CUstream) -> Result<bool> {
    // SAFETY: querying takes no pointers besides the handle, which the
    // driver validates.
    match unsafe { sys::cuStreamQuery(s) } {
        CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        r => check(ordinal, "cuStreamQuery", r).map(|()| true),
    }
}

pub(crate) fn stream_capturing(ordinal: usize, s: CUstream) -> Result<bool> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: `status` is a live out-pointer.
    check(ordinal, "cuStreamIsCapturing", unsafe {
        sys::cuStreamIsCapturing(s, &mut status)
    })?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// Maps the driver's "not supported" to [`DeviceError::Unsupported`].
fn memop_result(ordinal: usize, call: &'static str, r: CUresult) -> Result<()> {
    if r == CUresult::CUDA_ERROR_NOT_SUPPORTED {
        return Err(DeviceError::Unsupported {
            what: format!("{call} on CUDA device {ordinal}"),
            why: "the driver reports stream memory operations as unsupported on this device".into(),
        });
    }
    check(ordinal, call, r)
}

/// # Safety
/// `addr` is the device address of a live pinned `u32`.
pub(crate) unsafe fn stream_wait_geq(
    ordinal: usize,
    s: CUstream,
    addr: CUdeviceptr,
    value: u32,
) -> Result<()> {
    let flags = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as c_uint;
    // SAFETY: the caller's contract.
    let r = unsafe { sys::cuStreamWaitValue32_v2(s, addr, value, flags) };
    memop_result(ordinal, "cuStreamWaitValue32", r)
}

/// # Safety
/// `addr` is the device address of a live pinned `u32`.
pub(crate) unsafe fn stream_write(
    ordinal: usize,
    s: CUstream,
    addr: CUdeviceptr,
    value: u32,
) -> Result<()> {
    // The default flags order the write after earlier work, with a memory
    // barrier, so the host sees that work's results once it sees the value.
    let flags = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as c_uint;
    // SAFETY: the caller's contract.
    let r = unsafe { sys::cuStreamWriteValue32_v2(s, addr, value, flags) };
    memop_result(ordinal, "cuStreamWriteValue32", r)
}

pub(crate) fn event_create(ordinal: usize) -> Result<CUevent> {
    let mut e = std::ptr::null_mut();
    let flags = sys::CUevent_flags::CU_EVENT_DEFAULT as c_uint;
    // SAFETY: `e` is a live out-pointer.
    check(ordinal, "cuEventCreate", unsafe {
        sys::cuEventCreate(&mut e, flags)
    })?;
    Ok(e)
}

/// An interprocess event (`CU_EVENT_INTERPROCESS` needs
/// `CU_EVENT_DISABLE_TIMING`: the driver API, `cuEventCreate`) and its
/// exported handle.
pub(crate) fn ipc_event_create(ordinal: usize) -> Result<(CUevent, [u8; 64])> {
    let mut e = std::ptr::null_mut();
    let flags = (sys::CUevent_flags::CU_EVENT_INTERPROCESS as c_uint)
        | (sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint);
    // SAFETY: `e` is a live out-pointer.
    check(ordinal, "cuEventCreate", unsafe {
        sys::cuEventCreate(&mut e, flags)
    })?;
    let mut h = sys::CUipcEventHandle { reserved: [0; 64] };
    // SAFETY: `h` is a live out-pointer; `e` an interprocess event.
    let got = check(ordinal, "cuIpcGetEventHandle", unsafe {
        sys::cuIpcGetEventHandle(&mut h, e)
    });
    if let Err(err) = got {
        // SAFETY: made above, not used by anything else.
        let _ = unsafe { event_destroy(ordinal, e) };
        return Err(err);
    }
    Ok((e, h.reserved.map(|c| c as u8)))
}

/// Another process's interprocess event (`cuIpcOpenEventHandle`).
pub(crate) fn ipc_event_open(ordinal: usize, handle: &[u8; 64]) -> Result<CUevent> {
    let h = sys::CUipcEventHandle {
        reserved: handle.map(|b| b as c_char),
    };
    let mut e = std::ptr::null_mut();
    // SAFETY: `e` is a live out-pointer; the handle is passed by value.
    check(ordinal, "cuIpcOpenEventHandle", unsafe {
        sys::cuIpcOpenEventHandle(&mut e, h)
    })?;
    Ok(e)
}

/// # Safety
/// `e` came from [`event_create`], is destroyed once and not used after.
pub(crate) unsafe fn event_destroy(ordinal: usize, e: CUevent) -> Result<()> {
    // SAFETY: the caller's contract.
    check(ordinal, "cuEventDestroy", unsafe {
        sys::cuEventDestroy_v2(e)
    })
}

pub(crate) fn event_record(ordinal: usize, e: CUevent, s: CUstream) -> Result<()> {
    // SAFETY: handles only; the driver validates them.
    check(ordinal, "cuEventRecord", unsafe {
        sys::cuEventRecord(e, s)
    })
}

pub(crate) fn event_done(ordinal: usize, e: CUevent) -> Result<bool> {
    // SAFETY: a handle only; the driver validates it.
    match unsafe { sys::cuEventQuery(e) } {
        CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        r => check(ordinal, "cuEventQuery", r).map(|()| true),
    }
}

pub(crate) fn stream_wait_event(ordinal: usize, s: CUstream, e: CUevent) -> Result<()> {
    // SAFETY: handles only; flags 0.
    check(ordinal, "cuStreamWaitEvent", unsafe {
        sys::cuStreamWaitEvent(s, e, 0)
    })
}

pub(crate) fn event_elapsed(ordinal: usize, start: CUevent, end: CUevent) -> Result<f32> {
    let mut ms = 0f32;
    // SAFETY: `ms` is a live out-pointer.
    check(ordinal, "cuEventElapsedTime", unsafe {
        sys::cuEventElapsedTime(&mut ms, start, end)
    })?;
    Ok(ms)
}

pub(crate) fn ipc_get(ordinal: usize, p: CUdeviceptr) -> Result<[u8; 64]> {
    let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: `h` is a live out-pointer.
    check(ordinal, "cuIpcGetMemHandle", unsafe {
        sys::cuIpcGetMemHandle(&mut h, p)
    })?;
    Ok(h.reserved.map(|c| c as u8))
}

pub(crate) fn ipc_open(ordinal: usize, handle: &[u8; 64]) -> Result<CUdeviceptr> {
    let h = sys::CUipcMemHandle {
        reserved: handle.map(|b| b as c_char),
    };
    let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as c_uint;
    let mut p = 0;
    // SAFETY: `p` is a live out-pointer; the handle is passed by value.
    check(ordinal, "cuIpcOpenMemHandle", unsafe {
        sys::cuIpcOpenMemHandle_v2(&mut p, h, flags)
    })?;
    Ok(p)
}

/// # Safety
/// `p` came from [`ipc_open`], is closed once, with no work using it.
pub(crate) unsafe fn ipc_close(ordinal: usize, p: CUdeviceptr) -> Result<()> {
    // SAFETY: the caller's contract.
    check(ordinal, "cuIpcCloseMemHandle", unsafe {
        sys::cuIpcCloseMemHandle(p)
    })
}

/// Loads a CUBIN, or NUL-terminated PTX, into the current context.
pub(crate) fn module_load(ordinal: usize, image: &[u8]) -> Result<CUmodule> {
    let mut m = std::ptr::null_mut();
    // SAFETY: `image` is a complete CUBIN or NUL-terminated PTX (the
    // caller's job: `launch::image`), alive for the call.
    check(ordinal, "cuModuleLoadData", unsafe {
        sys::cuModuleLoadData(&mut m, image.as_ptr().cast())
    })?;
    Ok(m)
}

pub(crate) fn module_function(ordinal: usize, m: CUmodule, name: &CStr) -> Result<CUfunction> {
    let mut f = std::ptr::null_mut();
    // SAFETY: `f` is a live out-pointer; `name` is NUL-terminated.
    check(ordinal, "cuModuleGetFunction", unsafe {
        sys::cuModuleGetFunction(&mut f, m, name.as_ptr())
    })?;
    Ok(f)
}

/// # Safety
/// `m` came from [`module_load`], is unloaded once, with no work using it.
pub(crate) unsafe fn module_unload(ordinal: usize, m: CUmodule) -> Result<()> {
    // SAFETY: the caller's contract.
    check(ordinal, "cuModuleUnload", unsafe { sys::cuModuleUnload(m) })
}

/// # Safety
/// `params` holds one pointer per kernel parameter, each to a value of that
/// parameter's type, alive for the call (the driver copies them); the
/// kernel's device pointers are valid for the work it does.
pub(crate) unsafe fn launch(
    ordinal: usize,
    f: CUfunction,
    grid: u32,
    block: u32,
    s: CUstream,
    params: &mut [*mut c_void],
) -> Result<()> {
    // SAFETY: the caller's contract; no shared memory, no `extra`.
    check(ordinal, "cuLaunchKernel", unsafe {
        sys::cuLaunchKernel(
            f,
            grid,
            1,
            1,
            block,
            1,
            1,
            0,
            s,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    })
}

/// The context current on the calling thread (null: none).
pub(crate) fn current_context() -> Result<CUcontext> {
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: `ctx` is a live out-pointer.
    check(0, "cuCtxGetCurrent", unsafe {
        sys::cuCtxGetCurrent(&mut ctx)
    })?;
    Ok(ctx)
}

/// The ordinal of the device whose context is current on the calling thread,
/// or `None` when no context is current.
pub(crate) fn current_context_device() -> Result<Option<usize>> {
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: `ctx` is a live out-pointer.
    check(0, "cuCtxGetCurrent", unsafe {
        sys::cuCtxGetCurrent(&mut ctx)
    })?;
    if ctx.is_null() {
        return Ok(None);
    }
    let mut dev: CUdevice = 0;
    // SAFETY: `dev` is a live out-pointer; a context is current.
    check(0, "cuCtxGetDevice", unsafe {
        sys::cuCtxGetDevice(&mut dev)
    })?;
    // A CUdevice is the device's ordinal (cuDeviceGet(&dev, ordinal)).
    Ok(usize::try_from(dev).ok())
}

/// How many blocks of `block` threads of `f` one SM holds at once
/// (`cuOccupancyMaxActiveBlocksPerMultiprocessor`, no dynamic shared
/// memory).
pub(crate) fn occupancy(ordinal: usize, f: CUfunction, block: u32) -> Result<u32> {
    let mut n = 0;
    // SAFETY: `n` is a live out-pointer; `f` is a loaded function of the
    // current context.
    let r = unsafe { sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut n, f, block as i32, 0) };
    check(ordinal, "cuOccupancyMaxActiveBlocksPerMultiprocessor", r)?;
    Ok(n.max(0) as u32)
}
