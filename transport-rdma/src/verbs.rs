//! The small verbs interface the transport uses, with two providers: the
//! real one over libibverbs (`ibv.rs`) and the emulated one
//! ([`crate::emu`], `SNCL_IB_EMULATE=1`). Names and numbers follow
//! `<infiniband/verbs.h>` so that statuses read the same on both.

use std::fmt;

/// Result of a verbs call.
pub type Result<T> = std::result::Result<T, VerbsError>;

/// A verbs call that failed (the call itself, not a work completion).
#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    /// The provider refused or failed the call.
    #[error("{device}: {op} failed: {detail}")]
    Call {
        /// The device (e.g. `mlx5_0:1`, `emu_ib0:1`).
        device: String,
        /// The verb (`ibv_post_send`, ...).
        op: &'static str,
        /// What went wrong and what to check.
        detail: String,
    },
    /// The queue pair is in a state that does not allow the call.
    #[error("{device}: {op} on QP {qpn} in state {state} is not allowed (needs {need})")]
    QpState {
        /// The device.
        device: String,
        /// The verb.
        op: &'static str,
        /// The queue pair number.
        qpn: u32,
        /// Its state.
        state: QpState,
        /// The states that allow the call.
        need: &'static str,
    },
    /// A completion queue lost completions.
    #[error(
        "{device}: completion queue overflowed (depth {depth}): completions were lost and every \
         queue pair on it is in error; the CQ must hold every outstanding work request"
    )]
    CqOverflow {
        /// The device.
        device: String,
        /// The queue's depth.
        depth: usize,
    },
}

/// A queue pair's state (`enum ibv_qp_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpState {
    /// Just created, or reset.
    Reset,
    /// Initialised: may post receives.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// In error: every work request completes flushed.
    Error,
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Error => "ERROR",
        })
    }
}

/// The status of a work completion (`enum ibv_wc_status`, same numbers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WcStatus(pub u32);

impl WcStatus {
    /// `IBV_WC_SUCCESS`
    pub const SUCCESS: WcStatus = WcStatus(0);
    /// `IBV_WC_LOC_LEN_ERR`
    pub const LOC_LEN_ERR: WcStatus = WcStatus(1);
    /// `IBV_WC_LOC_PROT_ERR`
    pub const LOC_PROT_ERR: WcStatus = WcStatus(4);
    /// `IBV_WC_WR_FLUSH_ERR`
    pub const WR_FLUSH_ERR: WcStatus = WcStatus(5);
    /// `IBV_WC_REM_ACCESS_ERR`
    pub const REM_ACCESS_ERR: WcStatus = WcStatus(10);
    /// `IBV_WC_RETRY_EXC_ERR`
    pub const RETRY_EXC_ERR: WcStatus = WcStatus(12);
    /// `IBV_WC_GENERAL_ERR`
    pub const GENERAL_ERR: WcStatus = WcStatus(21);

    /// The status in words with what to check (not only a number).
    pub fn describe(self) -> &'static str {
        match self.0 {
            0 => "success",
            1 => "local length error (a work request's data did not fit)",
            2 => "local QP operation error (an internal consistency error of the QP)",
            4 => "local protection error (the local buffer is not registered or its lkey is wrong)",
            5 => "work request flushed (the queue pair went to the error state before it ran; an earlier error is the cause)",
            7 => "bad response from the remote side",
            8 => "local access error",
            9 => "remote invalid request (the peer's QP refused the operation)",
            10 => "remote access error (the rkey or the address range is not valid at the peer: a deregistered or out-of-bounds buffer)",
            11 => "remote operation error (the peer could not complete the operation)",
            12 => "transport retry counter exceeded (the peer did not answer: its process, NIC, port or link is gone, or on RoCE the GID index cannot reach it (a RoCE v1 or link-local GID across routers: SNCL_IB_GID_INDEX, `show_gids`); check the peer, the cabling/switch and SNCL_IB_TIMEOUT/SNCL_IB_RETRY_CNT)",
            13 => "RNR retry counter exceeded (the peer had no receive posted)",
            19 => "fatal error of the device",
            20 => "response timeout",
            21 => "general error",
            _ => "unknown work completion status",
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (status {})", self.describe(), self.0)
    }
}

