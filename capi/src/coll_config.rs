//! The collectives that take per-call settings (`snclAllReduceConfig`,
//! ...; the settings: `snclCollConfig_t`, NCCL 2.31's `ncclCollConfig_t`
//! where its fields mean something on sncl).

use std::ffi::{c_int, c_void};

use super::coll::Plain;
use super::comm::snclComm_t;
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
