//! The completions of a [`ConnState`]: polled by the executor's calls and,
//! while the executor is away, by the NIC's progress thread
//! (`progress.rs`), which asks [`ConnState::outstanding`] whether it is
//! needed and drives [`ConnState::background`].

use comm_core::transport::TransportError;
use comm_core::wire::HEADER_BYTES;

use crate::conn::{
    is_control, is_recv, ConnState, CREDIT_WR_ID, GDR_TAG, IMM_ABORT, IMM_BOARD, IMM_CREDIT,
    IMM_DATA, IMM_LOW, LENT_TAG, RECV_TAG,
};
use crate::verbs::{WcOpcode, WcStatus, WorkCompletion};

impl ConnState {
    /// A credit write that failed because the peer has gone, with nothing
    /// of this side in flight to it.
    fn late_credit(&self, wc: &WorkCompletion) -> bool {
        wc.wr_id == CREDIT_WR_ID
            && wc.status == WcStatus::RETRY_EXC_ERR
            && self.lent_in_flight == 0
            && self.gdr.in_flight == 0
    }

    /// Whether the NIC's progress thread (`progress.rs`) has anything to
    /// do here: completions awaited (lent or GPUDirect payload writes, any
    /// signalled request), device pieces waiting for their copy, inbox
    /// slots waiting for the work that reads them, or DMA the (strict
    /// emulated) device moves only while progressed.
    pub(crate) fn outstanding(&self) -> bool {
        self.broken.is_none()
            && self.deferred.is_none()
            && !self.device_failed
            && (self.lent_in_flight > 0
                || self.gdr.in_flight > 0
                || self.gdr.waiting()
                || self.sendq.awaiting()
                || self.dev.needs_progress())
    }

    /// What changes when the connection moves (pieces sent, credited,
    /// received, writes completed, device pieces queued): the progress
    /// thread backs off while it stays the same.
    pub(crate) fn progress_mark(&self) -> [u64; 7] {
        [
            self.sent,
            self.acked,
            self.received,
            self.credited,
            self.lent_in_flight,
            self.gdr.in_flight,
            self.dev.counters().send_completions,
        ]
    }

    /// The progress thread's turn: what the executor's calls do by the way
    /// — completions polled, credits written (also for device pieces whose
    /// reading work completed), device pieces posted once their copy
    /// completed. A failure is kept for the executor's next call: the
    /// connection's (broken, corrupt data) by `progress`; a device error
    /// recurs at the executor's next device call, and the thread stops
    /// driving the connection (its device work will not complete).
    pub(crate) fn background(&mut self) {
        if let Err(e) = self.gdr.release_done() {
            self.thread_stops(&e);
            return;
        }
        if self.progress().is_err() {
            return;
        }
        if let Err(e) = self.gdr_post_ready() {
            self.thread_stops(&e);
        }
    }

    fn thread_stops(&mut self, e: &dyn std::fmt::Display) {
        tracing::debug!(
            rank = self.rank,
            peer = self.peer,
            "rdma: the NIC's progress thread stops driving this connection: {e}"
        );
        self.device_failed = true;
    }

    /// Polls the completion queue and the async events.
    pub(crate) fn progress(&mut self) -> Result<(), TransportError> {
        if let Some(e) = self.error() {
            return Err(e);
        }
        // Inbox slots of device pieces whose reading work completed: their
        // credits go out below. A device error shows in the device calls.
        let _ = self.gdr.release_done();
        while let Some(ev) = self.dev.poll_async_event() {
            if ev.is_fatal() {
                let detail = format!(
                    "RDMA connection to peer rank {} on {}: asynchronous event: {ev}",
                    self.peer, self.device
                );
                return Err(self.fail(false, detail));
            }
            self.link.on_event(&ev, &self.device, self.peer);
        }
        loop {
            let mut wcs = std::mem::take(&mut self.wcs);
            wcs.clear();
            let polled = self.dev.poll_cq(self.cq, 64, &mut wcs);
            let n = match polled {
                Ok(n) => n,
                Err(e) => {
                    self.wcs = wcs;
                    let detail = format!("RDMA connection to peer rank {}: {e}", self.peer);
                    return Err(self.fail(false, detail));
                }
            };
            // The first error that is not a flush is the cause.
            // A late credit (`peer_left`) is not one.
            let cause = wcs.iter().position(|w| {
                w.status != WcStatus::SUCCESS
                    && w.status != WcStatus::WR_FLUSH_ERR
                    && !self.late_credit(w)
            });
            let handled = match cause {
                Some(i) => self.handle(&wcs[i]),
                None => self.handle_all(&wcs),
            };
            self.wcs = wcs;
            handled?;
            if n < 64 {
                break;
            }
        }
        if let Some(detail) = &self.deferred {
            return Err(TransportError::Corrupt {
                peer: self.peer,
                detail: detail.clone(),
            });
        }
        self.maybe_credit()
    }

