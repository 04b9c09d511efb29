//! Emulated verbs (`SNCL_IB_EMULATE=1`): the subset the transport uses,
//! between processes of one machine, with the semantics that matter.
//!
//! * Every registered region is a private shared-memory file
//!   (`/dev/shm/sncl-ibemu-<token>-<rkey>-<pid>`, mode 0600, created with
//!   [`transport_shm::private_file`]) with a header page (magic, valid flag,
//!   base address, length, rkey). A peer's RDMA WRITE maps the file and
//!   copies into it after checking the rkey, the valid flag and the bounds:
//!   anything else completes with a remote access error and moves the QP to
//!   ERROR, as hardware does. Local buffers are checked against their lkey.
//! * A small control channel carries what the wire would: one Unix datagram
//!   socket per opened device (abstract name derived from the GID, which
//!   holds the pid and a random token). A WRITE sends a 48-byte message
//!   after its copy; with an immediate it consumes a posted receive at the
//!   peer (kept pending, as RNR retries would, until one is posted). A QP not
//!   in RTR/RTS answers with a NAK, which completes the requester's work
//!   request with "transport retry counter exceeded" and moves its QP to
//!   ERROR; a socket that is gone (the peer process died) does the same at
//!   once.
//! * Each device publishes its QPs' states in a small shared table
//!   (`...-qps-<pid>`): a WRITE to a QP that is not in RTR/RTS (or no longer
//!   exists) completes with "transport retry counter exceeded" at once,
//!   whether or not the peer's process polls, as a NIC would after its
//!   retries.
//! * QP states RESET → INIT → RTR → RTS are enforced (posting in the wrong
//!   state fails), completions are in order per QP, a CQ that overflows
//!   raises `CqErr` and fails every later poll, and [`Fault`]s move QPs to
//!   ERROR (flushed completions) or the port down.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use memmap2::MmapRaw;

use crate::mem;
use crate::verbs::{
    AsyncEvent, Fault, LinkLayer, Mr, PortInfo, QpAddress, QpState, QpTransition, Result, SendWr,
    Verbs, VerbsError, WcOpcode, WcStatus, WorkCompletion,
};

/// Name of the emulated device.
pub const EMU_DEVICE: &str = "emu_ib0";
const HEADER: usize = 4096;
const MAGIC: u64 = 0x534e_434c_4942_454d; // "SNCLIBEM"
const MSG: usize = 48;
const KIND_WRITE: u8 = 1;
const KIND_NAK: u8 = 2;
const PAGE: usize = 4096;
/// Entries of the QP state table: `qpn << 32 | state`, at `qpn % QP_TABLE`.
const QP_TABLE: usize = 512;

struct LocalMr {
    map: Arc<MmapRaw>,
    path: PathBuf,
    mr: Mr,
}

struct RemoteMr {
    map: MmapRaw,
    base: u64,
    len: usize,
}

struct Qp {
    cq: u32,
    state: QpState,
    remote: Option<QpAddress>,
    max_send: u32,
    max_recv: u32,
    send_outstanding: u32,
    recvs: VecDeque<u64>,
    /// WRITE_WITH_IMM messages that found no receive posted.
    rnr: VecDeque<Msg>,
}

struct Cq {
    depth: usize,
    entries: VecDeque<WorkCompletion>,
    overflowed: bool,
}

#[derive(Clone, Copy)]
struct Msg {
    kind: u8,
    has_imm: bool,
    dst_qpn: u32,
    src_qpn: u32,
    imm: u32,
    byte_len: u32,
    wr_id: u64,
    src_gid: [u8; 16],
}

impl Msg {
    fn encode(&self) -> [u8; MSG] {
        let mut b = [0u8; MSG];
        b[0] = self.kind;
        b[1] = self.has_imm as u8;
        b[4..8].copy_from_slice(&self.dst_qpn.to_le_bytes());
        b[8..12].copy_from_slice(&self.src_qpn.to_le_bytes());
        b[12..16].copy_from_slice(&self.imm.to_le_bytes());
        b[16..20].copy_from_slice(&self.byte_len.to_le_bytes());
        b[24..32].copy_from_slice(&self.wr_id.to_le_bytes());
        b[32..48].copy_from_slice(&self.src_gid);
        b
    }

