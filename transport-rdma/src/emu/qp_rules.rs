//! Strict mode's queue-pair rules: what the kernel checks at
//! `ibv_modify_qp`, and what a responder does with a requester's packets
//! when the two sides' connection attributes do not agree.
//!
//! * **Transitions and masks** (ibv_modify_qp(3), "required attributes";
//!   the kernel's `qp_state_table` and `ib_modify_qp_is_ok` in
//!   drivers/infiniband/core/verbs.c, RC column): each transition has
//!   required and optional attribute bits; a missing required bit, a bit
//!   neither required nor optional, or a transition the table does not
//!   list fails with EINVAL. The attributes checked are the ones the real
//!   provider passes ([`crate::ibv::attr::modify_attrs`]), so a wrong mask
//!   fails here and not on the first NIC.
//! * **Values**: `port_num` names a port of the device; `path_mtu` is an
//!   `enum ibv_mtu` (256 … 4096; mlx5_ib_modify_qp refuses others);
//!   `timeout` fits 5 bits, `retry_cnt` and `rnr_retry` 3 (ibv_modify_qp(3));
//!   on an Ethernet (RoCE) port the address vector carries a GRH
//!   (`rdma_check_ah_attr`: RoCE addresses are GIDs) whose `sgid_index` is
//!   in the port's GID table.
//! * **Packets** (InfiniBand Architecture Specification vol. 1, ch. 9, the
//!   requester's and responder's PSN checks; RoCE frames above the link's
//!   MTU are dropped): a packet longer than the smaller of the two ports'
//!   active MTUs never arrives (no ACK: the requester's retries run out);
//!   a requester whose send PSN is ahead of the responder's expected PSN
//!   is NAKed (PSN sequence error) until its retries run out; one behind
//!   it is a duplicate, acknowledged and not executed (the WRITE
//!   "succeeds", nothing lands, no receive completes); a responder whose
//!   `dest_qp_num` is not the requester sends its ACKs elsewhere (the data
//!   lands, the requester's retries run out). PSNs are 24 bits (the
//!   hardware keeps the low 24 bits of what it is given).

use std::ffi::c_int;

use crate::gid::GidEntry;
use crate::ibv::attr::{self, QPS_ERR, QPS_INIT, QPS_RESET, QPS_RTR, QPS_RTS};
use crate::ibv::ffi::{self, QpAttr};
use crate::verbs::{LinkLayer, PortInfo, QpState};

/// PSNs are 24-bit.
pub(super) const PSN_MASK: u32 = 0x00ff_ffff;

/// `enum ibv_qp_state` of `s` (also what the shared QP table publishes).
pub(super) fn state_code(s: QpState) -> u32 {
    match s {
        QpState::Reset => QPS_RESET,
        QpState::Init => QPS_INIT,
        QpState::Rtr => QPS_RTR,
        QpState::Rts => QPS_RTS,
        QpState::Error => QPS_ERR,
    }
}

fn state_name(code: u32) -> &'static str {
    match code {
        QPS_RESET => "RESET",
        QPS_INIT => "INIT",
        QPS_RTR => "RTR",
        QPS_RTS => "RTS",
        QPS_ERR => "ERR",
        _ => "an unknown state",
    }
}

/// (required, optional) attribute bits of `cur` → `next` for an RC queue
/// pair, beside `IBV_QP_STATE`; `None`: not a valid transition.
fn rc_transition(cur: u32, next: u32) -> Option<(c_int, c_int)> {
    use ffi::*;
    let init_opt = QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS;
    Some(match (cur, next) {
        (_, QPS_RESET) | (_, QPS_ERR) => (0, 0),
        (QPS_RESET, QPS_INIT) => (QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS, 0),
        (QPS_INIT, QPS_INIT) => (0, init_opt),
        (QPS_INIT, QPS_RTR) => (
            QP_AV
                | QP_PATH_MTU
                | QP_DEST_QPN
                | QP_RQ_PSN
                | QP_MAX_DEST_RD_ATOMIC
                | QP_MIN_RNR_TIMER,
            QP_ALT_PATH | QP_ACCESS_FLAGS | QP_PKEY_INDEX,
        ),
        (QPS_RTR, QPS_RTS) => (
            QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY | QP_SQ_PSN | QP_MAX_QP_RD_ATOMIC,
            QP_CUR_STATE | QP_ALT_PATH | QP_ACCESS_FLAGS | QP_MIN_RNR_TIMER | QP_PATH_MIG_STATE,
        ),
        (QPS_RTS, QPS_RTS) => (
            0,
            QP_CUR_STATE | QP_ACCESS_FLAGS | QP_ALT_PATH | QP_PATH_MIG_STATE | QP_MIN_RNR_TIMER,
        ),
        _ => return None,
    })
}

