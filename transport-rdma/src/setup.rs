//! Choosing a provider ([`probe`]) and connecting every pair of ranks
//! through the bootstrap store ([`establish`]).

use std::time::Instant;

use comm_core::store::Store;
use comm_core::wire::HEADER_BYTES;
use comm_core::Error;

use crate::conn::{ConnState, Parts, MAX_SLOTS, MAX_SLOT_BYTES};
use crate::context::{ContextKey, ContextScope};
use crate::emu::EmuVerbs;
use crate::handle::RdmaConnection;
use crate::ibv::{self, IbvVerbs};
use crate::verbs::{PathAttrs, QpAddress, QpTransition, Verbs};
use crate::IbSettings;

/// Default FIFO slots per direction.
pub const DEFAULT_SLOTS: usize = 8;
/// Default slot size: a piece header and a 512 KiB payload. The payload
/// is a power of two so that the executor's pieces of power-of-two chunks
/// and segments leave no small tail (a tail below
/// [`crate::ZERO_COPY_MIN`] is copied instead of lent; issue 36, risk 9).
pub const DEFAULT_SLOT_BYTES: usize = (512 << 10) + HEADER_BYTES;
/// Receives kept posted on each QP beyond the FIFO's slots (credits, aborts).
const RQ_EXTRA: u32 = 8;
/// Send work requests per QP beyond the FIFO's slots.
const SQ_EXTRA: u32 = 8;

/// Which verbs provider connections use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Provider {
    /// The emulated provider (`SNCL_IB_EMULATE=1`).
    Emulated,
    /// A device port through libibverbs.
    Device {
        /// Device name.
        device: String,
        /// Port number.
        port: u8,
    },
}

impl std::fmt::Display for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Provider::Emulated => write!(f, "emulated verbs ({}:1)", crate::emu::EMU_DEVICE),
            Provider::Device { device, port } => write!(f, "{device}:{port}"),
        }
    }
}

/// Whether this process can use RDMA, and if not why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Availability {
    /// Usable with this provider.
    Ready(Provider),
    /// Not usable: the reason, naming what is missing and what to do.
    Unavailable(String),
}

/// Decides the provider from the settings: `SNCL_IB_DISABLE`, then
/// `SNCL_IB_EMULATE`, then libibverbs' devices filtered by `SNCL_IB_HCA`
/// (the first ACTIVE port allowed; see [`probe_for`] to choose by GPU
/// proximity and local rank).
pub fn probe(settings: &IbSettings) -> Availability {
    probe_for(settings, 0, || None)
}

/// [`probe`] for one rank of a node: among the ACTIVE ports allowed by
/// `SNCL_IB_HCA`, the one nearest (fewest PCI hops in sysfs) the GPU with
/// the PCI bus id `gpu_bus_id` answers (as `cuDeviceGetPCIBusId` or
/// `nvidia-smi` print it), ties and unknown topology shared out by
/// `local_rank` (the rank's index among the ranks of its node), so that the
/// ranks of a node use the NICs as rails. `gpu_bus_id` is asked only where
/// more than one port could serve.
pub fn probe_for(
    settings: &IbSettings,
    local_rank: usize,
    gpu_bus_id: impl FnOnce() -> Option<String>,
) -> Availability {
    if settings.disable {
        return Availability::Unavailable("SNCL_IB_DISABLE=1".into());
    }
    if settings.emulate {
        return Availability::Ready(Provider::Emulated);
    }
    let ports = match ibv::list_ports() {
        Ok(p) => p,
        Err(e) => return Availability::Unavailable(e),
    };
    if ports.is_empty() {
        return Availability::Unavailable(format!(
            "{} is present but finds no RDMA device (check `ibv_devices`, the kernel modules \
             (ib_uverbs, mlx5_ib) and /dev/infiniband; SNCL_IB_EMULATE=1 runs the transport \
             on emulated verbs)",
            ibv::SONAME
        ));
    }
    let usable = usable_ports(settings, &ports);
    let chosen = if usable.len() > 1 {
        let gpu = gpu_bus_id();
        let p = crate::topo::nearest_port(
            &usable,
            local_rank,
            gpu.as_deref(),
            &crate::topo::Sysfs::system(),
        );
        if let Some(p) = p {
            tracing::debug!(
                local_rank,
                gpu = gpu.as_deref().unwrap_or("unknown"),
                ports = usable.len(),
                "rdma: using {}:{}",
                p.device,
                p.port
            );
        }
        p
    } else {
        usable.first()
    };
    match chosen {
        Some(p) => Availability::Ready(Provider::Device {
            device: p.device.clone(),
            port: p.port,
        }),
        None => {
            let all: Vec<String> = ports
                .iter()
                .map(|p| {
                    format!(
                        "{}:{}{}",
                        p.device,
                        p.port,
                        if p.active { "" } else { " (not active)" }
                    )
                })
                .collect();
            Availability::Unavailable(format!(
                "no ACTIVE RDMA port is allowed by SNCL_IB_HCA among [{}]",
                all.join(", ")
            ))
        }
    }
}

