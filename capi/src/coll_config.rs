//! The collectives that take per-call settings (`snclAllReduceConfig`,
//! ...; the settings: `snclCollConfig_t`, NCCL 2.31's `ncclCollConfig_t`
//! where its fields mean something on sncl), and the tags they carry:
//! `snclTagOfName`, the calling thread's tag (`snclSetThreadTag`).

use std::ffi::{c_char, c_int, c_void, CStr};

use super::args::OK;
use super::coll::Plain;
use super::comm::snclComm_t;
use super::error::{guard, CError};
use super::types::*;
use sncl_rs::Collective;

/// `snclAllReduce` with the call's settings `config` (NULL: none).
///
/// # Safety
/// As `snclAllReduce`; `config` is NULL or an initialized
/// `snclCollConfig_t` (read before the call returns).
#[no_mangle]
pub unsafe extern "C" fn snclAllReduceConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: snclDataTypeRaw,
    op: snclRedOpRaw,
    comm: snclComm_t,
    stream: snclStream_t,
    config: *const snclCollConfig_t,
) -> snclResult_t {
    let plain = Plain::new(Collective::AllReduce, count, datatype)
        .op(op)
        .config(config);
    // SAFETY: forwarded from the caller.
    unsafe { plain.issue(sendbuff, recvbuff, comm, stream) }
}

/// `snclBroadcast` with the call's settings `config` (NULL: none).
///
/// # Safety
/// As `snclAllReduceConfig`.
#[no_mangle]
pub unsafe extern "C" fn snclBroadcastConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: snclDataTypeRaw,
    root: c_int,
    comm: snclComm_t,
    stream: snclStream_t,
    config: *const snclCollConfig_t,
) -> snclResult_t {
    let plain = Plain::new(Collective::Broadcast, count, datatype)
        .root(root)
        .config(config);
    // SAFETY: forwarded from the caller.
    unsafe { plain.issue(sendbuff, recvbuff, comm, stream) }
}

/// `snclReduce` with the call's settings `config` (NULL: none).
///
/// # Safety
/// As `snclAllReduceConfig`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn snclReduceConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: snclDataTypeRaw,
    op: snclRedOpRaw,
    root: c_int,
    comm: snclComm_t,
    stream: snclStream_t,
    config: *const snclCollConfig_t,
) -> snclResult_t {
    let plain = Plain::new(Collective::Reduce, count, datatype)
        .op(op)
        .root(root)
        .config(config);
    // SAFETY: forwarded from the caller.
    unsafe { plain.issue(sendbuff, recvbuff, comm, stream) }
}

/// `snclAllGather` with the call's settings `config` (NULL: none).
///
/// # Safety
/// As `snclAllReduceConfig`.
#[no_mangle]
pub unsafe extern "C" fn snclAllGatherConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: snclDataTypeRaw,
    comm: snclComm_t,
    stream: snclStream_t,
    config: *const snclCollConfig_t,
) -> snclResult_t {
    let plain = Plain::new(Collective::AllGather, sendcount, datatype).config(config);
    // SAFETY: forwarded from the caller.
    unsafe { plain.issue(sendbuff, recvbuff, comm, stream) }
}

/// `snclReduceScatter` with the call's settings `config` (NULL: none).
///
/// # Safety
/// As `snclAllReduceConfig`.
#[no_mangle]
pub unsafe extern "C" fn snclReduceScatterConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: snclDataTypeRaw,
    op: snclRedOpRaw,
    comm: snclComm_t,
    stream: snclStream_t,
    config: *const snclCollConfig_t,
) -> snclResult_t {
    let plain = Plain::new(Collective::ReduceScatter, recvcount, datatype)
        .op(op)
        .config(config);
    // SAFETY: forwarded from the caller.
    unsafe { plain.issue(sendbuff, recvbuff, comm, stream) }
}

/// `snclAlltoAll` with the call's settings `config` (NULL: none).
///
/// # Safety
/// As `snclAllReduceConfig`.
#[no_mangle]
pub unsafe extern "C" fn snclAlltoAllConfig(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: snclDataTypeRaw,
    comm: snclComm_t,
    stream: snclStream_t,
    config: *const snclCollConfig_t,
) -> snclResult_t {
    let plain = Plain::new(Collective::AllToAll, count, datatype).config(config);
    // SAFETY: forwarded from the caller.
    unsafe { plain.issue(sendbuff, recvbuff, comm, stream) }
}

/// Writes the tag of `name` into `*tag`: a stable 64-bit hash of the name
/// (never 0, the same in every process), remembered so the flight recorder,
/// `commbench trace` and the statistics print the name (a profiler's scope
/// name as a `snclCollConfig_t.userTag`).
///
/// # Safety
/// `name` is a NUL-terminated string; `tag` points to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn snclTagOfName(name: *const c_char, tag: *mut u64) -> snclResult_t {
    guard(|| {
        if tag.is_null() {
            return Err(CError::invalid("tag is NULL"));
        }
        if name.is_null() {
            return Err(CError::invalid("name is NULL"));
        }
        // SAFETY: checked non-NULL; the caller passes a NUL-terminated string.
        let name = unsafe { CStr::from_ptr(name) }
            .to_str()
            .map_err(|_| CError::invalid("the tag's name is not UTF-8"))?;
        // SAFETY: checked non-NULL; the caller provides a writable uint64_t.
        unsafe { tag.write(sncl_rs::tags::tag_of(name)) };
        Ok(OK)
    })
}

/// Sets the calling thread's tag (0: none), which the collectives this
/// thread issues without a `userTag` of their own carry (as an NVTX range
/// marks what runs inside it); the tag it replaces goes to `*previous`
/// unless `previous` is NULL.
///
/// # Safety
/// `previous` is NULL or points to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn snclSetThreadTag(tag: u64, previous: *mut u64) -> snclResult_t {
    guard(|| {
        let old = sncl_rs::tags::set_thread_tag(tag);
        if !previous.is_null() {
            // SAFETY: checked non-NULL; the caller provides a writable uint64_t.
            unsafe { previous.write(old) };
        }
        Ok(OK)
    })
}

/// Writes the calling thread's tag (`snclSetThreadTag`; 0: none) into
/// `*tag`.
///
/// # Safety
/// `tag` points to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn snclGetThreadTag(tag: *mut u64) -> snclResult_t {
    guard(|| {
        if tag.is_null() {
            return Err(CError::invalid("tag is NULL"));
        }
        // SAFETY: checked non-NULL; the caller provides a writable uint64_t.
        unsafe { tag.write(sncl_rs::tags::thread_tag()) };
        Ok(OK)
    })
}
