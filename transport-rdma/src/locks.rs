//! The crate's one way to take a lock.
//!
//! The crate's locks guard plain bookkeeping (the device context's
//! registry and handles, and a connection's state between calls) that a
//! panic in another holder leaves consistent; the verbs calls themselves
//! report errors. So a poisoned lock is taken as it stands rather than
//! turning one thread's panic into every other thread's.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, also after a panic in another holder (see the module's note).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
