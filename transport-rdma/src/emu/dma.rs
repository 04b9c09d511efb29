//! Strict mode's DMA: a posted WRITE is not executed at `ibv_post_send`.
//! A NIC reads the source and places the data by DMA some time after the
//! doorbell, packet by packet, and reports the completion only once the
//! responder acknowledged the last packet (ibv_post_send(3): the buffers
//! belong to the NIC until the completion is retrieved; ibv_poll_cq(3): a
//! completion means the work request is done). So the strict emulation
//! queues every WRITE per QP and moves it in [`CHUNK`]-byte steps, one
//! step per QP each time the device is progressed (`poll_cq`; the
//! transport polls while [`crate::verbs::Verbs::needs_progress`] says so,
//! which is what a NIC's own engine does by itself):
//! * the peer sees a WRITE's bytes land piecewise, and its immediate (the
//!   receive completion) only after the last byte;
//! * the sender's completion comes after that, never at the post;
//! * QPs advance in a rotating order, so nothing is ordered across QPs (a
//!   later small WRITE on another QP may complete before an earlier large
//!   one), as the InfiniBand ordering rules allow; within a QP, work
//!   requests complete in order;
//! * a link that is down at either end (`Fault::PortFlap`: `PortErr`,
//!   then `PortActive` once it is back; the QPs stay in RTS, as on a NIC)
//!   moves nothing; a WRITE stalled longer than its QP's retries last
//!   (4.096 µs × 2^`timeout` × (`retry_cnt` + 1)) fails with retry
//!   exceeded.
//!
//! Bounds and keys are checked per step, so a WRITE running past its
//! region places its first steps before failing (a NIC checks the whole
//! range at the first packet; both end in the same error completion and a
//! QP in ERROR).

use std::time::{Duration, Instant};

use super::odp::OdpAccess;
use super::strict::{Dma, End};
use super::EmuVerbs;
use crate::verbs::{AsyncEvent, WcStatus};

/// Bytes one step of a WRITE moves.
pub(super) const CHUNK: usize = 64 << 10;
impl EmuVerbs {
    /// Queues a WRITE on `qpn` behind the ones not finished yet.
    pub(super) fn queue_dma(&mut self, qpn: u32, d: Dma) {
        self.dma.entry(qpn).or_default().push_back(d);
    }

    /// WRITEs of `qpn` the NIC has not finished.
    pub(super) fn dma_pending(&self, qpn: u32) -> usize {
        self.dma.get(&qpn).map_or(0, |q| q.len())
    }

    /// Whether any WRITE is unfinished.
    pub(super) fn dma_busy(&self) -> bool {
        self.dma.values().any(|q| !q.is_empty())
    }

    /// One step of every QP's first unfinished WRITE, the QPs in a
    /// rotating order.
    pub(super) fn advance_dma(&mut self) {
        let mut qpns: Vec<u32> = self
            .dma
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .map(|(&n, _)| n)
            .collect();
        if qpns.is_empty() {
            return;
        }
        qpns.sort_unstable();
        self.dma_turn = self.dma_turn.wrapping_add(1);
        let turn = self.dma_turn % qpns.len();
        qpns.rotate_left(turn);
        for qpn in qpns {
            self.step(qpn);
        }
    }

    fn step(&mut self, qpn: u32) {
        let Some(d) = self.dma.get(&qpn).and_then(|q| q.front()).copied() else {
            return;
        };
        let (laddr, len, lkey) = d.local;
        let (gid, raddr, rkey) = d.remote;
        if self.stalled(qpn, &d) {
            return;
        }
        let n = (len - d.done).min(CHUNK);
        if self.odp_stall(&d, n) {
            return;
        }
        if self.stale_source(qpn, &d, n) {
            self.pop_dma(qpn);
            self.complete_send(qpn, d.wr_id, WcStatus::GENERAL_ERR);
            return;
        }
        if n > 0 {
            let at = d.done as u64;
            if let Err(status) = self.copy(gid, (laddr + at, n, lkey), (raddr + at, rkey)) {
                self.pop_dma(qpn);
                self.complete_send(qpn, d.wr_id, status);
                return;
            }
            if d.done + n < len {
                if let Some(f) = self.dma.get_mut(&qpn).and_then(|q| q.front_mut()) {
                    f.done += n;
                }
                return;
            }
        }
        self.pop_dma(qpn);
        if let Some(m) = d.imm {
            self.pending.push_back((gid, d.peer_qpn, m));
            self.flush_pending();
        }
        match d.end {
            End::Acked => self.complete_send_as(qpn, d.wr_id, WcStatus::SUCCESS, d.signaled),
            End::Unanswered => self.fail_unanswered(qpn, d.wr_id),
            End::Status(s) => self.complete_send_as(qpn, d.wr_id, s, d.signaled),
        }
    }

