//! The `extern "C"` functions of `sncl.h`: version, unique ids, errors.

use std::ffi::{c_char, c_int};
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::args::*;
use super::comm::snclComm_t;
use super::error::{self, guard, CError};
use super::types::*;
use super::uid;

/// Writes the version code, `SNCL_VERSION_CODE` of the library: the NCCL
/// version whose API sncl mirrors (major × 10000 + minor × 100 + patch);
/// sncl's own release is `SNCL_RELEASE`.
///
/// # Safety
/// `version` points to a writable int.
#[no_mangle]
pub unsafe extern "C" fn snclGetVersion(version: *mut c_int) -> snclResult_t {
    guard(|| {
        if version.is_null() {
            return Err(CError::invalid("version is NULL"));
        }
        // SAFETY: checked non-NULL; the caller provides a writable int.
        unsafe { version.write(SNCL_VERSION_CODE) };
        Ok(OK)
    })
}

/// Creates a unique id for a new communicator; call it on one rank and
/// pass the 128 bytes to every rank (as with `ncclGetUniqueId`).
///
/// Its root, where rank 0's rendezvous store will listen, is `SNCL_ROOT`
/// (`host:port`) when set. Otherwise it is a free port on this host's
/// address: that of interface `SNCL_SOCKET_IFNAME` when set, else the first
/// non-loopback IPv4 address (docker and virtual bridges skipped), else
/// 127.0.0.1; call it on the host where rank 0 will run.
///
/// The secret is random, except when `SNCL_ROOT` and `SNCL_SECRET` (32 hex
/// digits) are both set: then every process computes the same id, so each
/// rank of a launched job may call `snclGetUniqueId` itself instead of
/// receiving rank 0's.
///
/// # Safety
/// `uniqueId` points to a writable `snclUniqueId`.
#[no_mangle]
pub unsafe extern "C" fn snclGetUniqueId(uniqueId: *mut snclUniqueId) -> snclResult_t {
    guard(|| {
        if uniqueId.is_null() {
            return Err(CError::invalid("uniqueId is NULL"));
        }
        let id = snclUniqueId::from_id(&uid::new_unique_id()?);
        // SAFETY: checked non-NULL; the caller provides writable storage.
        unsafe { uniqueId.write(id) };
        Ok(OK)
    })
}

/// A static description of a result code.
#[no_mangle]
pub extern "C" fn snclGetErrorString(result: snclResultRaw) -> *const c_char {
    error::error_string(result).as_ptr()
}

/// The full text of the last error: `comm`'s last failure when `comm` is
/// not NULL and has one, else this thread's. The string stays valid until
/// this thread calls `snclGetLastError` again. Empty when there was none.
///
/// # Safety
/// `comm` is NULL or a live communicator handle.
#[no_mangle]
pub unsafe extern "C" fn snclGetLastError(comm: snclComm_t) -> *const c_char {
    let r = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: forwarded from the caller.
        let from_comm = unsafe { comm_arg(comm) }.ok().and_then(|c| c.last_error());
        let msg = from_comm.or_else(error::thread_last).unwrap_or_default();
        error::returned_c_str(&msg)
    }));
    r.unwrap_or_else(|_| c"internal error while reading the last error".as_ptr())
}