/// What a completion completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcOpcode {
    /// An RDMA WRITE (with or without immediate) this side posted.
    RdmaWrite,
    /// A receive consumed by a peer's WRITE with immediate.
    RecvRdmaWithImm,
    /// A receive, or any completion with an error status (whose opcode
    /// verbs leaves undefined: tell them apart by `wr_id`).
    Recv,
}

/// One work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The work request's id.
    pub wr_id: u64,
    /// Its status.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Bytes written (receives with immediate).
    pub byte_len: u32,
    /// The immediate data (host order), for receives with immediate.
    pub imm: Option<u32>,
    /// The local queue pair.
    pub qp_num: u32,
    /// Vendor error code (0 where none).
    pub vendor_err: u32,
}

/// Link layer of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand (addressed by LID).
    InfiniBand,
    /// Ethernet: RoCE (addressed by GID).
    Ethernet,
    /// The emulated provider.
    Emulated,
}

/// An opened device port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// Device name (`mlx5_0`, `emu_ib0`).
    pub device: String,
    /// Port number (from 1).
    pub port: u8,
    /// Local identifier (InfiniBand).
    pub lid: u16,
    /// The GID at [`PortInfo::gid_index`] (RoCE v2; also set on InfiniBand).
    pub gid: [u8; 16],
    /// Active MTU in bytes.
    pub mtu: u32,
    /// The link layer.
    pub link_layer: LinkLayer,
    /// The index of [`PortInfo::gid`] in the port's GID table, which the
    /// connections' `sgid_index` names (`SNCL_IB_GID_INDEX`, else chosen:
    /// [`crate::gid::choose_gid_index`]).
    pub gid_index: u8,
    /// The NUMA node the NIC sits on (sysfs; `None`: not reported), where
    /// its registered host memory is placed ([`crate::numa`]).
    pub numa_node: Option<u32>,
}

impl PortInfo {
    /// `device:port`, as errors name it.
    pub fn name(&self) -> String {
        format!("{}:{}", self.device, self.port)
    }
}

/// A registered memory region, allocated by the provider (page aligned,
/// zeroed); valid until [`Verbs::dereg_mr`] or the provider is dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mr {
    /// Its virtual address (what work requests and peers use).
    pub addr: u64,
    /// Its length in bytes.
    pub len: usize,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
}

/// Where a peer's queue pair is (exchanged through the bootstrap store).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpAddress {
    /// The peer port's LID.
    pub lid: u16,
    /// The peer port's GID.
    pub gid: [u8; 16],
    /// The peer's queue pair number.
    pub qpn: u32,
    /// The peer's initial packet sequence number.
    pub psn: u32,
}

/// Path and timing attributes of a connection (`SNCL_IB_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathAttrs {
    /// Path MTU in bytes (the smaller of both ports').
    pub mtu: u32,
    /// GID index (`SNCL_IB_GID_INDEX`).
    pub gid_index: u8,
    /// Service level (`SNCL_IB_SL`).
    pub sl: u8,
    /// Traffic class (`SNCL_IB_TC`).
    pub traffic_class: u8,
    /// Local ACK timeout exponent (`SNCL_IB_TIMEOUT`: 4.096 µs × 2^timeout).
    pub timeout: u8,
    /// Transport retry count (`SNCL_IB_RETRY_CNT`).
    pub retry_cnt: u8,
}

/// A state transition of [`Verbs::modify_qp`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpTransition {
    /// RESET → INIT (port, access: remote write).
    Init,
    /// INIT → RTR, connected to `remote`.
    Rtr {
        /// The peer's queue pair.
        remote: QpAddress,
        /// Path attributes.
        path: PathAttrs,
    },
    /// RTR → RTS with this side's send PSN.
    Rts {
        /// This queue pair's initial send PSN.
        psn: u32,
        /// Path attributes (timeout, retries).
        path: PathAttrs,
    },
    /// Any state → ERROR.
    Error,
    /// Any state → RESET.
    Reset,
}

