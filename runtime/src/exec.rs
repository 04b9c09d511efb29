//! The executor: walks one rank's [`Schedule`] over its connections. Within
//! a step every communication op progresses piece by piece, so sends and
//! receives of a step overlap and a reduction consumes each piece where the
//! transport holds it. Waiting spins briefly, then yields, then sleeps, and
//! every wait has a deadline measured from the last progress.

//!
//! Its parts: `wait` (backoff, deadlines, liveness probes, hang reports),
//! `piece` (pieces: send, receive, check, use), `device` (device routes
//! and device pieces).

use std::time::Duration;

use kernels::ReduceOp;

use crate::error::{Error, Result};
use crate::schedule::{Op, Schedule};
use crate::transport::Connection;

pub use crate::buffers::Buffers;
pub use crate::mem::Memory;

mod context;
mod device;
mod piece;
mod wait;
use context::{in_op, OpState};
pub use context::{peer_failed, AbortFlag, OpContext};
use device::host_routed_sends;
use piece::{flush, recv_some, send_some};
pub use wait::{check_peers, wait_on_ranks, wait_on_ranks_with, HANG_REPORT_EVERY};
use wait::{hang_report, probe_peers, wait_over, waiting_peers, Waiter};

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

/// Ops of one step whose progress is kept on the stack ([`execute`]).
const INLINE_STATES: usize = 16;

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
    // Per-op progress of the current step: on the stack for the usual few
    // ops a step has (a vector cost a malloc and a free per operation,
    // docs/perf-notes/NOTEBOOK.md §7), on the heap beyond.
    let mut inline_states = [OpState::default(); INLINE_STATES];
    let mut heap_states: Vec<OpState> = Vec::new();
    let mut traffic = traffic;
    let nsteps = sched.steps.len();
    // Device memory: every device path publishes this side first (no
    // waiting), so that no rank waits below for a peer that has not.
    if let Some(queue) = bufs.device_queue() {
        for c in conns.iter_mut().flatten() {
            c.ready(queue).map_err(|e| in_op(ctx, e))?;
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
        let states: &mut [OpState] = match inline_states.get_mut(..step.ops.len()) {
            Some(s) => s,
            None => {
                heap_states.resize(step.ops.len(), OpState::default());
                &mut heap_states[..]
            }
        };
        states.fill(OpState::default());
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
                let waiting_on = || waiting_peers(step.ops.as_slice(), states);
                let doing = || format!("waiting on {:?}", waiting_on());
                if let Some(e) = wait_over(ctx, waited, aborted(), doing, waiting_on) {
                    if matches!(e, Error::Timeout { .. }) {
                        hang_report(ctx, (k, nsteps), &step.ops, states, waited, true);
                    }
                    return Err(e);
                }
                if waited >= waiter.next_report {
                    waiter.next_report = waited + HANG_REPORT_EVERY;
                    hang_report(ctx, (k, nsteps), &step.ops, states, waited, false);
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

#[cfg(test)]
mod tests;
