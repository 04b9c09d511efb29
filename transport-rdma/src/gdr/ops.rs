//! The GPUDirect operations of a [`ConnState`]: deciding the device
//! path with the peer through the boards, sending device pieces, consuming
//! them and returning their credits (the design is described in the parent
//! module, [`super`]). A child of the GPUDirect state's module so that it
//! reads that state's fields directly.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use comm_core::transport::{ConsumeResult, DeviceRegion, Payload, TransportError};
use comm_core::wire::{PieceHeader, HEADER_BYTES};
use comm_core::Error;
use device::{Device, DeviceBuffer, DevicePtr, DeviceQueue};

use crate::conn::{ConnState, CONTROL_WR_ID, GDR_TAG, IMM_BOARD, SQ_RESERVE};
use crate::devregs::{DevRegs, DeviceRoute};
use crate::gdr_board::{Board, BOARD_BYTES};
use crate::verbs::{Mr, SendWr};

use super::{
    describe, queue_of, Active, Inbox, Queued, State, BOUNCED, BOUNCED_LOGGED, OP, RECEIVED, SENT,
    STAGED_LOGGED,
};

impl ConnState {
    /// Whether pieces to and from the peer go device to device (tests,
    /// diagnostics): `None` before the first device operation decided it.
    pub(crate) fn gdr_active(&self) -> Option<bool> {
        match &self.gdr.state {
            State::Decided(a) => Some(a.is_some()),
            State::Failed(_) => Some(false),
            _ => None,
        }
    }

    /// Device-memory registrations this connection made (dma-buf).
    pub(crate) fn gdr_registrations(&self) -> u64 {
        self.gdr.registrations()
    }

    fn device_err(&self, dev: &dyn Device, what: &str, e: impl std::fmt::Display) -> Error {
        Error::Device {
            rank: self.rank,
            op: OP,
            seq: None,
            device: describe(dev),
            what: format!(
                "{what} (link with peer rank {} on {})",
                self.peer, self.device
            ),
            detail: e.to_string(),
        }
    }

    fn te(&self, e: TransportError) -> Error {
        self.transport_err(e)
    }

    fn corrupt(&self, detail: String) -> Error {
        self.te(TransportError::Corrupt {
            peer: self.peer,
            detail,
        })
    }

    pub(crate) fn dev_slot(&self) -> usize {
        self.slot_bytes - HEADER_BYTES
    }

    /// How this side registers device memory: dma-buf where the device
    /// exports it and the verbs library takes it, else nvidia-peermem where
    /// the kernel has it; else why neither.
    fn device_route(&self, dev: &dyn Device) -> Result<DeviceRoute, String> {
        let device_exports = match dev.dmabuf_supported() {
            Ok(true) => Ok(()),
            Ok(false) => Err(format!(
                "{} does not export its memory as dma-buf (CUDA: \
                 CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0; it needs the open GPU kernel modules \
                 and Linux 5.12 or newer)",
                describe(dev)
            )),
            Err(e) => Err(format!("asking {} for dma-buf support: {e}", describe(dev))),
        };
        let dmabuf = device_exports.and_then(|()| {
            if self.dev.supports_dmabuf() {
                Ok(())
            } else {
                Err(format!(
                    "the verbs library of {} has no ibv_reg_dmabuf_mr (rdma-core 34 or newer has)",
                    self.device
                ))
            }
        });
        match dmabuf {
            Ok(()) => Ok(DeviceRoute::DmaBuf),
            Err(_) if self.dev.supports_peermem() => Ok(DeviceRoute::PeerMem),
            Err(why) => Err(format!(
                "{why}; and nvidia-peermem, the other route, is not loaded \
                 (/sys/module/nvidia_peermem)"
            )),
        }
    }

