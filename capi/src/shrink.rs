//! `snclCommShrink` (NCCL 2.27's `ncclCommShrink`): a communicator of the
//! survivors after a rank failed.

use std::ffi::c_int;

use super::args::*;
use super::comm::{snclComm_t, CommShared};
use super::error::{guard, CError};
use super::types::*;

/// `shrinkFlags` of `snclCommShrink`: the parent must have no operation
/// pending (they are waited for first).
pub const SNCL_SHRINK_DEFAULT: c_int = 0;
/// `shrinkFlags` of `snclCommShrink`: abort the parent first, so that
/// operations pending on it (stuck on the failed ranks) fail at once.
pub const SNCL_SHRINK_ABORT: c_int = 1;

/// Creates `newcomm` from the ranks of `comm` not listed in
/// `excludeRanksList` (NCCL's `ncclCommShrink`): every surviving rank calls
/// it with the same list and gets its rank among the survivors, in their
/// order in `comm`. Works after a failure, also when rank 0 (the store's
/// host) is excluded: the lowest survivor serves the new communicator's
/// rendezvous store (see `Communicator::shrink`). `shrinkFlags` is
/// `SNCL_SHRINK_DEFAULT` (waits for operations issued on `comm`) or
/// `SNCL_SHRINK_ABORT` (aborts `comm` first). The new communicator has
/// `comm`'s settings; of `config` (may be NULL) only `blocking` is read,
/// for the new handle, and the call completes before it returns either way. `comm` stays valid (destroy or abort it separately).
///
/// # Safety
/// `comm` is a live handle; `excludeRanksList` points to
/// `excludeRanksCount` ints (may be NULL when the count is 0); `newcomm`
/// points to writable storage for a handle; `config` is NULL or an
/// initialized `snclConfig_t`.
#[no_mangle]
pub unsafe extern "C" fn snclCommShrink(
    comm: snclComm_t,
    excludeRanksList: *mut c_int,
    excludeRanksCount: c_int,
    newcomm: *mut snclComm_t,
    config: *mut snclConfig_t,
    shrinkFlags: c_int,
) -> snclResult_t {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let parent = unsafe { comm_arg(comm) }?;
        if newcomm.is_null() {
            return Err(CError::invalid("newcomm is NULL"));
        }
        if shrinkFlags != SNCL_SHRINK_DEFAULT && shrinkFlags != SNCL_SHRINK_ABORT {
            return Err(CError::invalid(format!(
                "shrinkFlags {shrinkFlags} is neither SNCL_SHRINK_DEFAULT (0) nor \
                 SNCL_SHRINK_ABORT (1)"
            )));
        }
        let count = usize::try_from(excludeRanksCount).map_err(|_| {
            CError::invalid(format!("excludeRanksCount {excludeRanksCount} is negative"))
        })?;
        if count > 0 && excludeRanksList.is_null() {
            return Err(CError::invalid(format!(
                "excludeRanksList is NULL with excludeRanksCount {count}"
            )));
        }
        let list: &[c_int] = if count == 0 {
            &[]
        } else {
            // SAFETY: the caller provides `count` ints at the (non-NULL)
            // pointer, valid for this call.
            unsafe { std::slice::from_raw_parts(excludeRanksList, count) }
        };
        let exclude = list
            .iter()
            .map(|&r| {
                usize::try_from(r)
                    .map_err(|_| CError::invalid(format!("excluded rank {r} is negative")))
            })
            .collect::<Result<Vec<usize>, CError>>()?;
        // SAFETY: forwarded from the caller.
        let opts = unsafe { config_arg(config) }?;
        let blocking = opts.blocking.unwrap_or(parent.blocking);
        let c = parent.get()?;
        let mut ticket = parent.ticket();
        if shrinkFlags == SNCL_SHRINK_ABORT {
            c.abort();
        }
        ticket.wait_turn();
        let child = c.shrink(&exclude).map_err(|e| {
            let e = CError::from(e);
            parent.record(&e);
            e
        })?;
        drop(ticket);
        let route = parent.route.get().copied();
        // SAFETY: checked non-NULL; the caller provides storage.
        unsafe { write_handle(newcomm, CommShared::ready(child, blocking, route)) };
        Ok(snclResult_t::snclSuccess)
    })
}