/// The bytes [`establish`] pins for `peers` connections of `slots` ×
/// `slot_bytes` FIFO slots: per peer the inbound FIFO, the staging area and
/// the GPUDirect board, in whole pages (what the kernel counts against
/// `RLIMIT_MEMLOCK`, [`crate::sys::PinRules`]).
pub fn pinned_for(peers: usize, slots: usize, slot_bytes: usize) -> u64 {
    let page = crate::sys::PIN_PAGE;
    let pages = |b: usize| (b as u64).div_ceil(page) * page;
    let region = pages(slots * slot_bytes);
    peers as u64 * (2 * region + pages(2 * crate::gdr_board::BOARD_BYTES))
}

/// Where pinning the connections to `peers` peers would break the kernel's
/// rule, the reason (naming the limit, the need and the fix); `None` where
/// the process may pin them. Checked before the transport offers itself,
/// so that ranks fall back to TCP together instead of failing at connect.
pub fn memlock_shortfall(rules: &crate::sys::PinRules, peers: usize) -> Option<String> {
    let need = pinned_for(peers, DEFAULT_SLOTS, DEFAULT_SLOT_BYTES);
    match rules.budget() {
        Some(limit) if !rules.allows(need) => Some(format!(
            "{} for {peers} peer(s) (RLIMIT_MEMLOCK binds: no CAP_IPC_LOCK)",
            crate::sys::memlock_advice(limit, need)
        )),
        _ => None,
    }
}

/// The ACTIVE ports of `ports` that `SNCL_IB_HCA` allows.
pub fn usable_ports(settings: &IbSettings, ports: &[ibv::DevicePort]) -> Vec<ibv::DevicePort> {
    ports
        .iter()
        .filter(|p| {
            settings
                .hca
                .as_ref()
                .is_none_or(|f| f.allows(&p.device, p.port))
        })
        .filter(|p| p.active)
        .cloned()
        .collect()
}

/// Logs the one INFO line for a transport that is skipped.
pub fn log_skipped(reason: &str) {
    tracing::info!("rdma transport skipped: {reason}");
}

/// What [`establish`] needs to know. Every rank must use the same
/// `comm_id`, `slots`, `slot_bytes` and `SNCL_IB_QPS_PER_CONN`.
#[derive(Clone, Debug)]
pub struct RdmaSetup {
    /// This rank.
    pub rank: usize,
    /// The communicator's id (names the store keys).
    pub comm_id: u64,
    /// The `SNCL_IB_*` settings.
    pub settings: IbSettings,
    /// FIFO slots per direction (at most 256).
    pub slots: usize,
    /// Bytes of one slot: piece header + largest payload (below 4 MiB).
    pub slot_bytes: usize,
    /// Every wait of the setup ends here with an error.
    pub deadline: Instant,
    /// Where this rank listens for its peers' liveness sockets
    /// (`src/liveness.rs`: a dead peer is seen at once instead of after the
    /// NIC's retries); `None`: no liveness sockets (the NIC's retries
    /// alone).
    pub liveness_ip: Option<std::net::IpAddr>,
    /// Whose device context the connections use: the process's one per
    /// port (the default), or each its own ([`ContextScope`]).
    pub context: ContextScope,
}

