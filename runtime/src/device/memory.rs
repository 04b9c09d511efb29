//! [`DeviceMemory`]: the executor's `Memory` over device buffers.
//!
//! The data stays on the device; only what crosses the network crosses the
//! host, through pinned staging, pipelined in chunks:
//!
//! * a step's sends: [`Memory::prepare_sends`] enqueues the device-to-host
//!   copies of the step's send regions into pinned staging in chunks
//!   (growing from [`FIRST_SEND_CHUNK`] to [`MAX_SEND_CHUNK`]), each
//!   followed by a recorded event, and returns at once;
//!   [`Memory::with_piece`] hands a piece to the transport as soon as the
//!   event of the chunk holding its last byte is done (a non-blocking
//!   [`Device::event_done`]), while later chunks are still being copied;
//! * received pieces: copied into a pinned receive ring, then host-to-device
//!   into the destination (plain receive) or into the ring's device twin,
//!   where [`Device::reduce_copy`] folds them with the local region into the
//!   destination. An event recorded after each slot's host-to-device copy
//!   frees the slot: the host reuses a slot only once its event is done
//!   (when the ring is full, waiting until about half of it is free, with
//!   the communicator's timeout as the deadline), so receiving piece k+1 overlaps
//!   piece k's copy and reduction, and the host never overwrites a slot the
//!   device may still read. The device twin needs no such guard: only the
//!   stream uses it, in order;
//! * copies are device-to-device, avg's divide is [`Device::divide`].
//!
//! Everything runs on the communicator's internal stream, in order, so a
//! step's send staging sees the previous steps' reductions. The host waits
//! for the whole stream only at the end of the operation
//! ([`DeviceMemory::finish`]). Staging is allocated once, at device bind
//! ([`Staging::new`]); an operation never allocates or frees.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::exec::Memory;
use ::device::{Device, DeviceBuffer, DeviceError, DevicePtr, EventHandle, PinnedBuffer};
use comm_core::schedule::{BufId, Op, Region};
use comm_core::{DataType, Error, ReduceOp, Result};

use super::errors::device_error;

/// Ring slots start at multiples of this (alignment for any element).
const SLOT_ALIGN: usize = 256;
/// The first send-staging chunk of a step: small, so the first piece can
/// leave early.
pub const FIRST_SEND_CHUNK: usize = 64 << 10;
/// Send-staging chunks double up to this (fewer events on large steps).
pub const MAX_SEND_CHUNK: usize = 1 << 20;

/// A receive-ring slot the device may still read: bytes `start..end` of
/// the pinned ring, free once `event` is done.
#[derive(Clone, Copy, Debug)]
struct Slot {
    start: usize,
    end: usize,
    event: EventHandle,
}

/// Pinned and device staging of a communicator, and the events that
/// pipeline it, allocated once at device bind and reused by every
/// operation: nothing is allocated or freed inside an operation (both
/// synchronise a CUDA device, which deadlocks while a caller's stream waits
/// on the host). Every buffer holds [`Staging::bytes`], the device segment
/// size (`SNCL_DEVICE_STAGING_BYTES`); operations run in segments whose
/// staging fits (`segment.rs`). Its in-flight state outlives a
/// failed operation, so the next one still never overwrites what the
/// device may read.
pub struct Staging {
    send_host: PinnedBuffer,
    ring_host: PinnedBuffer,
    ring_dev: DeviceBuffer,
    scratch: DeviceBuffer,
    /// A segment's send and receive blocks, gathered contiguously where the
    /// caller's blocks are strided (`segment.rs`).
    segment_send: DeviceBuffer,
    segment_recv: DeviceBuffer,
    /// Every event created here (destroyed by [`Staging::release`]).
    events: Vec<EventHandle>,
    /// Events recorded for nothing the host still waits on.
    free_events: Vec<EventHandle>,
    /// The current step's send chunks in stream order: (end offset in send
    /// staging, event recorded after its copy).
    send_chunks: Vec<(usize, EventHandle)>,
    /// `send_chunks[..send_done]` are known to be complete.
    send_done: usize,
    /// Ring slots the device may still read, oldest first.
    ring_busy: VecDeque<Slot>,
}

