//! Address ranges a communicator has registered (windows,
//! `snclCommRegister`), by handle: the handle C sees is a token, never
//! dereferenced and never reused, so a handle given back twice, or to
//! another communicator, is found out instead of being a use after free.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::comm::CommShared;

/// One registered range and what comes with it.
struct Entry<V> {
    /// The communicator (its `CommShared`'s address).
    comm: usize,
    start: u64,
    bytes: usize,
    value: V,
}

/// The live ranges of one kind, by token.
pub(super) struct RangeTable<V> {
    entries: Mutex<BTreeMap<usize, Entry<V>>>,
}

/// The next token of every table: never 0, never reused, never another
/// table's.
fn token() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed) << 4
}

fn comm_id(shared: &Arc<CommShared>) -> usize {
    Arc::as_ptr(shared) as usize
}

impl<V> RangeTable<V> {
    pub(super) const fn new() -> RangeTable<V> {
        RangeTable {
            entries: Mutex::new(BTreeMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<usize, Entry<V>>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds `bytes` at `start` of `shared`'s with `value`; its token.
    pub(super) fn insert(
        &self,
        shared: &Arc<CommShared>,
        start: u64,
        bytes: usize,
        value: V,
    ) -> usize {
        let t = token();
        let comm = comm_id(shared);
        self.lock().insert(
            t,
            Entry {
                comm,
                start,
                bytes,
                value,
            },
        );
        t
    }

    /// Removes the range of token `t` if it is `shared`'s; its value.
    pub(super) fn take(&self, shared: &Arc<CommShared>, t: usize) -> Option<V> {
        let mut entries = self.lock();
        if entries.get(&t)?.comm != comm_id(shared) {
            return None;
        }
        entries.remove(&t).map(|e| e.value)
    }

    /// The token of a range holding `addr`.
    pub(super) fn holding(&self, addr: u64) -> Option<usize> {
        self.lock()
            .iter()
            .find(|(_, e)| addr >= e.start && addr - e.start < e.bytes as u64)
            .map(|(&t, _)| t)
    }

    /// Removes every range of `shared`; how many there were.
    pub(super) fn release_all(&self, shared: &Arc<CommShared>) -> usize {
        let me = comm_id(shared);
        let mut entries = self.lock();
        let before = entries.len();
        entries.retain(|_, e| e.comm != me);
        before - entries.len()
    }
}
