//! Opaque handles: the driver's `CUcontext`, `CUstream`, `CUevent`,
//! `CUmodule`, `CUfunction`, `CUgraph` and `CUgraphExec` are pointers the
//! caller never dereferences. The model hands out numbers from a range of
//! its own per kind (so a handle of the wrong kind, a forged one or one
//! destroyed is recognised: `CUDA_ERROR_INVALID_HANDLE`, as the driver
//! answers) and keeps the object behind it in a table.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::{CUresult, Res};

/// A table of live objects of one kind.
pub struct Table<T> {
    next: AtomicU64,
    live: Mutex<BTreeMap<u64, Arc<T>>>,
}

impl<T> Table<T> {
    /// A table whose handles start at `base` (each kind its own range).
    pub const fn new(base: u64) -> Table<T> {
        Table {
            next: AtomicU64::new(base),
            live: Mutex::new(BTreeMap::new()),
        }
    }

    /// Adds `obj`; returns its handle.
    pub fn insert(&self, obj: Arc<T>) -> u64 {
        let h = self.next.fetch_add(0x10, Ordering::Relaxed);
        self.lock().insert(h, obj);
        h
    }

    /// Adds `obj` under a handle chosen by the caller's `make` from the
    /// handle number (objects that know their own handle).
    pub fn insert_with(&self, make: impl FnOnce(u64) -> Arc<T>) -> (u64, Arc<T>) {
        let h = self.next.fetch_add(0x10, Ordering::Relaxed);
        let obj = make(h);
        self.lock().insert(h, obj.clone());
        (h, obj)
    }

    /// The object of handle `h`, or `CUDA_ERROR_INVALID_HANDLE`.
    pub fn get(&self, h: u64) -> Res<Arc<T>> {
        self.lock()
            .get(&h)
            .cloned()
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
    }

    /// Removes handle `h`, or `CUDA_ERROR_INVALID_HANDLE` when it is not live.
    pub fn remove(&self, h: u64) -> Res<Arc<T>> {
        self.lock()
            .remove(&h)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
    }

    /// Every live object.
    pub fn all(&self) -> Vec<Arc<T>> {
        self.lock().values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<T>>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Locks `m`, ignoring poisoning (a panic inside the model is caught at
/// the entry point and reported; the data stays usable).
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
