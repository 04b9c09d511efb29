//! Strict mode's fork rule (issue 36). After fork(2) the parent's private
//! pages are shared copy-on-write with the child, and the first write by
//! either side gives the writer a new page. A pinned registration keeps
//! the old page, so on a kernel without copy-on-fork for pinned pages the
//! parent's later writes go where the NIC no longer reads: silent
//! corruption after a data-loader worker or a `system()` call forks.
//! ibv_fork_init(3) is rdma-core's answer: from then on every registered
//! range is marked `MADV_DONTFORK` (the child gets no mapping of it, so
//! nothing is shared; `ibv_dontfork_range` in libibverbs/memory.c, counted
//! per page so overlapping registrations share the mark), and
//! `RDMAV_FORK_SAFE=1` does the same from the environment. The transport
//! calls it before opening any device ([`crate::IbvVerbs`]'s library
//! load), and calls [`fork_init`] before opening the emulated one.
//!
//! The emulation does not pin, so on any kernel a write by the parent
//! after a fork moves the page, and the stale-pages rule
//! (`stale_pages.rs`) fails the next WRITE from it: the kernel that needs
//! `ibv_fork_init`. With [`fork_init`] the emulated pinned registrations
//! are marked `MADV_DONTFORK` as libibverbs marks them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

const PAGE: u64 = 4096;

static FORK_SAFE: AtomicBool = AtomicBool::new(false);

/// The emulated library's `ibv_fork_init`: pinned registrations made from
/// now on are kept out of forked children.
pub fn fork_init() {
    FORK_SAFE.store(true, Ordering::Relaxed);
}

/// Whether [`fork_init`] was called in this process.
pub fn fork_initialized() -> bool {
    FORK_SAFE.load(Ordering::Relaxed)
}

/// How many registrations mark each page `MADV_DONTFORK`.
fn marks() -> &'static Mutex<HashMap<u64, u32>> {
    static MARKS: OnceLock<Mutex<HashMap<u64, u32>>> = OnceLock::new();
    MARKS.get_or_init(Default::default)
}

/// `madvise(advice)` on pages `first .. first + pages`; failures are
/// logged (the range stays as it was).
fn advise(first: u64, pages: u64, advice: libc::c_int) {
    // SAFETY: MADV_DONTFORK / MADV_DOFORK change only whether a forked
    // child inherits the pages' mapping, never the mapping or its contents
    // in this process; an unmapped range is refused with ENOMEM.
    let r = unsafe {
        libc::madvise(
            (first * PAGE) as *mut libc::c_void,
            (pages * PAGE) as usize,
            advice,
        )
    };
    if r != 0 {
        tracing::debug!(
            advice,
            "strict RDMA model: madvise of {pages} pages at {:#x}: {}",
            first * PAGE,
            std::io::Error::last_os_error()
        );
    }
}

/// A pinned registration's pages kept out of forked children while it
/// lives (after [`fork_init`]).
pub(super) struct DontFork {
    first: u64,
    pages: u64,
}

impl DontFork {
    /// Marks the pages of `len` bytes at `addr` (`None`: [`fork_init`] was
    /// not called, or nothing to mark).
    pub(super) fn mark(addr: u64, len: usize) -> Option<DontFork> {
        if !fork_initialized() || len == 0 {
            return None;
        }
        let first = addr / PAGE;
        let pages = (addr + len as u64).div_ceil(PAGE) - first;
        let mut m = marks().lock().unwrap_or_else(|e| e.into_inner());
        for p in first..first + pages {
            *m.entry(p).or_insert(0) += 1;
        }
        advise(first, pages, libc::MADV_DONTFORK);
        Some(DontFork { first, pages })
    }
}

impl Drop for DontFork {
    fn drop(&mut self) {
        let mut m = marks().lock().unwrap_or_else(|e| e.into_inner());
        for p in self.first..self.first + self.pages {
            if let Some(n) = m.get_mut(&p) {
                *n -= 1;
                if *n == 0 {
                    m.remove(&p);
                    advise(p, 1, libc::MADV_DOFORK);
                }
            }
        }
    }
}
