//! Window registration (NCCL 2.27's `ncclCommWindowRegister` /
//! `ncclCommWindowDeregister`): device memory from `snclMemAlloc`
//! registered collectively as a device window of the communicator
//! (`Communicator::register_device_window`), so that `snclAllReduce` on
//! device pointers inside it — at the same offset on every rank — runs the
//! direct (nvlink version 2) kernel; anything else keeps version 1.
//!
//! A `snclWindow_t` is a token, never dereferenced: live windows are kept
//! by token (a [`RangeTable`]) and tokens are never reused, so a window deregistered twice, or
//! passed to another communicator, is an error rather than a use after
//! free.

use std::ffi::{c_int, c_void};

use ::device::DevicePtr;
use sncl_rs::device::DeviceWindow;

use super::args::comm_arg;
use super::args::OK;
use super::comm::snclComm_t;
use super::devmem;
use super::error::{guard, CError};
use super::ranges::RangeTable;
use super::types::*;

/// A registered window (opaque; `snclWindow_t` points to none: it is a
/// token).
pub struct snclWindow {
    _private: u8,
}

/// Handle to a registered window, like `ncclWindow_t`.
pub type snclWindow_t = *mut snclWindow;

/// `snclCommWindowRegister` flag: any offsets (as NCCL's
/// `NCCL_WIN_DEFAULT`); all-reduces run directly only where every rank's
/// buffers are at the same offsets anyway.
pub const SNCL_WIN_DEFAULT: c_int = 0x00;
/// `snclCommWindowRegister` flag: the caller keeps offsets equal on every
/// rank (as NCCL's `NCCL_WIN_COLL_SYMMETRIC`).
pub const SNCL_WIN_COLL_SYMMETRIC: c_int = 0x01;

/// The live windows.
static WINDOWS: RangeTable<DeviceWindow> = RangeTable::new();

/// The window whose registered range holds `addr` (its token).
pub(super) fn holding(addr: u64) -> Option<usize> {
    WINDOWS.holding(addr)
}

/// Registers `size` bytes at `buff` as a window of `comm` (collective:
/// every rank calls it with the same size, in the same order, as NCCL's
/// `ncclCommWindowRegister`) and writes its handle to `*win`. `buff` must
/// be the start of a `snclMemAlloc` allocation of at least `size` bytes
/// (device memory ready for IPC). `winFlags`: `SNCL_WIN_DEFAULT` or
/// `SNCL_WIN_COLL_SYMMETRIC`. `snclAllReduce` on device pointers inside the
/// window, at the same offset on every rank, then reads the peers' buffers
/// directly (one-shot or two-shot kernel); other operations are unchanged.
/// Size 0, a range not at the start of a `snclMemAlloc` allocation, or one
/// overlapping a registered window are `snclInvalidArgument` (before
/// anything collective happens). Deregister before `snclMemFree` and
/// before destroying the communicator.
///
/// # Safety
/// `comm` is a live handle; `win` points to writable storage for a handle.
#[no_mangle]
pub unsafe extern "C" fn snclCommWindowRegister(
    comm: snclComm_t,
    buff: *mut c_void,
    size: usize,
    win: *mut snclWindow_t,
    winFlags: c_int,
) -> snclResult_t {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let shared = unsafe { comm_arg(comm) }?;
        let r = (|| {
            if win.is_null() {
                return Err(CError::invalid("win is NULL"));
            }
            let c = shared.get()?;
            let rank = c.rank();
            let bad = |m: String| {
                Err(CError::invalid(format!(
                    "rank {rank}: snclCommWindowRegister: {m}"
                )))
            };
            if winFlags != SNCL_WIN_DEFAULT && winFlags != SNCL_WIN_COLL_SYMMETRIC {
                return bad(format!(
                    "unknown winFlags {winFlags:#x}; expected SNCL_WIN_DEFAULT (0) or \
                     SNCL_WIN_COLL_SYMMETRIC (1)"
                ));
            }
            if size == 0 {
                return bad("size is 0; a window holds 1 or more bytes".into());
            }
            if buff.is_null() {
                return bad("buff is NULL".into());
            }
            let addr = buff as u64;
            let Some(d) = devmem::route(&[("buff", buff as *const u8)])? else {
                return bad(format!(
                    "buff {buff:p} is host memory; windows are device memory from snclMemAlloc"
                ));
            };
            if let Some(t) = holding(addr).or_else(|| holding(addr + size as u64 - 1)) {
                return bad(format!(
                    "{size} bytes at {buff:p} overlap registered window {t:#x}"
                ));
            }
            match devmem::allocation_of(addr) {
                Some((start, bytes)) if start == addr && size <= bytes => {}
                Some((start, bytes)) => {
                    return bad(format!(
                        "{size} bytes at {buff:p} are not the start of a snclMemAlloc \
                         allocation holding them (the allocation is {bytes} bytes at {start:#x})"
                    ))
                }
                None => {
                    return bad(format!(
                        "buff {buff:p} is not memory of snclMemAlloc (windows need memory \
                         allocated for IPC)"
                    ))
                }
            }
            sncl_rs::binding::bind_or_check(c, "snclCommWindowRegister", "buff", &d.dev)
                .map_err(CError::from)?;
            // In the issue order of the C calls on this communicator.
            let mut ticket = shared.ticket();
            ticket.wait_turn();
            // SAFETY: a live snclMemAlloc allocation of the bound device
            // holding `size` bytes (checked above); snclMemFree refuses it
            // until it is deregistered.
            let window =
                unsafe { c.register_device_window(DevicePtr(addr), size) }.map_err(CError::from)?;
            drop(ticket);
            let t = WINDOWS.insert(&shared, addr, size, window);
            // SAFETY: checked non-NULL; the caller provides storage. The
            // handle is a token, never dereferenced.
            unsafe { win.write(t as snclWindow_t) };
            Ok(OK)
        })();
        shared.recorded(r)
    })
}

