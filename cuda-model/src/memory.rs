//! Memory: device allocations, page-locked host memory, IPC mappings, and
//! what `cuPointerGetAttribute` / `cuMemGetAddressRange` answer about them.
//!
//! A device allocation is a `memfd` of its own mapped shared (so another
//! process can map it through an IPC handle; nothing is left in the file
//! system when a process dies). Its device address is where the model
//! mapped it (unified addressing: one address space for host and device,
//! as on 64-bit Linux). Kernels and copies run on the model's threads and
//! use the address directly.
//!
//! Rules (Driver API, "Memory Management"):
//! * `cuMemAlloc` of 0 bytes is `CUDA_ERROR_INVALID_VALUE`;
//! * `cuMemFree` of an address that is not an allocation's base is
//!   `CUDA_ERROR_INVALID_VALUE` (freeing twice included);
//! * `cuMemHostGetDevicePointer` answers only for page-locked memory
//!   allocated with `CU_MEMHOSTALLOC_DEVICEMAP` (or registered with
//!   `CU_MEMHOSTREGISTER_DEVICEMAP`), else `CUDA_ERROR_INVALID_VALUE`;
//! * pointer attributes answer for memory the driver knows
//!   (`CU_POINTER_ATTRIBUTE_MEMORY_TYPE`, `DEVICE_ORDINAL`,
//!   `RANGE_START_ADDR`, `RANGE_SIZE`, `BUFFER_ID`, `CONTEXT`); an address
//!   the driver does not know is `CUDA_ERROR_INVALID_VALUE`;
//!   `cuMemGetAddressRange` of such an address is `CUDA_ERROR_NOT_FOUND`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::handles::lock;
use crate::{CUresult, Res};

/// What a range of addresses is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A device allocation of this process (`memfd` is its file).
    Device {
        /// Its memfd.
        memfd: i32,
    },
    /// Another process's allocation mapped by `cuIpcOpenMemHandle`.
    Ipc {
        /// The exporting process.
        pid: u32,
        /// The allocation's id there.
        remote_id: u64,
        /// How many opens are outstanding (closed at zero).
        opens: u32,
    },
    /// Page-locked host memory from `cuMemHostAlloc` / `cuMemAllocHost`.
    Host {
        /// Mapped into the device address space (`DEVICEMAP`).
        mapped: bool,
    },
    /// Host memory registered with `cuMemHostRegister`.
    Registered {
        /// Mapped into the device address space (`DEVICEMAP`).
        mapped: bool,
    },
}

/// A range the driver knows.
#[derive(Clone, Copy, Debug)]
pub struct Range {
    /// Its first address.
    pub base: u64,
    /// Its length in bytes (what the caller asked for).
    pub size: u64,
    /// The mapping's length (whole pages).
    pub mapped: u64,
    /// What it is.
    pub kind: Kind,
    /// The device ordinal (device and IPC memory; host memory: the device
    /// of the context that allocated it).
    pub device: usize,
    /// The context that allocated or opened it.
    pub context: u64,
    /// A process-unique id (`CU_POINTER_ATTRIBUTE_BUFFER_ID`).
    pub id: u64,
}

impl Range {
    /// Whether this is device memory (own or IPC-mapped).
    pub fn is_device(&self) -> bool {
        matches!(self.kind, Kind::Device { .. } | Kind::Ipc { .. })
    }
}

fn ranges() -> &'static Mutex<BTreeMap<u64, Range>> {
    static R: OnceLock<Mutex<BTreeMap<u64, Range>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(BTreeMap::new()))
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The range containing `addr`, if the driver knows it.
pub fn find(addr: u64) -> Option<Range> {
    let r = lock(ranges());
    r.range(..=addr)
        .next_back()
        .map(|(_, r)| *r)
        .filter(|r| addr < r.base + r.size.max(1))
}

/// Checks that `[addr, addr + bytes)` lies inside one device range;
/// returns it. `CUDA_ERROR_INVALID_VALUE` otherwise (a copy or kernel
/// argument the driver would fault on).
pub fn device_span(addr: u64, bytes: u64) -> Res<Range> {
    let r = find(addr).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if !r.is_device() || addr + bytes > r.base + r.size.max(1) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(r)
}

