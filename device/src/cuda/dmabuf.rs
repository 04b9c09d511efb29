//! dma-buf export of CUDA device memory (GPUDirect RDMA through
//! `ibv_reg_dmabuf_mr`): the device attribute, the allocation's range and
//! `cuMemGetHandleForAddressRange`. The two range calls are looked up
//! before they are called (cudarc's dynamic loading panics on a missing
//! symbol), so an old driver answers "unsupported", never a panic.

use std::ffi::c_void;
use std::os::fd::{FromRawFd, OwnedFd};

use cudarc::driver::sys::{self, CUdevice, CUdevice_attribute, CUdeviceptr};

use super::driver::{self, check};
use crate::{DeviceError, DevicePtr, DmaBuf, Result};

/// The driver symbols dma-buf export needs beyond the backend's own.
const SYMBOLS: &[&str] = &[
    "cuMemGetHandleForAddressRange",
    "cuMemGetAddressRange_v2",
    "cuPointerGetAttribute",
];

/// The host page size dma-buf ranges are aligned to.
fn page() -> u64 {
    // SAFETY: getpagesize takes no arguments and only reads a constant.
    let p = unsafe { getpagesize() };
    u64::try_from(p)
        .ok()
        .filter(|p| p.is_power_of_two())
        .unwrap_or(4096)
}

extern "C" {
    /// glibc's (and every libc's) page size query.
    fn getpagesize() -> std::ffi::c_int;
}

/// The first of [`SYMBOLS`] the driver lacks, if any.
fn missing_symbol() -> Option<&'static str> {
    // SAFETY: the driver library is loaded (a device is open); looking a
    // symbol up calls nothing.
    let lib = unsafe { sys::culib() };
    SYMBOLS
        .iter()
        .copied()
        // SAFETY: as above; the looked-up address is not used.
        .find(|name| unsafe { lib.get::<*const c_void>(name.as_bytes()) }.is_err())
}

/// Whether device `dev` exports dma-bufs: the driver has the calls and
/// the device reports `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`.
pub(crate) fn supported(ordinal: usize, dev: CUdevice) -> Result<bool> {
    if let Some(name) = missing_symbol() {
        tracing::debug!(ordinal, name, "the CUDA driver lacks a dma-buf call");
        return Ok(false);
    }
    let v = driver::attribute(
        ordinal,
        dev,
        CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
    )?;
    Ok(v != 0)
}

fn unsupported(ordinal: usize, why: String) -> DeviceError {
    DeviceError::Unsupported {
        what: format!("dma-buf export on CUDA device {ordinal}"),
        why,
    }
}

/// The id of the allocation holding `p` (`CU_POINTER_ATTRIBUTE_BUFFER_ID`).
pub(crate) fn buffer_id(ordinal: usize, p: CUdeviceptr) -> Result<u64> {
    if let Some(name) = missing_symbol() {
        return Err(unsupported(ordinal, format!("the driver lacks {name}")));
    }
    let mut id: u64 = 0;
    // SAFETY: `id` is a live out-pointer of the attribute's type (unsigned
    // long long).
    check(ordinal, "cuPointerGetAttribute(BUFFER_ID)", unsafe {
        sys::cuPointerGetAttribute(
            (&mut id as *mut u64).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID,
            p,
        )
    })?;
    Ok(id)
}

/// Whether `p` is managed memory (`CU_POINTER_ATTRIBUTE_IS_MANAGED`).
pub(crate) fn is_managed(ordinal: usize, p: CUdeviceptr) -> Result<bool> {
    if let Some(name) = missing_symbol() {
        return Err(unsupported(ordinal, format!("the driver lacks {name}")));
    }
    let mut managed: std::ffi::c_uint = 0;
    // SAFETY: `managed` is a live out-pointer of the attribute's type
    // (unsigned int, read as a boolean).
    check(ordinal, "cuPointerGetAttribute(IS_MANAGED)", unsafe {
        sys::cuPointerGetAttribute(
            (&mut managed as *mut std::ffi::c_uint).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
            p,
        )
    })?;
    Ok(managed != 0)
}

