//! Interprocess sharing of device memory and events.
//!
//! Rules (Driver API, `cuIpcGetMemHandle`, `cuIpcOpenMemHandle`,
//! `cuIpcCloseMemHandle`, `cuIpcGetEventHandle`, `cuIpcOpenEventHandle`):
//! * a memory handle names an allocation made by `cuMemAlloc`, whole: it
//!   is taken "from the allocation's base pointer", and opening it maps the
//!   whole allocation and returns the base — an interior pointer exported
//!   is *not* the pointer the peer gets;
//! * opening the same handle again in a process counts a reference and
//!   returns the same address; `cuIpcCloseMemHandle` drops one and unmaps
//!   at zero; closing an address that is not an open mapping is
//!   `CUDA_ERROR_INVALID_VALUE` (so is closing twice);
//! * a handle exported by the calling process cannot be opened by it
//!   (`CUDA_ERROR_INVALID_CONTEXT`, as drivers answer; same-process peers
//!   use the pointer);
//! * an event handle needs an event made with `CU_EVENT_INTERPROCESS |
//!   CU_EVENT_DISABLE_TIMING`.
//!
//! Handles work between processes of one machine: the allocation is a
//! memfd, opened by the importer through `/proc/PID/fd/N` (same user).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::memory::{self, Kind, Range};
use crate::{CUresult, Res};

const MEM_MAGIC: &[u8; 8] = b"CUMDLMEM";
const EVENT_MAGIC: &[u8; 8] = b"CUMDLEVT";

/// A decoded handle: which process, which file, which allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle {
    /// The exporting process.
    pub pid: u32,
    /// Its file descriptor of the memfd.
    pub fd: i32,
    /// The allocation's id there.
    pub id: u64,
    /// The allocation's size.
    pub size: u64,
    /// The mapping's size.
    pub mapped: u64,
    /// The device ordinal.
    pub device: u32,
}

fn encode(magic: &[u8; 8], h: &Handle) -> [u8; 64] {
    let mut out = [0u8; 64];
    out[..8].copy_from_slice(magic);
    out[8..12].copy_from_slice(&h.pid.to_le_bytes());
    out[12..16].copy_from_slice(&h.fd.to_le_bytes());
    out[16..24].copy_from_slice(&h.id.to_le_bytes());
    out[24..32].copy_from_slice(&h.size.to_le_bytes());
    out[32..40].copy_from_slice(&h.mapped.to_le_bytes());
    out[40..44].copy_from_slice(&h.device.to_le_bytes());
    out
}

