//! [`ConnState`]: the executor's [`Connection`] over RC queue pairs (its
//! handle, [`RdmaConnection`](crate::RdmaConnection), shares it with the
//! NIC's progress thread).
//!
//! Each side registers an inbound FIFO of `slots` slots (a slot holds a
//! [`PieceHeader`] and up to `max_piece` payload bytes) and a staging area of
//! the same shape. Piece `k` is copied to staging slot `k % slots` and
//! RDMA-WRITTEN with immediate into the peer's FIFO slot `k % slots` on queue
//! pair `k % qps` (large messages stripe over the QPs); the immediate carries
//! the slot and the size. The receiver hands the slot to the executor in
//! place, and every `slots / 2` consumed pieces writes a credit (a
//! zero-byte WRITE with immediate carrying its count) back on QP 0. A sender
//! never has more than `slots` pieces unacknowledged.

use std::time::{Duration, Instant};

use comm_core::transport::registry::MemoryKind;
use comm_core::transport::{Connection, ConsumeResult, Outgoing, Payload, Space, TransportError};
use comm_core::wire::{PieceHeader, HEADER_BYTES};
use comm_core::Error;

use crate::link_watch::LinkWatch;
use crate::mem::Buf;
use crate::regcache::{RegCache, ZeroCopy};
use crate::sendq::SendQueues;
use crate::verbs::{Mr, SendWr, Verbs, WorkCompletion};

/// Immediate kinds (top two bits).
pub(crate) const IMM_DATA: u32 = 0;
pub(crate) const IMM_CREDIT: u32 = 1;
pub(crate) const IMM_ABORT: u32 = 2;
/// The peer wrote its GPUDirect board (`gdr.rs`) into ours.
pub(crate) const IMM_BOARD: u32 = 3;
pub(crate) const IMM_LOW: u32 = (1 << 30) - 1;
/// Data immediates: slot in bits 29..22, bytes in 21..0.
pub(crate) const MAX_SLOTS: usize = 256;
/// The largest slot (header + payload) a data immediate can describe.
pub(crate) const MAX_SLOT_BYTES: usize = (1 << 22) - 1;
/// Send work requests kept free on each QP for credits, aborts and probes.
pub(crate) const SQ_RESERVE: u32 = 4;
/// Receive work requests carry this bit (and their QP index).
pub(crate) const RECV_TAG: u64 = 1 << 63;
/// The wr_id of credits, aborts and probes (data writes carry their piece
/// number).
pub(crate) const CONTROL_WR_ID: u64 = u64::MAX;
/// The wr_id of credits: a credit a peer that has left cannot take is not
/// an error by itself (see [`ConnState::peer_left`]).
pub(crate) const CREDIT_WR_ID: u64 = u64::MAX - 1;
/// A signalled zero-length WRITE whose completion retires the unsignalled
/// WRITEs before it (`sendq.rs`: a staging slot waiting to be reused).
pub(crate) const FENCE_WR_ID: u64 = u64::MAX - 2;
/// Data writes of lent pieces carry this bit with their piece number.
pub(crate) const LENT_TAG: u64 = 1 << 62;
/// Payload writes of device pieces (GPUDirect) carry this bit.
pub(crate) const GDR_TAG: u64 = 1 << 61;
/// Pieces smaller than this are copied to staging even when lent (a
/// registration lookup and a second work request cost more than the copy).
pub const ZERO_COPY_MIN: usize = 64 << 10;
/// How long an aborting connection waits for writes from lent buffers.
const LENT_DRAIN: Duration = Duration::from_secs(2);
/// How often [`Connection::check_alive`] probes the peer.
const PROBE_EVERY: Duration = Duration::from_millis(100);

/// Credits, aborts, probes and boards (not a piece, not a receive).
pub(crate) fn is_control(wr_id: u64) -> bool {
    wr_id == CONTROL_WR_ID || wr_id == CREDIT_WR_ID || wr_id == FENCE_WR_ID
}

/// The staging slot a piece's WRITE reads (not a control request, not a
/// lent or GPUDirect payload).
pub(crate) fn staged_slot(wr_id: u64, slots: usize) -> Option<usize> {
    (!is_control(wr_id) && wr_id & (LENT_TAG | GDR_TAG | RECV_TAG) == 0)
        .then_some((wr_id % slots as u64) as usize)
}

