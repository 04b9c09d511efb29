//! [`Communicator::agree_on_failed`]: the survivors of a failure agree on
//! who failed, so that they all shrink to the same communicator.
//!
//! The guarantee: no two ranks that return `Ok` return different sets, and
//! a rank in the returned set gets an error. A round can end with an error
//! (every rank that waits on a silent coordinator past the deadline), never
//! with two answers.
//!
//! How:
//! * **Who coordinates** is the lowest rank whose standby store does not
//!   refuse connections. Only a refused connection (the process is gone:
//!   its kernel answers for it) proves a rank dead; a connection that
//!   times out (a flooded or stopped rank, an unreachable host) is retried
//!   until the deadline, never taken as proof. So every survivor picks the
//!   same coordinator, however slow or flooded it is; the failures each
//!   rank saw in its own operations go into its report, not into the
//!   choice.
//! * **The coordinator** collects every live rank's report in its own
//!   standby store (served since creation, with bounded handshakes, so
//!   strangers cannot starve it), counts ranks that refuse connections or
//!   stay silent past the deadline as failed, and writes the union as its
//!   decision. Every rank that learns a decision writes it into its own
//!   standby store before returning.
//! * **A coordinator that dies mid-round** is found by the others (its
//!   store now refuses) and the next lowest live rank coordinates. Before
//!   deciding anything it looks for a decision already made: a live rank
//!   that neither reports nor refuses has returned, and its standby store
//!   holds the decision, which the new coordinator adopts unchanged. So a
//!   round's answer never changes once any rank has returned it. Where it
//!   cannot read a rank (gone, or silent) after a predecessor died during
//!   the round, it fails the round instead of deciding.
//!
//! Assumed: a refused connection means the process is gone. A firewall
//! that *rejects* (rather than drops) connections to a live rank's standby
//! port breaks that assumption; keep the job's ports open between its
//! ranks (docs/FAULTS.md).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use comm_core::{Error, Result};
use sncl_bootstrap::{MemoryStore, PrefixStore, Store, TcpStore};

use crate::comm::Inner;
use crate::recovery::{probe, Probe, PROBE_WAIT};
use crate::shrink::derived_id;
use crate::Communicator;

const AGREE_TAG: u64 = 0x0061_6772_6565; // "agree"
/// How long a coordinator waits for a rank's report before it also looks
/// for that rank's decision (the rank may have returned from the round).
const LOOK_FOR_DECISION_AFTER: Duration = Duration::from_millis(300);
/// How often waiting ranks check that their coordinator is still alive.
const POLL: Duration = Duration::from_millis(250);

pub(crate) fn encode_set(s: &BTreeSet<usize>) -> Vec<u8> {
    s.iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
        .into_bytes()
}

pub(crate) fn decode_set(
    rank: usize,
    from: usize,
    nranks: usize,
    b: &[u8],
) -> Result<BTreeSet<usize>> {
    let s = String::from_utf8_lossy(b);
    s.split(',')
        .filter(|x| !x.is_empty())
        .map(|x| match x.parse::<usize>() {
            Ok(r) if r < nranks => Ok(r),
            _ => Err(Error::Bootstrap {
                rank,
                detail: format!(
                    "agree_on_failed: rank {from} sent a malformed failed-rank list {s:?} \
                     (expected ranks below {nranks}, comma-separated)"
                ),
            }),
        })
        .collect()
}

/// How a round with one coordinator ended.
enum Outcome {
    /// The decision.
    Decided(BTreeSet<usize>),
    /// The coordinator refuses connections: it is gone.
    CoordinatorGone,
}

/// One agreement round of one rank.
struct Round<'a> {
    inner: &'a Inner,
    me: usize,
    /// The store namespace of this round.
    prefix: String,
    /// What this rank saw fail in its own operations.
    seen: BTreeSet<usize>,
    /// Ranks proven gone (their standby store refused a connection).
    gone: BTreeSet<usize>,
    /// The end of the whole round.
    deadline: Instant,
}

