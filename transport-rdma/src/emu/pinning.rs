//! Strict mode's pinned-memory accounting (`SNCL_IB_EMULATE=strict`): a
//! registration pins its pages, counted per process as the kernel counts
//! `mm->pinned_vm` (every device of the process together), and fails with
//! ENOMEM where the total would pass `RLIMIT_MEMLOCK` without
//! `CAP_IPC_LOCK` ([`crate::sys::PinRules`], the rule of `ib_umem_get` in
//! drivers/infiniband/core/umem.c). Deregistration and closing the device
//! unpin. On-demand (ODP) and dma-buf registrations pin nothing that the
//! limit counts (`ib_umem_odp_get` and `ib_umem_dmabuf_get` do not charge
//! `pinned_vm`).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::sys::{PinRules, PIN_PAGE};

/// Bytes the emulated devices of this process have pinned (the process's
/// `pinned_vm`; tests give their devices counters of their own).
pub(super) static PINNED: AtomicU64 = AtomicU64::new(0);

/// Bytes the emulated devices of this process have pinned now (whole
/// pages).
pub fn pinned_bytes() -> u64 {
    PINNED.load(Ordering::Relaxed)
}

/// Charges `len` bytes (rounded up to pages) to `pinned` under `rules`; the
/// bytes to give back at deregistration, or the kernel's ENOMEM as text.
pub(super) fn charge(pinned: &AtomicU64, rules: &PinRules, len: usize) -> Result<u64, String> {
    let bytes = (len as u64).div_ceil(PIN_PAGE) * PIN_PAGE;
    let total = pinned.fetch_add(bytes, Ordering::Relaxed) + bytes;
    if rules.allows(total) {
        return Ok(bytes);
    }
    pinned.fetch_sub(bytes, Ordering::Relaxed);
    Err(format!(
        "Cannot allocate memory (ENOMEM): pinning {bytes} more bytes would make {total} pinned \
         bytes in this process, above RLIMIT_MEMLOCK ({} bytes) without CAP_IPC_LOCK",
        rules.limit.unwrap_or(0)
    ))
}

/// Gives back to `pinned` what [`charge`] took.
pub(super) fn release(pinned: &AtomicU64, bytes: u64) {
    pinned.fetch_sub(bytes, Ordering::Relaxed);
}
