//! Suspend and resume (NCCL's `ncclCommSuspend(NCCL_SUSPEND_MEM)` and
//! `ncclCommResume`): the communicator's peer buffers go and come back
//! while its membership stays.
//!
//! A suspend, in stream order on every rank, waits in the communicator's
//! store until every rank suspended (so no peer still reads a FIFO this
//! rank is about to drop), then drops every connection — shared-memory
//! segments, socket buffers, RDMA rings and registrations, a lazy kind's
//! prepared state — and the executor's scratch. What stays: the rank, the
//! size, the id, the secret, the topology and the planner's choices, the
//! sequence numbers, the windows, the flight recorder and the standby
//! store (recovery still works). Every operation on a suspended
//! communicator is refused on the calling rank, naming the suspend.
//!
//! A resume connects every rank anew, exactly as a creation does (a
//! rendezvous in the communicator's store, under an id derived from the
//! communicator's and the resume's number, so nothing of an earlier
//! generation is found), and adopts the new connections. It returns when
//! every rank connected. A suspend or resume that fails (a rank that does
//! not call it within the timeout) aborts the communicator: ranks could
//! otherwise disagree on whether it is suspended.

use std::sync::Arc;
use std::time::Instant;

use comm_core::{Error, Result};
use sncl_bootstrap::{PrefixStore, Store};

use super::suspension::Suspension;
use super::{memo, Inner, State};

/// How many of the ranks missing from a wait an error names.
const NAMED_MISSING: usize = 8;

impl Inner {
    /// The refusal of operation `op` while suspended.
    pub(crate) fn suspended_error(&self, op: &'static str) -> Error {
        Error::InvalidArgument {
            rank: self.rank,
            op,
            detail: "the communicator is suspended (its peer buffers were released); every \
                     rank calls resume before the next operation"
                .into(),
        }
    }

    /// With the state held: refuses operation `op` on a suspended
    /// communicator.
    pub(crate) fn check_not_suspended(&self, st: &State, op: &'static str) -> Result<()> {
        match st.suspension {
            Suspension::Active => Ok(()),
            Suspension::Suspended(_) => Err(self.suspended_error(op)),
        }
    }

    /// Whether the communicator is suspended now.
    pub(crate) fn is_suspended(&self) -> bool {
        matches!(self.lock().suspension, Suspension::Suspended(_))
    }

    /// Suspends this rank of the communicator (see the module docs), in
    /// stream order.
    pub(crate) fn suspend(&self) -> Result<()> {
        self.in_turn("suspend", |st| {
            let generation = match st.suspension {
                Suspension::Active => st.suspends + 1,
                Suspension::Suspended(_) => {
                    return Err(self.invalid(
                        "suspend",
                        "the communicator is suspended already; resume it first".into(),
                    ))
                }
            };
            let started = Instant::now();
            self.all_ranks_reach(&format!("suspend/{generation}"), "suspend")?;
            // Every rank finished its operations before it arrived: no
            // peer reads what is dropped here.
            let peers = st.conns.iter().flatten().count();
            let released = self.mem_stats_of(st).releasable();
            st.conns.iter_mut().for_each(|c| *c = None);
            st.lazy = None;
            st.scratch = Vec::new();
            st.lanes = memo::LaneChoice::default();
            st.suspends = generation;
            st.suspension = Suspension::Suspended(generation);
            st.released = released;
            tracing::info!(
                rank = self.rank,
                generation,
                peers,
                released,
                ms = started.elapsed().as_secs_f64() * 1e3,
                "communicator suspended: peer buffers released"
            );
            Ok(())
        })
    }

    /// Resumes a suspended communicator (see the module docs), in stream
    /// order: `connect` builds the new connections for the suspend
    /// `generation` (a communicator of the same ranks, whose connections
    /// this one adopts).
    pub(crate) fn resume(&self, connect: impl FnOnce(u64) -> Result<Inner>) -> Result<()> {
        self.in_turn("resume", |st| {
            let Suspension::Suspended(generation) = st.suspension else {
                return Err(self.invalid(
                    "resume",
                    "the communicator is not suspended; resume follows a suspend".into(),
                ));
            };
            let started = Instant::now();
            let fresh = connect(generation)?;
            let mut new = fresh.lock();
            st.conns = std::mem::take(&mut new.conns);
            st.lazy = new.lazy.take();
            if let Some(lazy) = &mut st.lazy {
                // Liveness probes go to the standby stores that outlive
                // this resume (the build's own close when it is dropped).
                lazy.standby.clone_from(&self.recovery.standby_addrs);
            }
            st.suspension = Suspension::Active;
            st.released = 0;
            tracing::info!(
                rank = self.rank,
                generation,
                peers = st.conns.iter().flatten().count(),
                ms = started.elapsed().as_secs_f64() * 1e3,
                "communicator resumed"
            );
            Ok(())
        })
    }

    /// Runs `f` in stream order (earlier operations finished), with the
    /// state held, on a communicator that is not aborted; a failure aborts
    /// the communicator.
    fn in_turn(&self, op: &'static str, f: impl FnOnce(&mut State) -> Result<()>) -> Result<()> {
        let ticket = self.ticket();
        self.order.wait_turn(ticket);
        let mut st = self.lock();
        let r = self.check_not_aborted(&mut st).and_then(|()| {
            let r = f(&mut st);
            if let Err(e) = &r {
                if !matches!(e, Error::InvalidArgument { .. }) {
                    self.fail(&mut st, e);
                }
            }
            r
        });
        drop(st);
        self.order.finish();
        if let Err(e) = &r {
            tracing::warn!(rank = self.rank, op, error = %e, "{op} failed");
        }
        r
    }

    /// The store this communicator was created in.
    pub(crate) fn own_store(&self, op: &'static str) -> Result<Arc<dyn Store>> {
        self.store.clone().ok_or_else(|| Error::Bootstrap {
            rank: self.rank,
            detail: format!("{op}: this communicator was built without a store to meet in"),
        })
    }

    /// Waits until every rank reached `key` (a barrier in the
    /// communicator's store, within the timeout); a timeout names the
    /// ranks that did not arrive.
    fn all_ranks_reach(&self, key: &str, op: &'static str) -> Result<()> {
        let kv = PrefixStore::new(format!("sncl/{:016x}", self.comm_id), self.own_store(op)?);
        kv.set(&format!("{key}/rank/{}", self.rank), b"")?;
        let timeout = self.config.timeout;
        let Err(e) = sncl_bootstrap::store_barrier(&kv, key, self.nranks, timeout) else {
            return Ok(());
        };
        let missing: Vec<usize> = (0..self.nranks)
            .filter(|r| !matches!(kv.try_get(&format!("{key}/rank/{r}")), Ok(Some(_))))
            .take(NAMED_MISSING)
            .collect();
        if missing.is_empty() {
            return Err(e);
        }
        Err(Error::Bootstrap {
            rank: self.rank,
            detail: format!(
                "{op}: rank(s) {missing:?} did not call {op} within {} ms (every rank calls \
                 it at the same point): {e}",
                timeout.as_millis()
            ),
        })
    }
}
