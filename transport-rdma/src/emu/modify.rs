//! `ibv_modify_qp` on the emulated NIC: the transition's attributes as the
//! real provider builds them ([`crate::ibv::attr::modify_attrs`]), checked
//! in strict mode as the kernel checks them, then the state change and
//! what the QP publishes for its peer (its responder side, at RTR).

use super::{qp_rules, shared, strict, EmuVerbs};
use crate::verbs::{QpState, QpTransition, Result, VerbsError};

impl EmuVerbs {
    /// `ibv_modify_qp`: strict mode checks what the real provider would
    /// pass (`qp_rules.rs`); both modes enforce the state order.
    pub(super) fn modify(&mut self, qpn: u32, to: QpTransition) -> Result<()> {
        let dev = self.dev();
        let cur = self.qp_mut("ibv_modify_qp", qpn)?.state;
        // What the real provider would pass; strict mode checks it as the
        // kernel does (`qp_rules.rs`) and finds where the source GID cannot
        // reach across the fabric.
        let (attr, mask) = crate::ibv::attr::modify_attrs(&to, &self.port);
        let mut unroutable = false;
        if let Some(s) = &self.strict {
            let fail = |detail: String| VerbsError::Call {
                device: dev.clone(),
                op: "ibv_modify_qp",
                detail: format!("{to:?}: {detail}"),
            };
            qp_rules::check_modify(cur, &attr, mask, &self.port, &s.gids).map_err(fail)?;
            if let QpTransition::Rtr { .. } = to {
                unroutable = !s.routable(attr.ah_attr.grh.sgid_index).map_err(fail)?;
            }
        }
        let port_mtu = self.port.mtu;
        let mut answers = None;
        let qp = self.qp_mut("ibv_modify_qp", qpn)?;
        let (need, next) = match to {
            QpTransition::Init => {
                if qp.state == QpState::Reset {
                    qp.access = attr.qp_access_flags;
                }
                (QpState::Reset, QpState::Init)
            }
            QpTransition::Rtr { remote, .. } => {
                if qp.state == QpState::Init {
                    if shared::split_gid(&remote.gid).is_none() {
                        return Err(VerbsError::Call {
                            device: dev,
                            op: "ibv_modify_qp",
                            detail: "RTR: the remote GID is not an emulated device's".into(),
                        });
                    }
                    qp.remote = Some(remote);
                    qp.unroutable = unroutable;
                    qp.requester.path_mtu =
                        crate::ibv::attr::mtu_bytes(attr.path_mtu).unwrap_or(port_mtu);
                    let responder = qp_rules::Responder {
                        expected_psn: attr.rq_psn & qp_rules::PSN_MASK,
                        acks_to: attr.dest_qp_num,
                        port_mtu,
                        remote_write: qp.access & crate::ibv::ffi::ACCESS_REMOTE_WRITE as u32 != 0,
                    };
                    answers = Some(responder);
                }
                (QpState::Init, QpState::Rtr)
            }
            QpTransition::Rts { path, .. } => {
                qp.retry_after = strict::retries_run_out_after(path.timeout, path.retry_cnt);
                if qp.state == QpState::Rtr {
                    qp.requester.send_psn = attr.sq_psn & qp_rules::PSN_MASK;
                }
                (QpState::Rtr, QpState::Rts)
            }
            QpTransition::Error => {
                self.enter_error(qpn);
                return Ok(());
            }
            QpTransition::Reset => {
                qp.remote = None;
                qp.unroutable = false;
                qp.failing = None;
                qp.recvs.clear();
                qp.rnr.clear();
                self.set_state(qpn, QpState::Reset);
                self.flush_dma(qpn, false);
                return Ok(());
            }
        };
        if qp.state != need {
            return Err(VerbsError::QpState {
                device: dev,
                op: "ibv_modify_qp",
                qpn,
                state: qp.state,
                need: match need {
                    QpState::Reset => "RESET",
                    QpState::Init => "INIT",
                    _ => "RTR",
                },
            });
        }
        self.set_state(qpn, next);
        if let Some(r) = answers {
            self.table.publish_responder(qpn, r);
        }
        Ok(())
    }
}
