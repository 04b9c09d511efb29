//! The executor: walks one rank's [`Schedule`] over its connections. Within
//! a step every communication op progresses piece by piece, so sends and
//! receives of a step overlap and a reduction consumes each piece where the
//! transport holds it. Waiting spins briefly, then yields, then sleeps, and
//! every wait has a deadline measured from the last progress.

use std::time::{Duration, Instant};

use kernels::{DataType, ReduceOp};

use crate::error::{Error, Result};
use crate::schedule::{Op, Region, Schedule};
use crate::transport::{Connection, TransportError};
use crate::wire::{Fingerprint, PieceHeader};

pub use crate::mem::{Buffers, Memory};

mod device;
use device::{device_route, host_routed_sends, recv_device, send_device};

/// Identity of one operation on one rank.
#[derive(Clone, Copy, Debug)]
pub struct OpContext {
    /// This rank.
    pub rank: usize,
    /// Ranks in the communicator.
    pub nranks: usize,
    /// Communicator id carried in every piece.
    pub comm_id: u64,
    /// Sequence number of the operation.
    pub seq: u64,
    /// Fingerprint every piece must carry.
    pub fingerprint: Fingerprint,
    /// Element type.
    pub dtype: DataType,
    /// Reduction operator (for reducing ops).
    pub op: ReduceOp,
    /// Deadline without progress.
    pub timeout: Duration,
    /// How long a waiter spins before it yields the core.
    pub spin: Duration,
    /// Pieces carry the CRC32C of their payload and received pieces are
    /// verified before use (`SNCL_CHECKSUM=1`).
    pub checksum: bool,
}

/// Set from any thread to make the running operation give up at its next
/// wait (the communicator's abort).
pub type AbortFlag = std::sync::atomic::AtomicBool;

/// Bytes moved by one execution, per peer.
#[derive(Clone, Debug, Default)]
pub struct Traffic {
    /// Bytes sent to each peer.
    pub sent: Vec<u64>,
    /// Bytes received from each peer.
    pub received: Vec<u64>,
    /// Time spent waiting on peers (no progress possible).
    pub waited: Duration,
}

#[derive(Clone, Copy, Default)]
struct OpState {
    done: usize,
    finished: bool,
}

impl OpState {
    /// Records `n` more bytes of the op's `total` moved; whether it is
    /// finished now.
    fn advance(&mut self, n: usize, total: usize) -> bool {
        self.done += n;
        self.finished = self.done == total;
        self.finished
    }
}

/// A fixed instant to initialise waiters without reading the clock.
static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// Waiting policy: spin (no system calls) for up to `spin`, then yield the
/// core, then sleep, with a deadline. The communicator sets `spin` short
/// when its node runs more ranks than it has cores, where a spinning waiter
/// would steal the core from the rank it waits for.
///
/// Bounded under contention: a waiter that finds its core was taken while
/// it spun or yielded (a clock gap, or a yield that returned late) treats
/// the core as shared — by another rank, the application or an unrelated
/// process — and, for this wait and the waits of the next
/// [`Waiter::CONTENTION_MEMORY`] on this thread, spins at most
/// [`Waiter::CONTENDED_SPIN`] and then sleeps instead of yielding. Yielding
/// hands a busy core back only after the other task's time slice (ms),
/// while a sleeper is woken with priority; spinning only burns the time
/// slice of the rank being waited for. On a quiet core nothing changes.
struct Waiter {
    idle: u32,
    waited: Duration,
    spin: Duration,
    last_progress: Instant,
    last_probe: Instant,
    /// The wait (since the last progress) at which the next hang report is due.
    next_report: Duration,
    /// The previous clock read of this wait (gaps reveal preemption).
    last_check: Instant,
    /// The previous round slept (so the next clock gap says nothing).
    slept: bool,
    /// This wait runs on a shared core: short spin, then sleep.
    contended: bool,
}

/// How often a waiting rank logs what it waits for (at INFO).
pub const HANG_REPORT_EVERY: Duration = Duration::from_secs(10);

