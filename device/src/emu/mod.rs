//! The emulated device (feature `emu`; a test double, never a product
//! backend).
//!
//! * Memory: every allocation is its own shared-memory mapping (so any of
//!   them can be exported), addressed by a fake [`DevicePtr`](crate::DevicePtr) space that
//!   crashes if dereferenced on the host; every access is bounds-checked
//!   against its allocation ([`DeviceError::InvalidArgument`], never UB).
//!   Pinned memory is ordinary aligned host memory.
//! * Streams: ordered queues, each run by its own worker thread.
//! * Kernels: the `.cu` kernels compiled for the host (`hostkernels`,
//!   `codecs`).
//! * IPC: the handle names the allocation's shared-memory file.
//! * Faults: [`Device::inject_fault`] makes the next enqueued operation fault
//!   the device; like a CUDA sticky error, every later call then fails with
//!   [`DeviceError::Fault`].
//!
//! Each [`open`] returns a new device object with its own allocations,
//! streams and events.

mod api;
pub mod codecs;
mod device;
pub mod hostkernels;
mod memory;
mod pointer;
mod shm;
mod stream;

use std::sync::Arc;

use crate::{Device, DeviceError, Result};

/// How many emulated devices there are.
pub const DEVICES: usize = 8;

/// Opens emulated device `ordinal` (below [`DEVICES`]): a new device object
/// with its own memory, streams and events.
pub fn open(ordinal: usize) -> Result<Arc<dyn Device>> {
    if ordinal >= DEVICES {
        return Err(DeviceError::InvalidArgument {
            ordinal,
            call: "open",
            detail: format!("the emulated backend has devices 0 to {}", DEVICES - 1),
        });
    }
    tracing::debug!(ordinal, "opened an emulated device");
    Ok(Arc::new(device::Emu::new(ordinal)))
}
