//! The `extern "C"` point-to-point and group functions of `sncl.h`.

use std::ffi::{c_int, c_void};

use super::args::*;
use super::coll::issue;
use super::comm::snclComm_t;
use super::error::guard;
use super::exec::{self, Item};
use super::types::*;
use sncl_rs::Communicator;

fn p2p(
    c: &Communicator,
    peer: c_int,
    count: usize,
    datatype: snclDataTypeRaw,
    ptr: *mut c_void,
    is_send: bool,
) -> R<Item> {
    let dt = dtype_arg(datatype)?;
    let peer = rank_arg("peer", peer, c.size())?;
    span("count", count, 1, dt)?;
    Ok(Item::P2p {
        peer,
        is_send,
        ptr: ptr as usize,
        count,
        dtype: dt,
    })
}

/// Sends `count` elements of `sendbuff` to rank `peer`, which receives them
/// with `snclRecv` (same count and type). Sends and receives that must
/// progress together (a ring exchange) go inside one group. A rank may send
/// to itself within a group that also receives from itself (the k-th send
/// to self feeds the k-th receive from self, same size); a send to self
/// without that receive is `snclInvalidArgument` (in NCCL it would hang).
///
/// # Safety
/// As `snclAllReduce`.
#[no_mangle]
pub unsafe extern "C" fn snclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: snclDataTypeRaw,
    peer: c_int,
    comm: snclComm_t,
    stream: snclStream_t,
) -> snclResult_t {
    // SAFETY: forwarded from the caller.
    unsafe {
        issue(comm, stream, |c, _| {
            p2p(c, peer, count, datatype, sendbuff as *mut c_void, true)
        })
    }
}

/// Receives `count` elements from rank `peer` into `recvbuff`.
///
/// # Safety
/// As `snclAllReduce`.
#[no_mangle]
pub unsafe extern "C" fn snclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: snclDataTypeRaw,
    peer: c_int,
    comm: snclComm_t,
    stream: snclStream_t,
) -> snclResult_t {
    // SAFETY: forwarded from the caller.
    unsafe {
        issue(comm, stream, |c, _| {
            p2p(c, peer, count, datatype, recvbuff, false)
        })
    }
}

/// Starts a group (groups nest): operations issued by this thread until the
/// matching `snclGroupEnd` are collected and run together there, as are
/// communicator creations and splits.
#[no_mangle]
pub extern "C" fn snclGroupStart() -> snclResult_t {
    guard(|| {
        exec::group_start();
        Ok(OK)
    })
}

/// Ends a group. At the outermost level: creates the communicators the
/// group started (concurrently), then runs its operations, per
/// communicator in issue order with all sends and receives progressing
/// together, different communicators concurrently. Operations on a NULL
/// stream have completed when it returns; those on a stream run there.
#[no_mangle]
pub extern "C" fn snclGroupEnd() -> snclResult_t {
    guard(|| exec::group_end().map(|_| OK))
}