/// Whether `addr` lies in page-locked host memory (allocated or registered).
pub fn is_pinned_host(addr: u64) -> bool {
    matches!(
        find(addr).map(|r| r.kind),
        Some(Kind::Host { .. } | Kind::Registered { .. })
    )
}

fn page() -> u64 {
    // SAFETY: sysconf has no memory effects.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(p).unwrap_or(4096).max(4096)
}

fn round_up(bytes: u64) -> u64 {
    bytes.div_ceil(page()) * page()
}

/// Maps `len` bytes of `fd` shared; the address or `CUDA_ERROR_OUT_OF_MEMORY`.
pub fn map_fd(fd: i32, len: u64) -> Res<u64> {
    // SAFETY: a fresh shared mapping of a file the caller owns; nothing
    // else is at the address the kernel picks.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    }
    Ok(p as u64)
}

/// Unmaps a mapping made by the model.
pub fn unmap(addr: u64, len: u64) {
    // SAFETY: the range was mapped by the model and is dropped from its
    // table first; no model thread uses it (the caller synchronised).
    unsafe { libc::munmap(addr as *mut libc::c_void, len as usize) };
}

/// `cuMemAlloc` (after the device synchronisation): a fresh device range.
pub fn alloc_device(device: usize, context: u64, bytes: u64) -> Res<u64> {
    if bytes == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let len = round_up(bytes);
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    // The name carries the id, so an importer can tell the allocation from
    // a later one that reused the file descriptor number.
    let name = std::ffi::CString::new(memfd_name(id)).expect("no NUL in the name");
    // SAFETY: memfd_create takes a NUL-terminated name and flags.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    }
    // SAFETY: `fd` is the memfd just made.
    if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
        // SAFETY: closing the fd made above.
        unsafe { libc::close(fd) };
        return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    }
    let base = match map_fd(fd, len) {
        Ok(b) => b,
        Err(e) => {
            // SAFETY: closing the fd made above.
            unsafe { libc::close(fd) };
            return Err(e);
        }
    };
    insert(Range {
        base,
        size: bytes,
        mapped: len,
        kind: Kind::Device { memfd: fd },
        device,
        context,
        id,
    });
    Ok(base)
}