    /// Handles every completion of a batch. Corrupt data from the peer (an
    /// immediate that names no free slot, a credit for pieces never sent)
    /// is kept (`deferred`: every later call returns it, whoever polled
    /// it, the executor or the progress thread) and the rest of the batch
    /// still handled, so that the writes it completes are not left
    /// outstanding; any other error ends the batch (the connection broke).
    fn handle_all(&mut self, wcs: &[WorkCompletion]) -> Result<(), TransportError> {
        for wc in wcs {
            match self.handle(wc) {
                Ok(()) => {}
                Err(TransportError::Corrupt { detail, .. }) if self.broken.is_none() => {
                    self.deferred.get_or_insert(detail);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn handle(&mut self, wc: &WorkCompletion) -> Result<(), TransportError> {
        let Some(q) = self.qps.iter().position(|&n| n == wc.qp_num) else {
            return Ok(());
        };
        if wc.status != WcStatus::SUCCESS {
            // A credit the departed peer cannot take, and what the QP's
            // error flushes after it (receives, control writes), wait for
            // this side to need the peer (`check_left`); a flushed piece
            // is data lost, an error.
            let late = self.late_credit(wc);
            let flushed = self.peer_left.is_some()
                && wc.status == WcStatus::WR_FLUSH_ERR
                && (is_control(wc.wr_id) || is_recv(wc.wr_id));
            if late || flushed {
                if !is_recv(wc.wr_id) {
                    self.sendq.complete(q, false, |_| {});
                }
                if late && self.peer_left.is_none() {
                    let detail = format!(
                        "RDMA connection to peer rank {} on {}: the peer has gone (a credit to it \
                         completed with: {}); this is an error only because this rank still \
                         needed the peer",
                        self.peer, self.device, wc.status
                    );
                    tracing::debug!(
                        rank = self.rank,
                        peer = self.peer,
                        device = %self.device,
                        "rdma: a credit could not be delivered: the peer has left (after its last \
                         operation, if nothing more is asked of it)"
                    );
                    self.peer_left = Some(detail);
                }
                return Ok(());
            }
            // The opcode of an error completion is undefined: the wr_id says.
            let what = if is_recv(wc.wr_id) {
                "a receive"
            } else {
                "an RDMA WRITE"
            };
            let detail = format!(
                "RDMA connection to peer rank {} on {}: {what} on QP {} completed with error: {}{}",
                self.peer,
                self.device,
                wc.qp_num,
                wc.status,
                if wc.vendor_err != 0 {
                    format!(", vendor error {:#x}", wc.vendor_err)
                } else {
                    String::new()
                }
            );
            return Err(self.fail(wc.status == WcStatus::RETRY_EXC_ERR, detail));
        }
        match wc.opcode {
            WcOpcode::RdmaWrite => {
                let (mut lent, mut gdr) = (0, 0);
                self.sendq.complete(q, true, |wr_id| {
                    if !is_control(wr_id) && wr_id & LENT_TAG != 0 {
                        lent += 1;
                    }
                    if !is_control(wr_id) && wr_id & GDR_TAG != 0 {
                        gdr += 1;
                    }
                });
                self.lent_in_flight = self.lent_in_flight.saturating_sub(lent);
                self.gdr.in_flight = self.gdr.in_flight.saturating_sub(gdr);
            }
            WcOpcode::RecvRdmaWithImm | WcOpcode::Recv => {
                if let Err(e) = self.dev.post_recv(wc.qp_num, RECV_TAG | q as u64) {
                    let detail = format!("RDMA connection to peer rank {}: {e}", self.peer);
                    return Err(self.fail(false, detail));
                }
                let imm = wc.imm.unwrap_or(u32::MAX);
                let low = imm & IMM_LOW;
                match imm >> 30 {
                    IMM_DATA => {
                        let slot = (low >> 22) as usize;
                        let bytes = (low & ((1 << 22) - 1)) as usize;
                        if slot >= self.slots
                            || bytes < HEADER_BYTES
                            || bytes > self.slot_bytes
                            || self.arrived[slot].is_some()
                        {
                            let detail = format!(
                                "RDMA immediate {imm:#x} from peer rank {} names slot {slot} with \
                                 {bytes} bytes (expected a free slot below {} of at most {} bytes)",
                                self.peer, self.slots, self.slot_bytes
                            );
                            return Err(TransportError::Corrupt {
                                peer: self.peer,
                                detail,
                            });
                        }
                        self.arrived[slot] = Some(bytes);
                    }
                    IMM_CREDIT => {
                        let delta = low.wrapping_sub(self.acked as u32 & IMM_LOW) & IMM_LOW;
                        self.acked += u64::from(delta);
                        if self.acked > self.sent {
                            return Err(TransportError::Corrupt {
                                peer: self.peer,
                                detail: format!(
                                    "credit for {} pieces but only {} were sent",
                                    self.acked, self.sent
                                ),
                            });
                        }
                    }
                    IMM_ABORT => {
                        self.peer_aborted = Some(low.checked_sub(1).map(|c| c as usize));
                    }
                    IMM_BOARD => self.gdr.board_arrived = true,
                    _ => {
                        return Err(TransportError::Corrupt {
                            peer: self.peer,
                            detail: format!("unknown RDMA immediate {imm:#x}"),
                        })
                    }
                }
            }
        }
        Ok(())
    }
}