impl Waiter {
    /// The spin budget on a core found shared.
    const CONTENDED_SPIN: Duration = Duration::from_micros(2);
    /// A gap this long between two clock reads of a spinning or yielding
    /// waiter (64 rounds of polling at most, microseconds each) means
    /// another task ran on its core: time slices are a millisecond or more.
    const PREEMPTED: Duration = Duration::from_millis(1);
    /// A `sched_yield` that returns this late handed the core to another
    /// task (on an idle core it returns within microseconds).
    const YIELD_LATE: Duration = Duration::from_micros(200);
    /// How long a thread keeps waiting as on a shared core after it last
    /// found its core taken.
    const CONTENTION_MEMORY: Duration = Duration::from_millis(250);
    /// How long a yielding waiter spends yielding before it sleeps.
    const YIELD_FOR: Duration = Duration::from_micros(200);

    /// No clock read here: most steps of small operations never wait.
    fn new(spin: Duration) -> Waiter {
        let epoch = *EPOCH.get_or_init(Instant::now);
        Waiter {
            idle: 0,
            waited: Duration::ZERO,
            spin,
            last_progress: epoch,
            last_probe: epoch,
            next_report: HANG_REPORT_EVERY,
            last_check: epoch,
            slept: false,
            contended: false,
        }
    }

    /// When this thread last found its core taken while waiting (`set`
    /// records a new finding).
    fn last_contention(set: Option<Instant>) -> Option<Instant> {
        thread_local! {
            static LAST: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
        }
        LAST.with(|l| {
            if set.is_some() {
                l.set(set);
            }
            l.get()
        })
    }

    fn mark_contended(&mut self, now: Instant) {
        if !self.contended {
            tracing::trace!("waiter found its core shared; sleeping instead of spinning");
        }
        self.contended = true;
        Waiter::last_contention(Some(now));
    }

    fn progressed(&mut self) {
        if self.idle > 0 {
            self.waited += self.last_progress.elapsed();
        }
        self.idle = 0;
        self.next_report = HANG_REPORT_EVERY;
    }

    /// Backs off once. Returns how long there has been no progress when it
    /// checked the clock (every 64 idle rounds while spinning).
    fn idle(&mut self) -> Option<Duration> {
        self.idle = self.idle.saturating_add(1);
        if self.idle == 1 {
            let now = Instant::now();
            self.last_progress = now;
            self.last_probe = now;
            self.last_check = now;
            self.slept = false;
            self.contended = Waiter::last_contention(None)
                .is_some_and(|t| now.duration_since(t) < Waiter::CONTENTION_MEMORY);
            return None;
        }
        if !self.idle.is_multiple_of(64) && self.idle < 1 << 30 {
            std::hint::spin_loop();
            return None;
        }
        let now = Instant::now();
        if !self.slept && now.duration_since(self.last_check) >= Waiter::PREEMPTED {
            self.mark_contended(now);
        }
        self.last_check = now;
        self.slept = false;
        let waited = now.duration_since(self.last_progress);
        let spin = if self.contended {
            self.spin.min(Waiter::CONTENDED_SPIN)
        } else {
            self.spin
        };
        if waited < spin {
            std::hint::spin_loop();
            return Some(waited);
        }
        // Past the spin budget, check the clock every round.
        self.idle = 1 << 30;
        if !self.contended && waited < spin + Waiter::YIELD_FOR {
            std::thread::yield_now();
            // A late return: another task had the core.
            let back = Instant::now();
            if back.duration_since(now) >= Waiter::YIELD_LATE {
                self.mark_contended(back);
            }
            self.last_check = back;
        } else if waited < Duration::from_millis(20) {
            // On a shared core the shortest sleep (the timer slack, about
            // 50 us) keeps small-message latency down; the wake-up still
            // gets the core back ahead of a busy task.
            std::thread::sleep(if self.contended {
                Duration::from_micros(1)
            } else {
                Duration::from_micros(50)
            });
            self.slept = true;
        } else {
            std::thread::sleep(Duration::from_micros(200));
            self.slept = true;
        }
        Some(waited)
    }
}

fn peer_failed(ctx: &OpContext, source: TransportError) -> Error {
    let failed_rank = match &source {
        TransportError::PeerGone { peer, .. } => Some(*peer),
        // The aborting peer only passes the failure on; blame its cause
        // (a suspect is named in the message, not counted as failed).
        TransportError::PeerAborted { cause, .. } => {
            crate::transport::AbortCause::failed_rank(*cause)
        }
        TransportError::Corrupt { peer, .. } | TransportError::Io { peer, .. } => Some(*peer),
    };
    Error::PeerFailed {
        rank: ctx.rank,
        op: ctx.fingerprint,
        seq: ctx.seq,
        failed_rank,
        source,
    }
}

