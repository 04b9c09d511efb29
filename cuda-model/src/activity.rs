//! The process's activity, counted for the hang detector ([`crate::watch`]):
//! everything that moves (an operation completed, a word changed, work was
//! issued, a blocked call returned) calls [`progress`]; and the kernel
//! thread id reports name threads by.

use std::sync::atomic::{AtomicU64, Ordering};

static PROGRESS: AtomicU64 = AtomicU64::new(0);

/// Something in the process moved.
pub fn progress() {
    PROGRESS.fetch_add(1, Ordering::Relaxed);
}

/// How often something moved so far.
pub fn count() -> u64 {
    PROGRESS.load(Ordering::Relaxed)
}

/// The calling thread's kernel id (for reports).
pub fn tid() -> i64 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) }
}
