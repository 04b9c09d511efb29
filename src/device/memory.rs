//! [`DeviceMemory`]: the executor's `Memory` over device buffers.
//!
//! The data stays on the device; only what crosses the network crosses the
//! host, through pinned staging:
//!
//! * a step's sends: its send regions are copied device-to-host into pinned
//!   staging once per step ([`Memory::prepare_sends`]), then read by the
//!   transports;
//! * received pieces: copied into a pinned ring, then host-to-device into
//!   the destination (plain receive) or into a device twin of the ring,
//!   where [`Device::reduce_copy`] folds them with the local region into
//!   the destination;
//! * copies are device-to-device, avg's divide is [`Device::divide`].
//!
//! Everything runs on the communicator's internal stream, in order; the
//! host waits for it (with the communicator's timeout as the deadline)
//! before it reads send staging, before it reuses the ring, and at the end
//! of the operation. Correct first: the next step is chunk pipelining (the
//! copy of chunk k+1 overlapping the transfer of chunk k, and a ring whose
//! slots are freed by events rather than a full synchronisation); it is
//! not done.

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

use ::device::{Device, DeviceBuffer, DeviceError, DevicePtr, PinnedBuffer};
use comm_core::exec::Memory;
use comm_core::schedule::{BufId, Op, Region};
use comm_core::{DataType, Error, ReduceOp, Result};

use super::Binding;

/// The receive ring's initial size (grown to the largest piece).
const RING_BYTES: usize = 4 << 20;
/// Ring slots start at multiples of this (alignment for any element).
const SLOT_ALIGN: usize = 256;

/// Pinned and device staging of a communicator, reused across operations
/// (allocating pinned memory is slow).
#[derive(Default)]
pub(crate) struct Staging {
    send_host: Option<PinnedBuffer>,
    ring_host: Option<PinnedBuffer>,
    ring_dev: Option<DeviceBuffer>,
    scratch: Option<DeviceBuffer>,
}

fn cap_pinned(b: &Option<PinnedBuffer>) -> usize {
    b.as_ref().map_or(0, PinnedBuffer::bytes)
}

fn cap_dev(b: &Option<DeviceBuffer>) -> usize {
    b.as_ref().map_or(0, DeviceBuffer::bytes)
}

impl Staging {
    /// Makes the device scratch at least `bytes` long. Only between
    /// operations (no enqueued work uses the old one).
    pub(crate) fn ensure_scratch(&mut self, b: &Binding, bytes: usize) -> ::device::Result<()> {
        if cap_dev(&self.scratch) < bytes {
            self.scratch = None;
            self.scratch = Some(DeviceBuffer::new(&b.dev, bytes)?);
        }
        Ok(())
    }
}

/// Who runs an operation, for error messages.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OpIds {
    pub rank: usize,
    pub op: &'static str,
    pub seq: u64,
}

/// One operation's device memory: the caller's send and receive buffers,
/// the communicator's device scratch, and its staging.
pub(crate) struct DeviceMemory<'a> {
    b: &'a Binding,
    ids: OpIds,
    send: (DevicePtr, usize),
    recv: (DevicePtr, usize),
    scratch: (DevicePtr, usize),
    timeout: Duration,
    staging: RefCell<&'a mut Staging>,
    /// Send regions of the current step and their offsets in send staging.
    staged: RefCell<Vec<(Region, usize)>>,
    /// Bytes of the ring in use since the last synchronisation.
    ring_used: Cell<usize>,
}