    /// This side's verdict: its registered inbox, or why it cannot.
    fn local_verdict(&mut self, q: &DeviceQueue) -> Result<Inbox, String> {
        if self.gdr.setting == Some(false) {
            return Err("SNCL_IB_GDR=0".into());
        }
        let dev = &q.dev;
        let route = self.device_route(&**dev)?;
        // Writes the device does not order must be flushed before use:
        // this side takes part only if it can flush (tried once here).
        let needs_flush = dev.gpudirect_flush_needed().map_err(|e| {
            format!(
                "asking {} for its GPUDirect write ordering: {e}",
                describe(&**dev)
            )
        })?;
        if needs_flush {
            dev.flush_gpudirect_writes().map_err(|e| {
                format!(
                    "{} does not order GPUDirect writes with its own work and cannot flush them: {e}",
                    describe(&**dev)
                )
            })?;
        }
        let bytes = self.slots * self.dev_slot();
        let mut registered = |what: &str| -> Result<(DeviceBuffer, Mr), String> {
            let buf = DeviceBuffer::new(dev, bytes)
                .map_err(|e| format!("allocating a {bytes}-byte device {what}: {e}"))?;
            let mr = route
                .register(&**dev, &mut *self.dev, buf.ptr().0, bytes)
                .map_err(|e| format!("registering the device {what} ({}): {e}", route.name()))?;
            Ok((buf, mr))
        };
        let (buf, mr) = registered("inbox")?;
        let (bounce, bounce_mr) = match registered("send bounce") {
            Ok(b) => b,
            Err(why) => {
                if let Err(e) = self.dev.dereg_user_mr(&mr) {
                    tracing::warn!("deregistering the GPUDirect inbox failed: {e}");
                }
                return Err(why);
            }
        };
        Ok(Inbox {
            route,
            dev: dev.clone(),
            buf,
            mr,
            needs_flush,
            bounce,
            bounce_mr,
        })
    }

    /// Decides this side's verdict and writes it into the peer's board;
    /// `Ok(false)` while the send queue has no room for it.
    fn gdr_publish(&mut self, q: &DeviceQueue) -> Result<bool, Error> {
        if !self.sq_room(0, 1) {
            return Ok(false);
        }
        let (local, reason) = match self.local_verdict(q) {
            Ok(i) => (Some(i), String::new()),
            Err(why) => (None, why),
        };
        let board = Board {
            yes: local.is_some(),
            inbox: local.as_ref().map_or((0, 0, 0), |i| {
                (i.buf.ptr().0, i.mr.rkey, i.buf.bytes() as u64)
            }),
            reason: reason.clone(),
        };
        let raw = board.encode();
        self.gdr.board.write(BOARD_BYTES, &[&raw]);
        let wr = SendWr {
            signaled: true,
            wr_id: CONTROL_WR_ID,
            local: (
                self.gdr.board_mr.addr + BOARD_BYTES as u64,
                raw.len() as u32,
                self.gdr.board_mr.lkey,
            ),
            remote_addr: self.gdr.remote_board.0,
            rkey: self.gdr.remote_board.1,
            imm: Some((IMM_BOARD << 30) | raw.len() as u32),
        };
        self.gdr.state = State::Published { local };
        self.post(0, wr).map_err(|e| self.te(e))?;
        tracing::debug!(rank = self.rank, peer = self.peer, yes = board.yes, %reason, "rdma GPUDirect verdict published");
        if self.gdr.setting == Some(true) && !board.yes {
            let msg = format!(
                "SNCL_IB_GDR=1 but this rank cannot use GPUDirect RDMA with peer rank {}: {reason}",
                self.peer
            );
            self.gdr.state = State::Failed(msg);
        }
        Ok(true)
    }