    fn decode(b: &[u8]) -> Option<Msg> {
        if b.len() != MSG || !matches!(b[0], KIND_WRITE | KIND_NAK) {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        Some(Msg {
            kind: b[0],
            has_imm: b[1] != 0,
            dst_qpn: u32_at(4),
            src_qpn: u32_at(8),
            imm: u32_at(12),
            byte_len: u32_at(16),
            wr_id: u64::from_le_bytes(b[24..32].try_into().unwrap()),
            src_gid: b[32..48].try_into().unwrap(),
        })
    }
}

/// The emulated device: one port, one protection domain.
pub struct EmuVerbs {
    port: PortInfo,
    sock: UnixDatagram,
    /// This device's QP states, readable by peers (a NIC answers for its
    /// QPs whether or not its process polls).
    qp_table: LocalMr,
    remote_tables: HashMap<[u8; 16], Arc<MmapRaw>>,
    next_key: u32,
    mrs: HashMap<u32, LocalMr>,
    remote_mrs: HashMap<([u8; 16], u32), RemoteMr>,
    qps: HashMap<u32, Qp>,
    next_qpn: u32,
    cqs: Vec<Cq>,
    events: VecDeque<AsyncEvent>,
    /// Messages the peer's socket had no room for yet, in order.
    pending: VecDeque<([u8; 16], [u8; MSG])>,
}

fn gid_of(pid: u32, token: u64) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0..4].copy_from_slice(b"snem");
    g[4..8].copy_from_slice(&pid.to_le_bytes());
    g[8..16].copy_from_slice(&token.to_le_bytes());
    g
}

fn split_gid(gid: &[u8; 16]) -> Option<(u32, u64)> {
    (&gid[0..4] == b"snem").then(|| {
        (
            u32::from_le_bytes(gid[4..8].try_into().unwrap()),
            u64::from_le_bytes(gid[8..16].try_into().unwrap()),
        )
    })
}

fn socket_name(pid: u32, token: u64) -> String {
    format!("sncl-ibemu-{pid}-{token:016x}")
}

fn mr_file_name(pid: u32, token: u64, rkey: u32) -> String {
    // The pid comes last: transport_shm::cleanup_stale removes the files
    // of dead processes.
    format!(
        "{}ibemu-{token:016x}-{rkey:08x}-{pid}",
        transport_shm::PREFIX
    )
}

impl EmuVerbs {
    /// Opens the emulated device: binds its control socket.
    pub fn open() -> Result<EmuVerbs> {
        let token = u64::from_le_bytes(
            transport_shm::private_file::random_token()
                .map_err(|e| call_err("open", e.to_string()))?
                .to_le_bytes()[..8]
                .try_into()
                .unwrap(),
        );
        let pid = std::process::id();
        let bind = || -> io::Result<UnixDatagram> {
            let addr = SocketAddr::from_abstract_name(socket_name(pid, token))?;
            let sock = UnixDatagram::bind_addr(&addr)?;
            sock.set_nonblocking(true)?;
            Ok(sock)
        };
        let sock = bind().map_err(|e| {
            call_err(
                "ibv_open_device",
                format!("binding the control socket failed: {e}"),
            )
        })?;
        let table_name = format!("{}ibemu-{token:016x}-qps-{pid}", transport_shm::PREFIX);
        let (file, path) =
            transport_shm::private_file::create(&table_name, QP_TABLE * 8).map_err(|e| {
                call_err(
                    "ibv_open_device",
                    format!("creating /dev/shm/{table_name}: {e}"),
                )
            })?;
        let map = MmapRaw::map_raw(&file).map_err(|e| {
            let _ = std::fs::remove_file(&path);
            call_err(
                "ibv_open_device",
                format!("mapping /dev/shm/{table_name}: {e}"),
            )
        })?;
        let qp_table = LocalMr {
            map: Arc::new(map),
            path,
            mr: Mr {
                addr: 0,
                len: QP_TABLE * 8,
                lkey: 0,
                rkey: 0,
            },
        };
        Ok(EmuVerbs {
            qp_table,
            remote_tables: HashMap::new(),
            port: PortInfo {
                device: EMU_DEVICE.to_string(),
                port: 1,
                lid: (pid & 0xffff) as u16,
                gid: gid_of(pid, token),
                mtu: 4096,
                link_layer: LinkLayer::Emulated,
            },
            sock,
            next_key: (token as u32 & 0x00ff_ff00) | 0x100,
            mrs: HashMap::new(),
            remote_mrs: HashMap::new(),
            qps: HashMap::new(),
            next_qpn: 0x100 + (token as u32 & 0xff),
            cqs: Vec::new(),
            events: VecDeque::new(),
            pending: VecDeque::new(),
        })
    }