/// Where a slot of `n` bytes fits in a ring of `cap` bytes given its busy
/// slots (oldest first), or `None` until the oldest is freed. `n <= cap`.
fn fit(busy: &VecDeque<Slot>, n: usize, cap: usize) -> Option<usize> {
    let (Some(front), Some(back)) = (busy.front(), busy.back()) else {
        return Some(0);
    };
    let head = back.end;
    if back.start >= front.start {
        // Busy bytes: front.start..head; free: head..cap, then 0..front.start.
        if head + n <= cap {
            Some(head)
        } else if n <= front.start {
            Some(0)
        } else {
            None
        }
    } else if head + n <= front.start {
        // Wrapped: busy front.start..cap and 0..head.
        Some(head)
    } else {
        None
    }
}

impl Staging {
    /// Allocates every staging buffer, `bytes` long (rounded up to a
    /// multiple of `SLOT_ALIGN` (256)), on `dev`: at device bind, before any
    /// operation.
    pub fn new(dev: &Arc<dyn Device>, bytes: usize) -> ::device::Result<Staging> {
        let bytes = bytes.next_multiple_of(SLOT_ALIGN).max(SLOT_ALIGN);
        Ok(Staging {
            send_host: PinnedBuffer::new(dev, bytes)?,
            ring_host: PinnedBuffer::new(dev, bytes)?,
            ring_dev: DeviceBuffer::new(dev, bytes)?,
            scratch: DeviceBuffer::new(dev, bytes)?,
            segment_send: DeviceBuffer::new(dev, bytes)?,
            segment_recv: DeviceBuffer::new(dev, bytes)?,
            events: Vec::new(),
            free_events: Vec::new(),
            send_chunks: Vec::new(),
            send_done: 0,
            ring_busy: VecDeque::new(),
        })
    }

    /// The size of every staging buffer in bytes.
    pub fn bytes(&self) -> usize {
        self.scratch.bytes()
    }

    /// Bytes held: (pinned host, device) over every staging buffer.
    pub fn held_bytes(&self) -> (usize, usize) {
        let pinned = self.send_host.bytes() + self.ring_host.bytes();
        let device = [
            &self.ring_dev,
            &self.scratch,
            &self.segment_send,
            &self.segment_recv,
        ]
        .iter()
        .map(|b| b.bytes())
        .sum();
        (pinned, device)
    }

    /// The segment buffers (send, receive), each [`Staging::bytes`] long.
    pub fn segment_buffers(&self) -> (DevicePtr, DevicePtr) {
        (self.segment_send.ptr(), self.segment_recv.ptr())
    }

    /// An event for the next record (from the pool, else a new one).
    fn take_event(&mut self, dev: &dyn Device) -> ::device::Result<EventHandle> {
        if let Some(ev) = self.free_events.pop() {
            return Ok(ev);
        }
        let ev = dev.create_event()?;
        self.events.push(ev);
        Ok(ev)
    }

    /// Everything enqueued has completed: every slot and chunk is free.
    fn all_done(&mut self) {
        let slots = self.ring_busy.drain(..).map(|s| s.event);
        self.free_events.extend(slots);
        self.send_done = self.send_chunks.len();
    }

    /// Destroys the staging's events (the buffers go with the value). Only
    /// after the stream was synchronised (at unbind).
    pub fn release(&mut self, dev: &dyn Device) {
        self.free_events.clear();
        self.send_chunks.clear();
        self.ring_busy.clear();
        for ev in std::mem::take(&mut self.events) {
            // SAFETY: created by `take_event` on this device, destroyed once
            // here; the stream that recorded it was synchronised.
            if let Err(e) = unsafe { dev.destroy_event(ev) } {
                tracing::warn!(error = %e, "destroying a staging event failed");
            }
        }
    }
}

