//! The emulated device's memory: allocations (each its own shared-memory
//! mapping) addressed by a fake [`DevicePtr`] space, and pinned host memory.
//!
//! Device addresses are `BASE + (id << ID_SHIFT) + offset`. `BASE` is far
//! outside any user-space address on x86_64 and aarch64, so code that
//! dereferences a `DevicePtr` as a host pointer crashes instead of silently
//! working. Ids come from one process-wide counter, so an address of one
//! emulated device object is never valid on another.

use std::alloc::Layout;
use std::collections::{BTreeMap, HashMap};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::shm::ShmMap;
use crate::DevicePtr;

const BASE: u64 = 0x4000_0000_0000_0000;
const ID_SHIFT: u32 = 36;
/// The largest emulated allocation (64 GiB: what an id's range holds).
pub(super) const MAX_ALLOC: usize = 1 << ID_SHIFT;
const MAX_ID: u64 = (1 << (62 - ID_SHIFT)) - 1;
/// Alignment of pinned allocations.
const PINNED_ALIGN: usize = 64;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Whether an allocation was made here or imported from another process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Origin {
    /// From `alloc`; freed with `free`, exportable.
    Alloc,
    /// From `ipc_import`; closed with `ipc_close`.
    Import,
}

/// One allocation.
#[derive(Debug)]
pub(super) struct Region {
    pub(super) map: ShmMap,
    pub(super) origin: Origin,
}

/// `bytes` bytes at `offset` of a region; holds the region alive, so an
/// enqueued operation never touches unmapped memory.
#[derive(Clone, Debug)]
pub(super) struct Span {
    region: Arc<Region>,
    offset: usize,
    bytes: usize,
}

impl Span {
    /// The first byte in host memory.
    pub(super) fn host(&self) -> *mut u8 {
        // SAFETY: `offset + bytes <= len` was checked when the span was made,
        // so the result stays inside (or one past the end of) the mapping.
        unsafe { self.region.map.ptr().add(self.offset) }
    }

    /// Whether the two spans share a byte (zero-length spans share none).
    pub(super) fn overlaps(&self, other: &Span) -> bool {
        let (a, b) = (self.host() as usize, other.host() as usize);
        self.bytes > 0 && other.bytes > 0 && a < b + other.bytes && b < a + self.bytes
    }

    /// Whether the two spans are the same range.
    pub(super) fn same(&self, other: &Span) -> bool {
        self.host() == other.host() && self.bytes == other.bytes
    }
}

/// Page-locked host memory (plain aligned host memory on `emu`).
#[derive(Debug)]
pub(super) struct Pinned {
    ptr: NonNull<u8>,
    layout: Layout,
    bytes: usize,
}

// SAFETY: an owned heap block; the raw pointer is only used through the
// Device contract, which orders accesses with streams.
unsafe impl Send for Pinned {}
// SAFETY: as above.
unsafe impl Sync for Pinned {}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: allocated in `Memory::alloc_pinned` with this layout and
        // freed only here, when the last holder lets go.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// All memory of one emulated device object.
#[derive(Debug, Default)]
pub(super) struct Memory {
    regions: Mutex<HashMap<u64, Arc<Region>>>,
    pinned: Mutex<BTreeMap<usize, Arc<Pinned>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Splits an address into (id, offset), or says why it is not one of ours.
pub(super) fn split(ptr: DevicePtr) -> Result<(u64, usize), String> {
    let rel = ptr.0.checked_sub(BASE).filter(|r| r >> ID_SHIFT <= MAX_ID);
    match rel {
        Some(rel) => Ok((rel >> ID_SHIFT, (rel & (MAX_ALLOC as u64 - 1)) as usize)),
        None => Err(format!(
            "{ptr:#x} is not an emulated device address (expected one from alloc or ipc_import)"
        )),
    }
}

impl Memory {
    /// Adds a mapped region; returns its address.
    pub(super) fn insert(&self, map: ShmMap, origin: Origin) -> Result<DevicePtr, String> {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        if id > MAX_ID {
            return Err(format!(
                "the emulated address space is used up ({MAX_ID} allocations)"
            ));
        }
        lock(&self.regions).insert(id, Arc::new(Region { map, origin }));
        Ok(DevicePtr(BASE + (id << ID_SHIFT)))
    }

    /// Removes the region that starts at `ptr`, if it has this origin.
    pub(super) fn remove(&self, ptr: DevicePtr, origin: Origin) -> Result<Arc<Region>, String> {
        let (id, offset) = split(ptr)?;
        let mut regions = lock(&self.regions);
        match regions.get(&id) {
            Some(r) if offset == 0 && r.origin == origin => {
                Ok(regions.remove(&id).expect("looked up above"))
            }
            Some(_) if offset != 0 => Err(format!(
                "{ptr:#x} is {offset} bytes into an allocation; expected its start"
            )),
            Some(r) => Err(format!(
                "{ptr:#x} is an allocation from {:?}, not from {origin:?}",
                r.origin
            )),
            None => Err(format!(
                "{ptr:#x} is not a live allocation of this device (freed, or from another \
                 device)"
            )),
        }
    }