fn in_op(ctx: &OpContext, e: Error) -> Error {
    match e {
        Error::Transport { source, .. } => peer_failed(ctx, source),
        other => other,
    }
}

/// Runs `sched` to completion.
///
/// `conns[p]` is the connection to rank `p` (None for self and unconnected
/// ranks). Regions must lie inside `bufs` (the caller validated sizes);
/// `bufs` is host [`Buffers`] or any other [`Memory`] (device memory).
pub fn execute<M: Memory>(
    sched: &Schedule,
    ctx: &OpContext,
    bufs: &M,
    conns: &mut [Option<Box<dyn Connection>>],
    traffic: Option<&mut Traffic>,
    abort: Option<&AbortFlag>,
) -> Result<()> {
    let aborted = || abort.is_some_and(|a| a.load(std::sync::atomic::Ordering::Relaxed));
    let esize = ctx.dtype.size();
    let mut states: Vec<OpState> = Vec::new();
    let mut traffic = traffic;
    let nsteps = sched.steps.len();
    // Device memory: every device path publishes this side first (no
    // waiting), so that no rank waits below for a peer that has not.
    if let Some(queue) = bufs.device_queue() {
        for c in conns.iter_mut().flatten() {
            if let Some(link) = c.device_link() {
                link.ready(queue).map_err(|e| in_op(ctx, e))?;
            }
        }
    }
    let mut staged_ops: Vec<Op> = Vec::new();
    for (k, step) in sched.steps.iter().enumerate() {
        for op in &step.ops {
            if let Op::Copy { src, dst } = *op {
                bufs.copy(src, dst, esize)?;
            }
        }
        if bufs.device_queue().is_some() {
            // Only sends that go through the host are staged there.
            host_routed_sends(ctx, bufs, &step.ops, conns, abort, &mut staged_ops)?;
            bufs.prepare_sends(&staged_ops, esize)?;
        } else {
            bufs.prepare_sends(&step.ops, esize)?;
        }
        states.clear();
        states.resize(step.ops.len(), OpState::default());
        let mut waiter = Waiter::new(ctx.spin);
        loop {
            let mut progressed = false;
            let mut pending = false;
            for i in 0..step.ops.len() {
                let op = step.ops[i];
                let Some(peer) = op.peer() else { continue };
                if states[i].finished {
                    continue;
                }
                pending = true;
                let is_send = matches!(op, Op::Send { .. });
                // Messages to / from one peer are matched in order.
                let blocked = step.ops[..i].iter().zip(&states[..i]).any(|(o, s)| {
                    !s.finished && o.peer() == Some(peer) && matches!(o, Op::Send { .. }) == is_send
                });
                if blocked {
                    continue;
                }
                let conn = conns
                    .get_mut(peer)
                    .and_then(|c| c.as_deref_mut())
                    .ok_or_else(|| Error::InvalidArgument {
                        rank: ctx.rank,
                        op: ctx.fingerprint.collective.name(),
                        detail: format!("no connection to rank {peer}"),
                    })?;
                let moved = match op {
                    Op::Send { src, .. } => send_some(ctx, bufs, conn, src, &mut states[i])?,
                    Op::Recv { dst, .. } => recv_some(ctx, bufs, conn, None, dst, &mut states[i])?,
                    Op::RecvReduce { local, dst, .. } => {
                        recv_some(ctx, bufs, conn, Some(local), dst, &mut states[i])?
                    }
                    _ => 0,
                };
                if moved > 0 || states[i].finished {
                    progressed = true;
                }
                if let Some(t) = traffic.as_deref_mut() {
                    let v = if is_send {
                        &mut t.sent
                    } else {
                        &mut t.received
                    };
                    if v.len() < ctx.nranks {
                        v.resize(ctx.nranks, 0);
                    }
                    v[peer] += moved as u64;
                }
            }
            // Let buffered transports (TCP) push what they hold.
            for op in &step.ops {
                if let Op::Send { peer, .. } = op {
                    if let Some(c) = conns.get_mut(*peer).and_then(|c| c.as_deref_mut()) {
                        flush(ctx, c)?;
                    }
                }
            }
            if !pending {
                waiter.progressed();
                if let Some(t) = traffic.as_deref_mut() {
                    t.waited += waiter.waited;
                }
                break;
            }
            if progressed {
                waiter.progressed();
                continue;
            }
            if let Some(waited) = waiter.idle() {
                let waiting_on = || waiting_peers(step.ops.as_slice(), &states);
                let doing = || format!("waiting on {:?}", waiting_on());
                if let Some(e) = wait_over(ctx, waited, aborted(), doing, waiting_on) {
                    if matches!(e, Error::Timeout { .. }) {
                        hang_report(ctx, (k, nsteps), &step.ops, &states, waited, true);
                    }
                    return Err(e);
                }
                if waited >= waiter.next_report {
                    waiter.next_report = waited + HANG_REPORT_EVERY;
                    hang_report(ctx, (k, nsteps), &step.ops, &states, waited, false);
                }
                probe_peers(ctx, &mut waiter, conns, waiting_on)?;
            }
        }
        // Drain buffered sends before the step's data may be overwritten.
        let mut waiter = Waiter::new(ctx.spin);
        loop {
            let mut all = true;
            for op in &step.ops {
                if let Op::Send { peer, .. } = op {
                    if let Some(c) = conns.get_mut(*peer).and_then(|c| c.as_deref_mut()) {
                        all &= flush(ctx, c)?;
                    }
                }
            }
            if all {
                break;
            }
            if let Some(waited) = waiter.idle() {
                let waiting_on = || step.ops.iter().filter_map(|o| o.peer()).collect();
                let doing = || "draining its sends".to_string();
                if let Some(e) = wait_over(ctx, waited, aborted(), doing, waiting_on) {
                    if let Error::Timeout { waiting_on, .. } = &e {
                        tracing::error!(
                            rank = ctx.rank,
                            op = %ctx.fingerprint,
                            seq = ctx.seq,
                            step = k + 1,
                            steps = nsteps,
                            peers = ?waiting_on,
                            since_progress_ms = waited.as_millis() as u64,
                            "sncl hang: buffered sends not drained before the deadline"
                        );
                    }
                    return Err(e);
                }
            }
        }
        for op in &step.ops {
            if let Op::Finalize { region } = *op {
                if ctx.op == ReduceOp::Avg {
                    bufs.divide(region, ctx.dtype, ctx.nranks)?;
                }
            }
        }
    }
    Ok(())
}