/// Who runs an operation, for error messages.
#[derive(Clone, Copy, Debug)]
pub struct OpIds {
    /// This rank.
    pub rank: usize,
    /// The operation's name.
    pub op: &'static str,
    /// Its sequence number on the communicator.
    pub seq: u64,
}

/// One operation's device memory: the caller's send and receive buffers,
/// the communicator's device scratch, and its staging.
pub struct DeviceMemory<'a> {
    ids: OpIds,
    send: (DevicePtr, usize),
    recv: (DevicePtr, usize),
    scratch: (DevicePtr, usize),
    /// A point-to-point group's buffers, [`BufId::Peer`]`(k)` in order.
    peers: Vec<(DevicePtr, usize)>,
    timeout: Duration,
    staging: RefCell<&'a mut Staging>,
    /// Send regions of the current step and their offsets in send staging.
    staged: RefCell<Vec<(Region, usize)>>,
    /// The device and stream, for transports with a device path.
    queue: ::device::DeviceQueue,
}

impl<'a> DeviceMemory<'a> {
    /// `send` and `recv` are the caller's device ranges (address, bytes);
    /// the scratch is `staging`'s.
    pub fn new(
        (dev, stream): (&Arc<dyn Device>, ::device::StreamHandle),
        staging: &'a mut Staging,
        ids: OpIds,
        send: (DevicePtr, usize),
        recv: (DevicePtr, usize),
        timeout: Duration,
    ) -> DeviceMemory<'a> {
        let scratch = (staging.scratch.ptr(), staging.scratch.bytes());
        DeviceMemory {
            ids,
            send,
            recv,
            scratch,
            peers: Vec::new(),
            timeout,
            staging: RefCell::new(staging),
            staged: RefCell::new(Vec::new()),
            queue: ::device::DeviceQueue {
                dev: dev.clone(),
                stream,
            },
        }
    }

    /// Adds the device buffers (address, bytes) of a point-to-point
    /// group, addressed as [`BufId::Peer`]`(k)` in order.
    pub fn with_peer_buffers(mut self, peers: Vec<(DevicePtr, usize)>) -> DeviceMemory<'a> {
        self.peers = peers;
        self
    }

    fn dev(&self) -> &dyn Device {
        &*self.queue.dev
    }

    fn err(&self, what: &str, e: DeviceError) -> Error {
        let ids = &self.ids;
        device_error(ids.rank, &self.queue.dev, (ids.op, Some(ids.seq)), what, e)
    }

    fn invalid(&self, detail: String) -> Error {
        Error::InvalidArgument {
            rank: self.ids.rank,
            op: self.ids.op,
            detail,
        }
    }

    /// Waits for everything enqueued so far (deadline: the timeout); then
    /// every staging slot and chunk is free.
    fn sync(&self, what: &str) -> Result<()> {
        self.dev()
            .synchronize(self.queue.stream, Instant::now() + self.timeout)
            .map_err(|e| self.err(what, e))?;
        self.staging.borrow_mut().all_done();
        Ok(())
    }

    /// Polls `event` until it is done (deadline: the timeout).
    fn wait_event(&self, event: EventHandle, what: &str) -> Result<()> {
        let start = Instant::now();
        let mut rounds = 0u32;
        loop {
            if self
                .dev()
                .event_done(event)
                .map_err(|e| self.err(what, e))?
            {
                return Ok(());
            }
            let waited = start.elapsed();
            if waited >= self.timeout {
                let e = DeviceError::Timeout {
                    ordinal: self.dev().ordinal(),
                    what: what.to_string(),
                    ms: self.timeout.as_millis() as u64,
                };
                return Err(self.err(what, e));
            }
            // Short sleeps rather than yields: a yield on a busy machine may
            // give the core away for a whole time slice.
            rounds += 1;
            if rounds < 8 {
                std::hint::spin_loop();
            } else if waited < Duration::from_millis(20) {
                std::thread::sleep(Duration::from_micros(20));
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }

    /// Records a new event on the stream (after the work enqueued so far).
    fn record(&self, st: &mut Staging, what: &str) -> Result<EventHandle> {
        let ev = st.take_event(self.dev()).map_err(|e| self.err(what, e))?;
        if let Err(e) = self.dev().record_event(ev, self.queue.stream) {
            st.free_events.push(ev);
            return Err(self.err(what, e));
        }
        Ok(ev)
    }

    /// Waits until the operation's device work is complete: the result is
    /// on the device and the staging is free.
    pub fn finish(&self) -> Result<()> {
        self.sync("completing on the device")
    }

    /// The device range of a region (bounds-checked).
    fn span(&self, r: Region, esize: usize) -> Result<(DevicePtr, usize)> {
        let (base, cap) = match r.buf {
            BufId::Send => self.send,
            BufId::Recv => self.recv,
            BufId::Scratch => self.scratch,
            BufId::Peer(k) => *self.peers.get(usize::from(k)).ok_or_else(|| {
                self.invalid(format!(
                    "schedule region {r:?} names point-to-point buffer {k}; the group has {}",
                    self.peers.len()
                ))
            })?,
        };
        let (off, len) = (r.offset * esize, r.len * esize);
        if off + len > cap {
            return Err(self.invalid(format!(
                "schedule region {r:?} exceeds its {cap}-byte device buffer"
            )));
        }
        Ok((base.add(off), len))
    }

    /// A free slot of `n` bytes (`n > 0`) in the receive ring (pinned and
    /// device twins at the same offset): reclaims slots whose events are
    /// done, and waits until about half the ring is free while none fits.
    /// A piece longer than the ring is an error (segments keep every piece
    /// within it, `segment.rs`). The caller fills the slot and
    /// then calls [`DeviceMemory::ring_commit`].
    fn ring_slot(&self, n: usize) -> Result<usize> {
        let cap = self.staging.borrow().ring_host.bytes();
        if n > cap {
            return Err(self.invalid(format!(
                "a piece of {n} bytes is longer than the {cap}-byte receive ring \
                 (SNCL_DEVICE_STAGING_BYTES); the operation's segments should keep it shorter"
            )));
        }
        loop {
            let target = {
                let mut st = self.staging.borrow_mut();
                while let Some(&s) = st.ring_busy.front() {
                    let done = self
                        .dev()
                        .event_done(s.event)
                        .map_err(|e| self.err("checking a receive-ring slot", e))?;
                    if !done {
                        break;
                    }
                    st.ring_busy.pop_front();
                    st.free_events.push(s.event);
                }
                if let Some(at) = fit(&st.ring_busy, n, cap) {
                    return Ok(at);
                }
                // Full: wait until about half the ring is free (slots free
                // in order), so that a device slower than the network costs
                // one wait per half ring rather than one per piece.
                st.ring_busy[st.ring_busy.len() / 2].event
            };
            self.wait_event(target, "waiting for receive-ring slots to be free")?;
        }
    }

    /// Marks slot `at..at + n` busy until the work enqueued so far (its
    /// host-to-device copy) is done.
    fn ring_commit(&self, at: usize, n: usize) -> Result<()> {
        let mut st = self.staging.borrow_mut();
        let event = self.record(&mut st, "recording a receive-ring slot's event")?;
        st.ring_busy.push_back(Slot {
            start: at,
            end: (at + n).next_multiple_of(SLOT_ALIGN),
            event,
        });
        Ok(())
    }

    /// Copies a received piece into ring slot `at` (host side) and returns
    /// the slot's pinned address.
    fn fill_slot(&self, at: usize, data: &[u8]) -> *const u8 {
        let st = self.staging.borrow();
        let ring = &st.ring_host;
        // SAFETY: `at + data.len()` is inside the ring (ring_slot checked);
        // the slot is free (no enqueued copy reads it: its event is done or
        // it was never used), and only this raw range is written, not the
        // slots the device may be reading.
        let dst = unsafe {
            let dst = ring.as_ptr().add(at);
            std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len());
            dst
        };
        comm_core::copies::count_staging_copy(data.len());
        dst
    }

    fn ring_dev(&self, at: usize) -> DevicePtr {
        let st = self.staging.borrow();
        st.ring_dev.ptr().add(at)
    }
}