/// A receive work request's completion.
pub(crate) fn is_recv(wr_id: u64) -> bool {
    wr_id & RECV_TAG != 0 && !is_control(wr_id)
}

fn imm_data(slot: usize, bytes: usize) -> u32 {
    (IMM_DATA << 30) | ((slot as u32) << 22) | bytes as u32
}

/// What a connection is built from (see `setup.rs`).
pub(crate) struct Parts {
    pub rank: usize,
    pub peer: usize,
    pub dev: Box<dyn Verbs>,
    pub cq: u32,
    pub qps: Vec<u32>,
    pub sq_depth: u32,
    pub fifo: Mr,
    pub staging: Mr,
    pub remote_fifo: (u64, u32),
    pub slots: usize,
    pub slot_bytes: usize,
    pub regs: RegCache,
    /// The GPUDirect board (two pages: the peer's board, ours to send).
    pub board: Mr,
    pub remote_board: (u64, u32),
    /// `SNCL_IB_GDR`.
    pub gdr: Option<bool>,
    /// The pair's liveness socket (`src/liveness.rs`), where set up.
    pub liveness: Option<crate::liveness::Liveness>,
}

/// An RDMA connection to one peer (both directions): what the executor's
/// handle ([`RdmaConnection`](crate::RdmaConnection)) and the NIC's
/// progress thread (`progress.rs`) share behind a lock.
pub(crate) struct ConnState {
    pub(crate) rank: usize,
    pub(crate) peer: usize,
    pub(crate) device: String,
    pub(crate) dev: Box<dyn Verbs>,
    pub(crate) cq: u32,
    pub(crate) qps: Vec<u32>,
    sq_depth: u32,
    /// Posted work requests per QP, and which are signalled (`sendq.rs`).
    pub(crate) sendq: SendQueues,
    fifo_mr: Mr,
    pub(crate) staging_mr: Mr,
    pub(crate) fifo: Buf,
    staging: Buf,
    pub(crate) remote_fifo: (u64, u32),
    pub(crate) slots: usize,
    pub(crate) slot_bytes: usize,
    pub(crate) sent: u64,
    pub(crate) acked: u64,
    pub(crate) received: u64,
    pub(crate) credited: u64,
    /// Per inbound slot: the bytes announced by its immediate, once arrived.
    pub(crate) arrived: Vec<Option<usize>>,
    pub(crate) peer_aborted: Option<Option<usize>>,
    pub(crate) broken: Option<(bool, String)>,
    /// The port's link, from the async events.
    pub(crate) link: LinkWatch,
    /// A credit could not be delivered because the peer has left (its QP
    /// is gone) while nothing of this side was in flight: the peer may
    /// simply have finished its last operation and exited. Not an error
    /// until this side needs the peer again (the detail then names it).
    pub(crate) peer_left: Option<String>,
    /// The device path (GPUDirect RDMA, `gdr.rs`).
    pub(crate) gdr: crate::gdr::Gdr,
    last_probe: Instant,
    pub(crate) wcs: Vec<WorkCompletion>,
    /// User-buffer registrations for lent pieces.
    pub(crate) regs: RegCache,
    /// Lent pieces whose data write has not completed yet.
    pub(crate) lent_in_flight: u64,
    /// The pair's liveness socket (`src/liveness.rs`), where set up.
    liveness: Option<crate::liveness::Liveness>,
    /// Corrupt data from the peer (`completions.rs` `handle_all`): the
    /// error every later call returns; completions are still polled (lent
    /// writes drain), nothing is credited.
    pub(crate) deferred: Option<String>,
    /// A device error stopped the progress thread driving this connection
    /// (the executor's next device call returns it).
    pub(crate) device_failed: bool,
}