    /// Reads the peer's board and decides (both yes: device to device).
    fn gdr_decide(&mut self) -> Result<(), Error> {
        let theirs = Board::decode(self.gdr.board.read(0, BOARD_BYTES))
            .map_err(|d| self.corrupt(format!("peer rank {}: {d}", self.peer)))?;
        let State::Published { local } = std::mem::replace(&mut self.gdr.state, State::Idle) else {
            return Ok(());
        };
        match local {
            Some(inbox) if theirs.yes => {
                if theirs.inbox.2 != inbox.buf.bytes() as u64 {
                    let mine = inbox.buf.bytes();
                    self.gdr.state = State::Published { local: Some(inbox) };
                    return Err(self.corrupt(format!(
                        "the peer's GPUDirect inbox has {} bytes, this rank's {mine}: the FIFO geometry differs",
                        theirs.inbox.2
                    )));
                }
                tracing::debug!(
                    rank = self.rank,
                    peer = self.peer,
                    "rdma GPUDirect path ready"
                );
                self.gdr.state = State::Decided(Some(Box::new(Active {
                    inbox,
                    peer_inbox: (theirs.inbox.0, theirs.inbox.1),
                    regs: DevRegs::default(),
                    events: Vec::new(),
                    free_events: Vec::new(),
                    queue: VecDeque::new(),
                    recv_pending: VecDeque::new(),
                    flushed_below: 0,
                })));
                Ok(())
            }
            local => {
                let mine = match &local {
                    Some(_) => "ready".to_string(),
                    None => "cannot".to_string(),
                };
                // The peer writes into our inbox only if both said yes.
                if let Some(i) = local {
                    for mr in [&i.mr, &i.bounce_mr] {
                        if let Err(e) = self.dev.dereg_user_mr(mr) {
                            tracing::warn!(
                                "deregistering an unused GPUDirect inbox or bounce failed: {e}"
                            );
                        }
                    }
                }
                let peer_why = if theirs.yes {
                    "ready".to_string()
                } else {
                    theirs.reason.clone()
                };
                if self.gdr.setting == Some(true) {
                    let msg = format!(
                        "SNCL_IB_GDR=1 but peer rank {} cannot use GPUDirect RDMA: {peer_why}",
                        self.peer
                    );
                    self.gdr.state = State::Failed(msg.clone());
                    return Err(Error::InvalidArgument {
                        rank: self.rank,
                        op: OP,
                        detail: msg,
                    });
                }
                if !STAGED_LOGGED.swap(true, Ordering::Relaxed) {
                    tracing::info!(
                        rank = self.rank,
                        peer = self.peer,
                        this_rank = %mine,
                        peer_rank = %peer_why,
                        "rdma: GPUDirect RDMA is not usable between this pair; device pieces are staged through host memory (logged once)"
                    );
                }
                self.gdr.state = State::Decided(None);
                Ok(())
            }
        }
    }

    /// Posts queued device pieces whose data is ready, in order.
    pub(crate) fn gdr_post_ready(&mut self) -> Result<(), Error> {
        let dev_slot = self.dev_slot();
        loop {
            let State::Decided(Some(a)) = &mut self.gdr.state else {
                return Ok(());
            };
            let Some(front) = a.queue.front() else {
                return Ok(());
            };
            if let Some(ev) = front.ev {
                match a.inbox.dev.event_done(ev) {
                    Ok(true) => {}
                    Ok(false) => return Ok(()),
                    Err(e) => {
                        let dev = a.inbox.dev.clone();
                        return Err(self.device_err(&*dev, "producing a device piece", e));
                    }
                }
            }
            let q = (front.k % self.qps.len() as u64) as usize;
            if !self.sq_room(q, SQ_RESERVE + 1) {
                return Ok(());
            }
            let State::Decided(Some(a)) = &mut self.gdr.state else {
                return Ok(());
            };
            let piece = a.queue.pop_front().expect("looked at");
            if let Some(ev) = piece.ev {
                a.free_events.push(ev);
            }
            let len = piece.header.len as usize;
            let slot = (piece.k % self.slots as u64) as usize;
            let payload = SendWr {
                signaled: true,
                wr_id: GDR_TAG | piece.k,
                local: (piece.src, len as u32, piece.lkey),
                remote_addr: a.peer_inbox.0 + (slot * dev_slot) as u64,
                rkey: a.peer_inbox.1,
                imm: None,
            };
            // The payload and the header that announces it as one chain:
            // one doorbell per piece.
            let header = self.stage_piece(piece.k, &piece.header, &[], HEADER_BYTES);
            if len > 0 {
                // Counted first, as lent pieces are: a failed post breaks
                // the connection, whose drain ends the count.
                self.gdr.in_flight += 1;
                self.post_chain(q, &mut [payload, header])
                    .map_err(|e| self.te(e))?;
            } else {
                self.post(q, header).map_err(|e| self.te(e))?;
            }
        }
    }