/// What ends a wait that made no progress for `waited`: the
/// communicator aborted (`Error::Aborted`, "interrupted by abort while
/// `doing`"), or the deadline passed (`Error::Timeout` naming
/// `waiting_on`); `None` while the wait goes on. The caller logs what it
/// waited for before returning the error.
fn wait_over(
    ctx: &OpContext,
    waited: Duration,
    aborted: bool,
    doing: impl FnOnce() -> String,
    waiting_on: impl FnOnce() -> Vec<usize>,
) -> Option<Error> {
    if aborted {
        return Some(Error::Aborted {
            rank: ctx.rank,
            reason: Some(format!(
                "{} (seq {}) interrupted by abort while {}",
                ctx.fingerprint,
                ctx.seq,
                doing()
            )),
        });
    }
    (waited >= ctx.timeout).then(|| Error::Timeout {
        rank: ctx.rank,
        op: ctx.fingerprint,
        seq: ctx.seq,
        waiting_on: waiting_on(),
        timeout_ms: ctx.timeout.as_millis() as u64,
    })
}

/// Every 100 ms of a wait, asks the connections to the awaited `peers`
/// whether their peer is still alive (a dead one is an error naming it).
fn probe_peers(
    ctx: &OpContext,
    waiter: &mut Waiter,
    conns: &mut [Option<Box<dyn Connection>>],
    peers: impl FnOnce() -> Vec<usize>,
) -> Result<()> {
    if waiter.last_probe.elapsed() < Duration::from_millis(100) {
        return Ok(());
    }
    waiter.last_probe = Instant::now();
    check_peers(ctx, conns, peers().into_iter())
}

/// Asks the connections to `peers` once whether their peer is still alive
/// and has not aborted (a dead or aborted one is an error naming it).
pub fn check_peers(
    ctx: &OpContext,
    conns: &mut [Option<Box<dyn Connection>>],
    peers: impl Iterator<Item = usize>,
) -> Result<()> {
    for p in peers {
        if let Some(c) = conns.get_mut(p).and_then(|c| c.as_deref_mut()) {
            c.check_alive().map_err(|e| peer_failed(ctx, e))?;
        }
    }
    Ok(())
}