impl ConnState {
    pub(crate) fn new(p: Parts) -> ConnState {
        // SAFETY: both regions were allocated by `p.dev`, which this
        // connection owns and drops last (after deregistering them); the
        // FIFO is written by the peer only in slots the protocol handed it.
        let (fifo, staging) = unsafe { (Buf::new(&p.fifo), Buf::new(&p.staging)) };
        let gdr = crate::gdr::Gdr::new(p.gdr, p.board, p.remote_board);
        ConnState {
            rank: p.rank,
            peer: p.peer,
            device: p.dev.port().name(),
            cq: p.cq,
            sendq: SendQueues::new(p.qps.len(), p.slots),
            qps: p.qps,
            sq_depth: p.sq_depth,
            fifo_mr: p.fifo,
            staging_mr: p.staging,
            fifo,
            staging,
            remote_fifo: p.remote_fifo,
            slots: p.slots,
            slot_bytes: p.slot_bytes,
            sent: 0,
            acked: 0,
            received: 0,
            credited: 0,
            arrived: vec![None; p.slots],
            peer_aborted: None,
            broken: None,
            link: LinkWatch::default(),
            peer_left: None,
            last_probe: Instant::now(),
            liveness: p.liveness,
            wcs: Vec::with_capacity(64),
            regs: p.regs,
            lent_in_flight: 0,
            gdr,
            dev: p.dev,
            deferred: None,
            device_failed: false,
        }
    }

    /// Whether a credit found the peer gone: it has left, after its last
    /// operation if this side asks nothing more of it (an error naming it
    /// as soon as this side needs it again).
    pub(crate) fn peer_left(&self) -> bool {
        self.peer_left.is_some()
    }

    /// Injects a fault into this connection's provider (emulated only).
    pub(crate) fn inject(
        &mut self,
        fault: crate::verbs::Fault,
    ) -> Result<(), crate::verbs::VerbsError> {
        self.dev.inject(fault)
    }

    pub(crate) fn error(&self) -> Option<TransportError> {
        self.broken.as_ref().map(|(gone, detail)| {
            if *gone {
                TransportError::PeerGone {
                    peer: self.peer,
                    detail: detail.clone(),
                }
            } else {
                TransportError::Io {
                    peer: self.peer,
                    source: std::io::Error::other(detail.clone()),
                }
            }
        })
    }

    /// An error naming the peer if it has left ([`ConnState::peer_left`]):
    /// called where this side needs the peer (to send, to receive, to know
    /// it alive), so a peer that died in the middle of an operation is
    /// still named.
    pub(crate) fn check_left(&mut self) -> Result<(), TransportError> {
        match self.peer_left.clone() {
            Some(detail) => Err(self.fail(true, detail)),
            None => Ok(()),
        }
    }

    pub(crate) fn fail(&mut self, gone: bool, detail: String) -> TransportError {
        if self.broken.is_none() {
            let detail = self.link.annotate(detail);
            tracing::warn!(rank = self.rank, peer = self.peer, device = %self.device, "{detail}");
            self.broken = Some((gone, detail));
            // The peer cannot learn it over RDMA before its NIC's retries
            // run out (if it can at all): tell it on the liveness socket.
            if let Some(l) = &mut self.liveness {
                l.tell_broken();
            }
        }
        self.error().expect("just set")
    }

    pub(crate) fn post(&mut self, q: usize, wr: SendWr) -> Result<(), TransportError> {
        self.post_chain(q, &mut [wr])
    }

    /// Posts `wrs` in order on QP `q` with one doorbell, signalled as
    /// `sendq.rs` says.
    pub(crate) fn post_chain(
        &mut self,
        q: usize,
        wrs: &mut [SendWr],
    ) -> Result<(), TransportError> {
        let limit = self.sq_depth.saturating_sub(SQ_RESERVE).max(1);
        self.sendq.mark(q, wrs, limit, |w| {
            w.wr_id == FENCE_WR_ID || (!is_control(w.wr_id) && w.wr_id & (LENT_TAG | GDR_TAG) != 0)
        });
        let qpn = self.qps[q];
        let posted = if wrs.len() == 1 {
            self.dev.post_send(qpn, &wrs[0])
        } else {
            self.dev.post_send_chain(qpn, wrs)
        };
        if let Err(e) = posted {
            let detail = format!(
                "RDMA connection to peer rank {} on {}: {e}",
                self.peer, self.device
            );
            return Err(self.fail(false, detail));
        }
        let slots = self.slots;
        self.sendq.posted(q, wrs, |w| staged_slot(w.wr_id, slots));
        Ok(())
    }

