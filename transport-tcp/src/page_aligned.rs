//! [`PageAlignedBytes`]: a zeroed byte buffer that starts on a page
//! boundary, for the receive buffer the kernel copies socket data into.
//!
//! Where a buffer comes from decides how fast `recv` fills it. glibc serves a
//! large allocation with its own `mmap`, and the bytes then start 16 bytes
//! into a page; the kernel's copy into such a destination (off a 64-byte
//! line) measured about 2x slower for a 2-rank TCP ring all-reduce of 2 MiB
//! than into a page-aligned one (commbench, same run, docs/PERF.md). Whether
//! a process got that placement depended on what it had freed before (a
//! freed 16 MiB block raises glibc's mmap threshold), so the receive buffer
//! fixes its own.
//!
//! The pages are touched at creation, so the buffer is resident as
//! `mem_stats` counts it (a zeroed allocation is otherwise only reserved
//! until first written: a 2-rank TCP communicator's resident memory grew
//! 20 % less than its count).

use std::ops::{Deref, DerefMut};

/// Alignment of the start of the bytes.
const PAGE: usize = 4096;

/// `len` zeroed bytes starting on a [`PAGE`] boundary (safe code: a slice of
/// a slightly larger vector).
pub(crate) struct PageAlignedBytes {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl PageAlignedBytes {
    /// `len` zeroed bytes, page-aligned, every page resident.
    pub(crate) fn zeroed(len: usize) -> PageAlignedBytes {
        let mut storage = vec![0u8; len + PAGE];
        let start = storage.as_ptr().align_offset(PAGE);
        for page in storage.chunks_mut(PAGE) {
            // A write faults the page in; black_box keeps the compiler from
            // dropping a store of the zero the allocation already holds.
            page[0] = std::hint::black_box(0);
        }
        PageAlignedBytes {
            storage,
            start,
            len,
        }
    }
}

impl PageAlignedBytes {
    /// Bytes allocated for it: its length and the page it may skip.
    pub(crate) fn allocated_bytes(&self) -> usize {
        self.storage.len()
    }
}

impl Deref for PageAlignedBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }
}

impl DerefMut for PageAlignedBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bytes_start_on_a_page_and_have_the_asked_length() {
        for len in [0, 1, 48, 4096, 593_920] {
            let mut b = PageAlignedBytes::zeroed(len);
            assert_eq!(b.len(), len);
            assert_eq!(b.as_ptr() as usize % PAGE, 0, "len {len}");
            assert!(b.iter().all(|&x| x == 0));
            if len > 0 {
                b[len - 1] = 7;
                assert_eq!(b[len - 1], 7);
            }
        }
    }
}