impl<'a> DeviceMemory<'a> {
    /// `send` and `recv` are the caller's device ranges (address, bytes);
    /// the scratch is `staging`'s (see [`Staging::ensure_scratch`]).
    pub(crate) fn new(
        b: &'a Binding,
        staging: &'a mut Staging,
        ids: OpIds,
        send: (DevicePtr, usize),
        recv: (DevicePtr, usize),
        timeout: Duration,
    ) -> DeviceMemory<'a> {
        let scratch = staging
            .scratch
            .as_ref()
            .map_or((DevicePtr(0), 0), |s| (s.ptr(), s.bytes()));
        DeviceMemory {
            b,
            ids,
            send,
            recv,
            scratch,
            timeout,
            staging: RefCell::new(staging),
            staged: RefCell::new(Vec::new()),
            ring_used: Cell::new(0),
        }
    }

    fn dev(&self) -> &dyn Device {
        &*self.b.dev
    }

    fn err(&self, what: &str, e: DeviceError) -> Error {
        self.b
            .error(self.ids.rank, self.ids.op, Some(self.ids.seq), what, e)
    }

    fn invalid(&self, detail: String) -> Error {
        Error::InvalidArgument {
            rank: self.ids.rank,
            op: self.ids.op,
            detail,
        }
    }

    /// Waits for everything enqueued so far (deadline: the timeout).
    fn sync(&self, what: &str) -> Result<()> {
        self.dev()
            .synchronize(self.b.stream, Instant::now() + self.timeout)
            .map_err(|e| self.err(what, e))
    }

    /// Waits until the operation's device work is complete: the result is
    /// on the device and the staging is free.
    pub(crate) fn finish(&self) -> Result<()> {
        self.sync("completing on the device")
    }

    /// The device range of a region (bounds-checked).
    fn span(&self, r: Region, esize: usize) -> Result<(DevicePtr, usize)> {
        let (base, cap) = match r.buf {
            BufId::Send => self.send,
            BufId::Recv => self.recv,
            BufId::Scratch => self.scratch,
            BufId::Peer(_) => {
                return Err(self
                    .invalid("point-to-point buffers are not supported on device memory".into()))
            }
        };
        let (off, len) = (r.offset * esize, r.len * esize);
        if off + len > cap {
            return Err(self.invalid(format!(
                "schedule region {r:?} exceeds its {cap}-byte device buffer"
            )));
        }
        Ok((base.add(off), len))
    }

    /// A slot of `n` bytes in the receive ring (pinned and device twins at
    /// the same offset); synchronises and starts over when the ring is full.
    fn ring_slot(&self, n: usize) -> Result<usize> {
        let mut st = self.staging.borrow_mut();
        let cap = cap_pinned(&st.ring_host).min(cap_dev(&st.ring_dev));
        if self.ring_used.get() + n > cap {
            if self.ring_used.get() > 0 {
                self.sync("waiting for received pieces before reusing the ring")?;
                self.ring_used.set(0);
            }
            if n > cap {
                let bytes = n.max(RING_BYTES);
                st.ring_host = None;
                st.ring_dev = None;
                st.ring_host = Some(
                    PinnedBuffer::new(&self.b.dev, bytes)
                        .map_err(|e| self.err("allocating the pinned receive ring", e))?,
                );
                st.ring_dev = Some(
                    DeviceBuffer::new(&self.b.dev, bytes)
                        .map_err(|e| self.err("allocating the device receive ring", e))?,
                );
            }
        }
        let at = self.ring_used.get();
        self.ring_used.set((at + n).next_multiple_of(SLOT_ALIGN));
        Ok(at)
    }

    /// Copies a received piece into ring slot `at` (host side) and returns
    /// the slot's pinned address.
    fn fill_slot(&self, at: usize, data: &[u8]) -> *const u8 {
        let mut st = self.staging.borrow_mut();
        let ring = st.ring_host.as_mut().expect("ring allocated by ring_slot");
        ring.as_mut_slice()[at..at + data.len()].copy_from_slice(data);
        // SAFETY: `at + data.len()` is inside the ring (ring_slot checked).
        unsafe { ring.as_ptr().add(at) }
    }

    fn ring_dev(&self, at: usize) -> DevicePtr {
        let st = self.staging.borrow();
        st.ring_dev.as_ref().expect("ring allocated").ptr().add(at)
    }
}

