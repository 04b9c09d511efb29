//! `snclSend` / `snclRecv` on device memory: a device point-to-point group
//! of the communicator (`Communicator::send_recv_device_raw`) queued on the
//! caller's stream. Outside a group a call is a group of one. Between
//! `snclGroupStart` and `snclGroupEnd` the transfers are collected per
//! communicator and queued together at the outermost `snclGroupEnd`, so a
//! ring exchange's send and receive progress together, as NCCL's do (one
//! queued at a time would wait for its peer's, which waits for its own).

use std::cell::RefCell;
use std::sync::{Arc, Mutex};

use ::device::StreamHandle;
use sncl_rs::{Communicator, DeviceTransfer};

use super::comm::CommShared;
use super::devmem::R;
use super::error::CError;
use super::exec;

/// One communicator's device transfers of the open group.
struct Pending {
    comm: Arc<CommShared>,
    stream: StreamHandle,
    transfers: Vec<DeviceTransfer>,
}

/// The open group's transfers (`None` once `snclGroupEnd` queued them).
type Collected = Arc<Mutex<Option<Vec<Pending>>>>;

thread_local! {
    /// The collection of the group this thread has open, if it has
    /// collected a device transfer.
    static OPEN: RefCell<Option<Collected>> = const { RefCell::new(None) };
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Queues `transfer` on `stream` (a stream of the communicator's bound
/// device, checked by the caller): now outside a group, at the outermost
/// `snclGroupEnd` inside one.
pub(super) fn issue(
    shared: &Arc<CommShared>,
    c: &Communicator,
    stream: StreamHandle,
    transfer: DeviceTransfer,
) -> R {
    if !exec::in_group() {
        return enqueue(shared, c, stream, &[transfer]);
    }
    let collected = OPEN.with(|open| {
        let mut open = open.borrow_mut();
        match &*open {
            Some(c) if lock(c).is_some() => c.clone(),
            _ => {
                let fresh: Collected = Arc::new(Mutex::new(Some(Vec::new())));
                *open = Some(fresh.clone());
                let at_end = fresh.clone();
                exec::defer(Box::new(move || flush(&at_end)));
                fresh
            }
        }
    });
    let mut guard = lock(&collected);
    let pending = guard.get_or_insert_with(Vec::new);
    match pending.iter_mut().find(|p| Arc::ptr_eq(&p.comm, shared)) {
        Some(p) if p.stream != stream => Err(CError::invalid(format!(
            "rank {}: snclSend / snclRecv on device memory in one group go on one stream per \
             communicator: this one names stream {:#x}, an earlier one {:#x}",
            c.rank(),
            stream.0,
            p.stream.0
        ))),
        Some(p) => {
            p.transfers.push(transfer);
            Ok(())
        }
        None => {
            pending.push(Pending {
                comm: shared.clone(),
                stream,
                transfers: vec![transfer],
            });
            Ok(())
        }
    }
}

/// At the outermost `snclGroupEnd`: queues each communicator's transfers
/// as one group; the first error.
fn flush(collected: &Collected) -> Result<(), CError> {
    let pending = lock(collected).take().unwrap_or_default();
    let mut first = None;
    for p in pending {
        let r = p
            .comm
            .get()
            .and_then(|c| enqueue(&p.comm, c, p.stream, &p.transfers));
        if let Err(e) = r {
            p.comm.record(&e);
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

/// Queues one group in the communicator's issue order.
fn enqueue(
    shared: &Arc<CommShared>,
    c: &Communicator,
    stream: StreamHandle,
    transfers: &[DeviceTransfer],
) -> R {
    let mut ticket = shared.ticket();
    ticket.wait_turn();
    // SAFETY: the caller lends each buffer for its count until the group
    // completes on `stream` (snclSend / snclRecv's documented contract);
    // the communicator checks them against the bound device's memory.
    let work = unsafe { c.send_recv_device_raw(transfers, stream) }.map_err(CError::from)?;
    drop(ticket);
    shared.add_device_work(work);
    Ok(())
}
