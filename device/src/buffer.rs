//! Owned device and pinned-host allocations that free themselves.

use std::ptr::NonNull;
use std::sync::Arc;

use crate::{Device, DevicePtr, Result};

/// Device memory from [`Device::alloc`], freed on drop.
#[derive(Debug)]
pub struct DeviceBuffer {
    device: Arc<dyn Device>,
    ptr: DevicePtr,
    bytes: usize,
}

impl DeviceBuffer {
    /// Allocates `bytes` on `device`.
    pub fn new(device: &Arc<dyn Device>, bytes: usize) -> Result<DeviceBuffer> {
        let ptr = device.alloc(bytes)?;
        Ok(DeviceBuffer {
            device: device.clone(),
            ptr,
            bytes,
        })
    }

    /// The device address.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The device it lives on.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc` on this device and is freed only
        // here; the owner synchronised the work that used it before dropping
        // (the runtime drops staging and scratch after the operation ends).
        if let Err(e) = unsafe { self.device.free(self.ptr) } {
            tracing::warn!(error = %e, "freeing a device buffer failed");
        }
    }
}

/// Page-locked host memory from [`Device::alloc_pinned`], freed on drop.
#[derive(Debug)]
pub struct PinnedBuffer {
    device: Arc<dyn Device>,
    ptr: NonNull<u8>,
    bytes: usize,
}

// SAFETY: the buffer is plain host memory owned by this value; the pointer
// is not shared with other Rust values, so moving it between threads is as
// safe as moving a Vec<u8>.
unsafe impl Send for PinnedBuffer {}
// SAFETY: shared references only hand out `&[u8]`, as for a Vec<u8>.
unsafe impl Sync for PinnedBuffer {}

impl PinnedBuffer {
    /// Allocates `bytes` of pinned host memory for `device`.
    pub fn new(device: &Arc<dyn Device>, bytes: usize) -> Result<PinnedBuffer> {
        let ptr = device.alloc_pinned(bytes)?;
        Ok(PinnedBuffer {
            device: device.clone(),
            ptr,
            bytes,
        })
    }

    /// The start of the buffer.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The contents. Only valid while no enqueued copy writes the buffer.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the allocation is `bytes` long and lives as long as self;
        // callers synchronise with enqueued copies before reading.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.bytes) }
    }

    /// The contents, mutably. Only valid while no enqueued copy uses it.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as for `as_slice`, and `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.bytes) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        // SAFETY: from `alloc_pinned` on this device with this length, freed
        // only here, after the owner synchronised the work that used it.
        if let Err(e) = unsafe { self.device.free_pinned(self.ptr, self.bytes) } {
            tracing::warn!(error = %e, "freeing pinned host memory failed");
        }
    }
}