impl Memory for DeviceMemory<'_> {
    /// A step's staged sends stay in the pinned send staging, unchanged,
    /// until the next step's [`Memory::prepare_sends`], and the executor
    /// drains every send of a step (each connection flushed) before that:
    /// transports may lend them instead of copying them again (issue 36,
    /// risk 9: one host copy per byte on the staged path, not two).
    fn pieces_outlive_step(&self) -> bool {
        true
    }

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
        let stream = self.queue.stream;
        if overlap {
            // Partially overlapping ranges go through the device ring (only
            // the stream uses the device twin, in order; the slot is taken
            // so that the ring is large enough).
            let at = self.ring_slot(len)?;
            let tmp = self.ring_dev(at);
            // SAFETY: both ranges are inside live device buffers (span and
            // ring_slot checked); the device twin is used in stream order.
            unsafe {
                self.dev()
                    .copy_d2d_async(tmp, s, len, stream)
                    .and_then(|()| self.dev().copy_d2d_async(d, tmp, len, stream))
            }
            .map_err(|e| self.err("copying through the ring", e))?;
            self.ring_commit(at, len)
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
        {
            // The previous step's chunks were all sent (the executor drains
            // a step's sends before the next); their events go back.
            let mut guard = self.staging.borrow_mut();
            let st = &mut **guard;
            st.free_events
                .extend(st.send_chunks.drain(..).map(|(_, ev)| ev));
            st.send_done = 0;
        }
        if staged.is_empty() {
            return Ok(());
        }
        let cap = self.staging.borrow().send_host.bytes();
        if total > cap {
            return Err(self.invalid(format!(
                "a step sends {total} bytes, more than the {cap}-byte send staging \
                 (SNCL_DEVICE_STAGING_BYTES); the operation's segments should keep it within"
            )));
        }
        let mut st = self.staging.borrow_mut();
        let host = st.send_host.as_ptr();
        let mut chunk = FIRST_SEND_CHUNK;
        for &(r, at) in staged.iter() {
            let (src, len) = self.span(r, esize)?;
            let mut off = 0;
            while off < len {
                let n = chunk.min(len - off);
                // SAFETY: `at + off + n <= total` fits the pinned staging,
                // which the host reads only up to chunks whose events are
                // done (this step's, recorded below); `src + off` is a live
                // device range of `n` bytes (span checked).
                unsafe {
                    self.dev().copy_d2h_async(
                        host.add(at + off),
                        src.add(off),
                        n,
                        self.queue.stream,
                    )
                }
                .map_err(|e| self.err("staging a send", e))?;
                let ev = self.record(&mut st, "recording a send chunk's event")?;
                st.send_chunks.push((at + off + n, ev));
                off += n;
                chunk = (chunk * 2).min(MAX_SEND_CHUNK);
            }
        }
        Ok(())
    }

    fn with_piece<R>(
        &self,
        r: Region,
        esize: usize,
        at: usize,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>> {
        if len == 0 {
            return Ok(Some(f(&[])));
        }
        let base = self
            .staged
            .borrow()
            .iter()
            .find(|(s, _)| *s == r)
            .map(|&(_, base)| base)
            .ok_or_else(|| self.invalid(format!("send region {r:?} was not staged")))?;
        if at + len > r.len * esize {
            return Err(self.invalid(format!("a piece beyond its send region {r:?}")));
        }
        let (start, end) = (base + at, base + at + len);
        let mut st = self.staging.borrow_mut();
        // The chunk holding the piece's last byte; chunks complete in stream
        // order, so it being done means every earlier one is.
        let i = st.send_chunks.partition_point(|&(e, _)| e < end);
        let Some(&(_, event)) = st.send_chunks.get(i) else {
            return Err(self.invalid(format!("send region {r:?} has no staging chunk")));
        };
        if i >= st.send_done {
            let done = self
                .dev()
                .event_done(event)
                .map_err(|e| self.err("checking a send chunk", e))?;
            if !done {
                return Ok(None);
            }
            st.send_done = i + 1;
        }
        let host = &st.send_host;
        // SAFETY: `start..end` is inside the staging (the region was staged
        // at `base` with `r.len * esize` bytes); the copies that wrote it
        // are complete and nothing writes it again during this step, while
        // the device may still write other chunks (not in this slice).
        let piece = unsafe { std::slice::from_raw_parts(host.as_ptr().add(start), end - start) };
        Ok(Some(f(piece)))
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
        // SAFETY: the slot holds the piece until its event (committed next)
        // is done; `d + at` is a live device range of `data.len()` bytes
        // (checked above).
        unsafe {
            self.dev()
                .copy_h2d_async(d.add(at), src, data.len(), self.queue.stream)
        }
        .map_err(|e| self.err("copying a received piece to the device", e))?;
        self.ring_commit(slot, data.len())
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
        let stream = self.queue.stream;
        // SAFETY: the pinned slot holds the piece until its event (committed
        // right after the copy) is done; its device twin is used in stream
        // order only; `l + at` and `d + at` are live ranges of `data.len()`
        // bytes (checked); schedules never let a reduction's operand
        // partially overlap its destination.
        unsafe {
            self.dev()
                .copy_h2d_async(piece, src, data.len(), stream)
                .map_err(|e| self.err("copying a received piece to the device", e))?;
            // Free the pinned slot as soon as its copy is done, before the
            // reduction runs.
            self.ring_commit(slot, data.len())?;
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

    fn device_queue(&self) -> Option<&dyn std::any::Any> {
        Some(&self.queue)
    }

    fn device_span(&self, r: Region, esize: usize, at: usize, len: usize) -> Result<Option<u64>> {
        let (p, cap) = self.span(r, esize)?;
        if at + len > cap {
            return Err(self.invalid(format!("a piece beyond its region {r:?}")));
        }
        Ok(Some(p.add(at).0))
    }

    fn device_recv(
        &self,
        local: Option<Region>,
        dst: Region,
        esize: usize,
        at: usize,
        src: u64,
        len: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<bool> {
        if len == 0 {
            return Ok(true);
        }
        let (d, dlen) = self.span(dst, esize)?;
        let stream = self.queue.stream;
        let piece = DevicePtr(src);
        match local {
            None => {
                if at + len > dlen {
                    return Err(self.invalid(format!("a piece beyond its region {dst:?}")));
                }
                // SAFETY: `d + at` is a live range of `len` bytes (checked);
                // `piece` is the transport's inbox slot, which it keeps
                // until this stream's work reading it has completed.
                unsafe { self.dev().copy_d2d_async(d.add(at), piece, len, stream) }
                    .map_err(|e| self.err("copying a received piece from the inbox", e))?;
            }
            Some(l) => {
                let (lp, llen) = self.span(l, esize)?;
                if at + len > llen.min(dlen) {
                    return Err(self.invalid(format!("a piece beyond its region {dst:?}")));
                }
                // SAFETY: as above for `piece`; `lp + at` and `d + at` are
                // live ranges of `len` bytes (checked); schedules never let
                // a reduction's operand partially overlap its destination.
                unsafe {
                    self.dev().reduce_copy(
                        stream,
                        dtype,
                        op,
                        &[lp.add(at), piece],
                        &[d.add(at)],
                        len / esize,
                    )
                }
                .map_err(|e| self.err("reducing a received piece from the inbox", e))?;
            }
        }
        Ok(true)
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
                .divide(self.queue.stream, dtype, p, len / esize, divisor)
        }
        .map_err(|e| self.err("dividing for avg", e))
    }
}

#[cfg(test)]
mod tests;