    /// What the provider counted on this connection's device (doorbells,
    /// send work requests and completions; the emulated provider counts).
    pub(crate) fn verbs_counters(&self) -> crate::verbs::VerbsCounters {
        self.dev.counters()
    }

    /// Room for one more send work request on QP `q` (keeping `reserve`).
    pub(crate) fn sq_room(&self, q: usize, reserve: u32) -> bool {
        self.sendq.outstanding(q) + reserve < self.sq_depth
    }

    /// Credits consumed pieces; a device piece counts once the work that
    /// reads its inbox slot has completed. Nothing goes to a peer that has
    /// left.
    pub(crate) fn maybe_credit(&mut self) -> Result<(), TransportError> {
        if self.peer_left.is_some() {
            return Ok(());
        }
        let threshold = (self.slots as u64 / 2).max(1);
        let released = self.gdr.released(self.received);
        if released - self.credited >= threshold && self.sq_room(0, 1) {
            let count = released as u32 & IMM_LOW;
            let wr = SendWr {
                signaled: true,
                wr_id: CREDIT_WR_ID,
                ..self.control_wr((IMM_CREDIT << 30) | count)
            };
            self.post(0, wr)?;
            self.credited = released;
        }
        Ok(())
    }

    fn control_wr(&self, imm: u32) -> SendWr {
        SendWr {
            signaled: true,
            wr_id: CONTROL_WR_ID,
            local: (0, 0, 0),
            remote_addr: self.remote_fifo.0,
            rkey: self.remote_fifo.1,
            imm: Some(imm),
        }
    }

    /// How this connection sends lent pieces.
    pub(crate) fn zero_copy(&self) -> ZeroCopy {
        self.regs.mode()
    }

    /// User-buffer registrations made so far, and bytes registered now.
    pub(crate) fn registrations(&self) -> (u64, usize) {
        (self.regs.made, self.regs.registered())
    }

    /// After a failed operation: the buffers it lent go back to the
    /// application, so wait (bounded by [`LENT_DRAIN`]) until the NIC has
    /// read them — every payload write completed, or the connection broke
    /// (a QP in error reads nothing more) — then drop per-step
    /// registrations.
    fn drain_lent(&mut self) {
        let deadline = Instant::now() + LENT_DRAIN;
        while (self.lent_in_flight > 0 || self.gdr.in_flight > 0) && self.broken.is_none() {
            // Corrupt data (`deferred`) leaves the QPs working: drain on.
            if (self.progress().is_err() && self.deferred.is_none()) || Instant::now() >= deadline {
                break;
            }
            std::thread::yield_now();
        }
        if self.lent_in_flight > 0 && self.broken.is_none() {
            tracing::warn!(
                rank = self.rank,
                peer = self.peer,
                device = %self.device,
                in_flight = self.lent_in_flight,
                "RDMA writes from user buffers still in flight {LENT_DRAIN:?} after a failed operation"
            );
        } else {
            self.lent_in_flight = 0;
            self.regs.idle(&mut *self.dev);
        }
    }

    /// [`ConnState::post_staged`] for piece `k` (already counted in
    /// `sent`: a device piece reserves its slot before its data is ready).
    pub(crate) fn post_piece(
        &mut self,
        q: usize,
        k: u64,
        header: &PieceHeader,
        payload: &[u8],
        announced: usize,
    ) -> Result<(), TransportError> {
        let wr = self.stage_piece(k, header, payload, announced);
        self.post(q, wr)
    }

