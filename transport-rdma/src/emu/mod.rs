//! Emulated verbs (`SNCL_IB_EMULATE=1`): the subset the transport uses,
//! between processes of one machine, with the semantics that matter.
//!
//! * Every registered region is a private shared-memory file with a header
//!   (magic, valid flag, base address, length, rkey; see `shared.rs`). A
//!   peer's RDMA WRITE maps the file and copies into it after checking the
//!   rkey, the valid flag and the bounds: anything else completes with a
//!   remote access error and moves the QP to ERROR, as hardware does. Local
//!   buffers are checked against their lkey (local protection error).
//! * The control channel is each device's QP table, another shared file:
//!   per QP its state and an inbound ring that only the connected peer QP
//!   writes. A WRITE_WITH_IMM appends its immediate after the copy; the
//!   owner's CQ poll takes it and consumes a posted receive (kept pending,
//!   as RNR retries would, until one is posted).
//! * A NIC answers for its QPs whether or not its process polls: a WRITE
//!   whose target QP is not in RTR/RTS, or whose device is closed or whose
//!   process is gone, completes at once with "transport retry counter
//!   exceeded" and moves the requester's QP to ERROR.
//! * QP states RESET → INIT → RTR → RTS are enforced (posting in the wrong
//!   state fails), completions are in order per QP (the failing request's
//!   before the flushes), a CQ that overflows raises `CqErr` and fails every
//!   later poll, and [`Fault`]s move QPs to ERROR (flushed completions) or
//!   the port down.

mod checks;
mod copy;
mod device_mr;
mod dma;
mod fork;
mod local_mr;
mod modify;
mod odp;
mod pinning;
mod post;
mod profile;
mod qp_rules;
mod shared;
mod stale_pages;
mod strict;
mod timing;
mod user_mr;
mod watch;
pub use fork::{fork_init, fork_initialized};
pub use pinning::pinned_bytes;
pub use profile::DeviceProfile;
pub use strict::retries_run_out_after;
pub use strict::Strict;

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};

use crate::ibv::attr::Registration;
use crate::verbs::{
    AsyncEvent, Fault, LinkLayer, Mr, PortInfo, QpAddress, QpState, QpTransition, Result, SendWr,
    Verbs, VerbsError, WcOpcode, WcStatus, WorkCompletion,
};
use local_mr::LocalMr;
use shared::{LocalRegion, LocalTable, Msg, RemoteRegion, RemoteTable, HEADER, QP_SLOTS};

/// Name of the emulated device.
pub const EMU_DEVICE: &str = "emu_ib0";
const PAGE: usize = 4096;

