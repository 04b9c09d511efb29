//! The communicator: owns the connections to every peer, turns each call
//! into a schedule (cached per shape), and runs operations in the order they
//! were enqueued (stream order). Blocking calls run inline on the caller's
//! thread; non-blocking ones run on a per-communicator progress thread.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use comm_core::algo::Algorithm;
use comm_core::topo::Topology;
use comm_core::transport::Connection;
use comm_core::tune::{LinkCost, Shape};
use comm_core::wire::Collective;
use comm_core::{Config, Error, Result};
use sncl_bootstrap::{Store, TcpStoreServer};
use sncl_runtime::exec;

mod check;
mod footprint;
mod lane;
mod mailbox;
mod memo;
mod op;
mod plan;
mod run;
mod suspend;
mod suspension;
mod tagged;
pub(crate) mod window;
pub(crate) mod windows;

pub use op::{P2p, RawOp, VCounts};

pub(crate) struct State {
    pub conns: Vec<Option<Box<dyn Connection>>>,
    seq: u64,
    scratch: Vec<u8>,
    /// The memoised plans and schedules of uniform-count operations.
    plans: memo::PlanMemo,
    aborted: Option<String>,
    traffic: exec::Traffic,
    ops: memo::FxHashMap<Collective, u64>,
    busy: std::time::Duration,
    /// Operations and their busy time per caller's tag ([`crate::CollConfig::tag`]).
    tagged: memo::FxHashMap<u64, (u64, std::time::Duration)>,
    /// Tagged messages that arrived before a receive asked for them.
    mailbox: mailbox::Mailbox,
    /// Bytes this rank's peers read from its windows and it read from
    /// theirs (direct all-reduces), as (sent, received).
    window_bytes: (u64, u64),
    /// Whether the smallest all-reduces take the lanes.
    lanes: memo::LaneChoice,
    /// The peers connected at their first use, and what connects them
    /// (`crate::setup::lazy`; `None`: every peer was connected at init).
    pub(crate) lazy: Option<crate::setup::lazy::LazyConnect>,
    /// Whether the peer buffers are released (`suspend.rs`).
    suspension: suspension::Suspension,
    /// How many suspends this rank took part in (each resume's
    /// connections are built under an id derived from it).
    suspends: u64,
    /// Suspends this rank went into the barrier of (refused ones too):
    /// each meets under a key of its own.
    suspend_attempts: u64,
}

impl State {
    /// The sequence number the next operation takes.
    pub(crate) fn next_seq(&self) -> u64 {
        self.seq + 1
    }

    /// Takes the next sequence number (an operation that nothing can
    /// refuse any more).
    pub(crate) fn take_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// The last sequence number taken.
    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }

    /// Counts an operation of `coll` (the statistics).
    pub(crate) fn count_op(&mut self, coll: Collective) {
        *self.ops.entry(coll).or_insert(0) += 1;
    }
}

/// How long a waiting rank spins before yielding: long when this node has
/// a core per local rank, short when ranks outnumber cores.
fn spin_budget(node_ids: &[String], rank: usize) -> std::time::Duration {
    let local = node_ids.iter().filter(|n| **n == node_ids[rank]).count();
    let cores = std::thread::available_parallelism()
        .map(|c| c.get())
        .unwrap_or(1);
    if local <= cores {
        std::time::Duration::from_micros(20)
    } else {
        std::time::Duration::from_micros(2)
    }
}