    fn dev(&self) -> String {
        self.port.name()
    }

    fn table_name(gid: &[u8; 16]) -> Option<String> {
        let (pid, token) = split_gid(gid)?;
        Some(format!(
            "{}ibemu-{token:016x}-qps-{pid}",
            transport_shm::PREFIX
        ))
    }

    /// Publishes a QP's state in this device's table.
    fn publish(&self, qpn: u32, state: QpState) {
        let code = match state {
            QpState::Reset => 0,
            QpState::Init => 1,
            QpState::Rtr => 2,
            QpState::Rts => 3,
            QpState::Error => 6,
        };
        mem::header_word(&self.qp_table.map, qpn as usize % QP_TABLE)
            .store((u64::from(qpn) << 32) | code, Ordering::Release);
    }

    /// Whether the peer's QP `qpn` answers (is in RTR or RTS).
    fn remote_qp_ready(&mut self, gid: [u8; 16], qpn: u32) -> bool {
        let open = || -> Option<MmapRaw> {
            let (file, _) = transport_shm::private_file::open(&Self::table_name(&gid)?).ok()?;
            MmapRaw::map_raw(&file)
                .ok()
                .filter(|m| m.len() >= QP_TABLE * 8)
        };
        let table = match self.remote_tables.entry(gid) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => match open() {
                Some(m) => e.insert(Arc::new(m)),
                None => return false,
            },
        };
        let w = mem::header_word(table, qpn as usize % QP_TABLE).load(Ordering::Acquire);
        (w >> 32) as u32 == qpn && matches!(w & 0xffff_ffff, 2 | 3)
    }

    fn qp_mut(&mut self, op: &'static str, qpn: u32) -> Result<&mut Qp> {
        let dev = self.dev();
        self.qps.get_mut(&qpn).ok_or_else(|| VerbsError::Call {
            device: dev,
            op,
            detail: format!("no queue pair {qpn} on this device"),
        })
    }

    /// Appends a completion; an overflow loses it, raises `CqErr` and
    /// moves every QP on the queue to ERROR.
    fn complete(&mut self, cq: u32, wc: WorkCompletion) {
        let q = &mut self.cqs[cq as usize];
        if q.overflowed {
            return;
        }
        if q.entries.len() >= q.depth {
            q.overflowed = true;
            self.events.push_back(AsyncEvent::CqErr);
            let mut hit = Vec::new();
            for (qpn, qp) in self.qps.iter_mut().filter(|(_, p)| p.cq == cq) {
                qp.state = QpState::Error;
                hit.push(*qpn);
            }
            for qpn in hit {
                self.publish(qpn, QpState::Error);
            }
            return;
        }
        q.entries.push_back(wc);
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

    /// Moves a QP to ERROR, flushing its posted receives.
    fn enter_error(&mut self, qpn: u32) {
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return;
        };
        qp.state = QpState::Error;
        qp.rnr.clear();
        let cq = qp.cq;
        self.publish(qpn, QpState::Error);
        let qp = self.qps.get_mut(&qpn).expect("present");
        let flushed: Vec<u64> = qp.recvs.drain(..).collect();
        for wr_id in flushed {
            self.complete(
                cq,
                Self::wc(qpn, wr_id, WcStatus::WR_FLUSH_ERR, WcOpcode::Recv),
            );
        }
    }

    /// Completes a send work request with `status` (and moves the QP to
    /// ERROR when it is an error).
    fn complete_send(&mut self, qpn: u32, wr_id: u64, status: WcStatus) {
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return;
        };
        qp.send_outstanding += 1;
        let cq = qp.cq;
        // The failed request's completion comes first, then the flushes.
        self.complete(cq, Self::wc(qpn, wr_id, status, WcOpcode::RdmaWrite));
        if status != WcStatus::SUCCESS && status != WcStatus::WR_FLUSH_ERR {
            self.enter_error(qpn);
        }
    }

    /// Sends a control message to the device with `gid`. `Ok(false)`: the
    /// peer's socket is gone.
    fn send_msg(&mut self, gid: [u8; 16], bytes: [u8; MSG]) -> bool {
        if !self.pending.is_empty() {
            self.pending.push_back((gid, bytes));
            return self.flush_pending();
        }
        match self.try_send_to(&gid, &bytes) {
            Ok(true) => true,
            Ok(false) => {
                self.pending.push_back((gid, bytes));
                true
            }
            Err(_) => false,
        }
    }

    /// `Ok(false)`: no room now.
    fn try_send_to(&self, gid: &[u8; 16], bytes: &[u8]) -> io::Result<bool> {
        let (pid, token) = split_gid(gid)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not an emulated GID"))?;
        let addr = SocketAddr::from_abstract_name(socket_name(pid, token))?;
        match self.sock.send_to_addr(bytes, &addr) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Sends what is pending; a message to a peer that is gone fails its
    /// work request. Returns false if the last message's peer is gone.
    fn flush_pending(&mut self) -> bool {
        while let Some((gid, bytes)) = self.pending.front().copied() {
            match self.try_send_to(&gid, &bytes) {
                Ok(true) => {
                    self.pending.pop_front();
                }
                Ok(false) => return true,
                Err(_) => {
                    self.pending.pop_front();
                    if let Some(m) = Msg::decode(&bytes).filter(|m| m.kind == KIND_WRITE) {
                        self.fail_gone(m.src_qpn, m.wr_id);
                    }
                    if self.pending.is_empty() {
                        return false;
                    }
                }
            }
        }
        true
    }

    /// A requester's message found no peer: retry exceeded.
    fn fail_gone(&mut self, qpn: u32, wr_id: u64) {
        if let Some(qp) = self.qps.get(&qpn) {
            if qp.state != QpState::Error {
                let cq = qp.cq;
                self.complete(
                    cq,
                    Self::wc(qpn, wr_id, WcStatus::RETRY_EXC_ERR, WcOpcode::RdmaWrite),
                );
                self.enter_error(qpn);
            }
        }
    }

    fn remote_mr(&mut self, gid: [u8; 16], rkey: u32) -> Option<&RemoteMr> {
        let open = || -> Option<RemoteMr> {
            let (pid, token) = split_gid(&gid)?;
            let (file, _) =
                transport_shm::private_file::open(&mr_file_name(pid, token, rkey)).ok()?;
            let map = MmapRaw::map_raw(&file).ok()?;
            if map.len() < HEADER || mem::header_word(&map, 0).load(Ordering::Acquire) != MAGIC {
                return None;
            }
            let base = mem::header_word(&map, 2).load(Ordering::Acquire);
            let len = mem::header_word(&map, 3).load(Ordering::Acquire) as usize;
            (len <= map.len() - HEADER).then_some(RemoteMr { map, base, len })
        };
        let r = match self.remote_mrs.entry((gid, rkey)) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(open()?),
        };
        (mem::header_word(&r.map, 1).load(Ordering::Acquire) == 1
            && mem::header_word(&r.map, 4).load(Ordering::Acquire) == u64::from(rkey))
        .then_some(r)
    }

    /// Handles the control messages that have arrived.
    fn drain_socket(&mut self) {
        let mut buf = [0u8; 64];
        loop {
            let n = match self.sock.recv(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return,
            };
            let Some(m) = Msg::decode(&buf[..n]) else {
                tracing::warn!(
                    bytes = n,
                    "emulated verbs: ignoring a malformed control message"
                );
                continue;
            };
            if m.kind == KIND_NAK {
                self.fail_gone(m.dst_qpn, m.wr_id);
                continue;
            }
            let ok = matches!(
                self.qps.get(&m.dst_qpn).map(|q| q.state),
                Some(QpState::Rtr | QpState::Rts)
            );
            if !ok {
                let nak = Msg {
                    kind: KIND_NAK,
                    dst_qpn: m.src_qpn,
                    src_qpn: m.dst_qpn,
                    src_gid: self.port.gid,
                    ..m
                };
                let _ = self.send_msg(m.src_gid, nak.encode());
                continue;
            }
            if m.has_imm {
                let qp = self.qps.get_mut(&m.dst_qpn).expect("checked");
                match qp.recvs.pop_front() {
                    Some(wr_id) => self.deliver(m, wr_id),
                    None => qp.rnr.push_back(m),
                }
            }
        }
    }

    fn deliver(&mut self, m: Msg, wr_id: u64) {
        let cq = self.qps[&m.dst_qpn].cq;
        self.complete(
            cq,
            WorkCompletion {
                wr_id,
                status: WcStatus::SUCCESS,
                opcode: WcOpcode::RecvRdmaWithImm,
                byte_len: m.byte_len,
                imm: Some(m.imm),
                qp_num: m.dst_qpn,
                vendor_err: 0,
            },
        );
    }
}

