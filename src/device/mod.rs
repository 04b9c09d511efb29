//! The device path of the runtime: collectives on device memory.
//!
//! A communicator binds to one device ([`crate::Communicator::bind_device`]).
//! A device collective is checked on the caller's thread, then queued on the
//! communicator's progress thread like a non-blocking host operation, and
//! returns at once with a work handle. Stream semantics (as NCCL's):
//!
//! * at enqueue an event is recorded on the caller's stream; the progress
//!   thread waits for it (polling, with the communicator's timeout as the
//!   deadline) before the operation touches the buffers, so the operation
//!   sees the work already on that stream;
//! * also at enqueue, a [`Device::stream_wait_u32`] on a flag in pinned
//!   host memory is put on the caller's stream, so the stream does not run
//!   past the collective until the progress thread writes the flag: after
//!   the result is on the device, or after a failure was marked (so a
//!   stream never hangs on a failed operation).
//!
//! Point-to-point groups on device memory (`p2p.rs`,
//! [`crate::Communicator::send_recv_device_raw`] and
//! [`crate::Communicator::group`] over device views), and all_gatherv and
//! alltoallv as such groups ([`crate::Communicator::enqueue_device_v`]),
//! take the same host-driven path, in segments through the staging.
//!
//! Small all-reduces take the kernel path instead (`window/lane.rs`): kernels
//! on the caller's stream with no host-released wait, capturable into CUDA
//! graphs; the progress thread only watches them.
//!
//! Nothing inside an operation allocates, frees, loads a module or opens
//! an IPC mapping (each may synchronise the device, which deadlocks while
//! a caller's stream waits on the host): binding loads every kernel and
//! allocates the staging (`SNCL_DEVICE_STAGING_BYTES` per buffer; larger
//! operations run in segments, `segment.rs`), and a rank's first device
//! collective publishes and maps the device links' inboxes around a host
//! barrier, on the caller's thread.
//!
//! The binding (device, internal stream, flag, staging) and the executor's
//! memory over device buffers, `DeviceMemory`, which keeps the data on the
//! device (the host never dereferences a [`DevicePtr`]), are in
//! `sncl_runtime::device`.
//!
//! The device layer's types are re-exported here: `sncl::device::open`,
//! `sncl::device::DeviceBuffer`, ...

pub use crate::buffer::{DeviceSlice, DeviceSliceMut};
pub use ::device::{
    current_device, device_count, open, Arch, Backend, Device, DeviceBuffer, DeviceError,
    DevicePtr, EventHandle, PinnedBuffer, StreamHandle,
};

mod api;
#[cfg(feature = "cuda")]
mod cudarc_slices;
mod host_records;
mod job;
mod lane_enqueue;
mod offer;
mod p2p;
mod window;

pub use api::DeviceOp;
pub(crate) use offer::Attachment;
pub use p2p::DeviceTransfer;
pub use sncl_runtime::device::binding::DirectCounts;
pub(crate) use sncl_runtime::device::errors::device_error;
pub(crate) use window::WindowCore;
pub use window::{DeviceWindow, DirectAlgo, DirectChoice};
