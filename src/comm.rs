//! The communicator: owns the connections to every peer, turns each call
//! into a schedule (cached per shape), and runs operations in the order they
//! were enqueued (stream order). Blocking calls run inline on the caller's
//! thread; non-blocking ones run on a per-communicator progress thread.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use comm_core::algo::{self, Algorithm, Params};
use comm_core::bootstrap::{Store, TcpStoreServer};
use comm_core::exec::{self, Buffers, OpContext};
use comm_core::schedule::Schedule;
use comm_core::topo::Topology;
use comm_core::transport::Connection;
use comm_core::tune::{self, LinkCost, Shape};
use comm_core::wire::{Collective, Fingerprint};
use comm_core::{Config, DataType, Error, ReduceOp, Result};

mod tagged;

/// Variable counts of all_gatherv / alltoallv, in elements.
/// all_gatherv uses only the receive side.
#[derive(Clone, Debug, Default)]
pub struct VCounts {
    /// Elements sent to each rank.
    pub send_counts: Vec<usize>,
    /// Where each rank's block starts in the input.
    pub send_displs: Vec<usize>,
    /// Elements received from each rank.
    pub recv_counts: Vec<usize>,
    /// Where each rank's block lands in the output.
    pub recv_displs: Vec<usize>,
}

/// One point-to-point transfer of a group (sizes in bytes).
#[derive(Clone, Copy, Debug)]
pub struct P2p {
    /// The other rank.
    pub peer: usize,
    /// Send (true) or receive (false).
    pub is_send: bool,
    /// The buffer.
    pub ptr: *mut u8,
    /// Its length in bytes.
    pub count: usize,
}

/// An operation on raw buffers, as the C ABI and framework bindings issue
/// them. Counts follow NCCL's conventions per collective (`count` is the
/// per-rank block for all_gather, reduce_scatter, alltoall, gather and
/// scatter). In place: `send == recv` (all_reduce, broadcast, reduce), `send
/// == recv + rank × count` (all_gather), `recv == send + rank × count`
/// (reduce_scatter).
#[derive(Clone, Debug)]
pub struct RawOp {
    /// The collective.
    pub coll: Collective,
    /// Element type.
    pub dtype: DataType,
    /// Reduction (reducing collectives).
    pub op: ReduceOp,
    /// Root (rooted collectives).
    pub root: usize,
    /// Element count (see above).
    pub count: usize,
    /// Input.
    pub send: *const u8,
    /// Output.
    pub recv: *mut u8,
    /// Variable counts (all_gatherv, alltoallv).
    pub v: Option<VCounts>,
    /// Transfers of a point-to-point group (`Collective::SendRecv`).
    pub p2p: Vec<P2p>,
}

// SAFETY: the raw pointers are lent by the caller until the operation
// completes (the typed API's borrows and scopes enforce it); only one thread
// executes the operation.
unsafe impl Send for RawOp {}

