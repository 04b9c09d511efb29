//! The model's dma-buf export (`cuMemGetHandleForAddressRange`, GPUDirect
//! RDMA's registration route), one rule at a time as the driver API states
//! them ("Retrieve handle for an address range"): the device says it
//! supports dma-buf; the handle type is `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`;
//! flags are zero or the PCIe mapping flag; `dptr` and `size` are aligned
//! to the host page size; the range is device memory of a `cuMemAlloc`
//! allocation, backed to its end; a context is current. The descriptor
//! maps the allocation's bytes.

mod common;

use std::ffi::c_int;

use common::*;

const PAGE: usize = 4096;
const DMA_BUF_FD: c_int = 1;
const DMA_BUF_SUPPORTED: c_int = 124;

/// `cuMemGetHandleForAddressRange` of `[p, p + size)`: the descriptor, or
/// the driver's answer.
fn export(p: u64, size: usize, handle_type: c_int, flags: u64) -> Result<c_int, CUresult> {
    let mut fd: c_int = -1;
    // SAFETY: a live out-pointer of the handle's type (an int).
    let r = unsafe {
        cuMemGetHandleForAddressRange((&mut fd as *mut c_int).cast(), p, size, handle_type, flags)
    };
    if r == CUDA_SUCCESS {
        Ok(fd)
    } else {
        Err(r)
    }
}

#[test]
fn dmabuf_export_follows_the_driver_rules_and_maps_the_allocation() {
    setup();
    let mut supported = -1;
    // SAFETY: a live out-pointer.
    ok("attribute", unsafe {
        cuDeviceGetAttribute(&mut supported, DMA_BUF_SUPPORTED, 0)
    });
    assert_eq!(supported, 1, "CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED");
    let p = alloc(2 * PAGE);
    // SAFETY: `p` is a live device allocation of 2 pages (the model maps
    // device memory in this process); a byte per page is written.
    unsafe {
        ok("memset", cuMemsetD8_v2(p, 0xab, 2 * PAGE));
    }
    let fd = export(p, 2 * PAGE, DMA_BUF_FD, 0).expect("the whole allocation");
    // The descriptor maps the allocation's bytes.
    // SAFETY: `fd` is the descriptor the model handed over (ours to close).
    let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let mut first = [0u8; 1];
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut first, PAGE as u64).expect("read");
    assert_eq!(first[0], 0xab, "the dma-buf maps the allocation");
    drop(file);
    let pcie = 1;
    assert!(
        export(p, PAGE, DMA_BUF_FD, pcie).is_ok(),
        "the PCIe mapping flag"
    );
    for (what, p2, size, ty, flags) in [
        ("another handle type", p, PAGE, 2, 0),
        ("an unknown flag", p, PAGE, DMA_BUF_FD, 2),
        ("an unaligned size", p, PAGE - 1, DMA_BUF_FD, 0),
        ("an empty range", p, 0, DMA_BUF_FD, 0),
        ("an unaligned start", p + 1, PAGE, DMA_BUF_FD, 0),
        ("past the allocation", p, 3 * PAGE, DMA_BUF_FD, 0),
    ] {
        assert_eq!(
            export(p2, size, ty, flags),
            Err(CUDA_ERROR_INVALID_VALUE),
            "{what}"
        );
    }
    // Not a driver rule: the model hands out the allocation's memfd, whose
    // offset 0 cannot be moved to a later `dptr`; sncl exports whole
    // allocations.
    assert_eq!(
        export(p + PAGE as u64, PAGE, DMA_BUF_FD, 0),
        Err(CUDA_ERROR_NOT_SUPPORTED),
        "a range from inside the allocation (not modelled)"
    );
    let mut host = std::ptr::null_mut();
    // SAFETY: a live out-pointer.
    ok("cuMemHostAlloc", unsafe {
        cuMemHostAlloc(&mut host, PAGE, 0)
    });
    assert_eq!(
        export(host as u64, PAGE, DMA_BUF_FD, 0),
        Err(CUDA_ERROR_INVALID_VALUE),
        "host memory"
    );
    std::thread::spawn(move || {
        assert_eq!(
            export(p, PAGE, DMA_BUF_FD, 0),
            Err(CUDA_ERROR_INVALID_CONTEXT),
            "no current context on this thread"
        );
    })
    .join()
    .expect("thread");
}
