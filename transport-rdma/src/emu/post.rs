//! Posting one WRITE on the emulated NIC: the state and queue checks a NIC
//! makes at `ibv_post_send`, then (strict mode) the source's digest, the
//! rules of an unanswered write and the responder's verdict, and the WRITE
//! queued for the NIC's DMA (`dma.rs`); the permissive emulation copies
//! and delivers the immediate at once.

use super::qp_rules::{self, Answer};
use super::strict::{Dma, End};
use super::{EmuVerbs, Msg};
use crate::verbs::{QpState, Result, SendWr, VerbsError, WcStatus};

impl EmuVerbs {
    /// One send work request (the doorbell is counted by the caller).
    pub(super) fn post_one(&mut self, qpn: u32, wr: &SendWr) -> Result<()> {
        self.counted.send_wrs += 1;
        let dev = self.dev();
        // Work requests the NIC still holds (strict: not finished).
        let in_flight = self.dma_pending(qpn) as u32;
        let qp = self.qp_mut("ibv_post_send", qpn)?;
        match qp.state {
            QpState::Rts => {}
            QpState::Error => {
                self.watch_source(qpn, None);
                self.complete_send(qpn, wr.wr_id, WcStatus::WR_FLUSH_ERR);
                return Ok(());
            }
            state => {
                return Err(VerbsError::QpState {
                    device: dev,
                    op: "ibv_post_send",
                    qpn,
                    state,
                    need: "RTS",
                })
            }
        }
        if qp.send_outstanding + in_flight >= qp.max_send {
            return Err(VerbsError::Call {
                device: dev,
                op: "ibv_post_send",
                detail: format!(
                    "send queue of QP {qpn} is full ({} work requests outstanding)",
                    qp.max_send
                ),
            });
        }
        let remote = qp.remote.expect("RTS has a remote");
        self.watch_source(qpn, Some(wr));
        let qp = self.qp_mut("ibv_post_send", qpn)?;
        // Strict: no packet from this source GID crosses the fabric; or a
        // WRITE before this one is still retrying.
        if qp.unroutable || self.retrying(qpn) {
            self.fail_unanswered(qpn, wr.wr_id);
            return Ok(());
        }
        let Some(responder) = self
            .remote_table(remote.gid)
            .filter(|t| t.ready(remote.qpn))
            .map(|t| t.responder(remote.qpn))
        else {
            self.fail_unanswered(qpn, wr.wr_id);
            return Ok(());
        };
        let (laddr, llen, lkey) = wr.local;
        // Strict: the responder's verdict on the two sides' attributes,
        // then the NIC's DMA (`dma.rs`).
        if let (Some(_), Some(resp)) = (&self.strict, responder) {
            let req = self.qps[&qpn].requester;
            let placed = |end| Dma {
                wr_id: wr.wr_id,
                local: (laddr, llen as usize, lkey),
                remote: (remote.gid, wr.remote_addr, wr.rkey),
                done: 0,
                peer_qpn: remote.qpn,
                signaled: wr.signaled,
                imm: wr.imm.map(|imm| Msg {
                    imm,
                    byte_len: llen,
                }),
                end,
                stalled_since: None,
            };
            let nothing_placed = |status| Dma {
                local: (laddr, 0, lkey),
                imm: None,
                ..placed(End::Status(status))
            };
            let dma = match qp_rules::answer(qpn, req, self.port.mtu, resp, llen) {
                Answer::Done => placed(End::Acked),
                Answer::Unanswered { lands, why } => {
                    tracing::debug!(qpn, why, "strict emulation: a WRITE nothing acknowledges");
                    if !lands {
                        self.fail_unanswered(qpn, wr.wr_id);
                        return Ok(());
                    }
                    placed(End::Unanswered)
                }
                Answer::Naked => nothing_placed(WcStatus::RETRY_EXC_ERR),
                Answer::Duplicate => nothing_placed(WcStatus::SUCCESS),
                Answer::RemoteAccess => nothing_placed(WcStatus::REM_ACCESS_ERR),
            };
            self.queue_dma(qpn, dma);
            return Ok(());
        }
        if llen > 0 {
            let local = (laddr, llen as usize, lkey);
            if let Err(status) = self.copy(remote.gid, local, (wr.remote_addr, wr.rkey)) {
                self.complete_send(qpn, wr.wr_id, status);
                return Ok(());
            }
        }
        if let Some(imm) = wr.imm {
            let m = Msg {
                imm,
                byte_len: llen,
            };
            self.pending.push_back((remote.gid, remote.qpn, m));
            self.flush_pending();
        }
        self.complete_send_as(qpn, wr.wr_id, WcStatus::SUCCESS, wr.signaled);
        Ok(())
    }
}