impl Memory for DeviceMemory<'_> {
    fn copy(&self, src: Region, dst: Region, esize: usize) -> Result<()> {
        let (s, len) = self.span(src, esize)?;
        let (d, dlen) = self.span(dst, esize)?;
        if len != dlen {
            return Err(self.invalid(format!(
                "copy between regions of different length ({src:?} to {dst:?})"
            )));
        }
        if len == 0 || s == d {
            return Ok(());
        }
        let overlap = s.0 < d.0 + len as u64 && d.0 < s.0 + len as u64;
        let stream = self.b.stream;
        if overlap {
            // Partially overlapping ranges go through the device ring.
            let at = self.ring_slot(len)?;
            let tmp = self.ring_dev(at);
            // SAFETY: both ranges are inside live device buffers (span and
            // ring_slot checked); the ring slot is ours until the next sync.
            unsafe {
                self.dev()
                    .copy_d2d_async(tmp, s, len, stream)
                    .and_then(|()| self.dev().copy_d2d_async(d, tmp, len, stream))
            }
            .map_err(|e| self.err("copying through the ring", e))
        } else {
            // SAFETY: disjoint live device ranges of `len` bytes (checked).
            unsafe { self.dev().copy_d2d_async(d, s, len, stream) }
                .map_err(|e| self.err("copying on the device", e))
        }
    }

    fn prepare_sends(&self, ops: &[Op], esize: usize) -> Result<()> {
        let mut staged = self.staged.borrow_mut();
        staged.clear();
        let mut total = 0;
        for op in ops {
            if let Op::Send { src, .. } = *op {
                if src.len > 0 && !staged.iter().any(|(r, _)| *r == src) {
                    staged.push((src, total));
                    total += src.len * esize;
                }
            }
        }
        if staged.is_empty() {
            return Ok(());
        }
        let mut st = self.staging.borrow_mut();
        if cap_pinned(&st.send_host) < total {
            st.send_host = None;
            st.send_host = Some(
                PinnedBuffer::new(&self.b.dev, total.max(RING_BYTES))
                    .map_err(|e| self.err("allocating pinned send staging", e))?,
            );
        }
        let host = st.send_host.as_ref().expect("allocated above").as_ptr();
        for &(r, at) in staged.iter() {
            let (src, len) = self.span(r, esize)?;
            // SAFETY: `at + len <= total` fits the pinned staging, which no
            // other enqueued copy uses (the previous step synchronised);
            // `src` is a live device range (span checked).
            unsafe {
                self.dev()
                    .copy_d2h_async(host.add(at), src, len, self.b.stream)
            }
            .map_err(|e| self.err("staging a send", e))?;
        }
        drop(st);
        self.sync("staging the step's sends")
    }

    fn with_ref<R>(&self, r: Region, esize: usize, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        if r.len == 0 {
            return Ok(f(&[]));
        }
        let at = self
            .staged
            .borrow()
            .iter()
            .find(|(s, _)| *s == r)
            .map(|&(_, at)| at)
            .ok_or_else(|| self.invalid(format!("send region {r:?} was not staged")))?;
        let st = self.staging.borrow();
        let host = st.send_host.as_ref().expect("staged regions have staging");
        Ok(f(&host.as_slice()[at..at + r.len * esize]))
    }

    fn write_at(&self, dst: Region, esize: usize, at: usize, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let (d, len) = self.span(dst, esize)?;
        if at + data.len() > len {
            return Err(self.invalid(format!("a piece beyond its region {dst:?}")));
        }
        let slot = self.ring_slot(data.len())?;
        let src = self.fill_slot(slot, data);
        // SAFETY: the slot holds the piece until the next synchronisation
        // (ring_slot synchronises before reuse); `d + at` is a live device
        // range of `data.len()` bytes (checked above).
        unsafe {
            self.dev()
                .copy_h2d_async(d.add(at), src, data.len(), self.b.stream)
        }
        .map_err(|e| self.err("copying a received piece to the device", e))
    }

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
        if data.is_empty() {
            return Ok(());
        }
        let (l, llen) = self.span(local, esize)?;
        let (d, dlen) = self.span(dst, esize)?;
        if at + data.len() > llen.min(dlen) {
            return Err(self.invalid(format!("a piece beyond its region {dst:?}")));
        }
        let slot = self.ring_slot(data.len())?;
        let src = self.fill_slot(slot, data);
        let piece = self.ring_dev(slot);
        let stream = self.b.stream;
        // SAFETY: the pinned slot and its device twin are ours until the
        // next synchronisation; `l + at` and `d + at` are live ranges of
        // `data.len()` bytes (checked); schedules never let a reduction's
        // operand partially overlap its destination.
        unsafe {
            self.dev()
                .copy_h2d_async(piece, src, data.len(), stream)
                .map_err(|e| self.err("copying a received piece to the device", e))?;
            self.dev()
                .reduce_copy(
                    stream,
                    dtype,
                    op,
                    &[l.add(at), piece],
                    &[d.add(at)],
                    data.len() / esize,
                )
                .map_err(|e| self.err("reducing a received piece", e))
        }
    }

    fn divide(&self, region: Region, dtype: DataType, divisor: usize) -> Result<()> {
        let esize = dtype.size();
        let (p, len) = self.span(region, esize)?;
        if len == 0 {
            return Ok(());
        }
        // SAFETY: a live device range of `len` bytes (span checked).
        unsafe {
            self.dev()
                .divide(self.b.stream, dtype, p, len / esize, divisor)
        }
        .map_err(|e| self.err("dividing for avg", e))
    }
}