/// Whether the emulated provider offers `ibv_reg_dmabuf_mr` (test double:
/// a verbs library without it is emulated by turning this off).
static DMABUF: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Test double: makes emulated devices of this process behave as a verbs
/// library without `ibv_reg_dmabuf_mr` (`false`), so device memory is
/// staged; `true` (the default) offers it.
pub fn set_dmabuf_supported(on: bool) {
    DMABUF.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Whether the emulated kernel has nvidia-peermem loaded (test double;
/// off by default, as on a machine without it).
static PEERMEM: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Test double: makes this process's emulated NICs behave as if the
/// kernel had nvidia-peermem loaded (`true`): `ibv_reg_mr` then takes
/// device memory.
pub fn set_peermem_loaded(on: bool) {
    PEERMEM.store(on, std::sync::atomic::Ordering::Relaxed);
}

struct Qp {
    cq: u32,
    state: QpState,
    remote: Option<QpAddress>,
    max_send: u32,
    max_recv: u32,
    send_outstanding: u32,
    recvs: VecDeque<u64>,
    /// Immediates that found no receive posted.
    rnr: VecDeque<Msg>,
    /// Strict mode: its source GID does not cross the fabric (every WRITE
    /// ends in retry exceeded).
    unroutable: bool,
    /// How long its retries last (`None`: forever), from the RTS path.
    retry_after: Option<std::time::Duration>,
    /// Strict mode: a WRITE nothing answers is retrying; when the retries
    /// run out (`Some(None)`: never).
    failing: Option<Option<std::time::Instant>>,
    /// Its path MTU and send PSN as the hardware took them (`qp_rules.rs`).
    requester: qp_rules::Requester,
    /// `qp_access_flags` from its INIT.
    access: u32,
    /// Unsignalled work requests done since its last completion, and per
    /// completion in the CQ how many it covers (their send-queue slots and
    /// sources are freed when it is polled).
    unsignalled_done: u32,
    covers: VecDeque<u32>,
    /// Strict mode: a packet reached it (`COMM_EST` is raised once, at the
    /// first packet a QP in RTR receives).
    established: bool,
}

struct Cq {
    depth: usize,
    entries: VecDeque<WorkCompletion>,
    overflowed: bool,
}

/// The emulated device: one port, one protection domain.
pub struct EmuVerbs {
    port: PortInfo,
    table: LocalTable,
    remote_tables: HashMap<[u8; 16], RemoteTable>,
    next_key: u32,
    mrs: HashMap<u32, LocalMr>,
    remote_mrs: HashMap<([u8; 16], u32), RemoteRegion>,
    qps: HashMap<u32, Qp>,
    next_qpn: u32,
    /// Completion queues by handle (`None`: destroyed).
    cqs: Vec<Option<Cq>>,
    events: VecDeque<AsyncEvent>,
    /// Immediates a full peer ring could not take yet, in order.
    pending: VecDeque<([u8; 16], u32, Msg)>,
    /// Strict mode's rules ([`Strict`]).
    strict: Option<Strict>,
    /// Strict mode: posted WRITEs' sources per QP (`watch.rs`).
    watched: HashMap<u32, VecDeque<strict::Watched>>,
    /// Strict mode: send completions the hardware reports later (`timing.rs`).
    late: VecDeque<strict::Late>,
    /// Strict mode: WRITEs the NIC has not finished, per QP (`dma.rs`),
    /// and whose turn is first.
    dma: HashMap<u32, VecDeque<strict::Dma>>,
    dma_turn: usize,
    /// Strict mode: the link is down until then (`Fault::PortFlap`).
    link_up_at: Option<std::time::Instant>,
    /// `Fault::DmabufRefused`: dma-buf registrations fail (EOPNOTSUPP).
    dmabuf_refused: bool,
    /// Doorbells, send work requests and send completions so far.
    counted: crate::verbs::VerbsCounters,
}

/// Emulated device contexts open in this process now.
static CONTEXTS_OPEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many emulated device contexts this process has open now (each
/// `ibv_open_device`'s worth: its QP table, its protection domain). The
/// transport opens one per port per process and shares it (issue 36,
/// risk 7); tests count them here.
pub fn contexts_open() -> usize {
    CONTEXTS_OPEN.load(std::sync::atomic::Ordering::Relaxed)
}

fn call_err(op: &'static str, detail: String) -> VerbsError {
    VerbsError::Call {
        device: format!("{EMU_DEVICE}:1"),
        op,
        detail,
    }
}

fn wc(qpn: u32, wr_id: u64, status: WcStatus, opcode: WcOpcode) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status,
        opcode,
        byte_len: 0,
        imm: None,
        qp_num: qpn,
        vendor_err: 0,
    }
}

impl EmuVerbs {
    /// A new registration's keys: the lkey (even) and its rkey (odd).
    fn take_keys(&mut self) -> (u32, u32) {
        let key = self.next_key;
        self.next_key = self.next_key.wrapping_add(2);
        (key, key | 1)
    }

    /// Opens the emulated device: creates its QP table.
    pub fn open() -> Result<EmuVerbs> {
        Self::open_with(None, None)
    }

    /// [`EmuVerbs::open`] in strict mode (`SNCL_IB_EMULATE=strict`): the
    /// rules a real NIC and kernel apply ([`Strict`]); `gid_index` is
    /// `SNCL_IB_GID_INDEX` (`None`: chosen as on a real RoCE port).
    pub fn open_strict(strict: Strict, gid_index: Option<u8>) -> Result<EmuVerbs> {
        Self::open_with(Some(strict), gid_index)
    }

    fn open_with(strict: Option<Strict>, gid_index: Option<u8>) -> Result<EmuVerbs> {
        let token = transport_shm::private_file::random_token()
            .map_err(|e| call_err("ibv_open_device", e.to_string()))? as u64;
        let pid = std::process::id();
        let gid = shared::gid_of(pid, token);
        let table = LocalTable::create(&gid).map_err(|e| call_err("ibv_open_device", e))?;
        CONTEXTS_OPEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(EmuVerbs {
            port: PortInfo {
                device: EMU_DEVICE.to_string(),
                port: 1,
                lid: (pid & 0xffff) as u16,
                gid,
                mtu: strict.as_ref().map_or(4096, |s| s.mtu),
                link_layer: strict
                    .as_ref()
                    .map_or(LinkLayer::Emulated, Strict::link_layer),
                gid_index: match &strict {
                    Some(s) => s.gid_index(gid_index),
                    None => gid_index.unwrap_or(0),
                },
                numa_node: strict.as_ref().and_then(|s| s.numa_node),
            },
            table,
            remote_tables: HashMap::new(),
            next_key: (token as u32 & 0x00ff_ff00) | 0x100,
            mrs: HashMap::new(),
            remote_mrs: HashMap::new(),
            qps: HashMap::new(),
            next_qpn: 0x100 + (token as u32 & 0xff),
            cqs: Vec::new(),
            events: VecDeque::new(),
            pending: VecDeque::new(),
            strict,
            watched: HashMap::new(),
            late: VecDeque::new(),
            dma: HashMap::new(),
            dma_turn: 0,
            link_up_at: None,
            dmabuf_refused: false,
            counted: Default::default(),
        })
    }

    /// Gives back bytes strict mode charged as pinned.
    fn release_pinned(&self, bytes: u64) {
        if let Some(s) = &self.strict {
            pinning::release(s.pinned, bytes);
        }
    }

    fn dev(&self) -> String {
        self.port.name()
    }

    fn qp_mut(&mut self, op: &'static str, qpn: u32) -> Result<&mut Qp> {
        let dev = self.dev();
        self.qps.get_mut(&qpn).ok_or_else(|| VerbsError::Call {
            device: dev,
            op,
            detail: format!("no queue pair {qpn} on this device"),
        })
    }

    fn set_state(&mut self, qpn: u32, state: QpState) {
        if let Some(qp) = self.qps.get_mut(&qpn) {
            qp.state = state;
            self.table.publish(qpn, state, false);
        }
    }

    /// The peer device's table, if the device is open and its process alive.
    fn remote_table(&mut self, gid: [u8; 16]) -> Option<&RemoteTable> {
        let t = match self.remote_tables.entry(gid) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(RemoteTable::open(&gid)?),
        };
        t.owner_alive().then_some(&*t)
    }

    /// Appends a completion; an overflow loses it, raises `CqErr` and
    /// moves every QP on the queue to ERROR.
    fn complete(&mut self, cq: u32, w: WorkCompletion) {
        let Some(q) = self.cqs.get_mut(cq as usize).and_then(Option::as_mut) else {
            return;
        };
        if q.overflowed {
            return;
        }
        if q.entries.len() < q.depth {
            q.entries.push_back(w);
            return;
        }
        q.overflowed = true;
        self.events.push_back(AsyncEvent::CqErr { cq });
        let hit: Vec<u32> = self
            .qps
            .iter()
            .filter(|(_, p)| p.cq == cq)
            .map(|(n, _)| *n)
            .collect();
        for qpn in hit {
            self.set_state(qpn, QpState::Error);
        }
    }

    /// Moves a QP to ERROR, flushing its unfinished WRITEs and posted
    /// receives.
    fn enter_error(&mut self, qpn: u32) {
        self.set_state(qpn, QpState::Error);
        self.flush_dma(qpn, true);
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return;
        };
        qp.rnr.clear();
        let cq = qp.cq;
        let flushed: Vec<u64> = qp.recvs.drain(..).collect();
        for wr_id in flushed {
            self.complete(cq, wc(qpn, wr_id, WcStatus::WR_FLUSH_ERR, WcOpcode::Recv));
        }
    }

    /// Completes a send work request; an error moves the QP to ERROR after
    /// its completion (the flushes follow it).
    fn complete_send(&mut self, qpn: u32, wr_id: u64, status: WcStatus) {
        self.complete_send_as(qpn, wr_id, status, true);
    }

    /// [`EmuVerbs::complete_send`] of a work request posted `signaled` or
    /// not: an unsignalled success makes no completion; the next
    /// completion of the QP covers it.
    fn complete_send_as(&mut self, qpn: u32, wr_id: u64, status: WcStatus, signaled: bool) {
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return;
        };
        qp.send_outstanding += 1;
        if status == WcStatus::SUCCESS && !signaled {
            qp.unsignalled_done += 1;
            return;
        }
        let covered = std::mem::take(&mut qp.unsignalled_done);
        qp.covers.push_back(covered);
        self.counted.send_completions += 1;
        let cq = qp.cq;
        self.complete(cq, wc(qpn, wr_id, status, WcOpcode::RdmaWrite));
        if status != WcStatus::SUCCESS && status != WcStatus::WR_FLUSH_ERR {
            self.enter_error(qpn);
        }
    }

    /// Pushes what waits for room in peers' rings, in order.
    fn flush_pending(&mut self) {
        while let Some(&(gid, qpn, m)) = self.pending.front() {
            match self.remote_table(gid) {
                Some(t) if !t.push(qpn, m) => return,
                // Pushed, or the peer is gone (its QP no longer listens).
                _ => {
                    self.pending.pop_front();
                }
            }
        }
    }

    /// Takes the immediates that arrived on this device's QPs.
    fn drain_rings(&mut self) {
        let qpns: Vec<u32> = self.qps.keys().copied().collect();
        for qpn in qpns {
            while let Some(m) = self.table.pop(qpn) {
                let qp = self.qps.get_mut(&qpn).expect("listed");
                if !matches!(qp.state, QpState::Rtr | QpState::Rts) {
                    continue; // a QP that does not listen drops packets
                }
                // ibv_get_async_event(3), IBV_EVENT_COMM_EST: "communication
                // was established on a QP" — raised when a QP still in RTR
                // receives its first packet (an informational event).
                let first = !std::mem::replace(&mut qp.established, true);
                if first && qp.state == QpState::Rtr && self.strict.is_some() {
                    self.events.push_back(AsyncEvent::CommEst { qpn });
                }
                let qp = self.qps.get_mut(&qpn).expect("listed");
                match qp.recvs.pop_front() {
                    Some(wr_id) => self.deliver(qpn, m, wr_id),
                    None => qp.rnr.push_back(m),
                }
            }
        }
    }

    fn deliver(&mut self, qpn: u32, m: Msg, wr_id: u64) {
        let cq = self.qps[&qpn].cq;
        self.complete(
            cq,
            WorkCompletion {
                imm: Some(m.imm),
                byte_len: m.byte_len,
                ..wc(qpn, wr_id, WcStatus::SUCCESS, WcOpcode::RecvRdmaWithImm)
            },
        );
    }
}