    /// Copies piece `k`'s payload and encoded header into its staging slot
    /// and returns the WRITE with immediate that sends them into the
    /// peer's slot, announcing `announced` bytes.
    pub(crate) fn stage_piece(
        &mut self,
        k: u64,
        header: &PieceHeader,
        payload: &[u8],
        announced: usize,
    ) -> SendWr {
        let slot = (k % self.slots as u64) as usize;
        let off = slot * self.slot_bytes;
        let mut header = *header;
        let staged_whole = announced == HEADER_BYTES + payload.len();
        comm_core::copies::count_staging_copy(payload.len());
        if header.checksum.is_some() && staged_whole {
            let crc = self.staging.write_checksummed(off + HEADER_BYTES, payload);
            header.checksum = Some(crc);
        } else {
            self.staging.write(off + HEADER_BYTES, &[payload]);
        }
        let mut h = [0u8; HEADER_BYTES];
        header.encode(&mut h);
        self.staging.write(off, &[&h]);
        SendWr {
            signaled: true,
            wr_id: k & !(LENT_TAG | GDR_TAG | RECV_TAG),
            local: (
                self.staging_mr.addr + off as u64,
                (HEADER_BYTES + payload.len()) as u32,
                self.staging_mr.lkey,
            ),
            remote_addr: self.remote_fifo.0 + off as u64,
            rkey: self.remote_fifo.1,
            imm: Some(imm_data(slot, announced)),
        }
    }

    pub(crate) fn transport_err(&self, source: TransportError) -> Error {
        Error::Transport {
            rank: self.rank,
            source,
        }
    }
}

impl Connection for ConnState {
    fn peer(&self) -> usize {
        self.peer
    }

    /// The registered inbound ring and staging area (pinned), and the
    /// user buffers kept registered for lent pieces where that pins them
    /// (on-demand registrations pin nothing).
    fn footprint(&self, report: &mut comm_core::transport::footprint::FootprintReport<'_>) {
        use comm_core::transport::footprint::{Purpose, Residence};
        report(Purpose::Fifo, Residence::Pinned, self.fifo_mr.len as u64);
        report(
            Purpose::Staging,
            Residence::Pinned,
            self.staging_mr.len as u64,
        );
        if self.regs.mode() == crate::regcache::ZeroCopy::Pinned {
            report(
                Purpose::RegistrationCache,
                Residence::Pinned,
                self.regs.registered() as u64,
            );
        }
    }

