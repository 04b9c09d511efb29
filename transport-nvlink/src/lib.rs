//! The `nvlink` transport: between two ranks of one node whose devices can
//! reach each other (CUDA IPC and peer access over NVLink or PCIe; two
//! processes on one device too), device pieces go device to device.
//!
//! Version 1, host-driven. Per direction, the receiver owns:
//!
//! * an **inbox** in device memory: `slots` slots of `slot_bytes`,
//!   allocated on its bound device at its first device operation and
//!   exported ([`device::Device::ipc_export`]);
//! * a **board** (a one-slot [`Segment`] in host shared memory) where it
//!   publishes the inbox (backend, PCI bus id, process, geometry, IPC
//!   handle), then its [`Verdict`] on the pair once it has read the
//!   peer's board; both sides use the AND of the two verdicts (`decide`);
//! * a **descriptor ring** (a [`Segment`] of `slots` small slots): one
//!   entry per device piece, holding the piece's header. Its flow control
//!   is the inbox's: entry `k` describes inbox slot `k % slots`, and the
//!   receiver moves the ring's tail past `k` only once the work that read
//!   the slot has completed on its stream (an event), so the sender never
//!   overwrites a slot the receiver's device may still read.
//!
//! The sender enqueues the copy from its memory into the peer's mapped
//! inbox slot on the operation's stream, records an event, and publishes
//! the entry once the event is done (polled in later calls and in
//! [`Connection::flush`], which the executor drains before a step ends).
//! The receiver, on the entry, hands the header and the slot's address to
//! the executor, which checks the header and enqueues the reduction (or
//! copy) from the slot into its memory.
//!
//! Host pieces (operations on host memory, or device memory where the
//! device path cannot be used) travel through an ordinary shared-memory
//! FIFO (`shm`'s connection, single copy included), so an `nvlink`
//! connection carries every operation and costs a host-only run nothing
//! extra: nothing device-related happens before the first device operation. Peer death is found as `shm` finds it (the peer's pid).

use std::collections::VecDeque;
use std::sync::Arc;

use comm_core::transport::registry::MemoryKind;
use comm_core::transport::{
    Connection, ConsumeResult, DeviceRegion, Outgoing, Payload, Space, TransportError,
};
use comm_core::wire::{PieceHeader, HEADER_BYTES};
use comm_core::Error;
use device::{Device, DeviceBuffer, DeviceError, DevicePtr, EventHandle};
use transport_shm::Segment;

mod board;
mod decide;
mod kind;
pub use board::{process_token, Board, Verdict, BOARD_BYTES};
pub use kind::NvlinkKind;

/// Whether a pair must use the device path (`SNCL_NVLINK`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Device to device where both sides can reach each other's device,
    /// else device pieces are staged through the host (logged at INFO).
    Auto,
    /// Device to device, or the first device operation fails with an error
    /// naming what is missing (`SNCL_NVLINK=1`).
    Required,
}

/// Name of the kind (`SNCL_TRANSPORT=nvlink`, stats, logs).
pub const NAME: &str = "nvlink";

/// Bytes of one descriptor-ring slot's payload (an encoded header).
pub const RING_SLOT_BYTES: usize = 64;

static DEVICE_SENT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static DEVICE_RECEIVED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Bytes this process has sent and received device to device over
/// `nvlink` connections, all communicators together (diagnostics and
/// tests; per-communicator bytes are in `Communicator::stats()` under
/// the transport `nvlink`, host and device pieces together).
pub fn device_bytes() -> (u64, u64) {
    (
        DEVICE_SENT.load(std::sync::atomic::Ordering::Relaxed),
        DEVICE_RECEIVED.load(std::sync::atomic::Ordering::Relaxed),
    )
}

/// The operation's device and stream (defined in the `device` crate, so
/// that other device links need not depend on this one).
pub use device::DeviceQueue;

/// The shared-memory objects of one direction, created by its receiver.
pub struct Inbound {
    /// The descriptor ring.
    pub ring: Segment,
    /// The board.
    pub board: Segment,
}

/// Inbox geometry of this side.
#[derive(Clone, Copy, Debug)]
pub struct Geometry {
    /// Slots of the inbox (and entries of the ring).
    pub slots: usize,
    /// Bytes of one inbox slot (the largest device piece).
    pub slot_bytes: usize,
}