fn call_err(op: &'static str, detail: String) -> VerbsError {
    VerbsError::Call {
        device: format!("{EMU_DEVICE}:1"),
        op,
        detail,
    }
}

impl Verbs for EmuVerbs {
    fn port(&self) -> &PortInfo {
        &self.port
    }

    fn alloc_mr(&mut self, len: usize) -> Result<Mr> {
        let len = len.max(1).div_ceil(PAGE) * PAGE;
        let key = self.next_key;
        self.next_key = self.next_key.wrapping_add(2);
        let (lkey, rkey) = (key, key | 1);
        let (pid, token) = split_gid(&self.port.gid).expect("own GID");
        let name = mr_file_name(pid, token, rkey);
        let (file, path) = transport_shm::private_file::create(&name, HEADER + len)
            .map_err(|e| call_err("ibv_reg_mr", format!("creating /dev/shm/{name}: {e}")))?;
        let map = MmapRaw::map_raw(&file).map_err(|e| {
            let _ = std::fs::remove_file(&path);
            call_err("ibv_reg_mr", format!("mapping /dev/shm/{name}: {e}"))
        })?;
        let addr = map.as_mut_ptr() as u64 + HEADER as u64;
        mem::header_word(&map, 2).store(addr, Ordering::Relaxed);
        mem::header_word(&map, 3).store(len as u64, Ordering::Relaxed);
        mem::header_word(&map, 4).store(u64::from(rkey), Ordering::Relaxed);
        mem::header_word(&map, 1).store(1, Ordering::Relaxed);
        mem::header_word(&map, 0).store(MAGIC, Ordering::Release);
        let mr = Mr {
            addr,
            len,
            lkey,
            rkey,
        };
        self.mrs.insert(
            lkey,
            LocalMr {
                map: Arc::new(map),
                path,
                mr,
            },
        );
        Ok(mr)
    }