/// Checks `ibv_modify_qp(qp in cur, a, mask)` as the kernel and an mlx5
/// device would; `Err` is the EINVAL's reason.
pub(super) fn check_modify(
    cur: QpState,
    a: &QpAttr,
    mask: c_int,
    port: &PortInfo,
    gids: &[GidEntry],
) -> Result<(), String> {
    let einval = |why: String| Err(format!("Invalid argument (EINVAL): {why}"));
    if mask & ffi::QP_STATE == 0 {
        return einval("the mask lacks IBV_QP_STATE".into());
    }
    let (from, to) = (state_code(cur), a.qp_state);
    let Some((required, optional)) = rc_transition(from, to) else {
        return einval(format!(
            "{} -> {} is not a transition of an RC queue pair",
            state_name(from),
            state_name(to)
        ));
    };
    let missing = required & !mask;
    if missing != 0 {
        return einval(format!(
            "{} -> {} requires attribute mask bits {missing:#x} (ibv_modify_qp(3))",
            state_name(from),
            state_name(to)
        ));
    }
    let extra = mask & !(required | optional | ffi::QP_STATE);
    if extra != 0 {
        return einval(format!(
            "{} -> {} does not take attribute mask bits {extra:#x}",
            state_name(from),
            state_name(to)
        ));
    }
    if mask & ffi::QP_PORT != 0 && a.port_num != port.port {
        return einval(format!(
            "port_num {} is not a port of {}",
            a.port_num, port.device
        ));
    }
    if mask & ffi::QP_PATH_MTU != 0 && attr::mtu_bytes(a.path_mtu).is_none() {
        return einval(format!("path_mtu {} is not an enum ibv_mtu", a.path_mtu));
    }
    if mask & ffi::QP_TIMEOUT != 0 && a.timeout > 31 {
        return einval(format!("timeout {} does not fit 5 bits", a.timeout));
    }
    if mask & ffi::QP_RETRY_CNT != 0 && a.retry_cnt > 7 {
        return einval(format!("retry_cnt {} does not fit 3 bits", a.retry_cnt));
    }
    if mask & ffi::QP_RNR_RETRY != 0 && a.rnr_retry > 7 {
        return einval(format!("rnr_retry {} does not fit 3 bits", a.rnr_retry));
    }
    if mask & ffi::QP_AV != 0 {
        if port.link_layer == LinkLayer::Ethernet && a.ah_attr.is_global == 0 {
            return einval("a RoCE address vector needs a GRH (is_global)".into());
        }
        if a.ah_attr.is_global != 0 {
            let s = a.ah_attr.grh.sgid_index;
            if !gids.iter().any(|e| e.index == s) {
                return einval(format!(
                    "sgid_index {s} is not in the port's GID table (indices {:?})",
                    gids.iter().map(|e| e.index).collect::<Vec<_>>()
                ));
            }
        }
    }
    Ok(())
}

/// What a connected QP's responder side publishes for its requester
/// (the shared QP table, `shared.rs`): the PSN it expects first, the QP
/// its ACKs go to, its port's active MTU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Responder {
    /// `rq_psn` (24 bits).
    pub expected_psn: u32,
    /// `dest_qp_num`.
    pub acks_to: u32,
    /// The port's active MTU in bytes.
    pub port_mtu: u32,
    /// Whether its INIT granted `IBV_ACCESS_REMOTE_WRITE`.
    pub remote_write: bool,
}