impl Verbs for EmuVerbs {
    fn port(&self) -> &PortInfo {
        &self.port
    }

    fn alloc_mr(&mut self, len: usize) -> Result<Mr> {
        self.check_registration("ibv_reg_mr", Registration::Staging)?;
        let len = len.max(1).div_ceil(PAGE) * PAGE;
        let pinned = match &self.strict {
            Some(s) => {
                pinning::charge(s.pinned, &s.pin, len).map_err(|e| call_err("ibv_reg_mr", e))?
            }
            None => 0,
        };
        let (lkey, rkey) = self.take_keys();
        let region = LocalRegion::create(&self.port.gid, rkey, len).map_err(|e| {
            self.release_pinned(pinned);
            call_err("ibv_reg_mr", e)
        })?;
        let mr = Mr {
            addr: region.addr(),
            len,
            lkey,
            rkey,
        };
        // The region's pages are untouched yet (its header is apart).
        crate::numa::place(&self.port.device, self.port.numa_node, mr.addr, len);
        self.mrs
            .insert(lkey, LocalMr::of_region(mr, region, None, pinned));
        Ok(mr)
    }

    unsafe fn reg_user_mr(&mut self, addr: u64, len: usize, on_demand: bool) -> Result<Mr> {
        // SAFETY: this function's contract, passed on.
        unsafe { self.register_user(addr, len, on_demand) }
    }

