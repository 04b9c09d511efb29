//! Buffer registration (NCCL's `ncclCommRegister` / `ncclCommDeregister`):
//! a local, non-collective call that tells the communicator a buffer will
//! be used in its operations.
//!
//! In NCCL registration is a hint: operations on unregistered buffers are
//! correct, and a transport that cannot use a registration ignores it. In
//! sncl today no transport reads registered buffers in place (the device
//! path copies through its staging, the host transports copy through their
//! own buffers), so operations on a registered buffer run exactly as on any
//! other. What registration does do: it checks the range once (live memory
//! of one kind, on the communicator's device where it is device memory),
//! it keeps a `snclMemAlloc` allocation from being freed while registered
//! (`snclMemFree` refuses it, as NCCL requires deregistration before the
//! free), and it checks every handle given back (deregistering twice, or
//! on another communicator, is an error rather than a silent no-op).
//! `snclCommDestroy` and `snclCommAbort` release what is still registered,
//! as NCCL does.
//!
//! A handle is a token of [`RangeTable`], never dereferenced, never reused.

use std::ffi::c_void;
use std::sync::Arc;

use super::args::comm_arg;
use super::args::OK;
use super::comm::{snclComm_t, CommShared};
use super::devmem;
use super::error::{guard, CError};
use super::ranges::RangeTable;
use super::types::*;

/// The live registrations (their value: nothing beyond the range).
static REGISTRATIONS: RangeTable<()> = RangeTable::new();

/// A registration whose range holds `addr` (its token).
pub(super) fn holding(addr: u64) -> Option<usize> {
    REGISTRATIONS.holding(addr)
}

/// Releases every registration of the communicator `shared` (destroy and
/// abort); returns how many there were.
pub(super) fn release_all(shared: &Arc<CommShared>) -> usize {
    REGISTRATIONS.release_all(shared)
}

/// Registers `size` bytes at `buff` for operations of `comm` and writes a
/// handle to `*handle` (local, not collective, as NCCL's
/// `ncclCommRegister`). `buff` is host memory or live device memory of the
/// communicator's device (the one its device operations run on; a
/// communicator with no device operation yet binds to it). Registrations
/// may overlap. A registered `snclMemAlloc` allocation cannot be freed
/// before `snclCommDeregister`. Operations on registered buffers run as on
/// any buffer: no sncl transport reads them in place yet (see the crate
/// documentation). NULL `buff` or `handle`, or size 0, are
/// `snclInvalidArgument`.
///
/// # Safety
/// `comm` is a live handle; `handle` points to writable storage for a
/// pointer.
#[no_mangle]
pub unsafe extern "C" fn snclCommRegister(
    comm: snclComm_t,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> snclResult_t {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let shared = unsafe { comm_arg(comm) }?;
        let r = (|| {
            let c = shared.get()?;
            let rank = c.rank();
            let bad = |m: String| {
                Err(CError::invalid(format!(
                    "rank {rank}: snclCommRegister: {m}"
                )))
            };
            if handle.is_null() {
                return bad("handle is NULL".into());
            }
            if buff.is_null() {
                return bad("buff is NULL".into());
            }
            if size == 0 {
                return bad("size is 0; a registration holds 1 or more bytes".into());
            }
            let start = buff as u64;
            let Some(last) = start.checked_add(size as u64 - 1) else {
                return bad(format!(
                    "{size} bytes at {buff:p} run past the address space"
                ));
            };
            let first_kind = devmem::route(&[("buff", buff as *const u8)])?;
            // A snclMemAlloc allocation holding the start must hold the
            // end (checked first: past its end the backend may answer
            // anything).
            if let Some((s, bytes)) = devmem::allocation_of(start) {
                if last - s >= bytes as u64 {
                    return bad(format!(
                        "{size} bytes at {buff:p} run past the snclMemAlloc allocation \
                         holding them ({bytes} bytes at {s:#x})"
                    ));
                }
            }
            let last_kind = devmem::route(&[("the last byte of buff", last as *const u8)])?;
            match (&first_kind, &last_kind) {
                (None, None) => {}
                (Some(a), Some(b)) if Arc::ptr_eq(a, b) => {
                    sncl_rs::binding::bind_or_check(c, "snclCommRegister", "buff", &a.dev)
                        .map_err(CError::from)?;
                }
                _ => {
                    return bad(format!(
                        "{size} bytes at {buff:p} are not one kind of memory (the first and \
                         the last byte are in different places); register one allocation"
                    ))
                }
            }
            let t = REGISTRATIONS.insert(&shared, start, size, ());
            tracing::debug!(
                rank,
                bytes = size,
                device = first_kind.is_some(),
                "snclCommRegister"
            );
            // SAFETY: checked non-NULL; the caller provides storage. The
            // handle is a token, never dereferenced.
            unsafe { handle.write(t as *mut c_void) };
            Ok(OK)
        })();
        shared.recorded(r)
    })
}

/// Releases a registration of `comm` made by `snclCommRegister` (local, as
/// NCCL's `ncclCommDeregister`). A handle that is not a live registration
/// of `comm` (released already, another communicator's, NULL) is
/// `snclInvalidArgument`.
///
/// # Safety
/// `comm` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn snclCommDeregister(comm: snclComm_t, handle: *mut c_void) -> snclResult_t {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let shared = unsafe { comm_arg(comm) }?;
        let r = (|| {
            let c = shared.get()?;
            if REGISTRATIONS.take(&shared, handle as usize).is_some() {
                return Ok(OK);
            }
            Err(CError::invalid(format!(
                "rank {}: snclCommDeregister: {handle:p} is not a live registration of this \
                 communicator (deregistered already, another communicator's, or not from \
                 snclCommRegister)",
                c.rank()
            )))
        })();
        shared.recorded(r)
    })
}