fn open(provider: &Provider, settings: &IbSettings) -> crate::verbs::Result<Box<dyn Verbs>> {
    if matches!(provider, Provider::Emulated) {
        // As libibverbs is loaded with ibv_fork_init (`ibv/mod.rs`):
        // registrations survive a fork (`emu/fork.rs`).
        crate::emu::fork_init();
    }
    Ok(match provider {
        Provider::Emulated if settings.emulate_strict => Box::new(EmuVerbs::open_strict(
            crate::emu::Strict::new(crate::sys::PinRules::of_process(), emulated_port_ip()),
            settings.gid_index,
        )?),
        Provider::Emulated => Box::new(EmuVerbs::open()?),
        Provider::Device { device, port } => {
            let table = crate::topo::Sysfs::system().gid_table(device, *port);
            Box::new(IbvVerbs::open(device, *port, settings.gid_index, &table)?)
        }
    })
}

/// The strict emulated port's IPv4 address (what its RoCE GIDs map): the
/// process's id in 198.18.0.0/15, which only the emulation reads.
fn emulated_port_ip() -> std::net::Ipv4Addr {
    let pid = std::process::id();
    std::net::Ipv4Addr::new(
        198,
        18 | ((pid >> 16) & 1) as u8,
        (pid >> 8) as u8,
        pid as u8,
    )
}

/// Queue pairs per peer: `SNCL_IB_QPS_PER_CONN`, or for auto (0) 2 on a
/// RoCE port — its switches spread flows over equal-cost paths by hashing
/// each QP's UDP source port, so one QP per peer can pile pairs onto one
/// path (NCCL gets several per peer from its channels) — and 1 on
/// InfiniBand, whose subnet manager routes by LID.
pub(crate) fn qps_per_conn(setting: usize, link: crate::verbs::LinkLayer) -> usize {
    match (setting, link) {
        (0, crate::verbs::LinkLayer::Ethernet) => 2,
        (0, _) => 1,
        (q, _) => q,
    }
}

fn random_psn() -> u32 {
    let mut b = [0u8; 4];
    let _ = getrandom::fill(&mut b);
    u32::from_le_bytes(b) & 0x00ff_ffff
}

struct Local {
    peer: usize,
    dev: Box<dyn Verbs>,
    /// The context's progress thread (`progress.rs`).
    driver: std::sync::Arc<crate::progress::Driver>,
    cq: u32,
    qps: Vec<(u32, u32)>,
    fifo: crate::verbs::Mr,
    staging: crate::verbs::Mr,
    board: crate::verbs::Mr,
    regs: crate::regcache::RegCache,
}

fn encode(setup: &RdmaSetup, l: &Local, live: Option<std::net::SocketAddr>) -> Vec<u8> {
    let p = l.dev.port();
    let qps: Vec<String> = l.qps.iter().map(|(q, s)| format!("{q}:{s}")).collect();
    format!(
        "sncl-rdma 1\ndevice={}\nlid={}\ngid={}\nmtu={}\nslots={}\nslot_bytes={}\nfifo={}:{}\nboard={}:{}\nqps={}\nlive={}\n",
        p.name(),
        p.lid,
        hex::encode(p.gid),
        p.mtu,
        setup.slots,
        setup.slot_bytes,
        l.fifo.addr,
        l.fifo.rkey,
        l.board.addr,
        l.board.rkey,
        qps.join(","),
        live.map_or_else(|| "-".to_string(), |a| a.to_string())
    )
    .into_bytes()
}