/// Shared state of a communicator.
pub(crate) struct Inner {
    pub rank: usize,
    pub nranks: usize,
    pub comm_id: u64,
    pub config: Config,
    forced: Mutex<Vec<(Collective, Algorithm)>>,
    /// Bumped by every change of `forced`, and by the first window: the
    /// plan memo and the lane choice are valid for one value of it.
    forced_epoch: AtomicU64,
    pub(crate) spin: std::time::Duration,
    pub topo: Topology,
    pub shape: Shape,
    /// The shape device operations plan with: intra-node links at the
    /// device tier where every rank's same-node pairs run over nvlink
    /// ([`InnerParts::device_tier`]), else [`Inner::shape`].
    pub device_shape: Shape,
    pub node_ids: Vec<String>,
    pub transports: Vec<&'static str>,
    pub state: Mutex<State>,
    /// Stream order: every operation takes a place when it is issued.
    pub(crate) order: crate::order::IssueOrder,
    pub store: Option<Arc<dyn Store>>,
    pub secret: [u8; 16],
    pub local_ip: std::net::IpAddr,
    pub splits: AtomicU64,
    pub(crate) abort_flag: exec::AbortFlag,
    /// Mirrors `State::suspension` (set with it), so that an enqueue checks
    /// it without waiting for the state, which the progress thread holds
    /// while it runs or watches an earlier operation.
    pub(crate) suspended: std::sync::atomic::AtomicBool,
    /// [`InnerParts::every_pair_has_lanes`].
    pub(crate) every_pair_has_lanes: bool,
    abort_reason: Mutex<Option<String>>,
    /// The last operations, for hang diagnosis (`crate::flight`).
    pub flight: sncl_runtime::flight::FlightRecorder,
    pub _server: Option<TcpStoreServer>,
    /// What recovery (shrink, agreement) keeps: failed peers, the standby
    /// stores.
    pub recovery: crate::recovery::Recovery,
    /// Windows allocated on this communicator (`alloc_window`).
    pub windows: Mutex<windows::Windows>,
}

pub(crate) struct InnerParts {
    /// Whether every pair of same-node ranks is given a transport kind
    /// that moves device memory (`registry::every_local_pair_moves`:
    /// decided from the published records, so every rank plans alike).
    pub device_tier: bool,
    /// Whether every pair of ranks is given a kind whose connections carry
    /// lanes (`registry::every_pair_given`, from the published records):
    /// the small all-reduces' lane path is then every rank's choice alike.
    pub every_pair_has_lanes: bool,
    pub rank: usize,
    pub nranks: usize,
    pub comm_id: u64,
    pub config: Config,
    pub node_ids: Vec<String>,
    pub transports: Vec<&'static str>,
    pub conns: Vec<Option<Box<dyn Connection>>>,
    pub store: Option<Arc<dyn Store>>,
    pub secret: [u8; 16],
    pub local_ip: std::net::IpAddr,
    pub server: Option<TcpStoreServer>,
    pub standby: Option<TcpStoreServer>,
    pub standby_addrs: Vec<Option<std::net::SocketAddr>>,
    /// Peers to connect at their first use (`SNCL_RUNTIME_CONNECT=1`).
    pub lazy: Option<crate::setup::lazy::LazyConnect>,
    /// The phases of the creation (none for a derived communicator).
    pub init_phases: Vec<sncl_runtime::flight::InitPhase>,
}

