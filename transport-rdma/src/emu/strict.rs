//! The strict emulated port (`SNCL_IB_EMULATE=strict`): what a RoCE port on
//! a routed (L3) fabric and the kernel enforce that the permissive
//! emulation answers at once. Each rule cites its source and has a test
//! that fails without it (docs/RDMA.md, "Strict emulation").
//!
//! * Pinned memory: [`super::pinning`] (`ib_umem_get`).
//! * The device's limits and registration access: [`DeviceProfile`]
//!   (`profile.rs`); queue-pair attributes and the responder's verdicts:
//!   `qp_rules.rs`.
//! * The GID table and the fabric: the port is RoCE (Ethernet link layer)
//!   with an mlx5-like table ([`crate::gid::mlx5_roce_table`]: 0 v1
//!   link-local, 1 v2 link-local, 2 v1 IPv4, 3 v2 IPv4); nodes sit in
//!   different racks joined by routers, as RoCE clusters are built. An RTR
//!   whose `sgid_index` is not in the table fails (ibv_modify_qp(3):
//!   EINVAL for an invalid attribute); a QP whose source GID is RoCE v1 or
//!   link-local reaches RTS (the hardware does not check reachability), but
//!   its packets never reach a peer behind a router: every WRITE ends with
//!   "transport retry counter exceeded" and the QP goes to ERROR, as a real
//!   NIC reports after its retries (ibv_poll_cq(3), IBV_WC_RETRY_EXC_ERR).

use std::net::Ipv4Addr;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use super::profile::DeviceProfile;
use super::shared::Msg;
use crate::gid::{choose_gid_index, mlx5_roce_table, GidEntry};
use crate::sys::PinRules;
use crate::verbs::{LinkLayer, WcStatus};

/// The strict port's rules.
#[derive(Clone, Debug)]
pub struct Strict {
    /// The kernel's pinning rule this process runs under.
    pub pin: PinRules,
    /// The port's GID table.
    pub gids: Vec<GidEntry>,
    /// Where pinned bytes are counted: the process's count
    /// ([`super::pinned_bytes`]), or a test's own.
    pub pinned: &'static AtomicU64,
    /// The port's active MTU in bytes (4096; a RoCE port on a 1500-byte
    /// Ethernet MTU reports 1024).
    pub mtu: u32,
    /// The device's limits and capabilities (a ConnectX-7's).
    pub profile: DeviceProfile,
    /// The NUMA node the NIC reports (the machine's first node, where
    /// it has one), on which its registered memory is placed.
    pub numa_node: Option<u32>,
}

impl Strict {
    /// A strict port under `pin` whose table's IPv4 entries carry `ip`.
    pub fn new(pin: PinRules, ip: Ipv4Addr) -> Strict {
        let o = ip.octets();
        Strict {
            pin,
            gids: mlx5_roce_table(ip, [o[1], o[2], o[3]]),
            pinned: &super::pinning::PINNED,
            mtu: 4096,
            profile: DeviceProfile::CONNECTX7,
            numa_node: crate::numa::first_node(),
        }
    }

    /// The link layer the strict port reports (RoCE).
    pub fn link_layer(&self) -> LinkLayer {
        LinkLayer::Ethernet
    }

    /// The GID index the port's connections use (`forced`:
    /// `SNCL_IB_GID_INDEX`), chosen as on a real port.
    pub fn gid_index(&self, forced: Option<u8>) -> u8 {
        choose_gid_index(&self.gids, self.link_layer(), forced).0
    }

    /// Whether a QP sending from `sgid_index` reaches peers across the
    /// fabric; an index outside the table is `Err` (EINVAL at RTR).
    pub fn routable(&self, sgid_index: u8) -> Result<bool, String> {
        match self.gids.iter().find(|e| e.index == sgid_index) {
            Some(e) => Ok(e.routable()),
            None => Err(format!(
                "Invalid argument (EINVAL): sgid_index {sgid_index} is not in the port's GID \
                 table (indices {:?})",
                self.gids.iter().map(|e| e.index).collect::<Vec<_>>()
            )),
        }
    }
}

/// One posted WRITE's source, in posting order per QP (completions come
/// in that order).
pub(super) struct Watched {
    /// (address, length, lkey) of the source; `None` where the work
    /// request completes without reading it (flushed).
    pub(super) source: Option<((u64, usize, u32), u32)>,
}

/// How long a requester retries before `IBV_WC_RETRY_EXC_ERR` (`None`:
/// forever, `timeout` 0).
pub fn retries_run_out_after(timeout: u8, retry_cnt: u8) -> Option<Duration> {
    if timeout == 0 {
        return None;
    }
    let per_try_ns = 4096u128 << timeout.min(31);
    let ns = per_try_ns * (u128::from(retry_cnt) + 1);
    Some(Duration::from_nanos(ns.min(u64::MAX as u128) as u64))
}

/// A send completion the hardware reports later.
pub(super) struct Late {
    /// When (`None`: never, the retries never run out).
    pub(super) due: Option<Instant>,
    pub(super) qpn: u32,
    pub(super) wr_id: u64,
    pub(super) status: WcStatus,
}

/// How a queued WRITE ends once its bytes are placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum End {
    /// Acknowledged.
    Acked,
    /// Never acknowledged: retried until the QP's retries run out.
    Unanswered,
    /// Completed with this status (nothing placed: queue length 0).
    Status(WcStatus),
}

/// A WRITE the NIC has not finished (`dma.rs`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Dma {
    pub wr_id: u64,
    /// Source: address, length, lkey.
    pub local: (u64, usize, u32),
    /// Destination: the peer device's GID, address, rkey.
    pub remote: ([u8; 16], u64, u32),
    /// Bytes placed so far.
    pub done: usize,
    /// The peer's QP.
    pub peer_qpn: u32,
    /// Whether its success makes a completion.
    pub signaled: bool,
    /// The immediate for the peer's QP, delivered after the last byte.
    pub imm: Option<Msg>,
    pub end: End,
    /// Since when no packet could go (a link down at either end): it
    /// fails once that outlasts its QP's retries.
    pub stalled_since: Option<Instant>,
}
