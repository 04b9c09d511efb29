//! Waiting: the executor's backoff (spin, yield, sleep, bounded under
//! contention), the deadline and abort checks that end a wait, the
//! periodic liveness probes of the awaited peers, and the hang reports.

use std::time::Duration;

use crate::clock::Instant;

use super::context::{peer_failed, AbortFlag, OpContext, OpState};
use crate::error::{Error, Result};
use crate::schedule::Op;
use crate::transport::Connection;

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
pub(super) struct Waiter {
    idle: u32,
    pub(super) waited: Duration,
    spin: Duration,
    last_progress: Instant,
    pub(super) last_probe: Instant,
    /// The wait (since the last progress) at which the next hang report is due.
    pub(super) next_report: Duration,
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
    /// Late yields, each within [`Waiter::CONTENTION_MEMORY`] of the one
    /// before, after which a waiter on a shared core sleeps, not yields.
    const LATE_YIELDS: u32 = 3;
    /// How long a yielding waiter spends yielding before it sleeps.
    const YIELD_FOR: Duration = Duration::from_micros(200);

    /// No clock read here: most steps of small operations never wait.
    pub(super) fn new(spin: Duration) -> Waiter {
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

    /// Whether this thread's yields keep returning late: another task
    /// keeps the core for its time slices. `late` records a yield that
    /// returned late at that time; [`Waiter::LATE_YIELDS`] of them within
    /// [`Waiter::CONTENTION_MEMORY`] of each other make the answer yes
    /// until a quarter of a second passes without one (a lone late yield
    /// is as often the hypervisor's as a busy task's).
    fn yields_late(now: Instant, late: bool) -> bool {
        thread_local! {
            // (late yields in a row, the last one's time)
            static LATE: std::cell::Cell<(u32, Option<Instant>)> =
                const { std::cell::Cell::new((0, None)) };
        }
        LATE.with(|l| {
            let (mut count, last) = l.get();
            let recent = last.is_some_and(|t| now.duration_since(t) < Waiter::CONTENTION_MEMORY);
            if !recent {
                count = 0;
            }
            if late {
                count = count.saturating_add(1);
                l.set((count, Some(now)));
            } else if !recent {
                l.set((0, last));
            }
            count >= Waiter::LATE_YIELDS
        })
    }

    fn mark_contended(&mut self, now: Instant) {
        if !self.contended {
            tracing::trace!("waiter found its core shared; a short spin, then yields or sleeps");
        }
        self.contended = true;
        Waiter::last_contention(Some(now));
    }

    pub(super) fn progressed(&mut self) {
        if self.idle > 0 {
            self.waited += self.last_progress.elapsed();
        }
        self.idle = 0;
        self.next_report = HANG_REPORT_EVERY;
    }

    /// Backs off once. Returns how long there has been no progress when it
    /// checked the clock (every 64 idle rounds while spinning).
    pub(super) fn idle(&mut self) -> Option<Duration> {
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
        // Past the spin budget, check the clock every round. A shared core
        // is yielded too, unless a yield came back late lately: where the
        // core's other tasks are ranks waiting like this one (more ranks
        // than cores), a yield hands the core to the rank that has work
        // within microseconds, where a sleep costs the timer slack (4 ranks
        // on 2 cores, 8 B all-reduce: 50-75 -> 7-16 us); where one is a
        // busy task, a yield returns only after its time slice, and a
        // sleeper is woken ahead of it.
        self.idle = 1 << 30;
        if waited < spin + Waiter::YIELD_FOR && !(self.contended && Waiter::yields_late(now, false))
        {
            std::thread::yield_now();
            // A late return: another task had the core.
            let back = Instant::now();
            if back.duration_since(now) >= Waiter::YIELD_LATE {
                self.mark_contended(back);
                Waiter::yields_late(back, true);
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

/// What ends a wait that made no progress for `waited`: the
/// communicator aborted (`Error::Aborted`, "interrupted by abort while
/// `doing`"), or the deadline passed (`Error::Timeout` naming
/// `waiting_on`); `None` while the wait goes on. The caller logs what it
/// waited for before returning the error.
pub(super) fn wait_over(
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
pub(super) fn probe_peers(
    ctx: &OpContext,
    waiter: &mut Waiter,
    conns: &mut [Option<Box<dyn Connection>>],
    peers: impl FnOnce() -> Vec<usize>,
) -> Result<()> {
    if waiter.last_probe.elapsed() < Duration::from_millis(100) {
        return Ok(());
    }
    waiter.last_probe = Instant::now();
    let peers = peers();
    check_peers(ctx, conns, peers.iter().copied())?;
    check_lanes(ctx, conns, peers.into_iter())
}

/// A rank waiting in operation `ctx.seq` whose awaited peer published a lane
/// line for that operation runs something else than the peer (a small
/// all-reduce, which takes the lanes, against another operation): a
/// [`Error::Mismatch`] naming both, as the fingerprints of pieces report
/// it, instead of a wait until the deadline.
fn check_lanes(
    ctx: &OpContext,
    conns: &mut [Option<Box<dyn Connection>>],
    peers: impl Iterator<Item = usize>,
) -> Result<()> {
    if ctx.seq == 0 {
        return Ok(());
    }
    for p in peers {
        let Some(lane) = conns
            .get_mut(p)
            .and_then(|c| c.as_deref_mut())
            .and_then(|c| c.lane())
        else {
            continue;
        };
        if let Some(theirs) = lane.peek(ctx.seq).filter(|t| *t != ctx.fingerprint) {
            return Err(Error::Mismatch {
                rank: ctx.rank,
                peer: p,
                seq: ctx.seq,
                ours: ctx.fingerprint,
                their_seq: ctx.seq,
                theirs,
            });
        }
    }
    Ok(())
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
    wait_on_ranks_with(ctx, conns, abort, doing, |_| Ok(pending()))
}

/// As [`wait_on_ranks`], for a `pending` that works on the connections
/// (lanes) and may fail: its error ends the wait.
pub fn wait_on_ranks_with(
    ctx: &OpContext,
    conns: &mut [Option<Box<dyn Connection>>],
    abort: Option<&AbortFlag>,
    doing: &str,
    mut pending: impl FnMut(&mut [Option<Box<dyn Connection>>]) -> Result<Option<usize>>,
) -> Result<()> {
    let mut waiter = Waiter::new(ctx.spin);
    loop {
        let Some(peer) = pending(conns)? else {
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

/// Logs what a waiting rank waits for: the operation, its sequence number,
/// step k of n, and per unfinished transfer the peer with the bytes
/// expected and moved so far. At ERROR when the deadline passed, else INFO
/// (every [`HANG_REPORT_EVERY`] while the wait lasts).
pub(super) fn hang_report(
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

pub(super) fn waiting_peers(ops: &[Op], states: &[OpState]) -> Vec<usize> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A waiter on a shared core keeps yielding through a lone late yield
    /// (a hypervisor pause) and two in a quarter second, sleeps from the
    /// third, and yields again once a quarter second passes without one.
    #[test]
    fn yields_turn_to_sleeps_after_three_late_yields_in_a_quarter_second() {
        // A fresh thread: the count is per thread.
        std::thread::spawn(|| {
            let t0 = Instant::now();
            let at = |ms: u64| t0 + Duration::from_millis(ms);
            assert!(!Waiter::yields_late(at(0), false), "nothing late yet");
            assert!(!Waiter::yields_late(at(1), true), "one late yield");
            assert!(!Waiter::yields_late(at(100), true), "two");
            assert!(!Waiter::yields_late(at(120), false), "asked between them");
            assert!(
                Waiter::yields_late(at(300), true),
                "three, each within 250 ms"
            );
            assert!(
                Waiter::yields_late(at(500), false),
                "still within 250 ms of the last"
            );
            assert!(
                !Waiter::yields_late(at(560), false),
                "a quarter second without one"
            );
            assert!(!Waiter::yields_late(at(600), true), "counting starts over");
            // Late yields further apart than the memory never add up.
            for k in 1..6 {
                assert!(
                    !Waiter::yields_late(at(600 + 300 * k), true),
                    "spread out, {k}"
                );
            }
        })
        .join()
        .unwrap();
    }
}