/// The device side, once both boards are known.
struct Active {
    dev: Arc<dyn Device>,
    /// This side's inbox (data from the peer).
    inbox: DeviceBuffer,
    /// The peer's inbox as mapped here, and whether we imported it.
    peer_inbox: DevicePtr,
    imported: bool,
    peer_slots: u64,
    peer_slot_bytes: usize,
    /// Unused events.
    free_events: Vec<EventHandle>,
    /// Every event created here (destroyed on drop).
    events: Vec<EventHandle>,
    /// Sent pieces whose copies may still run: header and event (none
    /// for empty pieces), oldest first.
    send_pending: VecDeque<(PieceHeader, Option<EventHandle>)>,
    /// Entries published to the peer's ring; copies enqueued.
    published: u64,
    enqueued: u64,
    /// The peer's ring tail as last read.
    acked: u64,
    /// Received entries whose reading work may still run, oldest first.
    recv_pending: VecDeque<Option<EventHandle>>,
    /// Entries handed to the executor; released (tail); posted (head seen).
    received: u64,
    released: u64,
    posted: u64,
}

enum LinkState {
    /// Our board is not published yet.
    Idle,
    /// Ours is published (the inbox exists); the peer's not seen yet.
    Published {
        dev: Arc<dyn Device>,
        inbox: DeviceBuffer,
    },
    /// The peer's board is read and our verdict published; the peer's
    /// verdict not seen yet.
    Judged(Box<decide::Judged>),
    /// Decided: device pieces go device to device (`Some`), or not.
    Decided(Option<Box<Active>>),
    /// Deciding failed (a device call, a bad board): the error is
    /// returned again; the inbox we published stays allocated until the
    /// connection is dropped, since the peer may have mapped it.
    Failed {
        /// Held, not used: freed with the connection.
        _inbox: DeviceBuffer,
        error: String,
    },
}

/// An `nvlink` connection to one peer.
pub struct NvlinkConnection {
    rank: usize,
    peer: usize,
    host: Box<dyn Connection>,
    inbound: Inbound,
    /// The peer's ring and board (for data from this rank).
    out_ring: Segment,
    out_board: Segment,
    geometry: Geometry,
    comm_id: u64,
    mode: Mode,
    state: LinkState,
    /// An inbox published but not used (staged pair), kept until drop.
    retired: Option<DeviceBuffer>,
}