/// A peer's published connection info.
struct Remote {
    device: String,
    lid: u16,
    gid: [u8; 16],
    mtu: u32,
    fifo: (u64, u32),
    board: (u64, u32),
    qps: Vec<(u32, u32)>,
    /// Where the peer listens for liveness sockets (`None`: it does not).
    live: Option<std::net::SocketAddr>,
}

fn decode(setup: &RdmaSetup, peer: usize, raw: &[u8], nqps: usize) -> Result<Remote, Error> {
    let me = setup.rank;
    let text = String::from_utf8_lossy(raw);
    let bad = |what: String| Error::Bootstrap {
        rank: me,
        detail: format!("peer rank {peer} published RDMA connection info that {what}: {text:?}"),
    };
    let mut lines = text.lines();
    if lines.next() != Some("sncl-rdma 1") {
        return Err(bad("is not version 1 of sncl's format".into()));
    }
    let fields: std::collections::HashMap<&str, &str> =
        lines.filter_map(|l| l.split_once('=')).collect();
    let get = |k: &str| {
        fields
            .get(k)
            .copied()
            .ok_or_else(|| bad(format!("lacks {k}")))
    };
    let num = |k: &str| -> Result<u64, Error> {
        get(k)?
            .parse::<u64>()
            .map_err(|_| bad(format!("has a bad {k}")))
    };
    let slots = num("slots")? as usize;
    let slot_bytes = num("slot_bytes")? as usize;
    if slots != setup.slots || slot_bytes != setup.slot_bytes {
        return Err(Error::Bootstrap {
            rank: me,
            detail: format!(
                "peer rank {peer} uses an RDMA FIFO of {slots} slots of {slot_bytes} bytes, this \
                 rank {} slots of {} bytes: every rank must use the same settings",
                setup.slots, setup.slot_bytes
            ),
        });
    }
    let gid_hex = get("gid")?;
    let mut gid = [0u8; 16];
    if gid_hex.len() != 32 {
        return Err(bad("has a GID that is not 16 bytes".into()));
    }
    hex::decode_to_slice(gid_hex, &mut gid).map_err(|_| bad("has a GID that is not hex".into()))?;
    let region = |k: &str| -> Result<(u64, u32), Error> {
        get(k)?
            .split_once(':')
            .and_then(|(a, r)| Some((a.parse().ok()?, r.parse().ok()?)))
            .ok_or_else(|| bad(format!("has a bad {k}")))
    };
    let (addr, rkey) = region("fifo")?;
    let board = region("board")?;
    let qps = get("qps")?
        .split(',')
        .map(|q| {
            q.split_once(':')
                .and_then(|(n, p)| Some((n.parse().ok()?, p.parse().ok()?)))
                .ok_or_else(|| bad("has a bad qps list".into()))
        })
        .collect::<Result<Vec<(u32, u32)>, Error>>()?;
    if qps.len() != nqps {
        return Err(Error::Bootstrap {
            rank: me,
            detail: format!(
                "peer rank {peer} uses {} queue pairs per connection, this rank {nqps} \
                 (SNCL_IB_QPS_PER_CONN must be the same on every rank)",
                qps.len(),
            ),
        });
    }
    Ok(Remote {
        device: get("device")?.to_string(),
        lid: num("lid")? as u16,
        gid,
        mtu: num("mtu")? as u32,
        fifo: (addr, rkey),
        board,
        qps,
        live: match get("live")? {
            "-" => None,
            a => Some(
                a.parse()
                    .map_err(|_| bad("has a bad live address".into()))?,
            ),
        },
    })
}

