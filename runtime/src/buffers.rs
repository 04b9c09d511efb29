//! [`Buffers`]: the executor's host [`Memory`], and the only place the
//! executor touches caller memory through raw pointers. A [`Buffers`] is
//! created (unsafely) by the communicator from the caller's slices, which
//! stay borrowed until the operation completes; every access below is
//! bounds-checked against the lengths it was created with.

use comm_core::error::Result;
use comm_core::mem::Memory;
use comm_core::schedule::{BufId, Region};
use comm_core::{DataType, ReduceOp};

impl Memory for Buffers {
    #[inline]
    fn pieces_outlive_step(&self) -> bool {
        // The caller's buffers stay lent until the operation completes, and
        // a step never writes the regions it sends.
        true
    }

    #[inline]
    fn copy(&self, src: Region, dst: Region, esize: usize) -> Result<()> {
        Buffers::copy(self, src, dst, esize);
        Ok(())
    }

    #[inline]
    fn with_piece<R>(
        &self,
        r: Region,
        esize: usize,
        at: usize,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>> {
        Ok(Some(Buffers::with_ref(self, r, esize, |b| {
            f(&b[at..at + len])
        })))
    }

    #[inline]
    fn write_at(&self, dst: Region, esize: usize, at: usize, data: &[u8]) -> Result<()> {
        Buffers::write_at(self, dst, esize, at, data);
        Ok(())
    }

    #[inline]
    fn reduce_at(
        &self,
        local: Region,
        dst: Region,
        esize: usize,
        at: usize,
        data: &[u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        Buffers::reduce_at(self, local, dst, esize, at, data, dtype, op);
        Ok(())
    }

    #[inline]
    fn divide(&self, region: Region, dtype: DataType, divisor: usize) -> Result<()> {
        self.with_mut(region, dtype.size(), |b| kernels::divide(dtype, b, divisor));
        Ok(())
    }
}

/// The memory of one operation: input, output and scratch.
#[derive(Debug)]
pub struct Buffers {
    send: *const u8,
    send_bytes: usize,
    recv: *mut u8,
    recv_bytes: usize,
    scratch: *mut u8,
    scratch_bytes: usize,
    peer_bufs: Vec<(*mut u8, usize)>,
}

// SAFETY: a Buffers is only a set of pointers the creator promised are valid
// and exclusively lent to this operation until it completes (see `new`); the
// executor uses it from one thread at a time.
unsafe impl Send for Buffers {}

impl Buffers {
    /// Wraps raw buffers.
    ///
    /// # Safety
    /// Each pointer must be valid for reads (send) or reads and writes (recv,
    /// scratch) of its length until the operation using this value completes,
    /// and nothing else may access the recv and scratch memory meanwhile. The
    /// send buffer may lie inside the recv buffer (in-place operations); it
    /// must not otherwise overlap recv or scratch; or the recv buffer may lie
    /// inside the send buffer (in-place reduce-scatter).
    pub unsafe fn new(
        send: *const u8,
        send_bytes: usize,
        recv: *mut u8,
        recv_bytes: usize,
        scratch: *mut u8,
        scratch_bytes: usize,
    ) -> Buffers {
        Buffers {
            send,
            send_bytes,
            recv,
            recv_bytes,
            scratch,
            scratch_bytes,
            peer_bufs: Vec::new(),
        }
    }

    /// Adds the buffers of a point-to-point group, addressed as
    /// [`BufId::Peer`]`(k)` in order.
    ///
    /// # Safety
    /// As for [`Buffers::new`]: each buffer valid for its length until the
    /// operation completes; buffers that are received into are exclusively
    /// lent and do not overlap any other buffer of the group.
    pub unsafe fn with_peer_buffers(mut self, bufs: Vec<(*mut u8, usize)>) -> Buffers {
        self.peer_bufs = bufs;
        self
    }

    /// Input size in bytes.
    pub fn send_bytes(&self) -> usize {
        self.send_bytes
    }

    /// Output size in bytes.
    pub fn recv_bytes(&self) -> usize {
        self.recv_bytes
    }

    /// Scratch size in bytes.
    pub fn scratch_bytes(&self) -> usize {
        self.scratch_bytes
    }

    fn span(&self, r: Region, esize: usize) -> (*mut u8, usize) {
        let (base, cap) = match r.buf {
            BufId::Send => (self.send as *mut u8, self.send_bytes),
            BufId::Recv => (self.recv, self.recv_bytes),
            BufId::Scratch => (self.scratch, self.scratch_bytes),
            BufId::Peer(k) => self.peer_bufs[k as usize],
        };
        let (off, len) = (r.offset * esize, r.len * esize);
        assert!(
            off + len <= cap,
            "schedule region {r:?} exceeds its {cap}-byte buffer"
        );
        if len == 0 {
            return (std::ptr::NonNull::dangling().as_ptr(), 0);
        }
        // SAFETY: off + len <= cap, so the result stays inside the buffer.
        (unsafe { base.add(off) }, len)
    }

    /// Calls `f` with the region's bytes.
    pub fn with_ref<R>(&self, r: Region, esize: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        let (p, len) = self.span(r, esize);
        // SAFETY: `span` checked the bounds; `new`'s contract makes the memory
        // valid, and no mutable slice of it is alive while `f` runs.
        f(unsafe { std::slice::from_raw_parts(p, len) })
    }

    /// Calls `f` with the region's bytes, mutably. Never for `Send`.
    pub fn with_mut<R>(&self, r: Region, esize: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let (p, len) = self.span(r, esize);
        // SAFETY: bounds checked; recv and scratch are exclusively ours by
        // `new`'s contract, and this is the only slice alive during `f`.
        f(unsafe { std::slice::from_raw_parts_mut(p, len) })
    }

    /// Copies `src` to `dst` (equal lengths); nothing when they are the same
    /// memory (in-place), a memmove when they overlap.
    pub fn copy(&self, src: Region, dst: Region, esize: usize) {
        let (s, len) = self.span(src, esize);
        let (d, dlen) = self.span(dst, esize);
        assert_eq!(len, dlen, "copy between regions of different length");
        if len == 0 || s == d {
            return;
        }
        let overlap = (s as usize) < (d as usize + len) && (d as usize) < (s as usize + len);
        if overlap {
            // SAFETY: both spans are in bounds; ptr::copy handles overlap.
            unsafe { std::ptr::copy(s, d, len) };
        } else {
            // SAFETY: in bounds and disjoint, so one shared and one mutable
            // slice may coexist.
            let (a, b) = unsafe {
                (
                    std::slice::from_raw_parts(s, len),
                    std::slice::from_raw_parts_mut(d, len),
                )
            };
            kernels::copy(b, a);
        }
    }

    /// Writes `data` at byte `at` of region `dst`.
    pub fn write_at(&self, dst: Region, esize: usize, at: usize, data: &[u8]) {
        self.with_mut(dst, esize, |b| {
            kernels::copy(&mut b[at..at + data.len()], data)
        });
    }

    /// `dst[at..] = local[at..] op data` for one piece.
    #[allow(clippy::too_many_arguments)]
    pub fn reduce_at(
        &self,
        local: Region,
        dst: Region,
        esize: usize,
        at: usize,
        data: &[u8],
        dtype: DataType,
        op: ReduceOp,
    ) {
        let (l, llen) = self.span(local, esize);
        let (d, dlen) = self.span(dst, esize);
        assert!(at + data.len() <= llen.min(dlen), "piece beyond its region");
        if data.is_empty() {
            return;
        }
        // SAFETY: both in bounds (checked above).
        let (l, d) = unsafe { (l.add(at), d.add(at)) };
        if l == d {
            // SAFETY: in place: one mutable slice only.
            let acc = unsafe { std::slice::from_raw_parts_mut(d, data.len()) };
            kernels::reduce_inplace(dtype, op, acc, data);
        } else {
            // SAFETY: schedules never let a reduction's operand partially
            // overlap its destination (the checker rejects it), so these
            // slices are disjoint.
            let (a, out) = unsafe {
                (
                    std::slice::from_raw_parts(l, data.len()),
                    std::slice::from_raw_parts_mut(d, data.len()),
                )
            };
            kernels::reduce_into(dtype, op, out, a, data);
        }
    }
}