    /// Whether the next `n` bytes of `d` come from a pinned registration
    /// whose pages changed since it was made (`stale_pages.rs`): the NIC
    /// would read the old pages.
    fn stale_source(&self, qpn: u32, d: &Dma, n: usize) -> bool {
        let (laddr, _, lkey) = d.local;
        let Some(pages) = self.mrs.get(&lkey).and_then(|m| m.pinned_pages.as_ref()) else {
            return false;
        };
        let at = laddr + d.done as u64;
        let Some(page) = pages.moved(at, n) else {
            return false;
        };
        tracing::error!(
            qpn,
            wr_id = d.wr_id,
            "strict RDMA model: the page at {page:#x} of a pinned registration (lkey {lkey:#x}) \
             is not the page it pinned (the memory was freed and mapped again, or copied on \
             write, since ibv_reg_mr): a real NIC reads the old page"
        );
        true
    }

    /// Whether the next `n` bytes of `d` read pages of an on-demand
    /// registration the NIC has not translated yet (`odp.rs`): the first
    /// such read faults (counted) and the QP waits for the fault.
    fn odp_stall(&mut self, d: &Dma, n: usize) -> bool {
        let (laddr, len, lkey) = d.local;
        let Some(pages) = self.mrs.get_mut(&lkey).and_then(|m| m.odp.as_mut()) else {
            return false;
        };
        let at = laddr + d.done as u64;
        match pages.access(at, n, (laddr, len), Instant::now()) {
            OdpAccess::Ready => false,
            OdpAccess::Resolving => true,
            OdpAccess::Faulted => {
                self.counted.odp_faults += 1;
                true
            }
        }
    }

    /// Whether `d`, first on `qpn`, cannot move: the link is down at this
    /// end or at the peer's (`Fault::PortFlap`). One stalled longer than
    /// the QP's retries last fails with retry exceeded (the QP to ERROR).
    fn stalled(&mut self, qpn: u32, d: &Dma) -> bool {
        let down = self.link_up_at.is_some()
            || self
                .remote_table(d.remote.0)
                .is_some_and(|t| t.link_down(d.peer_qpn));
        let now = Instant::now();
        let retry_after = self.qps.get(&qpn).and_then(|q| q.retry_after);
        let Some(f) = self.dma.get_mut(&qpn).and_then(|q| q.front_mut()) else {
            return false;
        };
        if !down {
            f.stalled_since = None;
            return false;
        }
        let since = *f.stalled_since.get_or_insert(now);
        if retry_after.is_some_and(|r| now.duration_since(since) > r) {
            self.pop_dma(qpn);
            self.complete_send(qpn, d.wr_id, WcStatus::RETRY_EXC_ERR);
        }
        true
    }

    /// `Fault::PortFlap`: the link goes down now and up after `down_for`.
    pub(super) fn flap(&mut self, down_for: Duration) {
        self.link_up_at = Some(Instant::now() + down_for);
        self.table.set_link_down(self.qps.keys().copied(), true);
        self.events.push_back(AsyncEvent::PortErr { port: 1 });
    }

    /// Brings a flapped link back up once its time is over.
    pub(super) fn check_link(&mut self) {
        if self.link_up_at.is_some_and(|t| Instant::now() >= t) {
            self.link_up_at = None;
            self.table.set_link_down(self.qps.keys().copied(), false);
            self.events.push_back(AsyncEvent::PortActive { port: 1 });
        }
    }

    fn pop_dma(&mut self, qpn: u32) {
        if let Some(q) = self.dma.get_mut(&qpn) {
            q.pop_front();
        }
    }

    /// `qpn` entered ERROR or RESET: its unfinished WRITEs are flushed
    /// (`complete`) or dropped.
    pub(super) fn flush_dma(&mut self, qpn: u32, complete: bool) {
        let Some(q) = self.dma.remove(&qpn) else {
            return;
        };
        if complete {
            for d in q {
                self.complete_send(qpn, d.wr_id, WcStatus::WR_FLUSH_ERR);
            }
        }
    }
}
