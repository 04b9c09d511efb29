//! Strict mode's rule on pinned user registrations (issue 36): a pinned
//! registration holds the physical pages it found at `ibv_reg_mr`
//! (`ib_umem_get` pins them with `pin_user_pages`, drivers/infiniband/core/
//! umem.c), and the NIC reads those pages however the process's mapping
//! changes afterwards. Memory freed and mapped again at the same address
//! (the allocator returned it to the kernel and got new pages), or a page
//! that copy-on-write replaced, leaves the NIC reading the old page: the
//! registration-cache invalidation bug class (why UCX and Open MPI hook
//! `munmap`, and why sncl drops pinned registrations at every step's end,
//! `regcache.rs`). The emulation reads user memory by its address, which
//! would hide it, so strict mode notes each page's frame number
//! (`/proc/self/pagemap`, proc(5): bits 0–54 when the reader has
//! `CAP_SYS_ADMIN`) at registration and fails a WRITE whose source pages
//! changed since (`IBV_WC_GENERAL_ERR` and an ERROR log naming the page).
//! Where frame numbers are hidden (no `CAP_SYS_ADMIN`) the rule cannot
//! apply and is skipped (logged once).

use std::os::unix::fs::FileExt;

const PAGE: u64 = 4096;
/// pagemap: the page frame number's bits.
const PFN_BITS: u64 = (1 << 55) - 1;

/// The frame numbers of the pages of `len` bytes at `addr` (0 for a page
/// not present), from the process's open pagemap `f`; `None` where it
/// cannot be read.
fn frames(f: &std::fs::File, addr: u64, len: usize) -> Option<Vec<u64>> {
    let first = addr / PAGE;
    let pages = ((addr + len as u64).div_ceil(PAGE) - first) as usize;
    let mut raw = vec![0u8; pages * 8];
    f.read_exact_at(&mut raw, first * 8).ok()?;
    Some(
        raw.chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) & PFN_BITS)
            .collect(),
    )
}

/// The pages a pinned registration holds.
pub(super) struct PinnedPages {
    first_page: u64,
    frames: Vec<u64>,
    /// `/proc/self/pagemap`, opened once (every WRITE step reads it).
    pagemap: std::fs::File,
    /// The pages kept out of forked children after `fork_init`
    /// (`fork.rs`).
    _dont_fork: Option<super::fork::DontFork>,
}

impl PinnedPages {
    /// Pins `len` bytes at `addr` as `ib_umem_get` does: every page is made
    /// present (faulted in) and its frame noted. `None` where frame numbers
    /// are hidden from this process (the rule is then skipped).
    ///
    /// # Safety
    /// `addr .. addr + len` is mapped, readable memory of this process.
    pub(super) unsafe fn pin(addr: u64, len: usize) -> Option<PinnedPages> {
        let first = addr / PAGE;
        let end = (addr + len as u64).div_ceil(PAGE);
        for page in first..end {
            let at = (page * PAGE).max(addr);
            // SAFETY: `at` lies in the caller's mapped, readable range; a
            // volatile read faults the page in, as pinning does.
            unsafe { std::ptr::read_volatile(at as *const u8) };
        }
        let pagemap = std::fs::File::open("/proc/self/pagemap").ok()?;
        let frames = frames(&pagemap, addr, len)?;
        if frames.iter().all(|&f| f == 0) {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::debug!(
                    "strict RDMA model: page frame numbers are hidden (no CAP_SYS_ADMIN): the \
                     stale-pinned-pages rule is skipped"
                )
            });
            return None;
        }
        Some(PinnedPages {
            first_page: first,
            frames,
            pagemap,
            _dont_fork: super::fork::DontFork::mark(addr, len),
        })
    }

    /// The address of the first page of `len` bytes at `addr` whose frame
    /// changed since the registration, if any.
    pub(super) fn moved(&self, addr: u64, len: usize) -> Option<u64> {
        let now = frames(&self.pagemap, addr, len)?;
        let first = addr / PAGE;
        now.iter().enumerate().find_map(|(i, &f)| {
            let page = first + i as u64;
            let then = *self.frames.get((page - self.first_page) as usize)?;
            (f != then).then_some(page * PAGE)
        })
    }
}
