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
mod visibility;

pub use visibility::{pci_bus_id_of, Visibility, DEVICES};

use std::sync::Arc;

use crate::{Device, DeviceError, Result};

/// GPUDirect write flushes of this process's emulated devices.
static GPUDIRECT_FLUSHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many GPUDirect write flushes ([`Device::flush_gpudirect_writes`])
/// this process's emulated devices took (tests: a receive path that
/// consumes GPUDirect writes without one is seen).
pub fn gpudirect_flushes() -> u64 {
    GPUDIRECT_FLUSHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Allocation ids a test marked (managed memory, no dma-buf), kept for
/// the process's emulated devices to answer from.
struct MarkedAllocations(std::sync::Mutex<Vec<u64>>);

impl MarkedAllocations {
    const fn new() -> MarkedAllocations {
        MarkedAllocations(std::sync::Mutex::new(Vec::new()))
    }

    /// Marks the allocation holding `ptr` (an error where `ptr` is no
    /// emulated device address).
    fn mark(&self, ptr: crate::DevicePtr) -> std::result::Result<(), String> {
        let (id, _) = memory::split(ptr)?;
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(id);
        Ok(())
    }

    /// Whether allocation `id` is marked.
    fn contains(&self, id: u64) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&id)
    }
}

/// Allocations the emulated devices call managed memory ([`mark_managed`]).
static MANAGED: MarkedAllocations = MarkedAllocations::new();

/// Makes this process's emulated devices answer that the allocation
/// holding `ptr` is managed memory from now on
/// ([`crate::Device::is_managed`]), as CUDA answers for
/// `cuMemAllocManaged`'s: tests of the paths that must not register it
/// through nvidia-peermem. An error where `ptr` is no emulated device
/// address.
pub fn mark_managed(ptr: crate::DevicePtr) -> std::result::Result<(), String> {
    MANAGED.mark(ptr)
}

/// Whether [`mark_managed`] marked allocation `id`.
fn is_marked_managed(id: u64) -> bool {
    MANAGED.contains(id)
}

/// Allocations whose dma-buf export the emulated devices refuse
/// ([`refuse_dmabuf_export`]).
static UNEXPORTABLE: MarkedAllocations = MarkedAllocations::new();

/// Makes this process's emulated devices refuse to export the allocation
/// that holds `ptr` as dma-buf from now on, as CUDA's
/// `cuMemGetHandleForAddressRange` refuses memory that has no dma-buf
/// (managed memory, or a range that spans several physical allocations of
/// a VMM reservation): tests of the paths that must do without it. An
/// error where `ptr` is no emulated device address.
pub fn refuse_dmabuf_export(ptr: crate::DevicePtr) -> std::result::Result<(), String> {
    UNEXPORTABLE.mark(ptr)
}

/// Whether [`refuse_dmabuf_export`] marked allocation `id`.
fn export_refused(id: u64) -> bool {
    UNEXPORTABLE.contains(id)
}

/// Set once this process opened an emulated device ([`opened`]).
static OPENED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether this process has opened an emulated device (so it may run
/// device operations although no CUDA driver is present).
pub fn opened() -> bool {
    OPENED.load(std::sync::atomic::Ordering::Relaxed)
}

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
    OPENED.store(true, std::sync::atomic::Ordering::Relaxed);
    Ok(Arc::new(device::Emu::new(ordinal)))
}

/// Opens ordinal `ordinal` of a process that sees the emulated devices as
/// `vis` says (see [`Visibility`]); [`open`] is this with the default.
pub fn open_with(ordinal: usize, vis: Visibility) -> Result<Arc<dyn Device>> {
    let bad = |detail: String| DeviceError::InvalidArgument {
        ordinal,
        call: "open",
        detail,
    };
    if vis.visible.iter().any(|&p| p >= DEVICES) {
        return Err(bad(format!(
            "visible devices {:?}: the emulated backend has devices 0 to {}",
            vis.visible,
            DEVICES - 1
        )));
    }
    if ordinal >= vis.visible.len() {
        return Err(bad(format!(
            "this process sees {} emulated device(s) ({:?})",
            vis.visible.len(),
            vis.visible
        )));
    }
    tracing::debug!(ordinal, ?vis, "opened an emulated device");
    OPENED.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut d = device::Emu::new(ordinal);
    d.visibility = vis;
    Ok(Arc::new(d))
}
