//! sncl extensions to the C ABI: tagged sends and receives, and receives
//! from any source (NCCL has neither; gloo and MPI have both). They run on
//! the NULL stream only (the call returns when the transfer is done), and
//! not inside a group; see `Communicator::send_tagged` for the matching
//! rules.

use std::ffi::{c_int, c_void};

use super::comm::snclComm_t;
use super::error::{guard, CError};
use super::exec;
use super::types::*;
use sncl_rs::DataType;

/// `snclRecvTagged`'s `peer` for "any rank" (sncl extension, as
/// `MPI_ANY_SOURCE`).
pub const SNCL_ANY_SOURCE: c_int = -1;

type R<T = ()> = Result<T, CError>;

/// Checks the arguments every tagged call shares; returns the
/// communicator and the message's byte count.
///
/// # Safety
/// `comm` is NULL or a live handle from this library.
unsafe fn common(
    comm: snclComm_t,
    stream: snclStream_t,
    buf: *const c_void,
    count: usize,
    datatype: snclDataTypeRaw,
    what: &str,
) -> R<(std::sync::Arc<super::comm::CommShared>, usize)> {
    if comm.is_null() {
        return Err(CError::invalid("comm is NULL"));
    }
    // SAFETY: per the contract above, a non-NULL `comm` points to a live
    // snclComm made by Box::into_raw.
    let shared = unsafe { &*comm }.shared.clone();
    if !stream.is_null() {
        return Err(CError::usage(format!(
            "{what} runs on the NULL stream only (sncl extension)"
        )));
    }
    if exec::in_group() {
        return Err(CError::usage(format!(
            "{what} cannot be part of a group (sncl extension; use snclSend / snclRecv there)"
        )));
    }
    let dt = u8::try_from(datatype)
        .ok()
        .and_then(DataType::from_u8)
        .ok_or_else(|| CError::invalid(format!("unknown datatype {datatype}")))?;
    let bytes = count
        .checked_mul(dt.size())
        .filter(|&b| b <= comm_core::shape::MAX_MESSAGE_BYTES)
        .ok_or_else(|| {
            CError::invalid(format!(
                "{what} of {count} elements is too large: one operation moves at most {} bytes",
                comm_core::shape::MAX_MESSAGE_BYTES
            ))
        })?;
    if bytes > 0 && buf.is_null() {
        return Err(CError::invalid(format!("{what}: the buffer is NULL")));
    }
    if let Some(d) = super::devmem::route(&[("the buffer", buf as *const u8)])? {
        return Err(CError::invalid(format!(
            "{what} takes host memory only (sncl extension); the buffer is memory of {}",
            d.label()
        )));
    }
    Ok((shared, bytes))
}

fn peer_arg(what: &str, peer: c_int, n: usize, any: bool) -> R<Option<usize>> {
    if any && peer == SNCL_ANY_SOURCE {
        return Ok(None);
    }
    usize::try_from(peer)
        .ok()
        .filter(|&p| p < n)
        .map(Some)
        .ok_or_else(|| CError::invalid(format!("{what} {peer} is out of range for {n} ranks")))
}

/// Sends `count` elements of `sendbuff` to rank `peer` as one message with
/// `tag` (sncl extension). The peer receives it with `snclRecvTagged` and
/// the same tag, naming this rank or `SNCL_ANY_SOURCE`; messages with
/// different tags never match each other, and messages with one tag are
/// received in the order they were sent. `stream` must be NULL: the call
/// returns once the message is handed over (it may wait for the receiver to
/// make room). A send to the rank itself completes at once.
///
/// # Safety
/// `sendbuff` holds `count` elements; `comm` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn snclSendTagged(
    sendbuff: *const c_void,
    count: usize,
    datatype: snclDataTypeRaw,
    peer: c_int,
    tag: c_int,
    comm: snclComm_t,
    stream: snclStream_t,
) -> snclResult_t {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let (shared, bytes) =
            unsafe { common(comm, stream, sendbuff, count, datatype, "snclSendTagged") }?;
        let r = (|| {
            let c = shared.get()?;
            let peer = peer_arg("peer", peer, c.size(), false)?.expect("not any");
            let data: &[u8] = if bytes == 0 {
                &[]
            } else {
                // SAFETY: the caller lends `count` elements (`bytes` bytes,
                // checked addressable and non-NULL above) until this returns.
                unsafe { std::slice::from_raw_parts(sendbuff as *const u8, bytes) }
            };
            let mut ticket = shared.ticket();
            ticket.wait_turn();
            c.send_tagged(data, peer, tag).map_err(CError::from)
        })();
        if let Err(e) = &r {
            shared.record(e);
        }
        r.map(|_| snclResult_t::snclSuccess)
    })
}

/// Receives one message with `tag` into `recvbuff` (`count` elements, the
/// message's exact size) from rank `peer`, or from any rank (this one
/// included) with `peer == SNCL_ANY_SOURCE`: the first message with that
/// tag to arrive. `*source` (when not NULL) receives the sender's rank.
/// `stream` must be NULL. No progress for the communicator's timeout is
/// `snclTimeout` (`snclGetLastError` starts "Timed out" and names the tag
/// and the ranks waited on); a message of another size is
/// `snclInvalidArgument`.
///
/// # Safety
/// `recvbuff` holds `count` elements; `source` is NULL or writable; `comm`
/// is a live handle.
#[no_mangle]
pub unsafe extern "C" fn snclRecvTagged(
    recvbuff: *mut c_void,
    count: usize,
    datatype: snclDataTypeRaw,
    peer: c_int,
    tag: c_int,
    comm: snclComm_t,
    stream: snclStream_t,
    source: *mut c_int,
) -> snclResult_t {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let (shared, bytes) =
            unsafe { common(comm, stream, recvbuff, count, datatype, "snclRecvTagged") }?;
        let r = (|| {
            let c = shared.get()?;
            let src = peer_arg("peer", peer, c.size(), true)?;
            let data: &mut [u8] = if bytes == 0 {
                &mut []
            } else {
                // SAFETY: the caller lends `count` elements (`bytes` bytes,
                // checked addressable and non-NULL above) until this returns.
                unsafe { std::slice::from_raw_parts_mut(recvbuff as *mut u8, bytes) }
            };
            let mut ticket = shared.ticket();
            ticket.wait_turn();
            let from = c.recv_tagged(data, src, tag).map_err(CError::from)?;
            drop(ticket);
            if !source.is_null() {
                // SAFETY: the caller passes NULL or a writable int.
                unsafe { *source = from as c_int };
            }
            Ok(())
        })();
        if let Err(e) = &r {
            shared.record(e);
        }
        r.map(|_| snclResult_t::snclSuccess)
    })
}