    fn dereg_mr(&mut self, mr: &Mr) -> Result<()> {
        let local = self.mrs.remove(&mr.lkey).ok_or_else(|| {
            call_err(
                "ibv_dereg_mr",
                format!("no region with lkey {:#x}", mr.lkey),
            )
        })?;
        mem::header_word(&local.map, 1).store(0, Ordering::Release);
        let _ = std::fs::remove_file(&local.path);
        Ok(())
    }

    fn create_cq(&mut self, depth: usize) -> Result<u32> {
        if depth == 0 || depth > 1 << 22 {
            return Err(call_err(
                "ibv_create_cq",
                format!("depth {depth} out of range"),
            ));
        }
        self.cqs.push(Cq {
            depth,
            entries: VecDeque::new(),
            overflowed: false,
        });
        Ok(self.cqs.len() as u32 - 1)
    }

    fn create_qp(&mut self, cq: u32, max_send: u32, max_recv: u32) -> Result<u32> {
        if cq as usize >= self.cqs.len() || max_send == 0 || max_recv == 0 {
            return Err(call_err(
                "ibv_create_qp",
                format!("bad attributes: cq {cq}, max_send {max_send}, max_recv {max_recv}"),
            ));
        }
        let qpn = self.next_qpn;
        self.next_qpn += 1;
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
            },
        );
        self.publish(qpn, QpState::Reset);
        Ok(qpn)
    }

    fn modify_qp(&mut self, qpn: u32, to: QpTransition) -> Result<()> {
        let dev = self.dev();
        let qp = self.qp_mut("ibv_modify_qp", qpn)?;
        let (need, next) = match to {
            QpTransition::Init => (QpState::Reset, QpState::Init),
            QpTransition::Rtr { remote, .. } => {
                if qp.state == QpState::Init {
                    if split_gid(&remote.gid).is_none() {
                        return Err(VerbsError::Call {
                            device: dev,
                            op: "ibv_modify_qp",
                            detail: "RTR: the remote GID is not an emulated device's".into(),
                        });
                    }
                    qp.remote = Some(remote);
                }
                (QpState::Init, QpState::Rtr)
            }
            QpTransition::Rts { .. } => (QpState::Rtr, QpState::Rts),
            QpTransition::Error => {
                self.enter_error(qpn);
                return Ok(());
            }
            QpTransition::Reset => {
                qp.state = QpState::Reset;
                qp.remote = None;
                qp.recvs.clear();
                qp.rnr.clear();
                self.publish(qpn, QpState::Reset);
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
        qp.state = next;
        self.publish(qpn, next);
        Ok(())
    }

    fn qp_state(&self, qpn: u32) -> Result<QpState> {
        self.qps
            .get(&qpn)
            .map(|q| q.state)
            .ok_or_else(|| call_err("ibv_query_qp", format!("no queue pair {qpn}")))
    }

    fn post_send(&mut self, qpn: u32, wr: &SendWr) -> Result<()> {
        let dev = self.dev();
        let qp = self.qp_mut("ibv_post_send", qpn)?;
        match qp.state {
            QpState::Rts => {}
            QpState::Error => {
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
        if qp.send_outstanding >= qp.max_send {
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
        if !self.remote_qp_ready(remote.gid, remote.qpn) {
            self.complete_send(qpn, wr.wr_id, WcStatus::RETRY_EXC_ERR);
            return Ok(());
        }
        let (laddr, llen, lkey) = wr.local;
        let llen = llen as usize;
        if llen > 0 {
            let Some(src) = self.mrs.get(&lkey).filter(|m| {
                laddr >= m.mr.addr && laddr - m.mr.addr + llen as u64 <= m.mr.len as u64
            }) else {
                self.complete_send(qpn, wr.wr_id, WcStatus::LOC_PROT_ERR);
                return Ok(());
            };
            let src_off = HEADER + (laddr - src.mr.addr) as usize;
            let src_map = Arc::clone(&src.map);
            let Some(dst) = self.remote_mr(remote.gid, wr.rkey).filter(|r| {
                wr.remote_addr >= r.base && wr.remote_addr - r.base + llen as u64 <= r.len as u64
            }) else {
                self.complete_send(qpn, wr.wr_id, WcStatus::REM_ACCESS_ERR);
                return Ok(());
            };
            let dst_off = HEADER + (wr.remote_addr - dst.base) as usize;
            mem::copy_between(&src_map, src_off, &dst.map, dst_off, llen);
        }
        let msg = Msg {
            kind: KIND_WRITE,
            has_imm: wr.imm.is_some(),
            dst_qpn: remote.qpn,
            src_qpn: qpn,
            imm: wr.imm.unwrap_or(0),
            byte_len: llen as u32,
            wr_id: wr.wr_id,
            src_gid: self.port.gid,
        };
        if self.send_msg(remote.gid, msg.encode()) {
            self.complete_send(qpn, wr.wr_id, WcStatus::SUCCESS);
        } else {
            self.complete_send(qpn, wr.wr_id, WcStatus::RETRY_EXC_ERR);
        }
        Ok(())
    }

    fn post_recv(&mut self, qpn: u32, wr_id: u64) -> Result<()> {
        let dev = self.dev();
        let qp = self.qp_mut("ibv_post_recv", qpn)?;
        match qp.state {
            QpState::Init | QpState::Rtr | QpState::Rts => {}
            QpState::Error => {
                let cq = qp.cq;
                self.complete(
                    cq,
                    Self::wc(qpn, wr_id, WcStatus::WR_FLUSH_ERR, WcOpcode::Recv),
                );
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
            Some(m) => self.deliver(m, wr_id),
            None => qp.recvs.push_back(wr_id),
        }
        Ok(())
    }

    fn poll_cq(&mut self, cq: u32, max: usize, out: &mut Vec<WorkCompletion>) -> Result<usize> {
        if cq as usize >= self.cqs.len() {
            return Err(call_err("ibv_poll_cq", format!("no completion queue {cq}")));
        }
        self.flush_pending();
        self.drain_socket();
        let q = &mut self.cqs[cq as usize];
        if q.overflowed {
            return Err(VerbsError::CqOverflow {
                device: self.port.name(),
                depth: q.depth,
            });
        }
        let n = max.min(q.entries.len());
        for wc in q.entries.drain(..n) {
            if wc.opcode == WcOpcode::RdmaWrite {
                if let Some(qp) = self.qps.get_mut(&wc.qp_num) {
                    qp.send_outstanding = qp.send_outstanding.saturating_sub(1);
                }
            }
            out.push(wc);
        }
        Ok(n)
    }

    fn poll_async_event(&mut self) -> Option<AsyncEvent> {
        self.events.pop_front()
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
        // The NIC is gone: none of its QPs answers any more.
        for i in 0..QP_TABLE {
            mem::header_word(&self.qp_table.map, i).store(0, Ordering::Release);
        }
        let _ = std::fs::remove_file(&self.qp_table.path);
        for m in self.mrs.values() {
            mem::header_word(&m.map, 1).store(0, Ordering::Release);
            let _ = std::fs::remove_file(&m.path);
        }
    }
}

#[cfg(test)]
#[path = "emu_tests.rs"]
mod tests;