fn decode(magic: &[u8; 8], b: &[u8; 64]) -> Res<Handle> {
    if &b[..8] != magic {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    Ok(Handle {
        pid: u32_at(8),
        fd: u32_at(12) as i32,
        id: u64_at(16),
        size: u64_at(24),
        mapped: u64_at(32),
        device: u32_at(40),
    })
}

/// Opens another process's memfd `fd` read-write, checking it is the
/// file named `name`.
fn open_remote(pid: u32, fd: i32, name: &str) -> Res<i32> {
    let link = format!("/proc/{pid}/fd/{fd}");
    let target = std::fs::read_link(&link).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if !target.to_string_lossy().contains(&format!("memfd:{name} ")) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let c = std::ffi::CString::new(link).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
    // SAFETY: opens a path (NUL-terminated) with flags; no memory effects.
    let mine = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if mine < 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(mine)
}

/// `cuIpcGetMemHandle`: the handle of the allocation containing `ptr`.
pub fn get_mem_handle(ptr: u64) -> Res<[u8; 64]> {
    let r = memory::find(ptr).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let Kind::Device { memfd } = r.kind else {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    };
    Ok(encode(
        MEM_MAGIC,
        &Handle {
            pid: std::process::id(),
            fd: memfd,
            id: r.id,
            size: r.size,
            mapped: r.mapped,
            device: r.device as u32,
        },
    ))
}

/// `cuIpcOpenMemHandle`: the base of the whole allocation, mapped here.
pub fn open_mem_handle(context: u64, device: usize, b: &[u8; 64]) -> Res<u64> {
    let h = decode(MEM_MAGIC, b)?;
    if h.pid == std::process::id() {
        crate::trace_line(|| "cuIpcOpenMemHandle: the handle was exported by this process".into());
        return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
    }
    // Opened before: one more reference, the same address.
    if let Some(base) = memory::find_ipc(h.pid, h.id) {
        memory::update(base, |r| {
            if let Kind::Ipc { opens, .. } = &mut r.kind {
                *opens += 1;
            }
        })?;
        return Ok(base);
    }
    let fd = open_remote(h.pid, h.fd, &memory::memfd_name(h.id))?;
    let mapped = memory::map_fd(fd, h.mapped);
    // SAFETY: our own fd of the file; the mapping (if made) keeps it alive.
    unsafe { libc::close(fd) };
    let base = mapped?;
    memory::insert(Range {
        base,
        size: h.size,
        mapped: h.mapped,
        kind: Kind::Ipc {
            pid: h.pid,
            remote_id: h.id,
            opens: 1,
        },
        device: if (h.device as usize) < crate::config::get().devices {
            h.device as usize
        } else {
            device
        },
        context,
        id: memory::next_id(),
    });
    Ok(base)
}

/// `cuIpcCloseMemHandle`.
pub fn close_mem_handle(ptr: u64) -> Res<()> {
    let r = memory::find(ptr)
        .filter(|r| r.base == ptr)
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let Kind::Ipc { opens, .. } = r.kind else {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    };
    if opens > 1 {
        return memory::update(ptr, |r| {
            if let Kind::Ipc { opens, .. } = &mut r.kind {
                *opens -= 1;
            }
        });
    }
    let r = memory::remove_if(ptr, |r| matches!(r.kind, Kind::Ipc { .. }))?;
    memory::unmap(r.base, r.mapped);
    Ok(())
}

/// The shared state of an interprocess event: tickets handed out by
/// records and the highest ticket completed, in a memfd both processes map.
pub struct SharedEvent {
    words: *const AtomicU64,
    fd: i32,
    id: u64,
}

// SAFETY: the pointer is to a shared mapping that lives as long as the
// value; all access is atomic.
unsafe impl Send for SharedEvent {}
// SAFETY: as above.
unsafe impl Sync for SharedEvent {}

impl SharedEvent {
    /// A fresh shared event (this process exports it).
    pub fn create() -> Res<SharedEvent> {
        let id = memory::next_id();
        let name = std::ffi::CString::new(memory::memfd_name(id)).expect("no NUL");
        // SAFETY: memfd_create takes a NUL-terminated name and flags.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        }
        // SAFETY: our fresh memfd.
        if unsafe { libc::ftruncate(fd, 4096) } != 0 {
            // SAFETY: closing our fd.
            unsafe { libc::close(fd) };
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        }
        let base = memory::map_fd(fd, 4096)?;
        Ok(SharedEvent {
            words: base as *const AtomicU64,
            fd,
            id,
        })
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        // SAFETY: the mapping is 4096 bytes, page aligned, alive while
        // `self` is; words 0 and 1 are used.
        unsafe { &*self.words.add(i) }
    }

    /// A ticket for a new record.
    pub fn next_ticket(&self) -> u64 {
        self.word(0).fetch_add(1, Ordering::AcqRel) + 1
    }

    /// The record with `ticket` has run.
    pub fn complete(&self, ticket: u64) {
        self.word(1).fetch_max(ticket, Ordering::AcqRel);
        crate::activity::progress();
    }

    /// The highest completed ticket.
    pub fn completed(&self) -> u64 {
        self.word(1).load(Ordering::Acquire)
    }

    /// The last ticket handed out (what a wait issued now waits for).
    pub fn target(&self) -> u64 {
        self.word(0).load(Ordering::Acquire)
    }

    /// Whether every record so far has run.
    pub fn done(&self) -> bool {
        self.completed() >= self.target()
    }

    /// `cuIpcGetEventHandle`.
    pub fn handle(&self) -> [u8; 64] {
        encode(
            EVENT_MAGIC,
            &Handle {
                pid: std::process::id(),
                fd: self.fd,
                id: self.id,
                size: 4096,
                mapped: 4096,
                device: 0,
            },
        )
    }

    /// `cuIpcOpenEventHandle`: maps another process's event.
    pub fn open(b: &[u8; 64]) -> Res<SharedEvent> {
        let h = decode(EVENT_MAGIC, b)?;
        if h.pid == std::process::id() {
            return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
        }
        let fd = open_remote(h.pid, h.fd, &memory::memfd_name(h.id))?;
        let base = memory::map_fd(fd, 4096);
        let base = match base {
            Ok(b) => b,
            Err(e) => {
                // SAFETY: our own fd.
                unsafe { libc::close(fd) };
                return Err(e);
            }
        };
        Ok(SharedEvent {
            words: base as *const AtomicU64,
            fd,
            id: h.id,
        })
    }
}

impl Drop for SharedEvent {
    fn drop(&mut self) {
        memory::unmap(self.words as u64, 4096);
        // SAFETY: our own fd, closed once.
        unsafe { libc::close(self.fd) };
    }
}