impl NvlinkConnection {
    /// Joins the host connection (a shared-memory one: `shm`'s, single copy
    /// included) with this side's inbound ring and board and the peer's
    /// (opened with [`Segment::open`]).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        rank: usize,
        peer: usize,
        comm_id: u64,
        host: Box<dyn Connection>,
        inbound: Inbound,
        (out_ring, out_board): (Segment, Segment),
        geometry: Geometry,
        mode: Mode,
    ) -> NvlinkConnection {
        NvlinkConnection {
            rank,
            peer,
            host,
            inbound,
            out_ring,
            out_board,
            geometry,
            comm_id,
            mode,
            state: LinkState::Idle,
            retired: None,
        }
    }

    fn device_err(&self, dev: &dyn Device, what: &str, e: DeviceError) -> Error {
        Error::Device {
            rank: self.rank,
            op: "nvlink transport",
            seq: None,
            device: format!(
                "{} device {} ({})",
                dev.backend().name(),
                dev.ordinal(),
                dev.name()
            ),
            what: format!("{what} (link with peer rank {})", self.peer),
            detail: e.to_string(),
        }
    }

    fn peer_err(&self, source: TransportError) -> Error {
        Error::Transport {
            rank: self.rank,
            source,
        }
    }

    fn corrupt(&self, detail: String) -> Error {
        self.peer_err(TransportError::Corrupt {
            peer: self.peer,
            detail,
        })
    }

    /// Publishes this side's board: allocates and exports the inbox.
    fn publish(&mut self, q: &DeviceQueue) -> Result<(), Error> {
        let g = self.geometry;
        let bytes = g.slots * g.slot_bytes;
        let dev = &q.dev;
        let inbox = DeviceBuffer::new(dev, bytes)
            .map_err(|e| self.device_err(&**dev, "allocating the device inbox", e))?;
        let handle = dev
            .ipc_export(inbox.ptr())
            .map_err(|e| self.device_err(&**dev, "exporting the device inbox", e))?;
        // A device without a bus id is published with none: the peer cannot
        // find it and says so (the pair stages, or fails where required).
        let bus_id = dev.pci_bus_id().unwrap_or_else(|e| {
            tracing::info!(rank = self.rank, error = %e, "nvlink: the device reports no PCI bus id");
            String::new()
        });
        let board = Board {
            backend: dev.backend(),
            ordinal: dev.ordinal(),
            bus_id,
            pid: std::process::id(),
            token: board::process_token(),
            slots: g.slots,
            slot_bytes: g.slot_bytes,
            addr: inbox.ptr().0,
            handle,
        };
        board.publish(&self.inbound.board, self.comm_id);
        tracing::debug!(
            rank = self.rank,
            peer = self.peer,
            backend = dev.backend().name(),
            ordinal = dev.ordinal(),
            bytes,
            "nvlink inbox published"
        );
        self.state = LinkState::Published {
            dev: dev.clone(),
            inbox,
        };
        Ok(())
    }

    /// The device path's state once decided.
    fn active(
        &self,
        dev: Arc<dyn Device>,
        inbox: DeviceBuffer,
        theirs: &Board,
        peer_inbox: DevicePtr,
        imported: bool,
    ) -> Active {
        tracing::debug!(
            rank = self.rank,
            peer = self.peer,
            "nvlink device path ready"
        );
        let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Acquire);
        Active {
            dev,
            inbox,
            peer_inbox,
            imported,
            peer_slots: theirs.slots as u64,
            peer_slot_bytes: theirs.slot_bytes,
            free_events: Vec::new(),
            events: Vec::new(),
            send_pending: VecDeque::new(),
            published: load(self.out_ring.head()),
            enqueued: load(self.out_ring.head()),
            acked: load(self.out_ring.tail()),
            recv_pending: VecDeque::new(),
            received: load(self.inbound.ring.tail()),
            released: load(self.inbound.ring.tail()),
            posted: load(self.inbound.ring.head()),
        }
    }

    /// Publishes sent pieces whose copies completed and releases inbox
    /// slots whose reading work completed.
    fn progress(&mut self) -> Result<(), Error> {
        let LinkState::Decided(Some(a)) = &mut self.state else {
            return Ok(());
        };
        let dev = a.dev.clone();
        let mut failed = None;
        while let Some(&(h, ev)) = a.send_pending.front() {
            if let Some(ev) = ev {
                match dev.event_done(ev) {
                    Ok(true) => a.free_events.push(ev),
                    Ok(false) => break,
                    Err(e) => {
                        failed = Some(("copying a piece into the peer's inbox", e));
                        break;
                    }
                }
            }
            let mut inner = [0u8; HEADER_BYTES];
            h.encode(&mut inner);
            let outer = PieceHeader {
                checksum: None,
                len: HEADER_BYTES as u32,
                ..h
            };
            self.out_ring.write_slot(a.published, &outer, &inner);
            a.published += 1;
            self.out_ring
                .head()
                .store(a.published, std::sync::atomic::Ordering::Release);
            a.send_pending.pop_front();
        }
        while failed.is_none() {
            let Some(&ev) = a.recv_pending.front() else {
                break;
            };
            if let Some(ev) = ev {
                match dev.event_done(ev) {
                    Ok(true) => a.free_events.push(ev),
                    Ok(false) => break,
                    Err(e) => {
                        failed = Some(("reading a piece from the inbox", e));
                        break;
                    }
                }
            }
            a.recv_pending.pop_front();
            a.released += 1;
            self.inbound
                .ring
                .tail()
                .store(a.released, std::sync::atomic::Ordering::Release);
        }
        match failed {
            Some((what, e)) => Err(self.device_err(&*dev, what, e)),
            None => Ok(()),
        }
    }

    fn aborted_by_peer(&self) -> Option<TransportError> {
        let a = self
            .inbound
            .ring
            .abort_by_sender()
            .load(std::sync::atomic::Ordering::Acquire);
        (a != 0).then(|| TransportError::PeerAborted {
            peer: self.peer,
            cause: (a != u64::MAX).then(|| (a - 1) as usize),
        })
    }

    fn queue<'q>(&self, device: &'q dyn std::any::Any) -> Result<&'q DeviceQueue, Error> {
        device
            .downcast_ref::<DeviceQueue>()
            .ok_or_else(|| Error::InvalidArgument {
                rank: self.rank,
                op: "nvlink transport",
                detail: "the operation's device queue is not the device layer's".into(),
            })
    }

    fn take_event(a: &mut Active) -> Result<EventHandle, DeviceError> {
        if let Some(ev) = a.free_events.pop() {
            return Ok(ev);
        }
        let ev = a.dev.create_event()?;
        a.events.push(ev);
        Ok(ev)
    }
}

