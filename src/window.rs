//! Windows: host buffers that the ranks of a one-node communicator map
//! into each other's address spaces (shared memory), so that an all-reduce
//! over them reads its peers' inputs directly — one copy instead of the
//! slot FIFO's several. The host counterpart of NCCL's registered
//! user buffers / symmetric memory windows.

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use crate::comm::windows::WindowShared;
use crate::{Communicator, Element, Result};

/// A buffer of `len` elements in shared memory, allocated collectively by
/// [`Communicator::alloc_window`]. It dereferences to a slice; pass parts
/// of it as the input and output of collectives as any other buffer.
///
/// An all-reduce of at least 256 KiB whose input and output lie in windows,
/// at the same offsets of the same windows on every rank of a one-node
/// communicator
/// runs directly over the windows (each rank reduces one slice reading every
/// rank's input, then copies the others' reduced slices); anything else
/// runs as usual. Every rank of such a communicator exchanges a small offer
/// at the start of each collective once it has a window.
pub struct Window<T: Element> {
    shared: Arc<WindowShared>,
    len: usize,
    _elements: PhantomData<T>,
}

impl<T: Element> std::fmt::Debug for Window<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("id", &self.shared.id)
            .field("len", &self.len)
            .field("dtype", &T::DTYPE.name())
            .finish()
    }
}

impl<T: Element> Window<T> {
    /// The window's id on its communicator (the same on every rank).
    pub fn id(&self) -> u64 {
        self.shared.id
    }
}

impl<T: Element> Deref for Window<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the region is page-aligned (any element alignment), at
        // least `len × size_of::<T>()` bytes (allocated so), zero-filled at
        // creation (a valid bit pattern for every Element type), and lives
        // as long as `shared`. Peers read it only during collectives that
        // borrow it from this rank.
        unsafe { std::slice::from_raw_parts(self.shared.as_ptr() as *const T, self.len) }
    }
}

impl<T: Element> DerefMut for Window<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`; `&mut self` makes this the only slice of
        // the window in this process (peers write only their own windows).
        unsafe { std::slice::from_raw_parts_mut(self.shared.as_ptr() as *mut T, self.len) }
    }
}

impl Communicator {
    /// Allocates a window of `len` elements on every rank (collective:
    /// every rank calls it with the same `len`, in the same order as its
    /// other window allocations). Zero-filled. On a communicator whose ranks
    /// span several nodes the window is shared within each node only and
    /// collectives over it run as usual.
    pub fn alloc_window<T: Element>(&self, len: usize) -> Result<Window<T>> {
        let bytes = len.saturating_mul(T::DTYPE.size());
        let shared = self.inner.alloc_window(bytes)?;
        Ok(Window {
            shared,
            len,
            _elements: PhantomData,
        })
    }
}