/// A connected QP's requester side (set at RTR and RTS).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Requester {
    /// Path MTU in bytes (RTR).
    pub path_mtu: u32,
    /// `sq_psn` (24 bits, RTS).
    pub send_psn: u32,
}

/// What becomes of a WRITE of `bytes` from QP `qpn` (requester `req`, on
/// a port of active MTU `port_mtu`) at `resp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Answer {
    /// Placed and acknowledged.
    Done,
    /// No ACK ever comes back; `lands`: the data was placed all the same.
    Unanswered { lands: bool, why: &'static str },
    /// NAKed (PSN sequence error) until the retries run out.
    Naked,
    /// Acknowledged as a duplicate: nothing placed, no receive completes.
    Duplicate,
    /// The responder QP takes no remote writes: a remote access error.
    RemoteAccess,
}

/// The responder's verdict on a WRITE (see the module's rules).
pub(super) fn answer(
    qpn: u32,
    req: Requester,
    port_mtu: u32,
    resp: Responder,
    bytes: u32,
) -> Answer {
    let fabric_mtu = port_mtu.min(resp.port_mtu);
    if bytes.min(req.path_mtu) > fabric_mtu {
        return Answer::Unanswered {
            lands: false,
            why: "packets above the fabric's MTU are dropped",
        };
    }
    let ahead = req.send_psn.wrapping_sub(resp.expected_psn) & PSN_MASK;
    if ahead != 0 {
        return if ahead < 1 << 23 {
            Answer::Naked
        } else {
            Answer::Duplicate
        };
    }
    if !resp.remote_write {
        return Answer::RemoteAccess;
    }
    if resp.acks_to != qpn {
        return Answer::Unanswered {
            lands: true,
            why: "the responder acknowledges another queue pair",
        };
    }
    Answer::Done
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::{PathAttrs, QpAddress, QpTransition};

    fn roce_port() -> (PortInfo, Vec<GidEntry>) {
        let ip = std::net::Ipv4Addr::new(198, 18, 0, 9);
        let gids = crate::gid::mlx5_roce_table(ip, [18, 0, 9]);
        let port = PortInfo {
            device: "mlx5_0".into(),
            port: 1,
            lid: 0,
            gid: gids[3].gid,
            mtu: 4096,
            link_layer: LinkLayer::Ethernet,
            gid_index: 3,
            numa_node: None,
        };
        (port, gids)
    }

    fn transitions() -> Vec<(QpState, QpTransition)> {
        let path = PathAttrs {
            mtu: 4096,
            gid_index: 3,
            sl: 0,
            traffic_class: 0,
            timeout: 20,
            retry_cnt: 7,
        };
        let remote = QpAddress {
            lid: 0,
            gid: [7; 16],
            qpn: 0x1234,
            psn: 0xabcdef,
        };
        vec![
            (QpState::Reset, QpTransition::Init),
            (QpState::Init, QpTransition::Rtr { remote, path }),
            (QpState::Rtr, QpTransition::Rts { psn: 5, path }),
            (QpState::Rts, QpTransition::Error),
            (QpState::Error, QpTransition::Reset),
        ]
    }

    /// The real provider's attributes pass every transition sncl makes;
    /// each required bit taken out, or an extra bit added, fails it.
    #[test]
    fn the_providers_attributes_pass_and_every_required_bit_is_checked() {
        let (port, gids) = roce_port();
        for (cur, to) in transitions() {
            let (a, mask) = attr::modify_attrs(&to, &port);
            check_modify(cur, &a, mask, &port, &gids).unwrap_or_else(|e| panic!("{to:?}: {e}"));
            for bit in (0..21)
                .map(|b| 1 << b)
                .filter(|b| mask & b != 0 && *b != ffi::QP_STATE)
            {
                let e = check_modify(cur, &a, mask & !bit, &port, &gids).unwrap_err();
                assert!(
                    e.contains("requires") && e.contains("EINVAL"),
                    "{to:?} {bit:#x}: {e}"
                );
            }
            let e = check_modify(cur, &a, mask | ffi::QP_DEST_QPN, &port, &gids);
            if !matches!(to, QpTransition::Rtr { .. }) {
                assert!(e.unwrap_err().contains("does not take"), "{to:?}");
            }
        }
    }

    #[test]
    fn bad_transitions_and_values_are_einval() {
        let (port, gids) = roce_port();
        let t = transitions();
        // RESET -> RTR skips INIT.
        let (a, mask) = attr::modify_attrs(&t[1].1, &port);
        let e = check_modify(QpState::Reset, &a, mask, &port, &gids).unwrap_err();
        assert!(e.contains("RESET -> RTR is not a transition"), "{e}");
        // A RoCE address vector without a GRH.
        let mut b = a;
        b.ah_attr.is_global = 0;
        let e = check_modify(QpState::Init, &b, mask, &port, &gids).unwrap_err();
        assert!(e.contains("GRH"), "{e}");
        // An sgid_index outside the table, a path MTU code out of range.
        let mut b = a;
        b.ah_attr.grh.sgid_index = 9;
        assert!(check_modify(QpState::Init, &b, mask, &port, &gids)
            .unwrap_err()
            .contains("sgid_index 9"));
        for code in [0, 6] {
            let mut b = a;
            b.path_mtu = code;
            assert!(check_modify(QpState::Init, &b, mask, &port, &gids)
                .unwrap_err()
                .contains("path_mtu"));
        }
        // A port the device does not have; a retry count past 3 bits.
        let (mut a, mask) = attr::modify_attrs(&t[0].1, &port);
        a.port_num = 2;
        assert!(check_modify(QpState::Reset, &a, mask, &port, &gids)
            .unwrap_err()
            .contains("port_num 2"));
        let (mut a, mask) = attr::modify_attrs(&t[2].1, &port);
        a.retry_cnt = 8;
        assert!(check_modify(QpState::Rtr, &a, mask, &port, &gids)
            .unwrap_err()
            .contains("retry_cnt 8"));
        let e = check_modify(QpState::Rtr, &a, mask & !ffi::QP_STATE, &port, &gids).unwrap_err();
        assert!(e.contains("IBV_QP_STATE"), "{e}");
    }

    #[test]
    fn answers_follow_mtu_psn_and_ack_rules() {
        let req = Requester {
            path_mtu: 4096,
            send_psn: 100,
        };
        let resp = Responder {
            expected_psn: 100,
            acks_to: 7,
            port_mtu: 4096,
            remote_write: true,
        };
        assert_eq!(answer(7, req, 4096, resp, 1 << 20), Answer::Done);
        // Path MTU 4096 towards a 1024-byte port: big packets are lost.
        let small = Responder {
            port_mtu: 1024,
            ..resp
        };
        assert!(matches!(
            answer(7, req, 4096, small, 4096),
            Answer::Unanswered { lands: false, .. }
        ));
        assert_eq!(answer(7, req, 4096, small, 1000), Answer::Done);
        let fits = Requester {
            path_mtu: 1024,
            ..req
        };
        assert_eq!(answer(7, fits, 4096, small, 1 << 20), Answer::Done);
        // PSNs: ahead is NAKed, behind is a duplicate, across the 24-bit wrap.
        for (send, expected, want) in [
            (101, 100, Answer::Naked),
            (99, 100, Answer::Duplicate),
            (0, PSN_MASK, Answer::Naked),
            (PSN_MASK, 0, Answer::Duplicate),
        ] {
            let r = Requester {
                send_psn: send,
                ..req
            };
            let s = Responder {
                expected_psn: expected,
                ..resp
            };
            assert_eq!(answer(7, r, 4096, s, 8), want, "{send} vs {expected}");
        }
        assert!(matches!(
            answer(8, req, 4096, resp, 8),
            Answer::Unanswered { lands: true, .. }
        ));
        let closed = Responder {
            remote_write: false,
            ..resp
        };
        assert_eq!(answer(7, req, 4096, closed, 8), Answer::RemoteAccess);
    }
}