    fn no_path(&self) -> Error {
        Error::InvalidArgument {
            rank: self.rank,
            op: OP,
            detail: format!("no GPUDirect RDMA path with peer rank {}", self.peer),
        }
    }
}

/// The device side of [`comm_core::transport::Connection`]'s methods.
impl ConnState {
    /// `Connection::ready`: decides the pair's GPUDirect path.
    pub(crate) fn gdr_ready(&mut self, device: &dyn std::any::Any) -> Result<Option<bool>, Error> {
        let q = queue_of(self.rank, device)?.clone();
        self.progress().map_err(|e| self.te(e))?;
        if matches!(self.gdr.state, State::Idle) && !self.gdr_publish(&q)? {
            return Ok(None);
        }
        if matches!(self.gdr.state, State::Published { .. }) {
            if !self.gdr.board_arrived {
                self.check_left().map_err(|e| self.te(e))?;
                if let Some(cause) = self.peer_aborted {
                    return Err(self.te(TransportError::PeerAborted {
                        peer: self.peer,
                        cause,
                    }));
                }
                return Ok(None);
            }
            self.gdr_decide()?;
        }
        match &self.gdr.state {
            State::Failed(msg) => Err(Error::InvalidArgument {
                rank: self.rank,
                op: OP,
                detail: msg.clone(),
            }),
            State::Decided(Some(a)) => {
                let d = &a.inbox.dev;
                if !Arc::ptr_eq(d, &q.dev)
                    && (d.backend(), d.ordinal()) != (q.dev.backend(), q.dev.ordinal())
                {
                    return Err(Error::InvalidArgument {
                        rank: self.rank,
                        op: OP,
                        detail: format!(
                            "the GPUDirect path with peer rank {} is set up on {}; this operation runs on {}",
                            self.peer,
                            describe(&**d),
                            describe(&*q.dev)
                        ),
                    });
                }
                Ok(Some(true))
            }
            _ => Ok(Some(false)),
        }
    }