impl Inner {
    pub fn new(p: InnerParts) -> Inner {
        let flight = sncl_runtime::flight::FlightRecorder::new(p.config.flight_recorder_entries);
        flight.set_init_phases(p.init_phases);
        let topo = Topology::from_node_ids(&p.node_ids);
        let forced_tcp = p.config.transport == comm_core::config::TransportChoice::Tcp;
        let shape = Shape {
            nranks: p.nranks,
            nnodes: topo.nnodes(),
            max_local: topo.nodes.iter().map(Vec::len).max().unwrap_or(1),
            intra: p.config.tiers.intra.unwrap_or(if forced_tcp {
                LinkCost::TCP
            } else {
                LinkCost::SHM
            }),
            inter: p.config.tiers.inter.unwrap_or(LinkCost::TCP),
        };
        let device_shape =
            comm_core::topo::device_shape(&shape, p.device_tier, p.config.tiers.intra);
        if p.rank == 0 {
            tracing::info!(
                nodes = topo.nnodes(),
                ranks_per_node = ?topo.nodes.iter().map(Vec::len).collect::<Vec<_>>(),
                intra_us = shape.intra.alpha_us,
                intra_gbps = shape.intra.bytes_per_us / 1e3,
                inter_us = shape.inter.alpha_us,
                inter_gbps = shape.inter.bytes_per_us / 1e3,
                "sncl topology"
            );
        }
        Inner {
            rank: p.rank,
            nranks: p.nranks,
            comm_id: p.comm_id,
            forced: Mutex::new(p.config.algo.clone()),
            forced_epoch: AtomicU64::new(0),
            spin: spin_budget(&p.node_ids, p.rank),
            topo,
            shape,
            device_shape,
            config: p.config,
            node_ids: p.node_ids,
            transports: p.transports,
            state: Mutex::new(State {
                conns: p.conns,
                seq: 0,
                scratch: Vec::new(),
                plans: memo::PlanMemo::default(),
                aborted: None,
                traffic: exec::Traffic::default(),
                ops: memo::FxHashMap::default(),
                busy: std::time::Duration::ZERO,
                tagged: memo::FxHashMap::default(),
                mailbox: mailbox::Mailbox::default(),
                window_bytes: (0, 0),
                lanes: memo::LaneChoice::default(),
                lazy: p.lazy,
                suspension: suspension::Suspension::Active,
                suspends: 0,
                suspend_attempts: 0,
            }),
            order: crate::order::IssueOrder::new(),
            store: p.store,
            secret: p.secret,
            local_ip: p.local_ip,
            splits: AtomicU64::new(0),
            abort_flag: exec::AbortFlag::new(false),
            suspended: std::sync::atomic::AtomicBool::new(false),
            every_pair_has_lanes: p.every_pair_has_lanes,
            abort_reason: Mutex::new(None),
            flight,
            _server: p.server,
            recovery: crate::recovery::Recovery::new(p.standby, p.standby_addrs),
            windows: Mutex::new(windows::Windows::default()),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a place in the stream order.
    pub fn ticket(&self) -> u64 {
        self.ticket_with(|t| t)
    }

    /// Takes a place in the stream order and runs `f` with it before anyone
    /// else can take the next one (so queued work stays in ticket order).
    pub fn ticket_with<R>(&self, f: impl FnOnce(u64) -> R) -> R {
        self.order.take_with(f)
    }

    /// Runs `op` when its ticket's turn comes.
    ///
    /// # Safety
    /// The buffers `op` points to must be valid as the op's counts describe
    /// until this returns.
    pub unsafe fn run_ordered(&self, ticket: u64, op: &RawOp) -> Result<()> {
        self.order.wait_turn(ticket);
        // SAFETY: forwarded from the caller.
        let r = unsafe { self.run(op) };
        self.order.finish();
        r
    }

    /// What the executor and its waits need of one operation: this rank,
    /// the communicator, `seq`, the `fingerprint` (its dtype), the reduction
    /// `op`, the deadline, the waiters' `spin` and the checksum setting.
    pub(crate) fn op_context(
        &self,
        seq: u64,
        fingerprint: comm_core::wire::Fingerprint,
        op: comm_core::ReduceOp,
        spin: std::time::Duration,
    ) -> exec::OpContext {
        exec::OpContext {
            rank: self.rank,
            nranks: self.nranks,
            comm_id: self.comm_id,
            seq,
            fingerprint,
            dtype: fingerprint.dtype,
            op,
            timeout: self.config.timeout,
            spin,
            checksum: self.config.checksum,
        }
    }

    /// Runs `f` in stream order with the state held, as an operation that
    /// is not a schedule (a device window's direct all-reduce,
    /// `src/device/window.rs`): `f` gets the operation's context for
    /// `fingerprint` and the abort flag; its failure aborts the
    /// communicator as a failed collective's does.
    pub(crate) fn run_in_turn<R>(
        &self,
        fingerprint: comm_core::wire::Fingerprint,
        f: impl FnOnce(&mut State, &exec::OpContext, &exec::AbortFlag) -> Result<R>,
    ) -> Result<R> {
        let ticket = self.ticket();
        self.order.wait_turn(ticket);
        let mut st = self.lock();
        let ctx = self.op_context(st.seq, fingerprint, fingerprint.op, self.spin);
        self.finish_abort(&mut st);
        let r = match &st.aborted {
            Some(why) => Err(Error::Aborted {
                rank: self.rank,
                reason: Some(why.clone()),
            }),
            None if st.suspension != suspension::Suspension::Active => {
                Err(self.suspended_error(fingerprint.collective.name()))
            }
            None => {
                let r = f(&mut st, &ctx, &self.abort_flag);
                if let Err(e) = &r {
                    self.fail(&mut st, e);
                }
                r
            }
        };
        drop(st);
        self.order.finish();
        r
    }

    pub(crate) fn invalid(&self, op: &'static str, detail: String) -> Error {
        Error::InvalidArgument {
            rank: self.rank,
            op,
            detail,
        }
    }

    /// Per-tier accounting since the communicator was created.
    pub fn stats(&self) -> crate::Stats {
        let st = self.lock();
        let mut s = crate::Stats {
            rank: self.rank,
            ops: st.ops.values().sum(),
            ops_by_collective: st
                .ops
                .iter()
                .map(|(c, n)| (c.name().to_string(), *n))
                .collect(),
            wait_time: st.traffic.waited,
            busy_time: st.busy,
            ops_by_tag: st
                .tagged
                .iter()
                .map(|(tag, (n, busy))| (*tag, *n, *busy))
                .collect(),
            retransmits: st
                .conns
                .iter()
                .flatten()
                .filter_map(|c| c.retransmits())
                .sum(),
            ..Default::default()
        };
        s.ops_by_collective.sort();
        s.ops_by_tag.sort();
        for (p, b) in st.traffic.sent.iter().enumerate() {
            if self.topo.same_node(self.rank, p) {
                s.intra_sent += b;
            } else {
                s.inter_sent += b;
            }
        }
        for (p, b) in st.traffic.received.iter().enumerate() {
            if self.topo.same_node(self.rank, p) {
                s.intra_received += b;
            } else {
                s.inter_received += b;
            }
        }
        s.intra_sent += st.window_bytes.0;
        s.intra_received += st.window_bytes.1;
        if st.window_bytes != (0, 0) {
            s.add_transport_bytes("window", st.window_bytes.0, st.window_bytes.1);
        }
        for (p, kind) in self.transports.iter().enumerate() {
            let sent = st.traffic.sent.get(p).copied().unwrap_or(0);
            let received = st.traffic.received.get(p).copied().unwrap_or(0);
            if p != self.rank {
                s.add_transport_bytes(kind, sent, received);
            }
        }
        s
    }

    /// Aborts: every peer's pending and later operations fail.
    /// Works from any thread, also while an operation runs, and never waits
    /// for it: the running operation gives up at its next wait (within a
    /// millisecond) and, holding the state, tells the peers itself (see
    /// [`Inner::run`]); otherwise this call tells them now.
    pub fn abort(&self, reason: &str) {
        {
            let mut r = self.abort_reason.lock().unwrap_or_else(|e| e.into_inner());
            r.get_or_insert_with(|| reason.to_string());
        }
        self.abort_flag.store(true, Ordering::SeqCst);
        // The state is held by a running operation: it sees the flag and
        // aborts the connections when it stops (`finish_abort` after the
        // executor returns), so waiting for the lock here would only make
        // the caller wait for that operation.
        // A waiting operation lets go within a millisecond; one that is
        // still moving data finishes its step first and tells the peers
        // itself, so after a short grace this call returns regardless.
        let grace = std::time::Instant::now() + std::time::Duration::from_millis(20);
        loop {
            match self.state.try_lock() {
                Ok(mut st) => return self.finish_abort(&mut st),
                Err(std::sync::TryLockError::Poisoned(p)) => {
                    return self.finish_abort(&mut p.into_inner())
                }
                Err(std::sync::TryLockError::WouldBlock) => {}
            }
            if std::time::Instant::now() >= grace {
                tracing::debug!(
                    rank = self.rank,
                    "abort: an operation holds the state; it tells the peers when it stops"
                );
                return;
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }

    /// With the state held: if [`Inner::abort`] was called, marks the
    /// communicator aborted and tells every peer (once), blaming this rank.
    pub(crate) fn finish_abort(&self, st: &mut State) {
        if !self.abort_flag.load(Ordering::SeqCst) || st.aborted.is_some() {
            return;
        }
        let reason = self
            .async_error()
            .unwrap_or_else(|| "aborted by the application".into());
        tracing::warn!(rank = self.rank, %reason, "communicator aborted; telling the peers");
        st.aborted = Some(reason.clone());
        for c in st.conns.iter_mut().flatten() {
            c.abort(Some(self.rank));
        }
        if let Some(lazy) = &st.lazy {
            lazy.note_abort(Some(self.rank));
        }
        self.auto_dump(&reason);
    }

    /// Whether [`Inner::abort`] was called.
    pub(crate) fn abort_requested(&self) -> bool {
        self.abort_flag.load(Ordering::SeqCst)
    }

    /// The first failure, if the communicator is aborted. Never blocks on a
    /// running operation.
    pub fn async_error(&self) -> Option<String> {
        self.abort_reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}