impl RawOp {
    /// An op with null buffers, `Sum` and root 0; fill in the rest.
    pub fn new(coll: Collective, dtype: DataType, count: usize) -> RawOp {
        RawOp {
            coll,
            dtype,
            op: ReduceOp::Sum,
            root: 0,
            count,
            send: std::ptr::null(),
            recv: std::ptr::null_mut(),
            v: None,
            p2p: Vec::new(),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct ShapeKey {
    coll: Collective,
    algo: Algorithm,
    count: usize,
    root: usize,
    chunk: usize,
}

pub(crate) struct State {
    pub conns: Vec<Option<Box<dyn Connection>>>,
    seq: u64,
    scratch: Vec<u8>,
    cache: HashMap<ShapeKey, Arc<Schedule>>,
    aborted: Option<String>,
    traffic: exec::Traffic,
    ops: HashMap<Collective, u64>,
    busy: std::time::Duration,
    /// Tagged messages that arrived before a receive asked for them.
    mailbox: tagged::Mailbox,
}

/// Ticket-based ordering: operations run in the order they took a ticket.
struct Order {
    next: Mutex<u64>,
    turn: AtomicU64,
    parked: AtomicU64,
    park: Mutex<()>,
    cv: Condvar,
}

impl Order {
    fn new() -> Order {
        Order {
            next: Mutex::new(0),
            turn: AtomicU64::new(0),
            parked: AtomicU64::new(0),
            park: Mutex::new(()),
            cv: Condvar::new(),
        }
    }

    fn wait_turn(&self, t: u64) {
        for _ in 0..200 {
            if self.turn.load(Ordering::Acquire) == t {
                return;
            }
            std::hint::spin_loop();
        }
        self.parked.fetch_add(1, Ordering::SeqCst);
        let mut g = self.park.lock().unwrap_or_else(|e| e.into_inner());
        while self.turn.load(Ordering::SeqCst) != t {
            g = self
                .cv
                .wait_timeout(g, std::time::Duration::from_millis(1))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(g);
        self.parked.fetch_sub(1, Ordering::SeqCst);
    }

    fn finish(&self) {
        self.turn.fetch_add(1, Ordering::SeqCst);
        // Waiters re-check at least every millisecond, so a missed wake-up
        // only delays; skip the lock when nobody is parked.
        if self.parked.load(Ordering::SeqCst) > 0 {
            let _g = self.park.lock().unwrap_or_else(|e| e.into_inner());
            self.cv.notify_all();
        }
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
    spin: std::time::Duration,
    pub topo: Topology,
    pub shape: Shape,
    pub node_ids: Vec<String>,
    pub transports: Vec<&'static str>,
    pub state: Mutex<State>,
    order: Order,
    pub store: Option<Arc<dyn Store>>,
    pub secret: [u8; 16],
    pub local_ip: std::net::IpAddr,
    pub splits: AtomicU64,
    abort_flag: exec::AbortFlag,
    abort_reason: Mutex<Option<String>>,
    pub _server: Option<TcpStoreServer>,
}

pub(crate) struct InnerParts {
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
}

impl Inner {
    pub fn new(p: InnerParts) -> Inner {
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
            spin: spin_budget(&p.node_ids, p.rank),
            topo,
            shape,
            config: p.config,
            node_ids: p.node_ids,
            transports: p.transports,
            state: Mutex::new(State {
                conns: p.conns,
                seq: 0,
                scratch: Vec::new(),
                cache: HashMap::new(),
                aborted: None,
                traffic: exec::Traffic::default(),
                ops: HashMap::new(),
                busy: std::time::Duration::ZERO,
                mailbox: tagged::Mailbox::default(),
            }),
            order: Order::new(),
            store: p.store,
            secret: p.secret,
            local_ip: p.local_ip,
            splits: AtomicU64::new(0),
            abort_flag: exec::AbortFlag::new(false),
            abort_reason: Mutex::new(None),
            _server: p.server,
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
        let mut n = self.order.next.lock().unwrap_or_else(|e| e.into_inner());
        let t = *n;
        *n += 1;
        f(t)
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

    fn invalid(&self, op: &'static str, detail: String) -> Error {
        Error::InvalidArgument {
            rank: self.rank,
            op,
            detail,
        }
    }

    fn validate(&self, op: &RawOp) -> Result<()> {
        let name = op.coll.name();
        let n = self.nranks;
        if op.coll.is_rooted() && op.root >= n {
            return Err(self.invalid(
                name,
                format!("root {} is out of range for {n} ranks", op.root),
            ));
        }
        if op.coll.is_reducing() {
            kernels::check_supported(op.dtype, op.op)
                .map_err(|e| self.invalid(name, e.to_string()))?;
        }
        if let Some(v) = &op.v {
            for (what, c) in [
                ("send counts", &v.send_counts),
                ("send displacements", &v.send_displs),
                ("receive counts", &v.recv_counts),
                ("receive displacements", &v.recv_displs),
            ] {
                if c.len() != n && !(op.coll == Collective::AllGatherV && what.starts_with("send"))
                {
                    return Err(self.invalid(
                        name,
                        format!(
                            "{what} have {} entries, expected one per rank ({n})",
                            c.len()
                        ),
                    ));
                }
            }
        }
        for p in &op.p2p {
            if p.peer >= n {
                return Err(self.invalid(
                    if p.is_send { "send" } else { "recv" },
                    format!("peer {} is out of range for {n} ranks", p.peer),
                ));
            }
        }
        self.validate_self_pairs(&op.p2p)
    }

    /// Sends to this rank itself and receives from itself, paired in issue
    /// order: the k-th send to self feeds the k-th receive from self of the
    /// same group (as in NCCL). Without its partner in the group a transfer
    /// to self could never complete (NCCL would hang), so it is rejected.
    fn validate_self_pairs(&self, p2p: &[P2p]) -> Result<()> {
        let me = self.rank;
        let sends = p2p.iter().filter(|p| p.peer == me && p.is_send);
        let recvs = p2p.iter().filter(|p| p.peer == me && !p.is_send);
        let (ns, nr) = (sends.clone().count(), recvs.clone().count());
        if ns != nr {
            return Err(self.invalid(
                if ns > nr { "send" } else { "recv" },
                format!(
                    "{ns} send(s) to this rank ({me}) itself but {nr} receive(s) from itself \
                     in one group; a transfer to self completes only with its partner in the \
                     same group (use Communicator::group)"
                ),
            ));
        }
        for (s, r) in sends.zip(recvs) {
            if s.count != r.count {
                return Err(self.invalid(
                    "send",
                    format!(
                        "a send of {} bytes to this rank ({me}) itself meets a receive of {} bytes",
                        s.count, r.count
                    ),
                ));
            }
            if s.count > 0 && (s.ptr.is_null() || r.ptr.is_null()) {
                return Err(self.invalid(
                    "send",
                    format!("a buffer of a send/receive to this rank ({me}) itself is NULL"),
                ));
            }
        }
        Ok(())
    }

    /// Runs the transfers of a point-to-point group to this rank itself as
    /// local copies; returns the group without them.
    ///
    /// # Safety
    /// As [`Inner::run`]; `op` passed [`Inner::validate`].
    unsafe fn copy_to_self(&self, op: &RawOp) -> RawOp {
        let me = self.rank;
        let sends = op.p2p.iter().filter(|p| p.peer == me && p.is_send);
        let recvs = op.p2p.iter().filter(|p| p.peer == me && !p.is_send);
        for (s, r) in sends.zip(recvs) {
            if s.count > 0 {
                // SAFETY: the caller lends both buffers for `count` bytes
                // (checked equal and non-NULL by validate) until the group
                // completes; `copy` allows them to overlap.
                unsafe { std::ptr::copy(s.ptr as *const u8, r.ptr, s.count) };
            }
        }
        let mut rest = op.clone();
        rest.p2p.retain(|p| p.peer != me);
        rest
    }

    /// Input and output extents in elements for the executor's bounds.
    fn extents(&self, op: &RawOp) -> (usize, usize) {
        let (n, r, c) = (self.nranks, self.rank, op.count);
        let extent = |counts: &[usize], displs: &[usize]| {
            counts
                .iter()
                .zip(displs)
                .map(|(c, d)| c + d)
                .max()
                .unwrap_or(0)
        };
        match op.coll {
            Collective::AllReduce => (c, c),
            Collective::ReduceScatter => (n * c, c),
            Collective::AllGather => (c, n * c),
            Collective::Broadcast => (if r == op.root { c } else { 0 }, c),
            Collective::Reduce => (c, if r == op.root { c } else { 0 }),
            Collective::AllToAll => (n * c, n * c),
            Collective::Gather => (c, if r == op.root { n * c } else { 0 }),
            Collective::Scatter => (if r == op.root { n * c } else { 0 }, c),
            Collective::AllGatherV => {
                let v = op.v.as_ref().expect("v counts");
                (v.recv_counts[r], extent(&v.recv_counts, &v.recv_displs))
            }
            Collective::AllToAllV => {
                let v = op.v.as_ref().expect("v counts");
                (
                    extent(&v.send_counts, &v.send_displs),
                    extent(&v.recv_counts, &v.recv_displs),
                )
            }
            Collective::SendRecv | Collective::Barrier | Collective::Tagged => (0, 0),
        }
    }

    /// The schedule of `op` with the algorithm the planner chose for it.
    /// Uniform-count schedules are cached per shape.
    fn schedule(&self, st: &mut State, op: &RawOp) -> Result<(Arc<Schedule>, Algorithm)> {
        let plan = self.plan(op.coll, op.dtype, op.count)?;
        let params = Params {
            nranks: self.nranks,
            rank: self.rank,
            count: op.count,
            root: op.root,
            chunk: plan.chunk_elems,
        };
        let build = |blocks| {
            let input = algo::Input {
                p: params,
                topo: &self.topo,
                blocks,
            };
            algo::build_input(op.coll, plan.algo, &input)
                .ok_or_else(|| Error::Config(algo::unavailable(op.coll, plan.algo)))
        };
        match op.coll {
            Collective::AllGatherV | Collective::AllToAllV => {
                let v = op.v.as_ref().ok_or_else(|| {
                    self.invalid(op.coll.name(), "variable counts are missing".into())
                })?;
                let counts = algo::VarCounts {
                    send_counts: &v.send_counts,
                    send_displs: &v.send_displs,
                    recv_counts: &v.recv_counts,
                    recv_displs: &v.recv_displs,
                };
                let s = build(algo::Blocks::Var(counts))?;
                return Ok((Arc::new(s), plan.algo));
            }
            Collective::SendRecv => {
                let transfers: Vec<algo::Transfer> = op
                    .p2p
                    .iter()
                    .map(|p| algo::Transfer {
                        peer: p.peer,
                        is_send: p.is_send,
                        len: p.count,
                    })
                    .collect();
                let s = build(algo::Blocks::P2p(&transfers))?;
                return Ok((Arc::new(s), plan.algo));
            }
            _ => {}
        }
        let key = ShapeKey {
            coll: op.coll,
            algo: plan.algo,
            count: op.count,
            root: op.root,
            chunk: plan.chunk_elems,
        };
        if let Some(s) = st.cache.get(&key) {
            return Ok((s.clone(), plan.algo));
        }
        let s = Arc::new(build(algo::Blocks::Uniform)?);
        if st.cache.len() > 256 {
            st.cache.clear();
        }
        st.cache.insert(key, s.clone());
        Ok((s, plan.algo))
    }

    /// The planner's choice for `coll` over `count` elements of `dtype`,
    /// with the algorithm forced for it (if any): the one place an
    /// operation's algorithm is decided.
    fn plan(&self, coll: Collective, dtype: DataType, count: usize) -> Result<tune::Plan> {
        let forced = self
            .forced
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(c, _)| *c == coll)
            .map(|(_, a)| *a);
        let esize = dtype.size();
        tune::choose(
            coll,
            forced,
            &self.shape,
            count.saturating_mul(esize),
            esize,
            self.config.chunk_bytes,
        )
    }

    /// The algorithm the planner picks for a collective of `count` elements.
    pub fn algorithm_for(
        &self,
        coll: Collective,
        dtype: DataType,
        count: usize,
    ) -> Result<&'static str> {
        Ok(self.plan(coll, dtype, count)?.algo.name())
    }

    /// Forces (or releases) the algorithm of one collective; the name must
    /// be one of the collective's rows in [`algo::ALGORITHMS`].
    pub fn force_algorithm(&self, coll: Collective, algo: Option<&str>) -> Result<()> {
        let chosen = match algo {
            Some(name) => Some(
                Algorithm::parse_for(coll, name.trim())
                    .map_err(|detail| self.invalid("force_algorithm", detail))?,
            ),
            None => None,
        };
        let mut f = self.forced.lock().unwrap_or_else(|e| e.into_inner());
        f.retain(|(c, _)| *c != coll);
        f.extend(chosen.map(|a| (coll, a)));
        Ok(())
    }

    /// Executes one operation now (the caller holds its turn).
    ///
    /// # Safety
    /// See [`Inner::run_ordered`].
    pub unsafe fn run(&self, op: &RawOp) -> Result<()> {
        self.validate(op)?;
        let mut guard = self.lock();
        let st = &mut *guard;
        if let Some(reason) = &st.aborted {
            return Err(Error::Aborted {
                rank: self.rank,
                reason: Some(reason.clone()),
            });
        }
        let rest;
        let op = if op.coll == Collective::SendRecv && op.p2p.iter().any(|p| p.peer == self.rank) {
            // SAFETY: forwarded from the caller; validated above.
            rest = unsafe { self.copy_to_self(op) };
            if rest.p2p.is_empty() {
                *st.ops.entry(op.coll).or_insert(0) += 1;
                return Ok(());
            }
            &rest
        } else {
            op
        };
        // Point-to-point groups involve only some ranks: they do not take a
        // collective sequence number (their pieces carry 0 and the
        // sendrecv fingerprint, so a mix-up with a collective is still caught).
        let seq = if op.coll == Collective::SendRecv {
            0
        } else {
            st.seq += 1;
            st.seq
        };
        let fingerprint = Fingerprint {
            collective: op.coll,
            dtype: op.dtype,
            op: if op.coll.is_reducing() {
                op.op
            } else {
                ReduceOp::Sum
            },
            root: if op.coll.is_rooted() {
                op.root as i32
            } else {
                -1
            },
            count: match op.coll {
                Collective::AllGatherV
                | Collective::AllToAllV
                | Collective::SendRecv
                | Collective::Barrier => 0,
                _ => op.count as u64,
            },
        };
        let (sched, _algo) = self.schedule(st, op)?;
        if sched.steps.is_empty() {
            return Ok(());
        }
        let esize = op.dtype.size();
        let (send_elems, recv_elems) = self.extents(op);
        // A rejected operation gives its sequence number back.
        let reject = |st: &mut State, detail: String| {
            if op.coll != Collective::SendRecv {
                st.seq -= 1;
            }
            Err(self.invalid(op.coll.name(), detail))
        };
        if (send_elems > 0 && op.send.is_null())
            || (recv_elems > 0 && op.recv.is_null())
            || op.p2p.iter().any(|p| p.count > 0 && p.ptr.is_null())
        {
            return reject(st, "a buffer is NULL".into());
        }
        let Some(scratch_bytes) = sched
            .scratch_elems
            .checked_mul(esize)
            .filter(|&b| b <= isize::MAX as usize)
        else {
            let detail = format!(
                "{} elements of scratch space are more than memory can address",
                sched.scratch_elems
            );
            return reject(st, detail);
        };
        if st.scratch.len() < scratch_bytes {
            let more = scratch_bytes - st.scratch.len();
            if let Err(e) = st.scratch.try_reserve_exact(more) {
                let detail = format!("cannot allocate {scratch_bytes} bytes of scratch space: {e}");
                return reject(st, detail);
            }
            st.scratch.resize(scratch_bytes, 0);
        }
        // SAFETY: the caller lends send/recv for the counts that `extents`
        // derives from; scratch is ours and sized above; p2p buffers are
        // lent by the caller for their counts.
        let bufs = unsafe {
            let b = Buffers::new(
                if send_elems == 0 {
                    std::ptr::NonNull::dangling().as_ptr()
                } else {
                    op.send
                },
                send_elems * esize,
                if recv_elems == 0 {
                    std::ptr::NonNull::dangling().as_ptr()
                } else {
                    op.recv
                },
                recv_elems * esize,
                st.scratch.as_mut_ptr(),
                scratch_bytes,
            );
            b.with_peer_buffers(op.p2p.iter().map(|p| (p.ptr, p.count * esize)).collect())
        };
        let ctx = OpContext {
            rank: self.rank,
            nranks: self.nranks,
            comm_id: self.comm_id,
            seq,
            fingerprint,
            dtype: op.dtype,
            op: op.op,
            timeout: self.config.timeout,
            spin: self.spin,
        };
        *st.ops.entry(op.coll).or_insert(0) += 1;
        let started = std::time::Instant::now();
        let result = exec::execute(
            &sched,
            &ctx,
            &bufs,
            &mut st.conns,
            Some(&mut st.traffic),
            Some(&self.abort_flag),
        );
        st.busy += started.elapsed();
        if let Err(e) = &result {
            self.fail(st, e);
        }
        result
    }

    /// After a failed operation: logs it and aborts every connection, so
    /// every peer fails fast and names the rank blamed.
    fn fail(&self, st: &mut State, e: &Error) {
        tracing::error!(rank = self.rank, error = %e, "operation failed; aborting the communicator");
        // A dead peer is named; a timeout does not prove the awaited peer
        // is the culprit (it may wait on another), so it names nobody;
        // anything else (mismatch, local abort) started on this rank.
        let cause = match e {
            Error::Timeout { .. } => None,
            // Passed on from a peer: keep its verdict (possibly none).
            Error::PeerFailed {
                source: comm_core::transport::TransportError::PeerAborted { .. },
                ..
            } => e.failed_rank(),
            _ => e.failed_rank().or(Some(self.rank)),
        };
        st.aborted = Some(e.to_string());
        self.abort_reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(|| e.to_string());
        for c in st.conns.iter_mut().flatten() {
            c.abort(cause);
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
            ..Default::default()
        };
        s.ops_by_collective.sort();
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
        s
    }

    /// Aborts: every peer's pending and later operations fail.
    /// Works from any thread, also while an operation runs: that operation
    /// gives up at its next wait.
    pub fn abort(&self, reason: &str) {
        {
            let mut r = self.abort_reason.lock().unwrap_or_else(|e| e.into_inner());
            r.get_or_insert_with(|| reason.to_string());
        }
        self.abort_flag.store(true, Ordering::SeqCst);
        let mut st = self.lock();
        if st.aborted.is_none() {
            st.aborted = Some(reason.to_string());
        }
        for c in st.conns.iter_mut().flatten() {
            c.abort(Some(self.rank));
        }
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
