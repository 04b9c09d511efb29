//! The device path of the C operations: an operation whose buffers are
//! device memory runs as a device collective of the communicator (bound to
//! the buffers' device on first use, as the Rust typed API binds), queued
//! on the caller's stream; the call returns once it is queued.

use std::sync::Arc;

use ::device::{DevicePtr, StreamHandle};

use super::comm::CommShared;
use super::devmem::{self, Dev, StreamArg, R};
use super::error::CError;
use super::exec::{self, Item};
use sncl_rs::Communicator;
use sncl_rs::{DeviceOp, DeviceTransfer};

/// The buffers of an item, named for errors.
pub(super) fn buffers(item: &Item) -> Vec<(&'static str, *const u8)> {
    match item {
        Item::Coll(c) => vec![
            ("sendbuff", c.raw.send),
            ("recvbuff", c.raw.recv as *const u8),
        ],
        Item::P2p { is_send, ptr, .. } => {
            let what = if *is_send { "sendbuff" } else { "recvbuff" };
            vec![(what, *ptr as *const u8)]
        }
    }
}

/// Issues a validated item on the path its buffers call for.
pub(super) fn issue(
    shared: &Arc<CommShared>,
    c: &Communicator,
    stream: StreamArg,
    item: Item,
) -> R {
    let dev = devmem::route(&buffers(&item))?;
    match (dev, stream) {
        (None, StreamArg::Null) => exec::issue(shared.clone(), None, item),
        (None, StreamArg::Host(s)) => exec::issue(shared.clone(), Some(s), item),
        (None, StreamArg::Device(h)) => {
            if buffers(&item).iter().all(|(_, p)| p.is_null()) {
                // Nothing to read or write: run it as with NULL.
                return exec::issue(shared.clone(), None, item);
            }
            let why = match devmem::unavailable() {
                Some(e) => format!("; no device backend is available ({e})"),
                None => String::new(),
            };
            Err(CError::invalid(format!(
                "rank {}: stream {:#x} is not a host stream of snclStreamCreate, so it is taken \
                 for a CUDA stream, but the buffers are host memory: pass NULL or a \
                 snclStreamCreate stream with host buffers, a CUDA stream with device \
                 buffers{why}",
                c.rank(),
                h.0
            )))
        }
        (Some(d), StreamArg::Host(_)) => Err(CError::usage(format!(
            "rank {}: the buffers are memory of {}, but the stream is a host stream of \
             snclStreamCreate; device buffers run on a CUDA stream (or NULL, the default stream)",
            c.rank(),
            d.label()
        ))),
        (Some(d), StreamArg::Null) => {
            let s = d.default_stream;
            run(shared, c, &d, s, item)
        }
        (Some(d), StreamArg::Device(h)) => run(shared, c, &d, h, item),
    }
}

/// Queues `item` on `stream` of device `d`.
fn run(shared: &Arc<CommShared>, c: &Communicator, d: &Dev, stream: StreamHandle, item: Item) -> R {
    let rank = c.rank();
    let name = match &item {
        Item::P2p { is_send: true, .. } => "snclSend",
        Item::P2p { .. } => "snclRecv",
        Item::Coll(coll) => coll.raw.coll.name(),
    };
    let (o, stream) = devmem::resolve_stream(stream, Some(d.dev.ordinal()))?;
    if o != d.dev.ordinal() {
        return Err(CError::invalid(format!(
            "rank {rank}: {name}: the stream was made on device {o} by snclDeviceStreamCreate, \
             but the buffers are memory of {}",
            d.label()
        )));
    }
    if let Err(e) = d.dev.is_capturing(stream) {
        return Err(CError::invalid(format!(
            "rank {rank}: {name}: stream {:#x} is not a stream of {}, where the buffers are: {e}",
            stream.0,
            d.label()
        )));
    }
    let coll = match item {
        Item::P2p {
            peer,
            is_send,
            ptr,
            count,
            dtype,
        } => {
            sncl_rs::binding::bind_or_check(c, "sendrecv", "the buffer", &d.dev)
                .map_err(CError::from)?;
            let transfer = DeviceTransfer {
                peer,
                is_send,
                ptr: DevicePtr(ptr as u64),
                count,
                dtype,
            };
            return super::devp2p::issue(shared, c, stream, transfer);
        }
        Item::Coll(coll) => coll,
    };
    let raw = &coll.raw;
    let unsupported = |what: &str| {
        Err(CError::invalid(format!(
            "rank {rank}: {name} on device memory: {what} is not supported on device buffers"
        )))
    };
    if coll.compress.is_some() {
        return unsupported("compression (snclAllReduceCompressed)");
    }
    if coll.premul.is_some() {
        return unsupported("a snclRedOpCreatePreMulSum operator");
    }
    if raw.v.is_none() && !sncl_rs::binding::runs_on_device(raw.coll) {
        return unsupported("this collective");
    }
    sncl_rs::binding::bind_or_check(c, name, "the buffers", &d.dev).map_err(CError::from)?;
    let mut op = DeviceOp::new(
        raw.coll,
        raw.dtype,
        raw.count,
        DevicePtr(raw.send as u64),
        DevicePtr(raw.recv as u64),
        stream,
    );
    op.op = raw.op;
    op.root = raw.root;
    op.config = raw.config;
    // Its place in the communicator's issue order: after the operations
    // issued before it have run (host operations on host streams included).
    let mut ticket = shared.ticket();
    ticket.wait_turn();
    // SAFETY: the caller lends the device buffers for NCCL's extents until
    // the operation completes on `stream` (the documented contract of the
    // C operations); they are live memory of the bound device (checked
    // above by their kind).
    let work = match raw.v.as_deref() {
        // Variable counts (all_gatherv, alltoallv): a point-to-point group.
        // SAFETY: as above, for the extents the counts give.
        Some(v) => unsafe {
            c.enqueue_device_v((raw.coll, raw.dtype), (op.send, op.recv), v.clone(), stream)
        },
        // SAFETY: as above.
        None => unsafe { c.enqueue_device(op) },
    }
    .map_err(CError::from)?;
    drop(ticket);
    shared.add_device_work(work);
    Ok(())
}