/// How long dropping a connection waits for its copies and reductions
/// still on the device (after a failed operation) before it unmaps and
/// frees the memory they use.
const DRAIN_ON_DROP: std::time::Duration = std::time::Duration::from_secs(5);

impl Drop for Active {
    fn drop(&mut self) {
        // Work still queued (a failed operation leaves some) reads our
        // inbox or writes the peer's: wait for it, bounded, before the
        // memory goes away.
        let deadline = std::time::Instant::now() + DRAIN_ON_DROP;
        let pending: Vec<EventHandle> = self
            .send_pending
            .iter()
            .filter_map(|(_, e)| *e)
            .chain(self.recv_pending.iter().filter_map(|e| *e))
            .collect();
        for ev in pending {
            while !matches!(self.dev.event_done(ev), Ok(true) | Err(_)) {
                if std::time::Instant::now() >= deadline {
                    tracing::warn!(
                        "nvlink: device work of a dropped connection still runs after {DRAIN_ON_DROP:?}; freeing its memory anyway"
                    );
                    break;
                }
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
        for ev in self.events.drain(..) {
            // SAFETY: created here on this device; destroyed once.
            if let Err(e) = unsafe { self.dev.destroy_event(ev) } {
                tracing::warn!(error = %e, "destroying an nvlink event failed");
            }
        }
        if self.imported {
            // SAFETY: imported once in `decide`; the communicator's work is
            // complete or failed when its connections are dropped.
            if let Err(e) = unsafe { self.dev.ipc_close(self.peer_inbox) } {
                tracing::warn!(error = %e, "closing the peer's nvlink inbox failed");
            }
        }
    }
}

/// The device side of the [`Connection`] methods.
impl NvlinkConnection {
    /// [`Connection::ready`]: publishes this side, decides the pair's path.
    fn device_ready(&mut self, device: &dyn std::any::Any) -> Result<Option<bool>, Error> {
        let q = self.queue(device)?;
        if matches!(self.state, LinkState::Idle) {
            let q = q.clone();
            self.publish(&q)?;
        }
        if matches!(
            self.state,
            LinkState::Published { .. } | LinkState::Judged(_)
        ) && !self.decide()?
        {
            if let Some(e) = self.aborted_by_peer() {
                return Err(self.peer_err(e));
            }
            return Ok(None);
        }
        match &self.state {
            LinkState::Decided(Some(a)) => {
                if !Arc::ptr_eq(&a.dev, &q.dev)
                    && (a.dev.backend(), a.dev.ordinal()) != (q.dev.backend(), q.dev.ordinal())
                {
                    return Err(Error::InvalidArgument {
                        rank: self.rank,
                        op: "nvlink transport",
                        detail: format!(
                            "the link with peer rank {} is set up on {} device {}; this operation runs on {} device {}",
                            self.peer, a.dev.backend().name(), a.dev.ordinal(), q.dev.backend().name(), q.dev.ordinal()
                        ),
                    });
                }
                Ok(Some(true))
            }
            _ => Ok(Some(false)),
        }
    }

    fn max_device_piece(&self) -> usize {
        match &self.state {
            LinkState::Decided(Some(a)) => a.peer_slot_bytes.min(self.geometry.slot_bytes),
            _ => self.geometry.slot_bytes,
        }
    }

    /// [`Connection::try_post_send`] of a device region: a device-to-device
    /// copy into the peer's inbox slot, enqueued on the region's stream.
    fn send_device(
        &mut self,
        header: &PieceHeader,
        region: DeviceRegion<'_>,
    ) -> Result<bool, Error> {
        let stream = self.queue(region.queue)?.stream;
        let src = region.addr;
        self.progress()?;
        let peer = self.peer;
        let aborted = self.aborted_by_peer();
        let LinkState::Decided(Some(a)) = &mut self.state else {
            return Err(Error::InvalidArgument {
                rank: self.rank,
                op: "nvlink transport",
                detail: format!("no device path to peer rank {peer}"),
            });
        };
        let len = header.len as usize;
        if len > a.peer_slot_bytes {
            let n = a.peer_slot_bytes;
            return Err(Error::InvalidArgument {
                rank: self.rank,
                op: "nvlink transport",
                detail: format!("a device piece of {len} bytes exceeds peer rank {peer}'s inbox slot of {n} bytes"),
            });
        }
        if a.enqueued - a.acked >= a.peer_slots {
            a.acked = self
                .out_ring
                .tail()
                .load(std::sync::atomic::Ordering::Acquire);
            if a.enqueued - a.acked >= a.peer_slots {
                if let Some(e) = aborted {
                    return Err(self.peer_err(e));
                }
                return Ok(false);
            }
        }
        let ev = if len > 0 {
            let slot = (a.enqueued % a.peer_slots) as usize;
            let dst = a.peer_inbox.add(slot * a.peer_slot_bytes);
            let dev = a.dev.clone();
            // SAFETY: `dst` is a slot of the peer's mapped inbox (slot <
            // slots, len <= slot bytes), free: the peer released it (its
            // ring tail passed it) after the work reading it completed;
            // `src` is a live range of the operation's memory
            // (Memory::device_span checked it).
            let r =
                unsafe { dev.copy_d2d_async(dst, DevicePtr(src), len, stream) }.and_then(|()| {
                    let ev = Self::take_event(a)?;
                    dev.record_event(ev, stream).map(|()| ev)
                });
            match r {
                Ok(ev) => Some(ev),
                Err(e) => {
                    return Err(self.device_err(&*dev, "copying a piece into the peer's inbox", e))
                }
            }
        } else {
            None
        };
        a.send_pending.push_back((*header, ev));
        a.enqueued += 1;
        DEVICE_SENT.fetch_add(len as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(true)
    }

    /// The device half of [`Connection::flush`]: publishes the headers of
    /// pieces whose copies completed.
    fn flush_device(&mut self) -> Result<bool, Error> {
        self.progress()?;
        let pending = match &self.state {
            LinkState::Decided(Some(a)) => !a.send_pending.is_empty(),
            _ => false,
        };
        if pending {
            if let Some(e) = self.aborted_by_peer() {
                return Err(self.peer_err(e));
            }
        }
        Ok(!pending)
    }

    /// [`Connection::try_recv`] of a device piece: handed over as the inbox
    /// slot's region.
    fn recv_device(
        &mut self,
        device: &dyn std::any::Any,
        consume: &mut dyn FnMut(&PieceHeader, Payload<'_>) -> ConsumeResult,
    ) -> Result<bool, Error> {
        let stream = self.queue(device)?.stream;
        self.progress()?;
        let aborted = self.aborted_by_peer();
        let (rank, peer) = (self.rank, self.peer);
        let LinkState::Decided(Some(a)) = &mut self.state else {
            return Err(Error::InvalidArgument {
                rank,
                op: "nvlink transport",
                detail: format!("no device path from peer rank {peer}"),
            });
        };
        if a.received == a.posted {
            a.posted = self
                .inbound
                .ring
                .head()
                .load(std::sync::atomic::Ordering::Acquire);
            if a.received == a.posted {
                if let Some(e) = aborted {
                    return Err(Error::Transport { rank, source: e });
                }
                return Ok(false);
            }
        }
        let corrupt = |detail: String| Error::Transport {
            rank,
            source: TransportError::Corrupt { peer, detail },
        };
        let (_, payload) = self
            .inbound
            .ring
            .read_inline_slot(a.received)
            .map_err(|d| corrupt(format!("nvlink descriptor: {d}")))?;
        let inner: &[u8; HEADER_BYTES] = payload
            .get(..HEADER_BYTES)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| corrupt("nvlink descriptor shorter than a header".into()))?;
        let h = PieceHeader::decode(inner)
            .map_err(|e| corrupt(format!("nvlink descriptor: {}", e.0)))?;
        let g = self.geometry;
        if h.len as usize > g.slot_bytes {
            return Err(corrupt(format!(
                "nvlink descriptor of a {}-byte piece; inbox slots hold {}",
                h.len, g.slot_bytes
            )));
        }
        let slot = (a.received % g.slots as u64) as usize;
        let src = a.inbox.ptr().add(slot * g.slot_bytes);
        let region = DeviceRegion {
            queue: device,
            addr: src.0,
            len: h.len as usize,
        };
        consume(&h, Payload::Device(region))?;
        let ev = if h.len > 0 {
            let dev = a.dev.clone();
            let r = Self::take_event(a).and_then(|ev| dev.record_event(ev, stream).map(|()| ev));
            match r {
                Ok(ev) => Some(ev),
                Err(e) => {
                    let ordinal = dev.ordinal();
                    return Err(Error::Device {
                        rank,
                        op: "nvlink transport",
                        seq: None,
                        device: format!("{} device {ordinal}", dev.backend().name()),
                        what: format!(
                            "recording an inbox slot's event (link with peer rank {peer})"
                        ),
                        detail: e.to_string(),
                    });
                }
            }
        } else {
            None
        };
        a.recv_pending.push_back(ev);
        a.received += 1;
        DEVICE_RECEIVED.fetch_add(h.len as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(true)
    }
}

impl Connection for NvlinkConnection {
    fn peer(&self) -> usize {
        self.peer
    }

    /// The host connection's, this side's descriptor ring and board, and
    /// the device inbox while this side holds one.
    fn footprint(&self, report: &mut comm_core::transport::footprint::FootprintReport<'_>) {
        use comm_core::transport::footprint::{Purpose, Residence};
        self.host.footprint(report);
        let rings = self.inbound.ring.mapped_bytes() + self.inbound.board.mapped_bytes();
        report(Purpose::Fifo, Residence::Shared, rings as u64);
        let inbox = match &self.state {
            LinkState::Idle | LinkState::Decided(None) => 0,
            _ => self.geometry.slots * self.geometry.slot_bytes,
        };
        let retired = self.retired.as_ref().map_or(0, |b| b.bytes());
        report(Purpose::Fifo, Residence::Device, (inbox + retired) as u64);
    }

    fn memory_kinds(&self) -> &'static [MemoryKind] {
        &[MemoryKind::Host, MemoryKind::Device]
    }

    fn max_piece(&self, kind: MemoryKind) -> usize {
        match kind {
            MemoryKind::Host => self.host.max_piece(kind),
            MemoryKind::Device => self.max_device_piece(),
        }
    }

    fn ready(&mut self, device: &dyn std::any::Any) -> Result<Option<bool>, Error> {
        self.device_ready(device)
    }

    /// Host pieces (lent ones included) go over the host connection,
    /// device regions into the peer's device inbox.
    fn try_post_send(&mut self, header: &PieceHeader, piece: Outgoing<'_>) -> Result<bool, Error> {
        match piece.payload() {
            Payload::Host(_) => self.host.try_post_send(header, piece),
            Payload::Device(region) => self.send_device(header, region),
        }
    }

    fn try_recv(
        &mut self,
        space: Space<'_>,
        consume: &mut dyn FnMut(&PieceHeader, Payload<'_>) -> ConsumeResult,
    ) -> Result<bool, Error> {
        match space {
            Space::Host => self.host.try_recv(space, consume),
            Space::Device(queue) => self.recv_device(queue, consume),
        }
    }

    fn flush(&mut self) -> Result<bool, Error> {
        let host = self.host.flush()?;
        let device = self.flush_device()?;
        Ok(host && device)
    }

    fn check_alive(&mut self) -> Result<(), TransportError> {
        self.host.check_alive()?;
        if let Some(e) = self.aborted_by_peer() {
            return Err(e);
        }
        Ok(())
    }

    fn abort(&mut self, cause: Option<usize>) {
        self.host.abort(cause);
        let w = cause.map(|c| c as u64 + 1).unwrap_or(u64::MAX);
        self.out_ring
            .abort_by_sender()
            .store(w, std::sync::atomic::Ordering::Release);
    }

    fn kind(&self) -> &'static str {
        NAME
    }
}