    /// `Connection::try_post_send` of a device region.
    pub(crate) fn gdr_send(
        &mut self,
        header: &PieceHeader,
        region: DeviceRegion<'_>,
    ) -> Result<bool, Error> {
        let stream = queue_of(self.rank, region.queue)?.stream;
        let src = region.addr;
        self.progress().map_err(|e| self.te(e))?;
        self.check_left().map_err(|e| self.te(e))?;
        self.gdr_post_ready()?;
        let (len, dev_slot) = (header.len as usize, self.dev_slot());
        if len > dev_slot {
            return Err(Error::InvalidArgument {
                rank: self.rank,
                op: OP,
                detail: format!(
                    "a device piece of {len} bytes exceeds peer rank {}'s inbox slot of {} bytes",
                    self.peer, dev_slot
                ),
            });
        }
        if !matches!(self.gdr.state, State::Decided(Some(_))) {
            return Err(self.no_path());
        }
        if !self.fifo_room().map_err(|e| self.te(e))? {
            return Ok(false);
        }
        let State::Decided(Some(a)) = &mut self.gdr.state else {
            return Err(self.no_path());
        };
        let dev = a.inbox.dev.clone();
        let k = self.sent;
        let bounce_slot = a
            .inbox
            .bounce
            .ptr()
            .add((k % self.slots as u64) as usize * dev_slot);
        let bounce_lkey = a.inbox.bounce_mr.lkey;
        let (source, ev) = if len > 0 {
            let source = match a
                .regs
                .lookup((&*dev, a.inbox.route), &mut *self.dev, src, len)
            {
                Ok(lkey) => Ok((src, lkey)),
                Err(why) => {
                    // The slot is free: its last user, piece k - slots,
                    // has had its payload read. `fifo_room` let piece k in
                    // only once the header WRITE of piece k - slots (its
                    // staging slot's reader) was retired by a completion,
                    // and that header is chained after the payload on the
                    // same QP, so the payload WRITE is retired too (a
                    // credit alone would not do: a retransmission reads the
                    // source again).
                    // SAFETY: the source is the caller's live device range
                    // of `len` bytes (the region's contract), the slot
                    // `len` ≤ `dev_slot` bytes of the bounce buffer; the
                    // event recorded below orders the write after the copy.
                    unsafe { dev.copy_d2d_async(bounce_slot, DevicePtr(src), len, stream) }
                        .map(|()| {
                            if !BOUNCED_LOGGED.swap(true, Ordering::Relaxed) {
                                tracing::info!(
                                    rank = self.rank,
                                    peer = self.peer,
                                    reason = %why,
                                    "rdma GPUDirect: a device buffer does not register; its \
                                     pieces are copied into a registered device bounce buffer"
                                );
                            }
                            BOUNCED.fetch_add(len as u64, Ordering::Relaxed);
                            (bounce_slot.0, bounce_lkey)
                        })
                        .map_err(|e| format!("{why}; copying it into the bounce buffer: {e}"))
                }
            };
            let ev = a
                .take_event()
                .and_then(|ev| dev.record_event(ev, stream).map(|()| ev));
            (source, Some(ev))
        } else {
            (Ok((src, 0)), None)
        };
        let (src, lkey) = match source {
            Ok(s) => s,
            Err(e) => {
                if let (Some(Ok(ev)), State::Decided(Some(a))) = (ev, &mut self.gdr.state) {
                    // Recorded, never waited for: free for a later piece
                    // (recording again overwrites it).
                    a.free_events.push(ev);
                }
                return Err(self.device_err(
                    &*dev,
                    "registering device memory for GPUDirect RDMA",
                    e,
                ));
            }
        };
        let ev = match ev {
            Some(Ok(ev)) => Some(ev),
            Some(Err(e)) => return Err(self.device_err(&*dev, "recording a piece's event", e)),
            None => None,
        };
        let State::Decided(Some(a)) = &mut self.gdr.state else {
            return Err(self.no_path());
        };
        a.queue.push_back(Queued {
            k,
            header: *header,
            src,
            lkey,
            ev,
        });
        self.sent += 1;
        SENT.fetch_add(len as u64, Ordering::Relaxed);
        self.gdr_post_ready()?;
        Ok(true)
    }

    /// The device half of `Connection::flush`: `Ok(true)` when no device
    /// piece is queued or its payload write in flight.
    pub(crate) fn gdr_flush(&mut self) -> Result<bool, Error> {
        if !matches!(self.gdr.state, State::Decided(Some(_))) && self.gdr.in_flight == 0 {
            return Ok(true);
        }
        self.progress().map_err(|e| self.te(e))?;
        self.gdr_post_ready()?;
        let queued = match &self.gdr.state {
            State::Decided(Some(a)) => !a.queue.is_empty(),
            _ => false,
        };
        let pending = queued || self.gdr.in_flight > 0;
        if pending {
            self.check_left().map_err(|e| self.te(e))?;
            if let Some(cause) = self.peer_aborted {
                return Err(self.te(TransportError::PeerAborted {
                    peer: self.peer,
                    cause,
                }));
            }
        } else if let State::Decided(Some(a)) = &mut self.gdr.state {
            // Nothing reads a registration now: drop stale ones.
            a.regs.idle(&mut *self.dev);
        }
        Ok(!pending)
    }