/// A send work request: RDMA WRITE of `local` to `remote_addr`/`rkey`,
/// with an immediate when `imm` is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWr {
    /// Whether it produces a completion when it succeeds
    /// (`IBV_SEND_SIGNALED`; the queue pair signals nothing by itself). A
    /// failed or flushed work request completes whatever this says. An
    /// unsignalled one is done, and its send-queue slot and source buffer
    /// free, once a later completion of its queue pair has been polled
    /// (ibv_post_send(3)).
    pub signaled: bool,
    /// Returned in the completion.
    pub wr_id: u64,
    /// Local buffer: address, length, lkey (length 0: no data).
    pub local: (u64, u32, u32),
    /// Remote address.
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Immediate data (host order): WRITE_WITH_IMM.
    pub imm: Option<u32>,
}

/// Work a provider counted (issue 36, risk 10: per-piece overheads).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VerbsCounters {
    /// Calls that told the NIC about new send work (one per post, one per
    /// chain).
    pub doorbells: u64,
    /// Send work requests posted.
    pub send_wrs: u64,
    /// Send completions reported (every send work request is signalled).
    pub send_completions: u64,
    /// Page faults the NIC took on on-demand registrations (strict
    /// emulation; issue 36, risk 8): each stalls its queue pair.
    pub odp_faults: u64,
}

/// An asynchronous event (`enum ibv_event_type`, the ones that matter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsyncEvent {
    /// A queue pair hit a fatal error.
    QpFatal {
        /// The queue pair.
        qpn: u32,
    },
    /// A completion queue overflowed.
    CqErr {
        /// The completion queue (`u32::MAX`: one the provider does not know).
        cq: u32,
    },
    /// The first packet reached a queue pair still in RTR
    /// (`IBV_EVENT_COMM_EST`): informational.
    CommEst {
        /// The queue pair.
        qpn: u32,
    },
    /// A port went down.
    PortErr {
        /// The port.
        port: u8,
    },
    /// A port came (back) up.
    PortActive {
        /// The port.
        port: u8,
    },
    /// The device hit a fatal error.
    DeviceFatal,
    /// Anything else (informational), with its `ibv_event_type` number.
    Other(u32),
}

impl fmt::Display for AsyncEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AsyncEvent::QpFatal { qpn } => write!(f, "QP {qpn} fatal error (IBV_EVENT_QP_FATAL)"),
            AsyncEvent::CqErr { cq } => {
                write!(f, "completion queue {cq} overrun (IBV_EVENT_CQ_ERR)")
            }
            AsyncEvent::PortErr { port } => write!(
                f,
                "port {port} went down (IBV_EVENT_PORT_ERR): check the cable, the switch port and `ibstat`"
            ),
            AsyncEvent::PortActive { port } => {
                write!(f, "port {port} is active (IBV_EVENT_PORT_ACTIVE)")
            }
            AsyncEvent::CommEst { qpn } => {
                write!(f, "QP {qpn} received its first packet (IBV_EVENT_COMM_EST)")
            }
            AsyncEvent::DeviceFatal => {
                write!(f, "device fatal error (IBV_EVENT_DEVICE_FATAL): check dmesg")
            }
            AsyncEvent::Other(n) => write!(f, "async event {n}"),
        }
    }
}

impl AsyncEvent {
    /// Whether the event breaks connections by itself. A port going down
    /// does not: its queue pairs stay in RTS and retry, and a link that
    /// comes back within their retries loses nothing (NCCL keeps its
    /// connections across it too); one that stays down fails them with
    /// retry exceeded, which the connection reports with the port named.
    pub fn is_fatal(&self) -> bool {
        !matches!(
            self,
            AsyncEvent::Other(_)
                | AsyncEvent::PortErr { .. }
                | AsyncEvent::PortActive { .. }
                | AsyncEvent::CommEst { .. }
        )
    }
}

