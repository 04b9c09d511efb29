//! Bytes the CPU copies through staging memory to move pieces (issue 36,
//! risk 9: "copies counted"): the RDMA transport's staging slots, and the
//! device path's pinned bounce ring for received pieces. Process-wide, like
//! the transports' byte counters; a test divides them by the payload bytes
//! moved to get host copies per byte.
//!
//! The copies the executor makes to deliver a received host piece into the
//! caller's host buffer are the operation itself, not staging, and are not
//! counted; neither are the device's DMA copies between pinned host memory
//! and device memory.

use std::sync::atomic::{AtomicU64, Ordering};

static STAGING_COPY_BYTES: AtomicU64 = AtomicU64::new(0);

/// Counts `bytes` copied by the CPU into or out of staging memory.
#[inline]
pub fn count_staging_copy(bytes: usize) {
    STAGING_COPY_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// Bytes this process has copied through staging memory so far.
pub fn staging_copy_bytes() -> u64 {
    STAGING_COPY_BYTES.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_add_up() {
        let before = super::staging_copy_bytes();
        super::count_staging_copy(4096);
        super::count_staging_copy(1);
        // Other tests of this binary may count meanwhile: at least ours.
        assert!(super::staging_copy_bytes() >= before + 4097);
    }
}
