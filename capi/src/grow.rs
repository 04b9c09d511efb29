//! `snclCommGetUniqueId` and `snclCommGrow` (NCCL 2.29's
//! `ncclCommGetUniqueId` and `ncclCommGrow`): a larger communicator of a
//! running one's members and new ranks (see `Communicator::grow`).

use std::ffi::c_int;

use super::args::*;
use super::comm::{snclComm_t, CommShared};
use super::error::{guard, CError};
use super::types::*;
use sncl_rs::Communicator;

/// Writes the grow id of `comm` to `uniqueId` (NCCL's
/// `ncclCommGetUniqueId`): rank 0 only. Pass it to the new ranks of a
/// grow out of band; it carries the communicator's secret.
///
/// # Safety
/// `comm` is a live handle; `uniqueId` points to a writable
/// `snclUniqueId`.
#[no_mangle]
pub unsafe extern "C" fn snclCommGetUniqueId(
    comm: snclComm_t,
    uniqueId: *mut snclUniqueId,
) -> snclResult_t {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let shared = unsafe { comm_arg(comm) }?;
        if uniqueId.is_null() {
            return Err(CError::invalid("uniqueId is NULL"));
        }
        let id = snclUniqueId::from_id(&shared.get()?.grow_unique_id()?);
        // SAFETY: checked non-NULL; the caller provides writable storage.
        unsafe { uniqueId.write(id) };
        Ok(snclResult_t::snclSuccess)
    })
}

/// Creates `newcomm`, a communicator of `nRanks` ranks: the ranks of
/// `comm` and new ones (NCCL's `ncclCommGrow`). A member passes its
/// `comm` and `rank = -1` and keeps its rank (`uniqueId` may be NULL; its
/// rank 0 may pass the id it handed out). A new rank passes `comm = NULL`,
/// the id rank 0 got from `snclCommGetUniqueId` and its `rank`, from
/// `comm`'s size up. Completes before it returns; of `config` (may be
/// NULL) a member reads only `blocking`, for the new handle, and a new
/// rank reads it as `snclCommInitRankConfig` does. `comm` stays valid
/// (destroy it separately), but cannot grow or shrink again.
///
/// # Safety
/// `comm` is NULL or a live handle; `uniqueId` is NULL or points to a
/// `snclUniqueId`; `newcomm` points to writable storage for a handle;
/// `config` is NULL or an initialized `snclConfig_t`.
#[no_mangle]
pub unsafe extern "C" fn snclCommGrow(
    comm: snclComm_t,
    nRanks: c_int,
    uniqueId: *const snclUniqueId,
    rank: c_int,
    newcomm: *mut snclComm_t,
    config: *mut snclConfig_t,
) -> snclResult_t {
    guard(|| {
        if newcomm.is_null() {
            return Err(CError::invalid("newcomm is NULL"));
        }
        let n = world_arg("nRanks", nRanks)?;
        let id = if uniqueId.is_null() {
            None
        } else {
            // SAFETY: checked non-NULL; the caller's id, valid for this call.
            Some(unsafe { &*uniqueId }.id()?)
        };
        // SAFETY: forwarded from the caller.
        let opts = unsafe { config_arg(config) }?;
        let shared = if comm.is_null() {
            let id = id.ok_or_else(|| {
                CError::invalid("a new rank (comm NULL) needs the grow's uniqueId")
            })?;
            let r = rank_arg("rank", rank, n)?;
            let blocking = opts.blocking.unwrap_or(true);
            let child = Communicator::join_grow(&id, r, n, env_config(&opts)?)?;
            CommShared::ready(child, blocking, Some(id.root))
        } else {
            if rank != -1 {
                return Err(CError::invalid(format!(
                    "rank {rank} with a communicator: a member keeps its rank (pass -1)"
                )));
            }
            // SAFETY: forwarded from the caller.
            let parent = unsafe { comm_arg(comm) }?;
            let c = parent.get()?;
            if let Some(id) = id {
                if c.rank() == 0 && c.grow_unique_id()? != id {
                    return Err(CError::invalid(
                        "uniqueId is not this communicator's grow id (snclCommGetUniqueId)",
                    ));
                }
            }
            let blocking = opts.blocking.unwrap_or(parent.blocking);
            let mut ticket = parent.ticket();
            ticket.wait_turn();
            // Not recorded as the parent's error: a failed grow leaves the
            // parent usable (unlike a failed shrink's parent).
            let child = c.grow(n)?;
            drop(ticket);
            CommShared::ready(child, blocking, parent.route.get().copied())
        };
        // SAFETY: checked non-NULL; the caller provides storage.
        unsafe { write_handle(newcomm, shared) };
        Ok(snclResult_t::snclSuccess)
    })
}