/// `cuMemGetHandleForAddressRange(.., DMA_BUF_FD, ..)` of `[dptr, dptr +
/// size)` in `device`'s memory: a dma-buf file descriptor of the range
/// (the caller owns it). The driver API's rules ("Retrieve handle for an
/// address range"): `dptr` and `size` aligned to the host page size, the
/// range obtained from `cuMemAlloc` (the model has no `cuMemAddressReserve`)
/// and resident on one device; `CUDA_ERROR_INVALID_VALUE` otherwise. The
/// descriptor is the allocation's memfd, so only ranges that start at the
/// allocation's base are modelled (`CUDA_ERROR_NOT_SUPPORTED`, logged,
/// for the others: a dma-buf's offset 0 is `dptr`, which a memfd cannot
/// move).
pub fn dmabuf_export(device: usize, dptr: u64, size: u64) -> Res<i32> {
    let page = page();
    if size == 0 || !dptr.is_multiple_of(page) || !size.is_multiple_of(page) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let r = find(dptr).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let Kind::Device { memfd } = r.kind else {
        // IPC-mapped and host memory are not this device's allocations.
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    };
    // The allocation's pages (`mapped`: whole pages) back the range.
    if r.device != device || dptr + size > r.base + r.mapped {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    if dptr != r.base {
        crate::log_line(&format!(
            "cuMemGetHandleForAddressRange: a range at {:#x} bytes into its allocation is not \
             modelled (only ranges from the allocation's base): CUDA_ERROR_NOT_SUPPORTED",
            dptr - r.base
        ));
        return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    // SAFETY: `memfd` is the live allocation's descriptor (it is in the
    // table); F_DUPFD_CLOEXEC makes a new descriptor the caller owns.
    let fd = unsafe { libc::fcntl(memfd, libc::F_DUPFD_CLOEXEC, 0) };
    if fd < 0 {
        return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    }
    Ok(fd)
}

/// The memfd name of allocation `id` (`/proc/PID/fd/N` links to
/// `/memfd:NAME (deleted)`).
pub fn memfd_name(id: u64) -> String {
    format!("cuda-model-{id}")
}

/// A fresh allocation id.
pub fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// Adds a range.
pub fn insert(r: Range) {
    lock(ranges()).insert(r.base, r);
}

/// Removes the range based at `base` if `pick` accepts it.
pub fn remove_if(base: u64, pick: impl FnOnce(&Range) -> bool) -> Res<Range> {
    let mut map = lock(ranges());
    match map.get(&base) {
        Some(r) if pick(r) => Ok(map.remove(&base).expect("just found")),
        _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

/// Updates the range based at `base`.
pub fn update(base: u64, f: impl FnOnce(&mut Range)) -> Res<()> {
    let mut map = lock(ranges());
    let r = map
        .get_mut(&base)
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    f(r);
    Ok(())
}

/// `cuMemFree` (after the device synchronisation).
pub fn free_device(addr: u64) -> Res<()> {
    let r = remove_if(addr, |r| matches!(r.kind, Kind::Device { .. }))?;
    if let Kind::Device { memfd } = r.kind {
        unmap(r.base, r.mapped);
        // SAFETY: the allocation's own fd, closed once (its range is gone).
        unsafe { libc::close(memfd) };
    }
    Ok(())
}

/// `cuMemHostAlloc` / `cuMemAllocHost` (after the device synchronisation).
pub fn alloc_host(device: usize, context: u64, bytes: u64, mapped: bool) -> Res<u64> {
    if bytes == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let len = round_up(bytes);
    // SAFETY: an anonymous private mapping at an address the kernel picks.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    }
    insert(Range {
        base: p as u64,
        size: bytes,
        mapped: len,
        kind: Kind::Host { mapped },
        device,
        context,
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
    });
    Ok(p as u64)
}

/// `cuMemFreeHost` (after the device synchronisation).
pub fn free_host(addr: u64) -> Res<()> {
    let r = remove_if(addr, |r| matches!(r.kind, Kind::Host { .. }))?;
    unmap(r.base, r.mapped);
    Ok(())
}

/// `cuMemHostRegister`: `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED` for an
/// overlap with known memory.
pub fn register_host(device: usize, context: u64, addr: u64, bytes: u64, mapped: bool) -> Res<()> {
    if addr == 0 || bytes == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    if find(addr).is_some() || find(addr + bytes - 1).is_some() {
        return Err(CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    }
    insert(Range {
        base: addr,
        size: bytes,
        mapped: bytes,
        kind: Kind::Registered { mapped },
        device,
        context,
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
    });
    Ok(())
}

/// `cuMemHostUnregister`: `CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED` unless
/// `addr` is a registered range's base.
pub fn unregister_host(addr: u64) -> Res<()> {
    remove_if(addr, |r| matches!(r.kind, Kind::Registered { .. }))
        .map(|_| ())
        .map_err(|_| CUresult::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)
}

/// `cuMemHostGetDevicePointer`: the device address of mapped page-locked
/// memory (the same address: unified addressing).
pub fn host_device_pointer(addr: u64) -> Res<u64> {
    match find(addr).map(|r| r.kind) {
        Some(Kind::Host { mapped: true } | Kind::Registered { mapped: true }) => Ok(addr),
        _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

/// Drops every range of a destroyed context (its memory is gone with it).
pub fn release_context(context: u64) {
    let gone: Vec<Range> = {
        let mut map = lock(ranges());
        let keys: Vec<u64> = map
            .values()
            .filter(|r| r.context == context)
            .map(|r| r.base)
            .collect();
        keys.iter().filter_map(|k| map.remove(k)).collect()
    };
    for r in gone {
        match r.kind {
            Kind::Device { memfd } => {
                unmap(r.base, r.mapped);
                // SAFETY: the allocation's own fd, closed once.
                unsafe { libc::close(memfd) };
            }
            Kind::Ipc { .. } | Kind::Host { .. } => unmap(r.base, r.mapped),
            Kind::Registered { .. } => {}
        }
    }
}

/// The base of this process's open mapping of `pid`'s allocation `id`.
pub fn find_ipc(pid: u32, id: u64) -> Option<u64> {
    lock(ranges())
        .values()
        .find(|r| matches!(r.kind, Kind::Ipc { pid: p, remote_id, .. } if p == pid && remote_id == id))
        .map(|r| r.base)
}