/// Waits until `pending` returns `None` (it names the first rank this rank
/// still waits on), with the executor's backoff, deadline, abort and
/// liveness probes: for protocols outside the step loop that wait on
/// peers' flags in shared memory (windows). `doing` says what the wait is
/// for in errors and logs.
pub fn wait_on_ranks(
    ctx: &OpContext,
    conns: &mut [Option<Box<dyn Connection>>],
    abort: Option<&AbortFlag>,
    doing: &str,
    mut pending: impl FnMut() -> Option<usize>,
) -> Result<()> {
    let mut waiter = Waiter::new(ctx.spin);
    loop {
        let Some(peer) = pending() else {
            return Ok(());
        };
        let Some(waited) = waiter.idle() else {
            continue;
        };
        let aborted = abort.is_some_and(|a| a.load(std::sync::atomic::Ordering::Relaxed));
        if let Some(e) = wait_over(ctx, waited, aborted, || doing.to_string(), || vec![peer]) {
            tracing::error!(
                rank = ctx.rank,
                seq = ctx.seq,
                op = %ctx.fingerprint,
                peer,
                waited_ms = waited.as_millis() as u64,
                "{doing}: gave up waiting"
            );
            return Err(e);
        }
        probe_peers(ctx, &mut waiter, conns, || vec![peer])?;
    }
}

/// Flushes a connection's buffered host pieces and its device path's
/// unpublished pieces; `Ok(true)` when nothing is left.
fn flush(ctx: &OpContext, c: &mut dyn Connection) -> Result<bool> {
    let host = c.flush().map_err(|e| peer_failed(ctx, e))?;
    let device = match c.device_link() {
        Some(link) => link.flush_device().map_err(|e| in_op(ctx, e))?,
        None => true,
    };
    Ok(host && device)
}

/// Logs what a waiting rank waits for: the operation, its sequence number,
/// step k of n, and per unfinished transfer the peer with the bytes
/// expected and moved so far. At ERROR when the deadline passed, else INFO
/// (every [`HANG_REPORT_EVERY`] while the wait lasts).
fn hang_report(
    ctx: &OpContext,
    (k, nsteps): (usize, usize),
    ops: &[Op],
    states: &[OpState],
    waited: Duration,
    timed_out: bool,
) {
    let level_on = if timed_out {
        tracing::enabled!(tracing::Level::ERROR)
    } else {
        tracing::enabled!(tracing::Level::INFO)
    };
    if !level_on {
        return;
    }
    let esize = ctx.dtype.size();
    let mut waiting = String::new();
    for (op, st) in ops.iter().zip(states).filter(|(_, s)| !s.finished) {
        let (what, peer, region) = match *op {
            Op::Send { peer, src } => ("send to", peer, src),
            Op::Recv { peer, dst } => ("recv from", peer, dst),
            Op::RecvReduce { peer, dst, .. } => ("recv-reduce from", peer, dst),
            _ => continue,
        };
        if !waiting.is_empty() {
            waiting.push_str("; ");
        }
        waiting.push_str(&format!(
            "{what} rank {peer}: {} of {} bytes",
            st.done,
            region.len * esize
        ));
    }
    let since_progress_ms = waited.as_millis() as u64;
    if timed_out {
        tracing::error!(
            rank = ctx.rank,
            op = %ctx.fingerprint,
            seq = ctx.seq,
            step = k + 1,
            steps = nsteps,
            waiting = %waiting,
            since_progress_ms,
            "sncl hang: deadline passed"
        );
    } else {
        tracing::info!(
            rank = ctx.rank,
            op = %ctx.fingerprint,
            seq = ctx.seq,
            step = k + 1,
            steps = nsteps,
            waiting = %waiting,
            since_progress_ms,
            "sncl hang: still waiting"
        );
    }
}