/// A fault the emulated provider can inject (tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Move a queue pair to ERROR as the hardware would on a fatal error:
    /// outstanding work requests complete flushed and an async
    /// `QpFatal` event is raised.
    QpFatal {
        /// The queue pair.
        qpn: u32,
    },
    /// Flush a queue pair (to ERROR, flushed completions, no event).
    Flush {
        /// The queue pair.
        qpn: u32,
    },
    /// The port goes down: every queue pair to ERROR, `PortErr` raised.
    PortDown,
    /// The verbs library has `ibv_reg_dmabuf_mr` but the kernel or the
    /// NIC's driver does not take dma-bufs: every dma-buf registration
    /// fails with EOPNOTSUPP from now on (rdma-core 34+ on a kernel before
    /// 5.12, or a driver without `reg_user_mr_dmabuf`).
    DmabufRefused,
    /// The link flaps (strict emulation): `PortErr` now, `PortActive` after
    /// `down_for`; meanwhile no packet leaves or reaches the port, so WRITEs
    /// from and to it stall, and one stalled longer than its QP's retries
    /// last fails with retry exceeded. Queue pairs stay in RTS, as on a NIC.
    PortFlap {
        /// How long the link stays down.
        down_for: std::time::Duration,
    },
}

/// The verbs the transport uses. One value is one opened device port with
/// one protection domain; queue pairs and completion queues are named by
/// number. Connections use it through a handle on the process's one context
/// per port (`context.rs`), shared.
pub trait Verbs: Send {
    /// The opened port.
    fn port(&self) -> &PortInfo;
    /// Allocates `len` bytes (rounded up to pages) and registers them with
    /// local write and remote write access.
    fn alloc_mr(&mut self, len: usize) -> Result<Mr>;
    /// Deregisters and frees a region from [`Verbs::alloc_mr`].
    fn dereg_mr(&mut self, mr: &Mr) -> Result<()>;
    /// Registers `len` bytes of this process's memory at `addr` as the
    /// source of RDMA WRITEs (local read access; no remote access). With
    /// `on_demand` the registration follows the page tables (ODP: nothing
    /// is pinned, and it stays correct when the memory is unmapped and
    /// mapped again), else the pages are pinned until
    /// [`Verbs::dereg_user_mr`].
    ///
    /// # Safety
    /// `addr .. addr + len` is memory of this process that stays mapped
    /// while a work request reading it is outstanding (the emulated
    /// provider reads it when the work request is posted).
    unsafe fn reg_user_mr(&mut self, addr: u64, len: usize, on_demand: bool) -> Result<Mr>;
    /// Deregisters a region from [`Verbs::reg_user_mr`] or
    /// [`Verbs::reg_dmabuf_mr`] (the memory stays the caller's).
    fn dereg_user_mr(&mut self, mr: &Mr) -> Result<()>;
    /// Asks the device to translate `len` bytes at `addr` of the on-demand
    /// registration `mr` before work requests read them
    /// (`ibv_advise_mr(3)`, `IBV_ADVISE_MR_ADVICE_PREFETCH`, asynchronous),
    /// so that a first pass over fresh memory does not stall on the NIC's
    /// page faults. `Ok(false)`: this provider cannot (it is advice:
    /// nothing breaks without it); an error: the range is not in an
    /// on-demand registration.
    fn prefetch_on_demand(&mut self, mr: &Mr, addr: u64, len: usize) -> Result<bool> {
        let _ = (mr, addr, len);
        Ok(false)
    }
    /// Whether on-demand registration (ODP) works on this device: a
    /// registration made once stays valid for any later use of the range.
    fn supports_on_demand(&mut self) -> bool;
    /// Whether [`Verbs::reg_dmabuf_mr`] is there: libibverbs exports
    /// `ibv_reg_dmabuf_mr` (rdma-core 34 and newer; the NIC's driver and
    /// the kernel, 5.12 or newer, decide whether a registration then
    /// succeeds). Without it device memory is staged through host memory.
    fn supports_dmabuf(&self) -> bool {
        false
    }
    /// Registers `len` bytes from byte `offset` of the dma-buf `fd` (device
    /// memory, GPUDirect RDMA), addressed by work requests and peers at
    /// `iova`, with local write, remote write and local read access.
    /// Deregistered with [`Verbs::dereg_user_mr`]; the registration keeps
    /// its own reference to the memory, so `fd` may be closed afterwards.
    fn reg_dmabuf_mr(
        &mut self,
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
    ) -> Result<Mr> {
        let _ = (fd, offset, len, iova);
        Err(VerbsError::Call {
            device: self.port().name(),
            op: "ibv_reg_dmabuf_mr",
            detail: "this verbs library has no ibv_reg_dmabuf_mr (rdma-core 34 or newer has)"
                .into(),
        })
    }
    /// Whether `ibv_reg_mr` registers device memory here: the kernel has
    /// nvidia-peermem (or the older `nv_peer_mem`) loaded, GPUDirect's
    /// route where dma-buf is not there (older kernels, the proprietary
    /// GPU kernel modules).
    fn supports_peermem(&self) -> bool {
        false
    }
    /// Registers `len` bytes of `dev`'s memory at device address `addr`
    /// through nvidia-peermem (`ibv_reg_mr` on the device pointer), with
    /// the access of [`Verbs::reg_dmabuf_mr`]; deregistered with
    /// [`Verbs::dereg_user_mr`].
    fn reg_peermem_mr(&mut self, dev: &dyn device::Device, addr: u64, len: usize) -> Result<Mr> {
        let _ = (dev, addr, len);
        Err(VerbsError::Call {
            device: self.port().name(),
            op: "ibv_reg_mr",
            detail: "device memory registers only with nvidia-peermem loaded".into(),
        })
    }
    /// Creates a completion queue of `depth` entries; returns its handle.
    fn create_cq(&mut self, depth: usize) -> Result<u32>;
    /// Destroys a completion queue once no queue pair uses it
    /// (`ibv_destroy_cq(3)`: EBUSY while one does).
    fn destroy_cq(&mut self, cq: u32) -> Result<()>;
    /// Creates an RC queue pair on completion queue `cq` (both directions).
    fn create_qp(&mut self, cq: u32, max_send: u32, max_recv: u32) -> Result<u32>;
    /// Destroys a queue pair; its outstanding work is discarded, and a
    /// peer's later WRITEs to it fail (`ibv_destroy_qp(3)`).
    fn destroy_qp(&mut self, qpn: u32) -> Result<()>;
    /// Moves a queue pair to another state; only RESET→INIT→RTR→RTS (and
    /// anything → ERROR or RESET) are allowed.
    fn modify_qp(&mut self, qpn: u32, to: QpTransition) -> Result<()>;
    /// A queue pair's state.
    fn qp_state(&self, qpn: u32) -> Result<QpState>;
    /// Posts a send work request (RTS only; ERROR completes it flushed).
    fn post_send(&mut self, qpn: u32, wr: &SendWr) -> Result<()>;
    /// Posts `wrs` in order on `qpn` with one doorbell (`ibv_post_send` of
    /// a linked list: the NIC is told once for the chain). The default
    /// posts them one by one.
    fn post_send_chain(&mut self, qpn: u32, wrs: &[SendWr]) -> Result<()> {
        wrs.iter().try_for_each(|w| self.post_send(qpn, w))
    }
    /// What the provider counted so far (the emulated one counts; a real
    /// NIC's work is not counted here).
    fn counters(&self) -> VerbsCounters {
        VerbsCounters::default()
    }
    /// Posts a receive for an immediate (INIT, RTR, RTS; ERROR flushes).
    fn post_recv(&mut self, qpn: u32, wr_id: u64) -> Result<()>;
    /// Appends up to `max` completions of `cq` to `out`; returns how many.
    fn poll_cq(&mut self, cq: u32, max: usize, out: &mut Vec<WorkCompletion>) -> Result<usize>;
    /// The next asynchronous event, if any (non-blocking).
    fn poll_async_event(&mut self) -> Option<AsyncEvent>;
    /// Whether work posted so far still needs this process's CPU to reach
    /// the peer (the emulated provider; a NIC moves data by itself).
    fn needs_progress(&self) -> bool {
        false
    }
    /// Injects a fault (emulated provider only).
    fn inject(&mut self, fault: Fault) -> Result<()> {
        Err(VerbsError::Call {
            device: self.port().name(),
            op: "inject",
            detail: format!("fault injection ({fault:?}) needs the emulated provider"),
        })
    }
}
