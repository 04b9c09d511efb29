//! Memory entry points: allocation, page-locked host memory, copies,
//! sets, pointer attributes and IPC of memory.

use std::ffi::{c_char, c_int, c_uint, c_void};

use cudarc::driver::sys::CUipcMemHandle;

use super::{h, out, ptr, run};
use crate::memory;
use crate::stream::{self, Op, Stream};
use crate::{context, ipc, report, sync, CUresult, Res};

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(p: *mut u64, bytes: usize) -> CUresult {
    run("cuMemAlloc", || {
        let c = context::current()?;
        if p.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        sync::device(c.device, "cuMemAlloc")?;
        let a = memory::alloc_device(c.device, c.handle, bytes as u64)?;
        report::event("allocations");
        out(p, a)
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(p: u64) -> CUresult {
    run("cuMemFree", || {
        let c = context::current()?;
        if p == 0 {
            return Ok(());
        }
        sync::device(c.device, "cuMemFree")?;
        memory::free_device(p)?;
        report::event("frees");
        Ok(())
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(
    p: *mut *mut c_void,
    bytes: usize,
    flags: c_uint,
) -> CUresult {
    run("cuMemHostAlloc", || {
        let c = context::current()?;
        if p.is_null() || flags & !0x7 != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        sync::device(c.device, "cuMemHostAlloc")?;
        const DEVICEMAP: c_uint = 0x2;
        // With unified addressing every page-locked allocation is mapped.
        let a = memory::alloc_host(c.device, c.handle, bytes as u64, true)?;
        let _ = flags & DEVICEMAP;
        report::event("host_allocations");
        out(p, ptr(a))
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(p: *mut *mut c_void, bytes: usize) -> CUresult {
    cuMemHostAlloc(p, bytes, 0)
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    run("cuMemFreeHost", || {
        let c = context::current()?;
        sync::device(c.device, "cuMemFreeHost")?;
        memory::free_host(h(p))?;
        report::event("host_frees");
        Ok(())
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostRegister_v2(
    p: *mut c_void,
    bytes: usize,
    flags: c_uint,
) -> CUresult {
    run("cuMemHostRegister", || {
        let c = context::current()?;
        sync::device(c.device, "cuMemHostRegister")?;
        memory::register_host(c.device, c.handle, h(p), bytes as u64, true)?;
        let _ = flags;
        Ok(())
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    run("cuMemHostUnregister", || {
        let c = context::current()?;
        sync::device(c.device, "cuMemHostUnregister")?;
        memory::unregister_host(h(p))
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    d: *mut u64,
    p: *mut c_void,
    flags: c_uint,
) -> CUresult {
    run("cuMemHostGetDevicePointer", || {
        context::current()?;
        if flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        out(d, memory::host_device_pointer(h(p))?)
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    run("cuMemGetInfo", || {
        context::current()?;
        out(free, 140usize << 30)?;
        out(total, 141usize << 30)
    })
}

/// A copy of `bytes` from `src` to `dst` on the stream's worker.
fn copy_op(what: &'static str, dst: u64, src: u64, bytes: usize) -> Op {
    Op::new(what, move |_s: &Stream| {
        // SAFETY: both ranges were checked at issue (device ranges the
        // model knows, host ranges the caller vouches for until the copy
        // completes, as the driver's contract says).
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
        Ok(())
    })
}

fn h2d(
    what: &'static str,
    dst: u64,
    src: *const c_void,
    bytes: usize,
    s: &std::sync::Arc<Stream>,
) -> Res<()> {
    memory::device_span(dst, bytes as u64)?;
    if bytes == 0 {
        return Ok(());
    }
    if src.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    if memory::is_pinned_host(h(src as *mut c_void)) {
        s.issue(copy_op(what, dst, src as u64, bytes))?;
        return Ok(());
    }
    // Pageable memory: staged at once ("Stream synchronization behavior":
    // the source is copied to a staging buffer before the call returns);
    // not capturable.
    // SAFETY: the caller's contract: `src` holds `bytes` readable bytes.
    let staged = unsafe { std::slice::from_raw_parts(src as *const u8, bytes) }.to_vec();
    let mut op = Op::new(what, move |_s: &Stream| {
        // SAFETY: `dst` was checked at issue to hold `bytes`.
        unsafe { std::ptr::copy_nonoverlapping(staged.as_ptr(), dst as *mut u8, staged.len()) };
        Ok(())
    });
    op.capturable = false;
    s.issue(op).map(|_| ())
}

fn d2h(
    what: &'static str,
    dst: *mut c_void,
    src: u64,
    bytes: usize,
    s: &std::sync::Arc<Stream>,
) -> Res<bool> {
    memory::device_span(src, bytes as u64)?;
    if bytes == 0 {
        return Ok(false);
    }
    if dst.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let pinned = memory::is_pinned_host(h(dst));
    let mut op = copy_op(what, dst as u64, src, bytes);
    op.capturable = pinned;
    s.issue(op)?;
    // Pageable destination: "the function will return only once the copy
    // has completed" (Stream synchronization behavior).
    Ok(!pinned)
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: u64,
    src: *const c_void,
    bytes: usize,
    st: *mut c_void,
) -> CUresult {
    run("cuMemcpyHtoDAsync", || {
        let s = stream::resolve(h(st))?;
        h2d("cuMemcpyHtoDAsync", dst, src, bytes, &s)
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: u64,
    bytes: usize,
    st: *mut c_void,
) -> CUresult {
    run("cuMemcpyDtoHAsync", || {
        let s = stream::resolve(h(st))?;
        if d2h("cuMemcpyDtoHAsync", dst, src, bytes, &s)? {
            crate::stream::refuse_on_capturing(&s)?;
            crate::sync::stream(&s, "cuMemcpyDtoHAsync (pageable)")?;
        }
        Ok(())
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: u64,
    src: u64,
    bytes: usize,
    st: *mut c_void,
) -> CUresult {
    run("cuMemcpyDtoDAsync", || {
        let s = stream::resolve(h(st))?;
        memory::device_span(dst, bytes as u64)?;
        memory::device_span(src, bytes as u64)?;
        if bytes > 0 {
            s.issue(copy_op("cuMemcpyDtoDAsync", dst, src, bytes))?;
        }
        Ok(())
    })
}

/// A synchronous copy: on the legacy stream, then wait for it (an unsafe
/// call during a capture).
fn sync_copy(
    what: &'static str,
    issue: impl FnOnce(&std::sync::Arc<Stream>) -> Res<()>,
) -> Res<()> {
    crate::stream::check_unsafe_call(what)?;
    let s = stream::resolve(0)?;
    issue(&s)?;
    crate::sync::stream(&s, what)
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(dst: u64, src: *const c_void, bytes: usize) -> CUresult {
    run("cuMemcpyHtoD", || {
        sync_copy("cuMemcpyHtoD", |s| h2d("cuMemcpyHtoD", dst, src, bytes, s))
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, bytes: usize) -> CUresult {
    run("cuMemcpyDtoH", || {
        sync_copy("cuMemcpyDtoH", |s| {
            d2h("cuMemcpyDtoH", dst, src, bytes, s).map(|_| ())
        })
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoD_v2(dst: u64, src: u64, bytes: usize) -> CUresult {
    run("cuMemcpyDtoD", || {
        sync_copy("cuMemcpyDtoD", |s| {
            memory::device_span(dst, bytes as u64)?;
            memory::device_span(src, bytes as u64)?;
            s.issue(copy_op("cuMemcpyDtoD", dst, src, bytes))
                .map(|_| ())
        })
    })
}

fn memset_op(dst: u64, value: u32, elem: usize, count: usize) -> Res<Op> {
    memory::device_span(dst, (elem * count) as u64)?;
    Ok(Op::new("cuMemset", move |_s: &Stream| {
        for i in 0..count {
            // SAFETY: checked at issue: `count` elements of `elem` bytes.
            unsafe {
                match elem {
                    1 => *(dst as *mut u8).add(i) = value as u8,
                    2 => *(dst as *mut u16).add(i) = value as u16,
                    _ => *(dst as *mut u32).add(i) = value,
                }
            }
        }
        Ok(())
    }))
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8_v2(dst: u64, value: u8, count: usize) -> CUresult {
    run("cuMemsetD8", || {
        sync_copy("cuMemsetD8", |s| {
            s.issue(memset_op(dst, value.into(), 1, count)?).map(|_| ())
        })
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32_v2(dst: u64, value: u32, count: usize) -> CUresult {
    run("cuMemsetD32", || {
        sync_copy("cuMemsetD32", |s| {
            s.issue(memset_op(dst, value, 4, count)?).map(|_| ())
        })
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8Async(
    dst: u64,
    value: u8,
    count: usize,
    st: *mut c_void,
) -> CUresult {
    run("cuMemsetD8Async", || {
        let s = stream::resolve(h(st))?;
        s.issue(memset_op(dst, value.into(), 1, count)?).map(|_| ())
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32Async(
    dst: u64,
    value: u32,
    count: usize,
    st: *mut c_void,
) -> CUresult {
    run("cuMemsetD32Async", || {
        let s = stream::resolve(h(st))?;
        s.issue(memset_op(dst, value, 4, count)?).map(|_| ())
    })
}

/// `CUpointer_attribute` values the model answers.
mod attr {
    pub const CONTEXT: i32 = 1;
    pub const MEMORY_TYPE: i32 = 2;
    pub const DEVICE_POINTER: i32 = 3;
    pub const HOST_POINTER: i32 = 4;
    pub const BUFFER_ID: i32 = 7;
    pub const IS_MANAGED: i32 = 8;
    pub const DEVICE_ORDINAL: i32 = 9;
    pub const RANGE_START_ADDR: i32 = 11;
    pub const RANGE_SIZE: i32 = 12;
    pub const MAPPED: i32 = 13;
}

/// `CU_MEMORYTYPE_HOST` / `CU_MEMORYTYPE_DEVICE`.
const MEMORYTYPE_HOST: u32 = 1;
const MEMORYTYPE_DEVICE: u32 = 2;

fn pointer_attribute(data: *mut c_void, a: i32, p: u64) -> Res<()> {
    let r = memory::find(p).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    match a {
        attr::CONTEXT => out(data as *mut u64, r.context),
        attr::MEMORY_TYPE => out(
            data as *mut u32,
            if r.is_device() {
                MEMORYTYPE_DEVICE
            } else {
                MEMORYTYPE_HOST
            },
        ),
        attr::DEVICE_POINTER => out(data as *mut u64, p),
        attr::HOST_POINTER => {
            if r.is_device() {
                Err(CUresult::CUDA_ERROR_INVALID_VALUE)
            } else {
                out(data as *mut u64, p)
            }
        }
        attr::BUFFER_ID => out(data as *mut u64, r.id),
        attr::IS_MANAGED => out(data as *mut u32, 0),
        attr::DEVICE_ORDINAL => out(data as *mut i32, r.device as i32),
        attr::RANGE_START_ADDR => out(data as *mut u64, r.base),
        attr::RANGE_SIZE => out(data as *mut usize, r.size as usize),
        attr::MAPPED => out(data as *mut u8, 1),
        _ => Err(CUresult::CUDA_ERROR_NOT_SUPPORTED),
    }
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(data: *mut c_void, a: i32, p: u64) -> CUresult {
    run("cuPointerGetAttribute", || {
        context::initialised()?;
        pointer_attribute(data, a, p)
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttributes(
    n: c_uint,
    attrs: *const i32,
    data: *mut *mut c_void,
    p: u64,
) -> CUresult {
    run("cuPointerGetAttributes", || {
        context::initialised()?;
        if attrs.is_null() || data.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        for i in 0..n as usize {
            // SAFETY: the caller's arrays hold `n` entries.
            let (a, d) = unsafe { (*attrs.add(i), *data.add(i)) };
            if memory::find(p).is_none() {
                // Unknown memory: the documented "not CUDA memory" answers.
                if a == attr::MEMORY_TYPE {
                    out(d as *mut u32, 0)?;
                }
                continue;
            }
            pointer_attribute(d, a, p)?;
        }
        Ok(())
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: *mut u64,
    size: *mut usize,
    p: u64,
) -> CUresult {
    run("cuMemGetAddressRange", || {
        context::current()?;
        let r = memory::find(p)
            .filter(|r| r.is_device())
            .ok_or(CUresult::CUDA_ERROR_NOT_FOUND)?;
        if !base.is_null() {
            out(base, r.base)?;
        }
        if !size.is_null() {
            out(size, r.size as usize)?;
        }
        Ok(())
    })
}

/// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`, the one handle type of
/// `cuMemGetHandleForAddressRange`.
const DMA_BUF_FD: c_int = 1;
/// `CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE` (CUDA 12.8: the dma-buf
/// is mapped through the PCIe BAR1); before it, "flags: reserved, must be
/// zero".
const DMA_BUF_MAPPING_TYPE_PCIE: u64 = 1;

/// The driver API entry point of this name (see the CUDA Driver API
/// reference, "Retrieve handle for an address range"): a context must be
/// current, `handleType` must be `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`,
/// `flags` zero or the PCIe mapping flag, and the range one the device's
/// allocation backs (`memory::dmabuf_export`). Exports are counted
/// (`dmabuf_exports`).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetHandleForAddressRange(
    handle: *mut c_void,
    dptr: u64,
    size: usize,
    handle_type: c_int,
    flags: u64,
) -> CUresult {
    run("cuMemGetHandleForAddressRange", || {
        let c = context::current()?;
        if handle.is_null() || handle_type != DMA_BUF_FD || flags & !DMA_BUF_MAPPING_TYPE_PCIE != 0
        {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let fd = memory::dmabuf_export(c.device, dptr, size as u64)?;
        report::event("dmabuf_exports");
        // "The handle will be interpreted as a pointer to an integer to
        // store the dma_buf file descriptor."
        out(handle.cast::<c_int>(), fd)
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuIpcGetMemHandle(handle: *mut CUipcMemHandle, p: u64) -> CUresult {
    run("cuIpcGetMemHandle", || {
        context::current()?;
        let bytes = ipc::get_mem_handle(p)?;
        out(
            handle,
            CUipcMemHandle {
                reserved: bytes.map(|b| b as c_char),
            },
        )
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(
    p: *mut u64,
    handle: CUipcMemHandle,
    flags: c_uint,
) -> CUresult {
    run("cuIpcOpenMemHandle", || {
        let c = context::current()?;
        if p.is_null() || flags & !0x1 != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let bytes = handle.reserved.map(|b| b as u8);
        let base = ipc::open_mem_handle(c.handle, c.device, &bytes)?;
        report::event("ipc_opens");
        out(p, base)
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle(
    p: *mut u64,
    handle: CUipcMemHandle,
    flags: c_uint,
) -> CUresult {
    cuIpcOpenMemHandle_v2(p, handle, flags)
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuIpcCloseMemHandle(p: u64) -> CUresult {
    run("cuIpcCloseMemHandle", || {
        context::current()?;
        ipc::close_mem_handle(p)?;
        report::event("ipc_closes");
        Ok(())
    })
}