fn waiting_peers(ops: &[Op], states: &[OpState]) -> Vec<usize> {
    let mut v: Vec<usize> = ops
        .iter()
        .zip(states)
        .filter(|(_, s)| !s.finished)
        .filter_map(|(o, _)| o.peer())
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The header of a piece with payload `data`. When the operation
/// checksums pieces it asks for a CRC32C, which the transport computes in
/// the pass that copies the payload (see [`PieceHeader::checksum`]).
fn header(ctx: &OpContext, data: &[u8]) -> PieceHeader {
    PieceHeader {
        checksum: ctx.checksum.then_some(0),
        comm_id: ctx.comm_id,
        seq: ctx.seq,
        fingerprint: ctx.fingerprint,
        len: data.len() as u32,
    }
}

/// Uses a received piece (bytes `at..at + data.len()` of a message of
/// `total` bytes from `peer`): writes it at `dst` (`local` is `None`) or
/// reduces it with `local` into `dst`, verifying its checksum in the same
/// pass. Host memory is written [`CHECKSUM_BLOCK`](crate::wire::CHECKSUM_BLOCK)
/// bytes at a time, each block checksummed just before it is used, so the
/// piece is read once; on a mismatch the piece has been written (the
/// operation fails and its output is undefined, as after any error).
/// Memory the host cannot write directly (device memory, staged) is
/// verified first. A mismatch, or a missing checksum where this rank
/// expects one, is corrupt data from that peer.
#[allow(clippy::too_many_arguments)]
fn use_piece<M: Memory>(
    ctx: &OpContext,
    bufs: &M,
    peer: usize,
    h: &PieceHeader,
    data: &[u8],
    (local, dst): (Option<Region>, Region),
    (at, total): (usize, usize),
) -> Result<()> {
    let esize = ctx.dtype.size();
    let put = |off: usize, part: &[u8]| match local {
        None => bufs.write_at(dst, esize, at + off, part),
        Some(l) => bufs.reduce_at(l, dst, esize, at + off, part, ctx.dtype, ctx.op),
    };
    let corrupt = |detail: String| peer_failed(ctx, TransportError::Corrupt { peer, detail });
    let want = match h.checksum {
        Some(want) => want,
        None if ctx.checksum => {
            return Err(corrupt(format!(
                "{} (seq {}): the piece at bytes {at}.. of {total} carries no checksum and \
                 SNCL_CHECKSUM=1 here (ranks must agree on SNCL_CHECKSUM)",
                ctx.fingerprint, ctx.seq
            )))
        }
        None => return put(0, data),
    };
    let got = if bufs.device_queue().is_some() {
        let got = crate::wire::piece_checksum(data);
        if got == want {
            put(0, data)?;
        }
        got
    } else {
        let block = (crate::wire::CHECKSUM_BLOCK / esize * esize).max(esize);
        let mut crc = 0;
        for (k, part) in data.chunks(block).enumerate() {
            crc = crate::wire::checksum_append(crc, part);
            put(k * block, part)?;
        }
        crc
    };
    if got != want {
        return Err(corrupt(format!(
            "{} (seq {}): the piece at bytes {at}..{} of {total} has CRC32C {got:#010x}, \
             its sender computed {want:#010x} (the data changed in memory or on the link)",
            ctx.fingerprint,
            ctx.seq,
            at + data.len()
        )));
    }
    Ok(())
}

/// Pushes as many pieces of `src` as the connection takes now and the
/// memory has ready (staged, for device memory).
fn send_some<M: Memory>(
    ctx: &OpContext,
    bufs: &M,
    conn: &mut dyn Connection,
    src: Region,
    st: &mut OpState,
) -> Result<usize> {
    let esize = ctx.dtype.size();
    let total = src.len * esize;
    match device_route(ctx, bufs, conn)? {
        None => return Ok(0),
        Some(true) => return send_device(ctx, bufs, conn, src, st),
        Some(false) => {}
    }
    let max = piece_limit(conn, esize);
    let mut moved = 0;
    let lend = bufs.pieces_outlive_step();
    loop {
        let n = max.min(total - st.done);
        let sent = bufs.with_piece(src, esize, st.done, n, |b| {
            if lend {
                // SAFETY: `pieces_outlive_step` promises `b` is the
                // operation's own memory, unchanged until the step ends, and
                // the step does not end (see the drain in `execute`) before every
                // connection it sent on has flushed.
                unsafe { conn.try_send_lent(&header(ctx, b), b) }
            } else {
                conn.try_send(&header(ctx, b), b)
            }
        })?;
        // Not staged yet (device memory): like no room now, try later.
        let Some(sent) = sent else {
            return Ok(moved);
        };
        if !sent.map_err(|e| peer_failed(ctx, e))? {
            return Ok(moved);
        }
        moved += n;
        if st.advance(n, total) {
            return Ok(moved);
        }
    }
}

fn piece_limit(conn: &dyn Connection, esize: usize) -> usize {
    (conn.max_piece() / esize * esize).max(esize)
}

/// Checks a received piece's header against this operation (communicator,
/// sequence number, fingerprint) and its length against the `expect`ed
/// bytes at byte `done` of `total`.
fn check_piece(
    ctx: &OpContext,
    peer: usize,
    h: &PieceHeader,
    len: usize,
    expect: usize,
    (done, total): (usize, usize),
) -> Result<()> {
    if h.comm_id != ctx.comm_id {
        return Err(Error::CommMismatch {
            rank: ctx.rank,
            peer,
            seq: ctx.seq,
            op: ctx.fingerprint,
            ours: ctx.comm_id,
            theirs: h.comm_id,
            their_seq: h.seq,
        });
    }
    if h.seq != ctx.seq || h.fingerprint != ctx.fingerprint {
        return Err(Error::Mismatch {
            rank: ctx.rank,
            peer,
            seq: ctx.seq,
            ours: ctx.fingerprint,
            their_seq: h.seq,
            theirs: h.fingerprint,
        });
    }
    if len != expect {
        return Err(Error::InvalidArgument {
            rank: ctx.rank,
            op: ctx.fingerprint.collective.name(),
            detail: format!(
                "peer rank {peer} sent a piece of {len} bytes at byte {done} of {total} where {expect} were expected (counts differ across ranks?)"
            ),
        });
    }
    Ok(())
}

/// Consumes as many arrived pieces into `dst` as there are.
fn recv_some<M: Memory>(
    ctx: &OpContext,
    bufs: &M,
    conn: &mut dyn Connection,
    local: Option<Region>,
    dst: Region,
    st: &mut OpState,
) -> Result<usize> {
    let esize = ctx.dtype.size();
    let total = dst.len * esize;
    match device_route(ctx, bufs, conn)? {
        None => return Ok(0),
        Some(true) => return recv_device(ctx, bufs, conn, local, dst, st),
        Some(false) => {}
    }
    let max = piece_limit(conn, esize);
    let peer = conn.peer();
    let mut moved = 0;
    loop {
        let expect = max.min(total - st.done);
        let done = st.done;
        let mut consume = |h: &PieceHeader, data: &[u8]| -> Result<()> {
            check_piece(ctx, peer, h, data.len(), expect, (done, total))?;
            use_piece(ctx, bufs, peer, h, data, (local, dst), (done, total))
        };
        let got = conn.try_recv(&mut consume).map_err(|e| in_op(ctx, e))?;
        if !got {
            return Ok(moved);
        }
        moved += expect;
        if st.advance(expect, total) {
            return Ok(moved);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::BufId;
    use crate::wire::Collective;

    /// Delivers one piece with a fixed header; sends are swallowed.
    struct OnePiece {
        peer: usize,
        header: PieceHeader,
    }

    impl Connection for OnePiece {
        fn peer(&self) -> usize {
            self.peer
        }
        fn max_piece(&self) -> usize {
            1 << 20
        }
        fn try_send(&mut self, _: &PieceHeader, _: &[u8]) -> Result<bool, TransportError> {
            Ok(true)
        }
        fn try_recv(
            &mut self,
            consume: &mut dyn FnMut(&PieceHeader, &[u8]) -> crate::transport::ConsumeResult,
        ) -> Result<bool> {
            let data = vec![0u8; self.header.len as usize];
            consume(&self.header, &data)?;
            Ok(true)
        }
        fn abort(&mut self, _: Option<usize>) {}
        fn kind(&self) -> &'static str {
            "test"
        }
    }

    fn recv_one(ours: u64, theirs: u64, their_fp: Fingerprint) -> Result<()> {
        recv_checked(ours, theirs, their_fp, false, None)
    }

    /// Receives one 8-byte piece of zeros whose header carries `sent`, on
    /// a rank that checksums pieces when `checksum`.
    fn recv_checked(
        ours: u64,
        theirs: u64,
        their_fp: Fingerprint,
        checksum: bool,
        sent: Option<u32>,
    ) -> Result<()> {
        recv_len(8, (ours, theirs), their_fp, checksum, sent)
    }

    /// As [`recv_checked`], for a piece of `len` zeros.
    fn recv_len(
        len: usize,
        (ours, theirs): (u64, u64),
        their_fp: Fingerprint,
        checksum: bool,
        sent: Option<u32>,
    ) -> Result<()> {
        let ctx = OpContext {
            rank: 0,
            nranks: 2,
            comm_id: ours,
            seq: 3,
            fingerprint: sendrecv_fp(),
            dtype: DataType::Uint8,
            op: ReduceOp::Sum,
            timeout: Duration::from_secs(5),
            spin: Duration::ZERO,
            checksum,
        };
        let mut sched = Schedule::new(2, 0);
        sched.push(vec![Op::Recv {
            peer: 1,
            dst: Region::new(BufId::Peer(0), 0, len),
        }]);
        let mut dst = vec![0u8; len];
        // SAFETY: `dst` outlives the execution and nothing else touches it;
        // the other buffers are empty.
        let bufs = unsafe {
            Buffers::new(
                std::ptr::NonNull::dangling().as_ptr(),
                0,
                std::ptr::NonNull::dangling().as_ptr(),
                0,
                std::ptr::NonNull::dangling().as_ptr(),
                0,
            )
            .with_peer_buffers(vec![(dst.as_mut_ptr(), dst.len())])
        };
        let header = PieceHeader {
            checksum: sent,
            comm_id: theirs,
            seq: 3,
            fingerprint: their_fp,
            len: len as u32,
        };
        let mut conns: Vec<Option<Box<dyn Connection>>> =
            vec![None, Some(Box::new(OnePiece { peer: 1, header }))];
        execute(&sched, &ctx, &bufs, &mut conns, None, None)
    }

    fn sendrecv_fp() -> Fingerprint {
        Fingerprint {
            collective: Collective::SendRecv,
            dtype: DataType::Uint8,
            op: ReduceOp::Sum,
            root: -1,
            count: 0,
        }
    }

    #[test]
    fn checksummed_pieces_are_verified() {
        let fp = sendrecv_fp();
        let good = crate::wire::piece_checksum(&[0u8; 8]);
        recv_checked(7, 7, fp, true, Some(good)).expect("a matching CRC32C passes");
        // A receiver that does not checksum still verifies what it is given.
        let e = recv_checked(7, 7, fp, false, Some(good ^ 1)).expect_err("a bad CRC32C fails");
        let msg = e.to_string();
        assert!(
            matches!(
                e,
                Error::PeerFailed {
                    failed_rank: Some(1),
                    ..
                }
            ),
            "{e:?}"
        );
        for want in [
            "rank 0",
            "peer rank 1",
            "CRC32C",
            "bytes 0..8 of 8",
            "seq 3",
        ] {
            assert!(msg.contains(want), "{msg:?} lacks {want:?}");
        }
        let e = recv_checked(7, 7, fp, true, None).expect_err("a missing checksum fails");
        assert!(e.to_string().contains("SNCL_CHECKSUM"), "{e}");
    }

    /// A piece of several checksum blocks is verified as a whole while it
    /// is written block by block.
    #[test]
    fn multi_block_pieces_are_verified_whole() {
        let fp = sendrecv_fp();
        let len = 2 * crate::wire::CHECKSUM_BLOCK + 5;
        let good = crate::wire::piece_checksum(&vec![0u8; len]);
        recv_len(len, (7, 7), fp, true, Some(good)).expect("a matching CRC32C passes");
        let e = recv_len(len, (7, 7), fp, true, Some(good ^ 0x8000_0000))
            .expect_err("a bad CRC32C fails");
        assert!(
            e.to_string().contains(&format!("bytes 0..{len} of {len}")),
            "{e}"
        );
    }

    #[test]
    fn comm_id_mismatch_names_both_ids() {
        let e = recv_one(0x1111_2222_3333_4444, 0xaaaa_bbbb_cccc_dddd, sendrecv_fp())
            .expect_err("a piece of another communicator must fail");
        assert!(
            matches!(
                e,
                Error::CommMismatch {
                    rank: 0,
                    peer: 1,
                    seq: 3,
                    ours: 0x1111_2222_3333_4444,
                    theirs: 0xaaaa_bbbb_cccc_dddd,
                    their_seq: 3,
                    ..
                }
            ),
            "{e:?}"
        );
        let msg = e.to_string();
        for want in [
            "rank 0",
            "peer rank 1",
            "seq 3",
            "1111222233334444",
            "aaaabbbbccccdddd",
        ] {
            assert!(msg.contains(want), "{msg:?} lacks {want:?}");
        }
    }

    #[test]
    fn same_comm_other_collective_is_a_fingerprint_mismatch() {
        let mut theirs = sendrecv_fp();
        theirs.collective = Collective::AllReduce;
        let e = recv_one(7, 7, theirs).expect_err("a different collective must fail");
        assert!(matches!(e, Error::Mismatch { peer: 1, .. }), "{e:?}");
        recv_one(7, 7, sendrecv_fp()).expect("a matching piece is received");
    }
}