/// Connects this rank to every peer in `peers` over RDMA and returns the
/// connections in the same order.
///
/// Per peer: opens the provider, registers the inbound FIFO and the
/// staging area, creates `SNCL_IB_QPS_PER_CONN` RC queue pairs (RESET →
/// INIT, receives posted), publishes LID, GID, MTU, QPNs, PSNs and the
/// FIFO's address and rkey under `rdma/<comm>/<rank>-<peer>`, reads the
/// peer's, moves the QPs to RTR and RTS, and waits for the peer to be
/// ready too (so nobody writes to a QP not yet able to receive). Every
/// wait ends at `setup.deadline` with an error naming the peer.
pub fn establish(
    setup: &RdmaSetup,
    provider: &Provider,
    store: &dyn Store,
    peers: &[usize],
) -> Result<Vec<RdmaConnection>, Error> {
    let me = setup.rank;
    let s = &setup.settings;
    let err = |detail: String| Error::Bootstrap { rank: me, detail };
    if setup.slots == 0 || setup.slots > MAX_SLOTS {
        return Err(err(format!(
            "RDMA FIFO slots must be between 1 and {MAX_SLOTS}, got {}",
            setup.slots
        )));
    }
    if setup.slot_bytes <= HEADER_BYTES || setup.slot_bytes > MAX_SLOT_BYTES {
        return Err(err(format!(
            "RDMA slot size must be between {} and {MAX_SLOT_BYTES} bytes, got {}",
            HEADER_BYTES + 1,
            setup.slot_bytes
        )));
    }
    let region = setup.slots * setup.slot_bytes;
    let verbs_err = |peer: usize, e: crate::verbs::VerbsError| {
        err(format!("setting up RDMA to peer rank {peer}: {e}"))
    };
    let key = |from: usize, to: usize| format!("rdma/{:016x}/{from}-{to}", setup.comm_id);
    // A lent piece takes two send work requests (payload, then header).
    let sq_depth = 2 * setup.slots as u32 + SQ_EXTRA;
    let rq_depth = setup.slots as u32 + RQ_EXTRA;

    // The liveness sockets' listener (the lower rank of each pair listens).
    let listener = setup
        .liveness_ip
        .map(crate::liveness::listen)
        .transpose()
        .map_err(|e| err(format!("listening for RDMA liveness sockets: {e}")))?;
    let live_addr = listener.as_ref().map(|l| l.addr);

    // 1. Local resources and published info, for every peer.
    let mut locals = Vec::with_capacity(peers.len());
    for &peer in peers {
        let ve = |e| verbs_err(peer, e);
        let context = ContextKey {
            provider: provider.to_string(),
            strict: s.emulate_strict,
            gid_index: s.gid_index,
        };
        let handle =
            crate::context::acquire(context, setup.context, || open(provider, s)).map_err(ve)?;
        let driver = handle.driver();
        let mut dev: Box<dyn Verbs> = Box::new(handle);
        let nqps = qps_per_conn(s.qps_per_conn, dev.port().link_layer);
        let cq = dev
            .create_cq(nqps * (sq_depth + rq_depth) as usize + 16)
            .map_err(ve)?;
        let fifo = dev.alloc_mr(region).map_err(ve)?;
        let staging = dev.alloc_mr(region).map_err(ve)?;
        let board = dev
            .alloc_mr(2 * crate::gdr_board::BOARD_BYTES)
            .map_err(ve)?;
        let mut qps = Vec::with_capacity(nqps);
        for q in 0..nqps {
            let qpn = dev.create_qp(cq, sq_depth, rq_depth).map_err(ve)?;
            dev.modify_qp(qpn, QpTransition::Init).map_err(ve)?;
            for _ in 0..rq_depth {
                dev.post_recv(qpn, crate::conn::RECV_TAG | q as u64)
                    .map_err(ve)?;
            }
            qps.push((qpn, random_psn()));
        }
        let mode = crate::regcache::ZeroCopy::choose(s.zero_copy, &mut *dev);
        let l = Local {
            peer,
            dev,
            driver,
            cq,
            qps,
            fifo,
            staging,
            board,
            regs: crate::regcache::RegCache::new(mode, s.reg_cache_mb << 20),
        };
        store.set(&key(me, peer), &encode(setup, &l, live_addr))?;
        locals.push(l);
    }

    // 2. Connect to each peer's queue pairs.
    let remaining = || setup.deadline.saturating_duration_since(Instant::now());
    let mut remotes = Vec::with_capacity(peers.len());
    for l in &mut locals {
        let peer = l.peer;
        let raw = store.get(&key(peer, me), remaining()).map_err(|e| {
            err(format!(
                "waiting for peer rank {peer}'s RDMA connection info by the deadline: {e} \
                 (is rank {peer} running, and does it use RDMA too?)"
            ))
        })?;
        let r = decode(setup, peer, &raw, l.qps.len())?;
        let path = PathAttrs {
            mtu: r.mtu.min(l.dev.port().mtu),
            gid_index: l.dev.port().gid_index,
            sl: s.sl,
            traffic_class: s.traffic_class,
            timeout: s.timeout,
            retry_cnt: s.retry_cnt,
        };
        for (&(qpn, psn), &(rqpn, rpsn)) in l.qps.iter().zip(&r.qps) {
            let remote = QpAddress {
                lid: r.lid,
                gid: r.gid,
                qpn: rqpn,
                psn: rpsn,
            };
            let ve = |e| verbs_err(peer, e);
            l.dev
                .modify_qp(qpn, QpTransition::Rtr { remote, path })
                .map_err(ve)?;
            l.dev
                .modify_qp(qpn, QpTransition::Rts { psn, path })
                .map_err(ve)?;
        }
        store.set(&format!("{}/ready", key(me, peer)), b"1")?;
        tracing::debug!(rank = me, peer, device = %l.dev.port().name(), remote = %r.device, "rdma queue pairs ready");
        remotes.push(r);
    }

    // 3. Wait until every peer's queue pairs can receive.
    for l in &locals {
        let peer = l.peer;
        store
            .get(&format!("{}/ready", key(peer, me)), remaining())
            .map_err(|e| {
                err(format!(
                    "waiting for peer rank {peer} to bring its RDMA queue pairs to RTS by the \
                     deadline: {e}"
                ))
            })?;
    }

    // 4. Liveness sockets: connect to lower ranks that listen, accept the
    // higher ones (connects complete in the listener's backlog).
    let mut live: Vec<Option<crate::liveness::Liveness>> = Vec::with_capacity(locals.len());
    for (l, r) in locals.iter().zip(&remotes) {
        live.push(match (l.peer < me, r.live) {
            (true, Some(addr)) if listener.is_some() => Some(
                crate::liveness::connect(addr, setup.comm_id, me, setup.deadline).map_err(|e| {
                    err(format!(
                        "opening the RDMA liveness socket to peer rank {} at {addr}: {e}",
                        l.peer
                    ))
                })?,
            ),
            _ => None,
        });
    }
    if let Some(listener) = &listener {
        let higher: Vec<usize> = locals
            .iter()
            .zip(&remotes)
            .filter(|(l, r)| l.peer > me && r.live.is_some())
            .map(|(l, _)| l.peer)
            .collect();
        for (peer, socket) in
            crate::liveness::accept(listener, setup.comm_id, &higher, setup.deadline)
                .map_err(err)?
        {
            let i = locals.iter().position(|l| l.peer == peer).expect("a peer");
            live[i] = Some(socket);
        }
    }
    Ok(locals
        .into_iter()
        .zip(remotes)
        .zip(live)
        .map(|((l, r), liveness)| {
            let driver = l.driver;
            let state = ConnState::new(Parts {
                liveness,
                rank: me,
                peer: l.peer,
                dev: l.dev,
                cq: l.cq,
                qps: l.qps.iter().map(|q| q.0).collect(),
                sq_depth,
                fifo: l.fifo,
                staging: l.staging,
                remote_fifo: r.fifo,
                slots: setup.slots,
                slot_bytes: setup.slot_bytes,
                regs: l.regs,
                board: l.board,
                remote_board: r.board,
                gdr: s.gdr,
            });
            RdmaConnection::new(state, driver)
        })
        .collect())
}