impl Round<'_> {
    fn error(&self, detail: String) -> Error {
        Error::Bootstrap {
            rank: self.me,
            detail: format!("agree_on_failed: {detail}"),
        }
    }

    /// Probes rank `r`'s standby store (a rank without a published address
    /// is an error, never taken for a dead one).
    fn probe(&self, r: usize) -> Result<Probe> {
        Ok(probe(self.inner.standby_addr(r)?))
    }

    /// The client end of a connection to a standby store: replies may take
    /// as long as the communicator's timeout (a loaded coordinator is slow,
    /// not dead).
    fn client(&self, s: TcpStore) -> PrefixStore<Arc<TcpStore>> {
        let io = self.inner.config.timeout.max(POLL * 4);
        PrefixStore::new(self.prefix.clone(), Arc::new(s.with_io_timeout(io)))
    }

    /// Connects to rank `c`'s standby store; `None` when it is gone. Retries
    /// timeouts (a flooded or stopped rank), with a pause between attempts,
    /// until the round's deadline.
    fn connect(&self, c: usize) -> Result<Option<PrefixStore<Arc<TcpStore>>>> {
        let mut last = String::from("no attempt finished");
        loop {
            if self.probe(c)? == Probe::Gone {
                return Ok(None);
            }
            let now = Instant::now();
            if now >= self.deadline {
                return Err(self.error(format!(
                    "rank {c} (standby store {}), the lowest rank not known to be gone, did not \
                     answer within the round's deadline ({} ms from its start; last attempt: \
                     {last}); no decision was taken",
                    self.inner
                        .standby_addr(c)
                        .map_or("unknown".into(), |a| a.to_string()),
                    (self.inner.config.timeout * 2).as_millis()
                )));
            }
            let slice = (now + Duration::from_secs(2)).min(self.deadline);
            match self.inner.connect_standby(c, self.me, slice) {
                Ok(s) => return Ok(Some(self.client(s))),
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(POLL);
        }
    }

    /// Follows coordinator `c`: reports what this rank saw, then waits for
    /// the decision in `c`'s store.
    fn follow(&self, c: usize) -> Result<Outcome> {
        let Some(mut kv) = self.connect(c)? else {
            return Ok(Outcome::CoordinatorGone);
        };
        let report = format!("report/{}", self.me);
        let mut reported = false;
        loop {
            let started = Instant::now();
            if !reported && kv.set(&report, &encode_set(&self.seen)).is_ok() {
                reported = true;
            }
            if reported {
                // A healthy connection waits here (the server holds the
                // request up to POLL); a dead coordinator breaks it at once.
                if let Ok(b) = kv.get("decided", POLL) {
                    return Ok(Outcome::Decided(decode_set(
                        self.me,
                        c,
                        self.inner.nranks,
                        &b,
                    )?));
                }
            }
            if Instant::now() >= self.deadline {
                return Err(self.error(format!(
                    "rank {c} (the coordinator) decided nothing within the round's deadline \
                     ({} ms; this rank's report {}; ranks found gone: {:?})",
                    (self.inner.config.timeout * 2).as_millis(),
                    if reported {
                        "was delivered"
                    } else {
                        "could not be delivered"
                    },
                    self.gone
                )));
            }
            if broken(&kv) {
                match self.connect(c)? {
                    Some(again) => kv = again,
                    None => return Ok(Outcome::CoordinatorGone),
                }
            } else if started.elapsed() < POLL / 2 {
                // An answer that was neither the decision nor a wait
                // (a refused request): do not spin.
                std::thread::sleep(POLL);
            }
        }
    }

    /// Coordinates: collects the reports of every rank not known gone, and
    /// decides — or adopts a decision some rank already returned.
    fn coordinate(&self, own: &PrefixStore<MemoryStore>) -> Result<BTreeSet<usize>> {
        let me = self.me;
        let n = self.inner.nranks;
        // Wait for reports at most one timeout from now, within the round.
        let until = (Instant::now() + self.inner.config.timeout).min(self.deadline);
        let started = Instant::now();
        let mut pending: BTreeSet<usize> = (0..n)
            .filter(|r| *r != me && !self.gone.contains(r))
            .collect();
        // Ranks some survivor saw fail before the round (this rank, or a
        // reporter): dead before anyone could coordinate.
        let mut seen_before: BTreeSet<usize> = self.seen.clone();
        let mut failed: BTreeSet<usize> = self.gone.clone();
        // Ranks counted failed without being read: gone, or silent.
        let mut unread: BTreeSet<usize> = BTreeSet::new();
        let mut peers: BTreeMap<usize, PrefixStore<Arc<TcpStore>>> = BTreeMap::new();
        let mut probed: BTreeMap<usize, Instant> = BTreeMap::new();
        'collect: while !pending.is_empty() {
            for r in pending.clone() {
                if Instant::now() >= until {
                    break 'collect;
                }
                if let Some(b) = own
                    .try_get(&format!("report/{r}"))
                    .map_err(|e| self.error(format!("reading rank {r}'s report: {e}")))?
                {
                    let theirs = decode_set(me, r, n, &b)?;
                    seen_before.extend(&theirs);
                    failed.extend(theirs);
                    pending.remove(&r);
                    continue;
                }
                if started.elapsed() < LOOK_FOR_DECISION_AFTER
                    || probed.get(&r).is_some_and(|t| t.elapsed() < POLL)
                {
                    continue;
                }
                probed.insert(r, Instant::now());
                match self.probe(r)? {
                    Probe::Gone => {
                        unread.insert(r);
                        pending.remove(&r);
                    }
                    Probe::Unknown => {}
                    Probe::Alive => {
                        // A live rank that does not report may have returned
                        // a decision of an earlier coordinator of this round.
                        if let Some(decided) = self.decision_of(r, &mut peers)? {
                            tracing::info!(
                                rank = me,
                                peer = r,
                                ?decided,
                                "agree_on_failed: adopting the decision rank {r} already returned"
                            );
                            return Ok(decided);
                        }
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        for r in &pending {
            tracing::warn!(
                rank = me,
                peer = *r,
                "agree_on_failed: rank {r} did not report in time; counted as failed"
            );
        }
        unread.extend(std::mem::take(&mut pending));
        failed.extend(&self.seen);
        // A rank below this one that died during the round (nobody saw it
        // fail before) may have coordinated and decided; a rank this one
        // could not read may have returned that decision and gone on. Then
        // excluding it could contradict an answer already given: fail the
        // round instead (every rank still waiting fails with it).
        let predecessor = self.gone.iter().any(|g| !seen_before.contains(g));
        let unexplained: Vec<usize> = unread.difference(&seen_before).copied().collect();
        if predecessor && !unexplained.is_empty() {
            return Err(self.error(format!(
                "rank(s) {:?} below this one died during the round and may have decided; rank(s) \
                 {unexplained:?} neither reported nor showed a decision, so this rank cannot \
                 decide without risking a second answer",
                self.gone.difference(&seen_before).collect::<Vec<_>>()
            )));
        }
        failed.extend(unread);
        Ok(failed)
    }

    /// Rank `r`'s decision of this round, if its standby store holds one.
    fn decision_of(
        &self,
        r: usize,
        peers: &mut BTreeMap<usize, PrefixStore<Arc<TcpStore>>>,
    ) -> Result<Option<BTreeSet<usize>>> {
        let kv = match peers.entry(r) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => {
                let short = (Instant::now() + PROBE_WAIT).min(self.deadline);
                match self.inner.connect_standby(r, self.me, short) {
                    Ok(s) => e.insert(self.client(s)),
                    Err(err) => {
                        tracing::debug!(rank = self.me, peer = r, error = %err, "agree_on_failed: cannot read rank {r}'s decision yet");
                        return Ok(None);
                    }
                }
            }
        };
        match kv.try_get("decided") {
            Ok(Some(b)) => Ok(Some(decode_set(self.me, r, self.inner.nranks, &b)?)),
            Ok(None) => Ok(None),
            Err(_) => {
                peers.remove(&r);
                Ok(None)
            }
        }
    }
}

fn broken(kv: &PrefixStore<Arc<TcpStore>>) -> bool {
    kv.inner().is_broken()
}

impl Communicator {
    /// The ranks that failed, as the survivors agree (like ULFM's
    /// `MPIX_Comm_agree` on the failed group). Every surviving rank calls
    /// it after an operation failed; each reports the peers it saw fail,
    /// the lowest live rank collects the reports in the standby store it
    /// has served since creation, adds every rank that refuses
    /// connections or stays silent past the timeout, and every survivor
    /// returns the union (sorted), ready for [`Communicator::shrink`].
    ///
    /// No two ranks that return `Ok` return different sets, however slow,
    /// flooded or failing their peers are (see the module docs of
    /// `agree`): when the lowest live rank cannot be reached within twice
    /// the communicator's timeout, the round ends with an error instead.
    /// A rank that finds itself in the result was judged failed (it
    /// answered too late, or a peer saw it fail) and gets an error.
    pub fn agree_on_failed(&self) -> Result<Vec<usize>> {
        let inner = &self.inner;
        let me = inner.rank;
        let round = inner.recovery.agrees.fetch_add(1, Ordering::SeqCst);
        let tag = derived_id(inner.comm_id, AGREE_TAG, round, &[]);
        let prefix = format!("sncl-agree/{tag:016x}");
        let own = PrefixStore::new(prefix.clone(), inner.own_standby_store("agree_on_failed")?);
        let seen = inner.recovery.failed_so_far();
        let mut round = Round {
            inner,
            me,
            prefix,
            seen,
            gone: BTreeSet::new(),
            deadline: Instant::now() + inner.config.timeout * 2,
        };
        let (decided, by) = loop {
            // This rank never counts itself gone, so a candidate is left.
            let c = (0..inner.nranks)
                .find(|r| !round.gone.contains(r))
                .unwrap_or(me);
            if c == me {
                break (round.coordinate(&own)?, me);
            }
            match round.follow(c)? {
                Outcome::Decided(d) => break (d, c),
                Outcome::CoordinatorGone => {
                    tracing::info!(
                        rank = me,
                        peer = c,
                        "agree_on_failed: rank {c} is gone (its standby store refuses connections)"
                    );
                    round.gone.insert(c);
                }
            }
        };
        // Before returning: a later coordinator of this round adopts it.
        own.set("decided", &encode_set(&decided))?;
        if decided.contains(&me) {
            return Err(round.error(format!(
                "rank {by} (the coordinator) counted this rank as failed ({decided:?}): it \
                 reported too late, or a survivor saw it fail"
            )));
        }
        tracing::info!(rank = me, failed = ?decided, "agree_on_failed: agreed");
        Ok(decided.into_iter().collect())
    }
}