    fn dereg_user_mr(&mut self, mr: &Mr) -> Result<()> {
        match self.mrs.get(&mr.lkey) {
            Some(m) if (m.region.is_none() || m.dmabuf.is_some()) && m.mr == *mr => {
                if let Some(r) = self.mrs.remove(&mr.lkey).and_then(|m| m.region) {
                    r.invalidate();
                }
                Ok(())
            }
            _ => Err(call_err(
                "ibv_dereg_mr",
                format!("no user registration with lkey {:#x}", mr.lkey),
            )),
        }
    }

    fn prefetch_on_demand(&mut self, mr: &Mr, addr: u64, len: usize) -> Result<bool> {
        self.prefetch(mr, addr, len)
    }

    fn supports_on_demand(&mut self) -> bool {
        // As the real provider probes: an on-demand registration is taken.
        let odp = Registration::UserSource { on_demand: true };
        self.check_registration("ibv_reg_mr", odp).is_ok()
    }

    fn supports_dmabuf(&self) -> bool {
        DMABUF.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn reg_dmabuf_mr(
        &mut self,
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
    ) -> Result<Mr> {
        self.reg_dmabuf(fd, offset, len, iova)
    }

    fn supports_peermem(&self) -> bool {
        PEERMEM.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn reg_peermem_mr(&mut self, dev: &dyn device::Device, addr: u64, len: usize) -> Result<Mr> {
        self.reg_peermem(dev, addr, len)
    }

    fn dereg_mr(&mut self, mr: &Mr) -> Result<()> {
        let local = self.mrs.remove(&mr.lkey).ok_or_else(|| {
            call_err(
                "ibv_dereg_mr",
                format!("no region with lkey {:#x}", mr.lkey),
            )
        })?;
        match local.region {
            Some(r) => {
                r.invalidate();
                self.release_pinned(local.pinned);
            }
            None => {
                let lkey = mr.lkey;
                self.mrs.insert(lkey, local);
                return Err(call_err(
                    "ibv_dereg_mr",
                    format!("lkey {lkey:#x} is a user registration (dereg_user_mr)"),
                ));
            }
        }
        Ok(())
    }

    fn create_cq(&mut self, depth: usize) -> Result<u32> {
        self.check_profile("ibv_create_cq", |p| p.check_cq(depth))?;
        if depth == 0 || depth > 1 << 22 {
            return Err(call_err(
                "ibv_create_cq",
                format!("depth {depth} out of range"),
            ));
        }
        self.cqs.push(Some(Cq {
            depth,
            entries: VecDeque::new(),
            overflowed: false,
        }));
        Ok(self.cqs.len() as u32 - 1)
    }

    fn destroy_cq(&mut self, cq: u32) -> Result<()> {
        if self.cqs.get(cq as usize).is_none_or(Option::is_none) {
            return Err(call_err(
                "ibv_destroy_cq",
                format!("no completion queue {cq}"),
            ));
        }
        // ibv_destroy_cq(3): fails (EBUSY) while a queue pair uses it.
        if let Some(qpn) = self.qps.iter().find(|(_, q)| q.cq == cq).map(|(n, _)| *n) {
            return Err(call_err(
                "ibv_destroy_cq",
                format!("EBUSY: completion queue {cq} still has queue pair {qpn}"),
            ));
        }
        self.cqs[cq as usize] = None;
        Ok(())
    }

    fn create_qp(&mut self, cq: u32, max_send: u32, max_recv: u32) -> Result<u32> {
        self.check_profile("ibv_create_qp", |p| p.check_qp(max_send, max_recv))?;
        if self.cqs.get(cq as usize).is_none_or(Option::is_none) || max_send == 0 || max_recv == 0 {
            return Err(call_err(
                "ibv_create_qp",
                format!("bad attributes: cq {cq}, max_send {max_send}, max_recv {max_recv}"),
            ));
        }
        if self.qps.len() >= QP_SLOTS {
            return Err(call_err(
                "ibv_create_qp",
                format!("the emulated device holds at most {QP_SLOTS} queue pairs"),
            ));
        }
        // A number whose table slot no live QP holds (a destroyed QP's
        // slot is taken again under a new number: peers of the old one
        // find the number changed and stop).
        let mut qpn = self.next_qpn;
        let slot = |n: u32| n as usize % QP_SLOTS;
        while self.qps.keys().any(|&q| slot(q) == slot(qpn)) {
            qpn += 1;
        }
        self.next_qpn = qpn + 1;
        self.qps.insert(
            qpn,
            Qp {
                cq,
                state: QpState::Reset,
                remote: None,
                max_send,
                max_recv,
                send_outstanding: 0,
                recvs: VecDeque::new(),
                rnr: VecDeque::new(),
                unroutable: false,
                retry_after: None,
                failing: None,
                requester: Default::default(),
                access: 0,
                unsignalled_done: 0,
                covers: VecDeque::new(),
                established: false,
            },
        );
        self.table.publish(qpn, QpState::Reset, true);
        if self.link_up_at.is_some() {
            self.table.set_link_down(std::iter::once(qpn), true);
        }
        Ok(qpn)
    }

    fn destroy_qp(&mut self, qpn: u32) -> Result<()> {
        self.qp_mut("ibv_destroy_qp", qpn)?;
        // Outstanding work is discarded (ibv_destroy_qp(3)): no completion
        // for it reaches the CQ, and the peer's WRITEs find the QP gone.
        self.qps.remove(&qpn);
        self.watched.remove(&qpn);
        self.dma.remove(&qpn);
        self.late.retain(|l| l.qpn != qpn);
        self.table.close(std::iter::once(qpn));
        Ok(())
    }

    fn modify_qp(&mut self, qpn: u32, to: QpTransition) -> Result<()> {
        self.modify(qpn, to)
    }

    fn qp_state(&self, qpn: u32) -> Result<QpState> {
        self.qps
            .get(&qpn)
            .map(|q| q.state)
            .ok_or_else(|| call_err("ibv_query_qp", format!("no queue pair {qpn}")))
    }

    fn post_send(&mut self, qpn: u32, wr: &SendWr) -> Result<()> {
        self.counted.doorbells += 1;
        self.post_one(qpn, wr)
    }

    fn post_send_chain(&mut self, qpn: u32, wrs: &[SendWr]) -> Result<()> {
        self.counted.doorbells += 1;
        wrs.iter().try_for_each(|w| self.post_one(qpn, w))
    }

    fn counters(&self) -> crate::verbs::VerbsCounters {
        self.counted
    }

    fn post_recv(&mut self, qpn: u32, wr_id: u64) -> Result<()> {
        let dev = self.dev();
        let qp = self.qp_mut("ibv_post_recv", qpn)?;
        match qp.state {
            QpState::Init | QpState::Rtr | QpState::Rts => {}
            QpState::Error => {
                let cq = qp.cq;
                self.complete(cq, wc(qpn, wr_id, WcStatus::WR_FLUSH_ERR, WcOpcode::Recv));
                return Ok(());
            }
            state => {
                return Err(VerbsError::QpState {
                    device: dev,
                    op: "ibv_post_recv",
                    qpn,
                    state,
                    need: "INIT, RTR or RTS",
                })
            }
        }
        if qp.recvs.len() >= qp.max_recv as usize {
            return Err(VerbsError::Call {
                device: dev,
                op: "ibv_post_recv",
                detail: format!("receive queue of QP {qpn} is full ({})", qp.max_recv),
            });
        }
        match qp.rnr.pop_front() {
            Some(m) => self.deliver(qpn, m, wr_id),
            None => qp.recvs.push_back(wr_id),
        }
        Ok(())
    }

    fn poll_cq(&mut self, cq: u32, max: usize, out: &mut Vec<WorkCompletion>) -> Result<usize> {
        if cq as usize >= self.cqs.len() {
            return Err(call_err("ibv_poll_cq", format!("no completion queue {cq}")));
        }
        self.check_link();
        self.advance_dma();
        self.release_late();
        self.flush_pending();
        self.drain_rings();
        let Some(q) = self.cqs[cq as usize].as_mut() else {
            return Err(call_err("ibv_poll_cq", format!("no completion queue {cq}")));
        };
        if q.overflowed {
            return Err(VerbsError::CqOverflow {
                device: self.port.name(),
                depth: q.depth,
            });
        }
        let n = max.min(q.entries.len());
        let done: Vec<WorkCompletion> = q.entries.drain(..n).collect();
        for mut w in done {
            if w.opcode == WcOpcode::RdmaWrite {
                let mut covered = 0;
                if let Some(qp) = self.qps.get_mut(&w.qp_num) {
                    covered = qp.covers.pop_front().unwrap_or(0);
                    qp.send_outstanding = qp.send_outstanding.saturating_sub(1 + covered);
                }
                self.check_source(&mut w, covered);
            }
            out.push(w);
        }
        Ok(n)
    }

    fn poll_async_event(&mut self) -> Option<AsyncEvent> {
        self.events.pop_front()
    }

    fn needs_progress(&self) -> bool {
        !self.pending.is_empty()
            || !self.late.is_empty()
            || self.dma_busy()
            || self.link_up_at.is_some()
    }

    fn inject(&mut self, fault: Fault) -> Result<()> {
        match fault {
            Fault::QpFatal { qpn } | Fault::Flush { qpn } => {
                self.qp_mut("inject", qpn)?;
                self.enter_error(qpn);
                if matches!(fault, Fault::QpFatal { .. }) {
                    self.events.push_back(AsyncEvent::QpFatal { qpn });
                }
            }
            Fault::DmabufRefused => self.dmabuf_refused = true,
            Fault::PortFlap { down_for } => {
                if self.strict.is_none() {
                    return Err(call_err(
                        "inject",
                        "a link flap needs the strict emulation (SNCL_IB_EMULATE=strict)".into(),
                    ));
                }
                self.flap(down_for);
            }
            Fault::PortDown => {
                let qpns: Vec<u32> = self.qps.keys().copied().collect();
                for qpn in qpns {
                    self.enter_error(qpn);
                }
                self.events.push_back(AsyncEvent::PortErr { port: 1 });
            }
        }
        Ok(())
    }
}

impl Drop for EmuVerbs {
    fn drop(&mut self) {
        CONTEXTS_OPEN.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        // The NIC is gone: none of its QPs answers, no region is valid.
        self.table.close(self.qps.keys().copied());
        for m in self.mrs.values() {
            if let Some(r) = &m.region {
                r.invalidate();
            }
            if let Some(s) = &self.strict {
                pinning::release(s.pinned, m.pinned);
            }
        }
    }
}

#[cfg(test)]
mod tests;