    /// `Connection::try_recv` of a device piece: handed over as the inbox
    /// slot's region.
    pub(crate) fn gdr_recv(
        &mut self,
        device: &dyn std::any::Any,
        consume: &mut dyn FnMut(&PieceHeader, Payload<'_>) -> ConsumeResult,
    ) -> Result<bool, Error> {
        let stream = queue_of(self.rank, device)?.stream;
        let progressed = self.progress();
        // Sends on this connection move on too (as nvlink's do).
        if progressed.is_ok() {
            self.gdr_post_ready()?;
        }
        let slot = (self.received % self.slots as u64) as usize;
        let Some(bytes) = self.arrived[slot] else {
            // Pieces that arrived before an error are still delivered.
            progressed.map_err(|e| self.te(e))?;
            self.check_left().map_err(|e| self.te(e))?;
            if let Some(cause) = self.peer_aborted {
                return Err(self.te(TransportError::PeerAborted {
                    peer: self.peer,
                    cause,
                }));
            }
            return Ok(false);
        };
        if bytes != HEADER_BYTES {
            return Err(self.corrupt(format!(
                "slot {slot}: a host piece of {} payload bytes arrived where a device piece was \
                 expected (does the peer run this operation on host memory?)",
                bytes - HEADER_BYTES
            )));
        }
        let off = slot * self.slot_bytes;
        let raw: &[u8; HEADER_BYTES] = self
            .fifo
            .read(off, HEADER_BYTES)
            .try_into()
            .expect("HEADER_BYTES");
        let h = PieceHeader::decode(raw).map_err(|e| self.corrupt(format!("slot {slot}: {e}")))?;
        let dev_slot = self.dev_slot();
        if h.len as usize > dev_slot {
            return Err(self.corrupt(format!(
                "slot {slot}: a device piece of {} bytes; inbox slots hold {dev_slot}",
                h.len
            )));
        }
        let arrived = self.arrived.iter().filter(|a| a.is_some()).count() as u64;
        let State::Decided(Some(a)) = &mut self.gdr.state else {
            return Err(self.no_path());
        };
        if a.inbox.needs_flush && self.received >= a.flushed_below {
            // Every piece that has arrived so far (its completion was
            // polled) is visible to the device's work after this.
            let dev = a.inbox.dev.clone();
            if let Err(e) = dev.flush_gpudirect_writes() {
                return Err(self.device_err(&*dev, "flushing GPUDirect writes", e));
            }
            let State::Decided(Some(a)) = &mut self.gdr.state else {
                return Err(self.no_path());
            };
            a.flushed_below = self.received + arrived;
        }
        let State::Decided(Some(a)) = &mut self.gdr.state else {
            return Err(self.no_path());
        };
        let src = a.inbox.buf.ptr().add(slot * dev_slot);
        let region = DeviceRegion {
            queue: device,
            addr: src.0,
            len: h.len as usize,
        };
        consume(&h, Payload::Device(region))?;
        let ev = if h.len > 0 {
            let dev = a.inbox.dev.clone();
            match a
                .take_event()
                .and_then(|ev| dev.record_event(ev, stream).map(|()| ev))
            {
                Ok(ev) => Some(ev),
                Err(e) => return Err(self.device_err(&*dev, "recording an inbox slot's event", e)),
            }
        } else {
            None
        };
        a.recv_pending.push_back((self.received, ev));
        self.arrived[slot] = None;
        self.received += 1;
        RECEIVED.fetch_add(u64::from(h.len), Ordering::Relaxed);
        if self.error().is_none() {
            self.maybe_credit().map_err(|e| self.te(e))?;
        }
        Ok(true)
    }
}