/// Exports the allocation holding `p .. p + bytes`, rounded out to host
/// pages, as a dma-buf.
pub(crate) fn export(ordinal: usize, p: CUdeviceptr, bytes: usize) -> Result<DmaBuf> {
    if let Some(name) = missing_symbol() {
        return Err(unsupported(ordinal, format!("the driver lacks {name}")));
    }
    let (mut base, mut size): (CUdeviceptr, usize) = (0, 0);
    // SAFETY: both out-pointers are live.
    check(ordinal, "cuMemGetAddressRange", unsafe {
        sys::cuMemGetAddressRange_v2(&mut base, &mut size, p)
    })?;
    if p + bytes as u64 > base + size as u64 {
        return Err(DeviceError::InvalidArgument {
            ordinal,
            call: "dmabuf_export",
            detail: format!(
                "{bytes} bytes at {p:#x} run past the end of their allocation \
                 ({base:#x}, {size} bytes)"
            ),
        });
    }
    let page = page();
    let start = base & !(page - 1);
    let len = (base + size as u64 - start).div_ceil(page) * page;
    let mut fd: std::ffi::c_int = -1;
    // SAFETY: `fd` is a live out-pointer of the handle type's size (an
    // int); the range is the page-aligned hull of a live allocation.
    let r = unsafe {
        sys::cuMemGetHandleForAddressRange(
            (&mut fd as *mut std::ffi::c_int).cast(),
            start,
            len as usize,
            sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
            0,
        )
    };
    check(ordinal, "cuMemGetHandleForAddressRange(DMA_BUF_FD)", r)?;
    if fd < 0 {
        return Err(unsupported(
            ordinal,
            "cuMemGetHandleForAddressRange returned no file descriptor".into(),
        ));
    }
    // SAFETY: a new descriptor the driver opened for us; owned from here.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let id = buffer_id(ordinal, p)?;
    Ok(DmaBuf {
        fd,
        offset: 0,
        base: DevicePtr(start),
        len: len as usize,
        id,
    })
}

/// Whether GPUDirect RDMA writes into device `dev` need a flush before its
/// own work reads them (`CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING`
/// below `CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER`).
pub(crate) fn flush_needed(ordinal: usize, dev: CUdevice) -> Result<bool> {
    let v = driver::attribute(
        ordinal,
        dev,
        CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING,
    )?;
    Ok(v < sys::CUGPUDirectRDMAWritesOrdering::CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER as i32)
}

/// `cuFlushGPUDirectRDMAWrites(TARGET_CURRENT_CTX, TO_OWNER)` on the bound
/// context of device `dev`; unsupported where the driver lacks the call or
/// the device the host-side flush option.
pub(crate) fn flush_writes(ordinal: usize, dev: CUdevice) -> Result<()> {
    const CALL: &str = "cuFlushGPUDirectRDMAWrites";
    let why = |w: &str| DeviceError::Unsupported {
        what: format!("GPUDirect RDMA write flushes on CUDA device {ordinal}"),
        why: w.to_string(),
    };
    // SAFETY: the driver library is loaded (a device is open); looking a
    // symbol up calls nothing.
    let lib = unsafe { sys::culib() };
    // SAFETY: as above; the looked-up address is not used.
    if unsafe { lib.get::<*const c_void>(CALL.as_bytes()) }.is_err() {
        return Err(why(
            "the driver lacks cuFlushGPUDirectRDMAWrites (CUDA 11.3 or newer has it)",
        ));
    }
    let options = driver::attribute(
        ordinal,
        dev,
        CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS,
    )?;
    let host =
        sys::CUflushGPUDirectRDMAWritesOptions::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST as i32;
    if options & host == 0 {
        return Err(why("the device does not offer the host-side flush (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS)"));
    }
    // SAFETY: plain enum arguments; the caller bound the device's context.
    check(ordinal, CALL, unsafe {
        sys::cuFlushGPUDirectRDMAWrites(
            sys::CUflushGPUDirectRDMAWritesTarget::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
            sys::CUflushGPUDirectRDMAWritesScope::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER,
        )
    })
}
