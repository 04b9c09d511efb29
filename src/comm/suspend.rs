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
//! every rank connected. A suspend either passes on every rank or fails on
//! every rank (one verdict in the store, `all_ranks_agree`); a suspend or
//! resume that fails (a rank that does not call it within the timeout, an
//! abort while waiting) aborts the communicator.
//!
//! Tagged messages must be received before the suspend: one still on its
//! way would go with its connection, so every rank notes the tagged
//! messages it sent and received per peer, and where a pair's counts
//! differ the suspend is refused on every rank, naming the pair (the
//! communicator goes on as before). Each suspend and resume leaves its keys in the store
//! (a rendezvous's worth per resume), as every creation does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use comm_core::{Error, Result};
use sncl_bootstrap::{PrefixStore, Store};

use super::suspension::Suspension;
use super::{memo, Inner, State};

/// How many of the ranks missing from a wait an error names.
const NAMED_MISSING: usize = 8;

/// How often a rank waiting for the others' suspend checks for an abort.
const AGREE_POLL: Duration = Duration::from_millis(100);

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
            Suspension::Suspended { .. } => Err(self.suspended_error(op)),
        }
    }

    /// Whether the communicator is suspended now.
    pub(crate) fn is_suspended(&self) -> bool {
        self.suspended.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Suspends this rank of the communicator (see the module docs), in
    /// stream order. The wait for the other ranks runs without the state
    /// held (the turn keeps operations out), so `mem_stats` and `abort`
    /// answer meanwhile; an abort ends it.
    pub(crate) fn suspend(&self) -> Result<()> {
        self.in_turn("suspend", || {
            let (generation, attempt, note) = {
                let mut st = self.lock();
                match st.suspension {
                    Suspension::Active => {
                        st.suspend_attempts += 1;
                        (
                            st.suspends + 1,
                            st.suspend_attempts,
                            st.mailbox.counts_note(),
                        )
                    }
                    Suspension::Suspended { .. } => {
                        return Err(self.invalid(
                            "suspend",
                            "the communicator is suspended already; resume it first".into(),
                        ))
                    }
                }
            };
            let started = Instant::now();
            self.all_ranks_agree(
                &format!("suspend/{attempt}"),
                "suspend",
                note,
                tagged_in_flight,
            )?;
            let mut guard = self.lock();
            let st = &mut *guard;
            self.check_not_aborted(st)?;
            // Every rank finished its operations before it arrived: no
            // peer reads what is dropped here.
            let peers = st.conns.iter().flatten().count();
            let released = self.mem_stats_of(st).releasable();
            st.conns.iter_mut().for_each(|c| *c = None);
            st.lazy = None;
            st.scratch = Vec::new();
            st.lanes = memo::LaneChoice::default();
            st.suspends = generation;
            st.suspension = Suspension::Suspended { released };
            self.suspended
                .store(true, std::sync::atomic::Ordering::Release);
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
    /// this one adopts), without the state held.
    pub(crate) fn resume(&self, connect: impl FnOnce(u64) -> Result<Inner>) -> Result<()> {
        self.in_turn("resume", || {
            let (suspension, generation) = {
                let st = self.lock();
                (st.suspension, st.suspends)
            };
            let Suspension::Suspended { .. } = suspension else {
                return Err(self.invalid(
                    "resume",
                    "the communicator is not suspended; resume follows a suspend".into(),
                ));
            };
            let started = Instant::now();
            let fresh = connect(generation)?;
            let mut new = fresh.lock();
            let mut guard = self.lock();
            let st = &mut *guard;
            self.check_not_aborted(st)?;
            st.conns = std::mem::take(&mut new.conns);
            st.lazy = new.lazy.take();
            if let Some(lazy) = &mut st.lazy {
                // Liveness probes go to the standby stores that outlive
                // this resume (the build's own close when it is dropped).
                lazy.standby.clone_from(&self.recovery.standby_addrs);
            }
            st.suspension = Suspension::Active;
            self.suspended
                .store(false, std::sync::atomic::Ordering::Release);
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

    /// Runs `f` in stream order (earlier operations finished) on a
    /// communicator that is not aborted; a failure other than misuse
    /// aborts the communicator.
    fn in_turn(&self, op: &'static str, f: impl FnOnce() -> Result<()>) -> Result<()> {
        let ticket = self.ticket();
        self.order.wait_turn(ticket);
        let r = {
            let mut st = self.lock();
            self.check_not_aborted(&mut st)
        }
        .and_then(|()| f());
        if let Err(e) = &r {
            if !matches!(e, Error::InvalidArgument { .. } | Error::Aborted { .. }) {
                let mut st = self.lock();
                self.fail(&mut st, e);
            }
            tracing::warn!(rank = self.rank, op, error = %e, "{op} failed");
        }
        self.order.finish();
        r
    }

    /// The store this communicator was created in.
    pub(crate) fn own_store(&self, op: &'static str) -> Result<Arc<dyn Store>> {
        self.store.clone().ok_or_else(|| Error::Bootstrap {
            rank: self.rank,
            detail: format!("{op}: this communicator was built without a store to meet in"),
        })
    }

    /// A barrier at `key` in the communicator's store whose outcome every
    /// rank shares: it passes on every rank once all arrived, or fails on
    /// every rank naming why (the ranks that did not arrive within the
    /// timeout, or the rank that aborted while waiting).
    ///
    /// The outcome is decided once, by whoever first takes the decision
    /// (`add` on `{key}/decide` returning 1): the last rank to arrive
    /// (`{key}/arrived` reaching the size), or a rank whose wait ran out or
    /// was aborted, which decides from the arrivals it counts then. Every
    /// rank then follows the verdict that decider wrote, so a rank arriving
    /// just as another gives up cannot pass where that one failed.
    ///
    /// A rank may bring a `note` (published before it arrives); once all
    /// arrived, the decider reads every rank's note (if any rank brought
    /// one) and `refuse` may turn them into a refusal: every rank then
    /// returns it as [`Error::InvalidArgument`] and goes on as before.
    fn all_ranks_agree(
        &self,
        key: &str,
        op: &'static str,
        note: Option<String>,
        refuse: impl Fn(&[Option<String>]) -> Option<String>,
    ) -> Result<()> {
        let kv = PrefixStore::new(format!("sncl/{:016x}", self.comm_id), self.own_store(op)?);
        if let Some(note) = &note {
            kv.set(&format!("{key}/note/{}", self.rank), note.as_bytes())?;
            kv.add(&format!("{key}/notes"), 1)?;
        }
        kv.set(&format!("{key}/rank/{}", self.rank), b"")?;
        let (arrived_key, decide, verdict) = (
            format!("{key}/arrived"),
            format!("{key}/decide"),
            format!("{key}/verdict"),
        );
        let n = self.nranks as i64;
        let timeout = self.config.timeout;
        let deadline = Instant::now() + timeout;
        let mut why = None;
        if kv.add(&arrived_key, 1)? == n {
            why = Some(String::new());
        }
        loop {
            if let Some(reason) = why.take() {
                // Take the decision, or learn that someone else took it.
                if kv.add(&decide, 1)? == 1 {
                    let arrived = kv.add(&arrived_key, 0)?;
                    let decided = if arrived < n {
                        format!("rank {} gave up: {reason}", self.rank)
                    } else if kv.add(&format!("{key}/notes"), 0)? == 0 {
                        "ok".to_string()
                    } else {
                        let notes = (0..self.nranks)
                            .map(|r| {
                                kv.try_get(&format!("{key}/note/{r}"))
                                    .map(|v| v.map(|b| String::from_utf8_lossy(&b).into_owned()))
                            })
                            .collect::<Result<Vec<_>>>()?;
                        match refuse(&notes) {
                            Some(why) => format!("refuse:{why}"),
                            None => "ok".to_string(),
                        }
                    };
                    kv.set(&verdict, decided.as_bytes())?;
                }
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let slice = left.min(AGREE_POLL).max(Duration::from_millis(1));
            let tried = Instant::now();
            match kv.wait(&[verdict.as_str()], slice) {
                Ok(()) => break,
                // Failed before its slice ran out: the store is gone.
                Err(e) if tried.elapsed() + Duration::from_millis(1) < slice => return Err(e),
                Err(_) => {}
            }
            if self.abort_requested() {
                why = Some("it was aborted while waiting".into());
            } else if Instant::now() >= deadline {
                let missing: Vec<usize> = (0..self.nranks)
                    .filter(|r| !matches!(kv.try_get(&format!("{key}/rank/{r}")), Ok(Some(_))))
                    .take(NAMED_MISSING)
                    .collect();
                why = Some(format!(
                    "rank(s) {missing:?} did not call {op} within {} ms (every rank calls it at \
                     the same point)",
                    timeout.as_millis()
                ));
            }
        }
        // The decider writes the verdict right after taking the decision.
        let decided = kv.get(&verdict, timeout)?;
        match decided.as_slice() {
            b"ok" => Ok(()),
            why if why.starts_with(b"refuse:") => Err(self.invalid(
                op,
                format!(
                    "refused on every rank: {}",
                    String::from_utf8_lossy(&why[7..])
                ),
            )),
            why => Err(Error::Bootstrap {
                rank: self.rank,
                detail: format!(
                    "{op} called off on every rank: {}",
                    String::from_utf8_lossy(why)
                ),
            }),
        }
    }
}

/// A suspend's refusal where a tagged message is still on its way (its
/// connection goes with the suspend): from the ranks' notes of tagged
/// messages sent and received per peer ([`super::mailbox::Mailbox::counts_note`]).
fn tagged_in_flight(notes: &[Option<String>]) -> Option<String> {
    let parse = |note: &str, side: &str| -> Vec<(usize, u64)> {
        note.split(';')
            .find_map(|part| part.strip_prefix(side))
            .unwrap_or("")
            .split(',')
            .filter_map(|pc| {
                let (p, c) = pc.split_once('=')?;
                Some((p.parse().ok()?, c.parse().ok()?))
            })
            .collect()
    };
    for (from, note) in notes.iter().enumerate() {
        let Some(note) = note else { continue };
        for (to, sent) in parse(note, "s:") {
            let received = notes
                .get(to)
                .and_then(Option::as_deref)
                .map(|n| parse(n, "r:"))
                .unwrap_or_default()
                .into_iter()
                .find(|&(p, _)| p == from)
                .map_or(0, |(_, c)| c);
            if received < sent {
                return Some(format!(
                    "rank {from} sent {sent} tagged message(s) to rank {to}, which has received \
                     {received}: receive every tagged message before suspending (its connection \
                     goes with the suspend)"
                ));
            }
        }
    }
    None
}