/// Deregisters a window of `comm` (collective, as NCCL's
/// `ncclCommWindowDeregister`: every rank calls it in the same order; no
/// rank releases its mappings before every rank has reached it). A handle
/// that is not a live window of `comm` (deregistered already, another
/// communicator's, NULL) is `snclInvalidArgument`.
///
/// # Safety
/// `comm` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn snclCommWindowDeregister(
    comm: snclComm_t,
    win: snclWindow_t,
) -> snclResult_t {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let shared = unsafe { comm_arg(comm) }?;
        let r = (|| {
            let c = shared.get()?;
            let Some(window) = WINDOWS.take(&shared, win as usize) else {
                return Err(CError::invalid(format!(
                    "rank {}: snclCommWindowDeregister: {win:p} is not a live window of this \
                     communicator (deregistered already, or another communicator's)",
                    c.rank()
                )));
            };
            let mut ticket = shared.ticket();
            ticket.wait_turn();
            window.close().map_err(CError::from)?;
            Ok(OK)
        })();
        shared.recorded(r)
    })
}

/// Writes how many all-reduces ran the direct (nvlink version 2) kernels
/// on this rank of `comm` so far, one-shot and two-shot (sncl extension;
/// tests and benchmarks see whether the window path was taken).
///
/// # Safety
/// `comm` is a live handle; `oneShot` and `twoShot` point to writable
/// storage.
#[no_mangle]
pub unsafe extern "C" fn snclCommDirectCount(
    comm: snclComm_t,
    oneShot: *mut u64,
    twoShot: *mut u64,
) -> snclResult_t {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let shared = unsafe { comm_arg(comm) }?;
        if oneShot.is_null() || twoShot.is_null() {
            return Err(CError::invalid("oneShot or twoShot is NULL"));
        }
        let n = shared.get()?.direct_all_reduces();
        // SAFETY: checked non-NULL; the caller provides storage.
        unsafe {
            oneShot.write(n.one_shot);
            twoShot.write(n.two_shot);
        }
        Ok(OK)
    })
}