    fn memory_kinds(&self) -> &'static [MemoryKind] {
        &[MemoryKind::Host, MemoryKind::Device]
    }

    fn max_piece(&self, kind: MemoryKind) -> usize {
        match kind {
            MemoryKind::Host => self.slot_bytes - HEADER_BYTES,
            MemoryKind::Device => self.dev_slot(),
        }
    }

    fn ready(&mut self, device: &dyn std::any::Any) -> Result<Option<bool>, Error> {
        self.gdr_ready(device)
    }

    /// Host pieces go through the staging copy, or (lent, `SNCL_IB_ZERO_COPY`)
    /// straight from the registered user buffer; device regions over
    /// GPUDirect RDMA (`gdr.rs`).
    fn try_post_send(&mut self, header: &PieceHeader, piece: Outgoing<'_>) -> Result<bool, Error> {
        let r = match piece.payload() {
            Payload::Device(region) => return self.gdr_send(header, region),
            // SAFETY: `Outgoing::lent`'s contract: `data` stays mapped and
            // unchanged until `flush` returns true.
            Payload::Host(data) if piece.is_lent() => unsafe { self.send_lent(header, data) },
            Payload::Host(data) => self.send_host(header, data),
        };
        r.map_err(|e| self.transport_err(e))
    }

    fn try_recv(
        &mut self,
        space: Space<'_>,
        consume: &mut dyn FnMut(&PieceHeader, Payload<'_>) -> ConsumeResult,
    ) -> Result<bool, Error> {
        if let Space::Device(queue) = space {
            return self.gdr_recv(queue, consume);
        }
        let progressed = self.progress();
        let slot = (self.received % self.slots as u64) as usize;
        let Some(bytes) = self.arrived[slot] else {
            // Pieces that arrived before an error are still delivered.
            progressed.map_err(|e| self.transport_err(e))?;
            self.check_left().map_err(|e| self.transport_err(e))?;
            if let Some(cause) = self.peer_aborted {
                return Err(self.transport_err(TransportError::PeerAborted {
                    peer: self.peer,
                    cause,
                }));
            }
            return Ok(false);
        };
        let off = slot * self.slot_bytes;
        let raw: &[u8; HEADER_BYTES] = self.fifo.read(off, HEADER_BYTES).try_into().unwrap();
        let corrupt = |detail: String| TransportError::Corrupt {
            peer: self.peer,
            detail,
        };
        let h = PieceHeader::decode(raw)
            .map_err(|e| self.transport_err(corrupt(format!("slot {slot}: {e}"))))?;
        if HEADER_BYTES + h.len as usize != bytes {
            return Err(self.transport_err(corrupt(format!(
                "slot {slot}: the header says {} payload bytes but the immediate announced {}",
                h.len,
                bytes - HEADER_BYTES
            ))));
        }
        consume(
            &h,
            Payload::Host(self.fifo.read(off + HEADER_BYTES, h.len as usize)),
        )?;
        self.arrived[slot] = None;
        self.received += 1;
        if self.broken.is_none() && self.deferred.is_none() {
            self.maybe_credit().map_err(|e| self.transport_err(e))?;
        }
        Ok(true)
    }

    /// Host pieces: lent writes completed; device pieces: their payload
    /// writes completed (`gdr.rs`).
    fn flush(&mut self) -> Result<bool, Error> {
        let host = self.flush_host().map_err(|e| self.transport_err(e))?;
        let device = self.gdr_flush()?;
        Ok(host && device)
    }

    fn check_alive(&mut self) -> Result<(), TransportError> {
        let progressed = self.progress();
        // Pieces that arrived before a peer went away are delivered first
        // (`try_recv`); the error shows once none is left.
        if self.arrived[(self.received % self.slots as u64) as usize].is_some() {
            return Ok(());
        }
        progressed?;
        self.check_left()?;
        if let Some(Err((gone, what))) = self.liveness.as_mut().map(|l| l.check()) {
            // A peer that aborted and then exited told why over RDMA
            // before its socket closed: pass its cause on (blame the
            // cause, not the messenger), as the shm transport does.
            let _ = self.progress();
            if let Some(cause) = self.peer_aborted {
                return Err(TransportError::PeerAborted {
                    peer: self.peer,
                    cause,
                });
            }
            let detail = format!(
                "RDMA connection to peer rank {} on {}: {what}",
                self.peer, self.device
            );
            return Err(self.fail(gone, detail));
        }
        if self.last_probe.elapsed() >= PROBE_EVERY {
            self.last_probe = Instant::now();
            // A zero-byte WRITE on every QP: the peer's NIC must answer it,
            // so a dead peer or a peer QP in error ends in "retry counter
            // exceeded".
            let wr = SendWr {
                signaled: true,
                imm: None,
                ..self.control_wr(0)
            };
            for q in 0..self.qps.len() {
                if self.sq_room(q, 1) {
                    self.post(q, wr)?;
                }
            }
            self.progress()?;
        }
        if let Some(cause) = self.peer_aborted {
            return Err(TransportError::PeerAborted {
                peer: self.peer,
                cause,
            });
        }
        Ok(())
    }

    fn abort(&mut self, cause: Option<usize>) {
        if self.broken.is_none() && self.peer_left.is_none() && self.sq_room(0, 0) {
            let low = cause.map(|c| (c as u32 + 1) & IMM_LOW).unwrap_or(0);
            let _ = self.post(0, self.control_wr((IMM_ABORT << 30) | low));
            let _ = self.progress();
        }
        self.drain_lent();
    }

    fn kind(&self) -> &'static str {
        "rdma"
    }
}

impl Drop for ConnState {
    fn drop(&mut self) {
        for qpn in &self.qps {
            let _ = self.dev.modify_qp(*qpn, crate::verbs::QpTransition::Error);
        }
        self.regs.clear(&mut *self.dev);
        self.gdr.clear(&mut *self.dev);
        let _ = self.dev.dereg_mr(&self.fifo_mr);
        let _ = self.dev.dereg_mr(&self.staging_mr);
        // The device context is the process's (`context.rs`) and outlives
        // this connection: its queue pairs, then their completion queue,
        // go now (children before parents, as ibv_destroy_cq(3) asks).
        for qpn in &self.qps {
            if let Err(e) = self.dev.destroy_qp(*qpn) {
                tracing::debug!(peer = self.peer, "rdma: {e}");
            }
        }
        if let Err(e) = self.dev.destroy_cq(self.cq) {
            tracing::debug!(peer = self.peer, "rdma: {e}");
        }
    }
}
