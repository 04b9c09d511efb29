//! The only place the transport touches registered memory through raw
//! addresses: bounds-checked reads and writes of a region that stays mapped
//! while its [`Buf`] lives.

use crate::verbs::Mr;

/// A registered region of this process, accessed by offset.
#[derive(Debug)]
pub(crate) struct Buf {
    addr: u64,
    len: usize,
}

impl Buf {
    /// Wraps a region of this process.
    ///
    /// # Safety
    /// `mr.addr .. mr.addr + mr.len` must stay mapped, readable and writable
    /// for as long as the returned value is used, and only this process's
    /// single owner of the `Buf`, or a peer's RDMA WRITE into a part the
    /// protocol has handed to the peer, may write to it meanwhile.
    pub(crate) unsafe fn new(mr: &Mr) -> Buf {
        Buf {
            addr: mr.addr,
            len: mr.len,
        }
    }

    fn check(&self, off: usize, len: usize) {
        assert!(
            off.checked_add(len).is_some_and(|end| end <= self.len),
            "registered buffer access {off}+{len} beyond {} bytes",
            self.len
        );
    }

    /// Copies `parts` one after the other to `off`.
    pub(crate) fn write(&mut self, off: usize, parts: &[&[u8]]) {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        self.check(off, total);
        let mut at = off;
        for p in parts {
            // SAFETY: in bounds (checked above) of a mapping that `new`'s
            // contract keeps alive; `p` is a separate Rust slice, so the
            // ranges do not overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(p.as_ptr(), (self.addr as *mut u8).add(at), p.len())
            };
            at += p.len();
        }
    }

    /// Copies `src` to `off` and returns its CRC32C, computed in the copy
    /// ([`comm_core::wire::copy_checksummed`]).
    pub(crate) fn write_checksummed(&mut self, off: usize, src: &[u8]) -> u32 {
        self.check(off, src.len());
        // SAFETY: in bounds (checked above) of a mapping that `new`'s
        // contract keeps alive and only this owner writes; `src` is a
        // separate Rust slice, so the ranges do not overlap.
        let dst =
            unsafe { std::slice::from_raw_parts_mut((self.addr as *mut u8).add(off), src.len()) };
        comm_core::wire::copy_checksummed(dst, src)
    }

    /// The bytes at `off .. off + len`.
    pub(crate) fn read(&self, off: usize, len: usize) -> &[u8] {
        self.check(off, len);
        // SAFETY: in bounds of a live mapping (`new`'s contract); the
        // protocol guarantees no peer writes this part while it is borrowed.
        unsafe { std::slice::from_raw_parts((self.addr as *const u8).add(off), len) }
    }
}

/// The `idx`-th 64-bit word of a mapping's header, as an atomic (the
/// emulated provider's region header: magic, valid flag, base, length, key).
pub(crate) fn header_word(map: &memmap2::MmapRaw, idx: usize) -> &std::sync::atomic::AtomicU64 {
    assert!((idx + 1) * 8 <= map.len() && (map.as_ptr() as usize).is_multiple_of(8));
    // SAFETY: in bounds and 8-byte aligned (checked; mappings are page
    // aligned); the mapping lives as long as the borrow of `map`; every
    // process touches these words only atomically.
    unsafe { &*(map.as_mut_ptr().add(idx * 8) as *const std::sync::atomic::AtomicU64) }
}

/// Copies `len` bytes from `src` at `src_off` to `dst` at `dst_off` (two
/// mappings; an emulated RDMA WRITE).
pub(crate) fn copy_between(
    src: &memmap2::MmapRaw,
    src_off: usize,
    dst: &memmap2::MmapRaw,
    dst_off: usize,
    len: usize,
) {
    let fits = |off: usize, total: usize| off.checked_add(len).is_some_and(|e| e <= total);
    assert!(fits(src_off, src.len()) && fits(dst_off, dst.len()));
    // SAFETY: both ranges are in bounds of live mappings (checked above).
    // They never overlap: a region is never the target of a write from
    // itself in the transport, and `ptr::copy` would tolerate it anyway.
    unsafe {
        std::ptr::copy(
            src.as_ptr().add(src_off),
            dst.as_mut_ptr().add(dst_off),
            len,
        )
    }
}

/// Copies `len` bytes at address `src` of this process to `dst` at
/// `dst_off` (an emulated RDMA WRITE from a user registration).
///
/// # Safety
/// `src .. src + len` is readable memory of this process (the contract of
/// `Verbs::reg_user_mr`), not inside `dst`'s destination range.
pub(crate) unsafe fn copy_from_user(src: u64, dst: &memmap2::MmapRaw, dst_off: usize, len: usize) {
    assert!(dst_off.checked_add(len).is_some_and(|e| e <= dst.len()));
    // SAFETY: the destination is in bounds of a live mapping (checked); the
    // source is readable for `len` bytes by the caller's contract.
    unsafe { std::ptr::copy(src as *const u8, dst.as_mut_ptr().add(dst_off), len) }
}

/// CRC32C of `len` bytes at address `src` of this process (the strict
/// emulation's digest of a WRITE's source, `emu/watch.rs`).
///
/// # Safety
/// `src .. src + len` is readable memory of this process: a registered
/// region's mapping, or a user registration's bytes while a work request
/// reading them is outstanding (the contract of `Verbs::reg_user_mr`).
pub(crate) unsafe fn digest_raw(src: *const u8, len: usize) -> u32 {
    // SAFETY: readable for `len` bytes by the caller's contract.
    let bytes = unsafe { std::slice::from_raw_parts(src, len) };
    comm_core::wire::checksum_append(0, bytes)
}
