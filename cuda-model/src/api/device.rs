//! Initialisation, devices, contexts and peer access.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use cudarc::driver::sys::CUdevice_attribute as A;

use super::{h, out, ptr, run};
use crate::{config, context, sync, CUresult};

/// The driver version the model reports (CUDA 12.8).
pub const DRIVER_VERSION: c_int = 12080;

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    run("cuInit", || {
        context::init(flags)?;
        crate::watch::start();
        crate::report::install();
        Ok(())
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(v: *mut c_int) -> CUresult {
    run("cuDriverGetVersion", || out(v, DRIVER_VERSION))
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(n: *mut c_int) -> CUresult {
    run("cuDeviceGetCount", || {
        context::initialised()?;
        out(n, config::get().devices as c_int)
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(dev: *mut c_int, ordinal: c_int) -> CUresult {
    run("cuDeviceGet", || {
        out(dev, context::device(ordinal)? as c_int)
    })
}

fn write_str(buf: *mut c_char, len: c_int, text: &str) -> crate::Res<()> {
    if buf.is_null() || len <= 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let bytes = text.as_bytes();
    let n = bytes.len().min(len as usize - 1);
    // SAFETY: the caller's buffer holds `len` bytes; `n + 1 <= len`.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf as *mut u8, n);
        *buf.add(n) = 0;
    }
    Ok(())
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: c_int) -> CUresult {
    run("cuDeviceGetName", || {
        context::device(dev)?;
        write_str(name, len, "NVIDIA H200 (cuda-model, strict driver model)")
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: c_int) -> CUresult {
    run("cuDeviceTotalMem", || {
        context::device(dev)?;
        out(bytes, 141usize << 30)
    })
}

/// The value of one device attribute.
pub fn attribute(attr: c_int) -> Option<c_int> {
    let sms = config::get().sms as c_int;
    let a = |x: A| x as c_int;
    Some(match attr {
        x if x == a(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) => 9,
        x if x == a(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) => 0,
        x if x == a(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) => sms,
        x if x == a(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK) => 1024,
        x if x == a(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X) => 1024,
        x if x == a(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y) => 1024,
        x if x == a(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z) => 64,
        x if x == a(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X) => i32::MAX,
        x if x == a(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y) => 65535,
        x if x == a(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z) => 65535,
        x if x == a(A::CU_DEVICE_ATTRIBUTE_WARP_SIZE) => 32,
        x if x == a(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR) => 2048,
        x if x == a(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR) => 32,
        x if x == a(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK) => 49152,
        x if x == a(A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING) => 1,
        x if x == a(A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY) => 1,
        x if x == a(A::CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS) => 1,
        x if x == a(A::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH) => 1,
        x if x == a(A::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT) => 2,
        x if x == a(A::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS) => 1,
        x if x == a(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) => 0x18,
        x if x == a(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE) => 50 << 20,
        x if x == a(A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH) => 6144,
        x if x == a(A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE) => 1_980_000,
        x if x == a(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE) => 2_619_000,
        x if x == a(A::CU_DEVICE_ATTRIBUTE_ECC_ENABLED) => 1,
        // GPUDirect RDMA as an x86 Hopper system reports it: writes from a
        // NIC are not ordered with the device's own work
        // (`CU_GPU_DIRECT_RDMA_WRITES_ORDERING_NONE`), so a consumer must
        // flush, and the host-side flush is offered
        // (`CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST`): driver API,
        // cuFlushGPUDirectRDMAWrites ("Users may query support for this
        // API via CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS").
        x if x == a(A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED) => 1,
        x if x == a(A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING) => 0,
        x if x == a(A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS) => 1,
        // dma-buf export of device memory (`cuMemGetHandleForAddressRange`:
        // "users are expected to query for dma_buf support for the platform
        // by using CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED"), as the open
        // kernel modules on Linux 5.12+ report it.
        x if x == a(A::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED) => 1,
        x if (0..a(A::CU_DEVICE_ATTRIBUTE_MAX)).contains(&x) => 0,
        _ => return None,
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(v: *mut c_int, attr: c_int, dev: c_int) -> CUresult {
    run("cuDeviceGetAttribute", || {
        let d = context::device(dev)?;
        let mut value = attribute(attr).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        if attr == A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID as c_int {
            value += d as c_int;
        }
        // cuda.h: "Indicates if contexts created on this device will be
        // shared via MPS" (CUDA_MODEL_MPS).
        if attr == A::CU_DEVICE_ATTRIBUTE_MPS_ENABLED as c_int {
            value = c_int::from(crate::config::get().mps);
        }
        out(v, value)
    })
}

fn bus_id(d: usize) -> String {
    format!("00000000:{:02X}:00.0", 0x18 + d)
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(buf: *mut c_char, len: c_int, dev: c_int) -> CUresult {
    run("cuDeviceGetPCIBusId", || {
        let d = context::device(dev)?;
        write_str(buf, len, &bus_id(d))
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetByPCIBusId(dev: *mut c_int, id: *const c_char) -> CUresult {
    run("cuDeviceGetByPCIBusId", || {
        context::initialised()?;
        if id.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a NUL-terminated string from the caller.
        let text = unsafe { CStr::from_ptr(id) }
            .to_string_lossy()
            .to_uppercase();
        let found = (0..config::get().devices).find(|d| {
            let mine = bus_id(*d);
            text == mine || mine.ends_with(&text)
        });
        out(
            dev,
            found.ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)? as c_int,
        )
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(
    can: *mut c_int,
    dev: c_int,
    peer: c_int,
) -> CUresult {
    run("cuDeviceCanAccessPeer", || {
        let (a, b) = (context::device(dev)?, context::device(peer)?);
        out(can, c_int::from(a != b))
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuCtxEnablePeerAccess(peer_ctx: *mut c_void, flags: c_uint) -> CUresult {
    run("cuCtxEnablePeerAccess", || {
        let me = context::current()?;
        let peer = context::by_handle(h(peer_ctx))?;
        if flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if peer.device == me.device {
            return Err(CUresult::CUDA_ERROR_INVALID_DEVICE);
        }
        if !crate::handles::lock(peers()).insert((me.handle, peer.handle)) {
            return Err(CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
        }
        Ok(())
    })
}

fn peers() -> &'static std::sync::Mutex<std::collections::HashSet<(u64, u64)>> {
    static P: std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<(u64, u64)>>> =
        std::sync::OnceLock::new();
    P.get_or_init(Default::default)
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut *mut c_void, dev: c_int) -> CUresult {
    run("cuDevicePrimaryCtxRetain", || {
        out(ctx, ptr(context::primary_retain(dev)?))
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: c_int) -> CUresult {
    run("cuDevicePrimaryCtxRelease", || {
        if let Some(gone) = context::primary_release(dev)? {
            crate::stream::forget_context(gone);
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
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease(dev: c_int) -> CUresult {
    cuDevicePrimaryCtxRelease_v2(dev)
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: c_int,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CUresult {
    run("cuDevicePrimaryCtxGetState", || {
        let (count, live) = context::primary_state(dev)?;
        let _ = count;
        out(flags, 0)?;
        out(active, c_int::from(live))
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(
    ctx: *mut *mut c_void,
    flags: c_uint,
    dev: c_int,
) -> CUresult {
    run("cuCtxCreate", || {
        let _ = flags;
        out(ctx, ptr(context::create(dev)?))
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: *mut c_void) -> CUresult {
    run("cuCtxDestroy", || {
        let handle = h(ctx);
        context::destroy_handle(handle, |c| crate::sync::context(c, "cuCtxDestroy"))?;
        crate::stream::forget_context(handle);
        Ok(())
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: *mut c_void) -> CUresult {
    run("cuCtxSetCurrent", || context::set_current(h(ctx)))
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut *mut c_void) -> CUresult {
    run("cuCtxGetCurrent", || {
        out(ctx, ptr(context::current_handle()?))
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: *mut c_void) -> CUresult {
    run("cuCtxPushCurrent", || context::push(h(ctx)))
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(ctx: *mut *mut c_void) -> CUresult {
    run("cuCtxPopCurrent", || {
        let popped = context::pop()?;
        if !ctx.is_null() {
            out(ctx, ptr(popped))?;
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
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut c_int) -> CUresult {
    run("cuCtxGetDevice", || {
        out(dev, context::current()?.device as c_int)
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    run("cuCtxSynchronize", || {
        let c = context::current()?;
        crate::stream::check_unsafe_call("cuCtxSynchronize")?;
        sync::context(&c, "cuCtxSynchronize")
    })
}

/// Flushes counted by [`cuFlushGPUDirectRDMAWrites`] (tests).
pub static GPUDIRECT_FLUSHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// `cuFlushGPUDirectRDMAWrites(target, scope)`: "Blocks until remote writes
/// are visible to the specified scope" (driver API). The model has no
/// NIC writing into its memory, so there is nothing to wait for; it checks
/// what the driver checks: a current context (the target is "the currently
/// active CUDA device context", `CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX`
/// = 0, the only target), and a scope of `..._TO_OWNER` (100) or
/// `..._TO_ALL_DEVICES` (200); anything else is `CUDA_ERROR_INVALID_VALUE`.
/// The call does not synchronise with any stream.
#[no_mangle]
pub extern "C" fn cuFlushGPUDirectRDMAWrites(target: c_int, scope: c_int) -> CUresult {
    run("cuFlushGPUDirectRDMAWrites", || {
        context::current()?;
        if target != 0 || !matches!(scope, 100 | 200) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        GPUDIRECT_FLUSHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    })
}
