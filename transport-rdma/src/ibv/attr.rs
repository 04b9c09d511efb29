//! The `ibv_modify_qp` attributes and mask of each transition, built in
//! one place: the real provider passes them to libibverbs, and the strict
//! emulated provider checks the same values against the kernel's rules
//! (`emu/qp_rules.rs`), so a missing or extra mask bit fails on this
//! machine rather than as EINVAL on the first NIC.

use std::ffi::c_int;

use super::ffi;
use crate::verbs::{LinkLayer, PortInfo, QpTransition};

/// `enum ibv_qp_state` values.
pub(crate) const QPS_RESET: u32 = 0;
pub(crate) const QPS_INIT: u32 = 1;
pub(crate) const QPS_RTR: u32 = 2;
pub(crate) const QPS_RTS: u32 = 3;
pub(crate) const QPS_ERR: u32 = 6;

/// `enum ibv_mtu` code of a path MTU of `bytes` (the largest of 256 …
/// 4096 not above it; 256 below that).
pub(crate) fn mtu_code(bytes: u32) -> u32 {
    match bytes {
        4096.. => 5,
        2048.. => 4,
        1024.. => 3,
        512.. => 2,
        _ => 1,
    }
}

/// Bytes of `enum ibv_mtu` `code` (1 … 5: 256 … 4096; `None` otherwise).
pub(crate) fn mtu_bytes(code: u32) -> Option<u32> {
    (1..=5).contains(&code).then(|| 128 << code)
}

/// What a memory registration is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Registration {
    /// The transport's own staging, FIFOs and boards: peers write into it.
    Staging,
    /// A device allocation exported as a dma-buf (GPUDirect inbox or
    /// source): peers write into inboxes.
    DmaBuf,
    /// A user buffer WRITEs read from (zero-copy sends; `on_demand`: ODP,
    /// also the probe of whether the device pages on demand).
    UserSource { on_demand: bool },
}

/// The `ibv_reg_mr` access flags of a registration `r` (local reads need
/// no flag; remote write needs local write, ibv_reg_mr(3)).
pub(crate) fn mr_access(r: Registration) -> c_int {
    match r {
        Registration::Staging | Registration::DmaBuf => ffi::ACCESS_LOCAL_REMOTE_WRITE,
        Registration::UserSource { on_demand: true } => ffi::ACCESS_ON_DEMAND,
        Registration::UserSource { on_demand: false } => 0,
    }
}

/// The attributes and mask `ibv_modify_qp` gets for `to` on `port` (an RC
/// queue pair; ibv_modify_qp(3), "required attributes" per transition).
pub(crate) fn modify_attrs(to: &QpTransition, port: &PortInfo) -> (ffi::QpAttr, c_int) {
    let mut a = ffi::QpAttr::default();
    let mask = match *to {
        QpTransition::Init => {
            a.qp_state = QPS_INIT;
            a.port_num = port.port;
            a.qp_access_flags = ffi::ACCESS_LOCAL_REMOTE_WRITE as u32;
            ffi::QP_STATE | ffi::QP_PKEY_INDEX | ffi::QP_PORT | ffi::QP_ACCESS_FLAGS
        }
        QpTransition::Rtr { remote, path } => {
            a.qp_state = QPS_RTR;
            a.path_mtu = mtu_code(path.mtu);
            a.dest_qp_num = remote.qpn;
            a.rq_psn = remote.psn;
            a.max_dest_rd_atomic = 1;
            a.min_rnr_timer = 12;
            a.ah_attr.dlid = remote.lid;
            a.ah_attr.sl = path.sl;
            a.ah_attr.port_num = port.port;
            if port.link_layer == LinkLayer::Ethernet || remote.gid != [0; 16] {
                a.ah_attr.is_global = 1;
                a.ah_attr.grh.dgid = ffi::Gid(remote.gid);
                a.ah_attr.grh.sgid_index = port.gid_index;
                a.ah_attr.grh.hop_limit = 255;
                a.ah_attr.grh.traffic_class = path.traffic_class;
            }
            ffi::QP_STATE
                | ffi::QP_AV
                | ffi::QP_PATH_MTU
                | ffi::QP_DEST_QPN
                | ffi::QP_RQ_PSN
                | ffi::QP_MAX_DEST_RD_ATOMIC
                | ffi::QP_MIN_RNR_TIMER
        }
        QpTransition::Rts { psn, path } => {
            a.qp_state = QPS_RTS;
            a.sq_psn = psn;
            a.timeout = path.timeout;
            a.retry_cnt = path.retry_cnt;
            a.rnr_retry = 7;
            a.max_rd_atomic = 1;
            ffi::QP_STATE
                | ffi::QP_TIMEOUT
                | ffi::QP_RETRY_CNT
                | ffi::QP_RNR_RETRY
                | ffi::QP_SQ_PSN
                | ffi::QP_MAX_QP_RD_ATOMIC
        }
        QpTransition::Error => {
            a.qp_state = QPS_ERR;
            ffi::QP_STATE
        }
        QpTransition::Reset => {
            a.qp_state = QPS_RESET;
            ffi::QP_STATE
        }
    };
    (a, mask)
}