    /// The region that starts at `ptr`.
    pub(super) fn region_at(&self, ptr: DevicePtr) -> Result<Arc<Region>, String> {
        let (id, offset) = split(ptr)?;
        let region = lock(&self.regions).get(&id).cloned();
        match region {
            Some(r) if offset == 0 => Ok(r),
            Some(_) => Err(format!(
                "{ptr:#x} is {offset} bytes into an allocation; expected its start"
            )),
            None => Err(format!("{ptr:#x} is not a live allocation of this device")),
        }
    }

    /// `bytes` bytes from `ptr`, checked against the allocation's bounds.
    pub(super) fn span(&self, ptr: DevicePtr, bytes: usize) -> Result<Span, String> {
        let (id, offset) = split(ptr)?;
        let Some(region) = lock(&self.regions).get(&id).cloned() else {
            return Err(format!(
                "{ptr:#x} is not inside a live allocation of this device (freed, or from \
                 another device)"
            ));
        };
        let len = region.map.len();
        if offset.checked_add(bytes).is_none_or(|end| end > len) {
            return Err(format!(
                "{bytes} bytes at {ptr:#x} (offset {offset}) run past the end of its \
                 {len}-byte allocation"
            ));
        }
        Ok(Span {
            region,
            offset,
            bytes,
        })
    }

    /// The allocation that holds `ptr .. ptr + bytes` (dma-buf export):
    /// its start, its id and the region.
    pub(super) fn holder(
        &self,
        ptr: DevicePtr,
        bytes: usize,
    ) -> Result<(DevicePtr, u64, Arc<Region>), String> {
        let span = self.span(ptr, bytes)?;
        let (id, offset) = split(ptr)?;
        Ok((DevicePtr(ptr.0 - offset as u64), id, span.region))
    }

    /// The id of the live allocation that holds `ptr`.
    pub(super) fn live_id(&self, ptr: DevicePtr) -> Result<u64, String> {
        self.holder(ptr, 0).map(|(_, id, _)| id)
    }

    /// Allocates `bytes` of zeroed pinned host memory.
    pub(super) fn alloc_pinned(&self, bytes: usize) -> Option<NonNull<u8>> {
        let layout = Layout::from_size_align(bytes.max(1), PINNED_ALIGN).ok()?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })?;
        let block = Pinned { ptr, layout, bytes };
        lock(&self.pinned).insert(ptr.as_ptr() as usize, Arc::new(block));
        Some(ptr)
    }

    /// Forgets the pinned block at `ptr` of `bytes` bytes (freed when the
    /// last enqueued operation that holds it is done).
    pub(super) fn free_pinned(&self, ptr: NonNull<u8>, bytes: usize) -> Result<(), String> {
        let mut pinned = lock(&self.pinned);
        let key = ptr.as_ptr() as usize;
        match pinned.get(&key) {
            Some(p) if p.bytes == bytes => {
                pinned.remove(&key);
                Ok(())
            }
            Some(p) => Err(format!(
                "pinned block {ptr:?} has {} bytes, not the {bytes} given",
                p.bytes
            )),
            None => Err(format!("{ptr:?} is not a live pinned block of this device")),
        }
    }

    /// The pinned block that holds the aligned `u32` at `addr`.
    pub(super) fn pinned_u32(&self, addr: usize) -> Result<Arc<Pinned>, String> {
        if !addr.is_multiple_of(4) {
            return Err(format!("{addr:#x} is not 4-byte aligned"));
        }
        let pinned = lock(&self.pinned);
        match pinned.range(..=addr).next_back() {
            Some((&start, p)) if addr + 4 <= start + p.bytes => Ok(p.clone()),
            _ => Err(format!(
                "the u32 at {addr:#x} is not inside a live pinned allocation of this device"
            )),
        }
    }

    /// Drops every allocation (the device object is going away).
    pub(super) fn clear(&self) {
        lock(&self.regions).clear();
        lock(&self.pinned).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_split_back_and_foreign_ones_are_refused() {
        let mem = Memory::default();
        let p = mem
            .insert(ShmMap::create(10).unwrap(), Origin::Alloc)
            .unwrap();
        assert!(mem.span(p, 10).is_ok());
        assert!(mem.span(p.add(3), 7).is_ok());
        assert!(mem.span(p.add(3), 8).is_err());
        assert!(mem.span(p.add(10), 0).is_ok());
        assert!(mem.span(DevicePtr(0x1000), 1).is_err());
        assert!(mem.span(DevicePtr(u64::MAX), 1).is_err());
        assert!(mem.remove(p, Origin::Import).is_err());
        assert!(mem.remove(p.add(1), Origin::Alloc).is_err());
        mem.remove(p, Origin::Alloc).unwrap();
        assert!(mem.span(p, 1).is_err());
    }
}
