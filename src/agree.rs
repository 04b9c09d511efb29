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
//!   round's answer never changes once any rank has returned it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use comm_core::{Error, Result};
use sncl_bootstrap::{MemoryStore, PrefixStore, Store, TcpStore};

use crate::comm::Inner;
use crate::shrink::derived_id;
use crate::Communicator;

const AGREE_TAG: u64 = 0x0061_6772_6565; // "agree"
/// How long a coordinator waits for a rank's report before it also looks
/// for that rank's decision (the rank may have returned from the round).
const LOOK_FOR_DECISION_AFTER: Duration = Duration::from_millis(300);
/// How often waiting ranks check that their coordinator is still alive.
const POLL: Duration = Duration::from_millis(250);
/// How long one liveness probe waits for a TCP connection.
const PROBE_WAIT: Duration = Duration::from_secs(1);

/// What one TCP connection to a rank's standby store says about the rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Probe {
    /// Its kernel accepted: the process exists (it may be slow or stopped).
    Alive,
    /// Refused: nothing listens, the process is gone.
    Gone,
    /// No answer in time: proves nothing.
    Unknown,
}

fn probe(addr: SocketAddr) -> Probe {
    match TcpStream::connect_timeout(&addr, PROBE_WAIT) {
        Ok(_) => Probe::Alive,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Probe::Gone,
        Err(_) => Probe::Unknown,
    }
}

fn encode_set(s: &BTreeSet<usize>) -> Vec<u8> {
    s.iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
        .into_bytes()
}

fn decode_set(rank: usize, from: usize, nranks: usize, b: &[u8]) -> Result<BTreeSet<usize>> {
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

    fn probe(&self, r: usize) -> Probe {
        self.inner.standby_addr(r).map_or(Probe::Gone, probe)
    }

    /// Connects to rank `c`'s standby store within `wait`; `None` when it
    /// is gone. Retries timeouts (a flooded or stopped rank) until the
    /// round's deadline.
    fn connect(&self, c: usize) -> Result<Option<PrefixStore<Arc<TcpStore>>>> {
        loop {
            match self.probe(c) {
                Probe::Gone => return Ok(None),
                Probe::Alive | Probe::Unknown => {}
            }
            let now = Instant::now();
            if now >= self.deadline {
                return Err(self.error(format!(
                    "rank {c}, the lowest rank not known to be gone, did not answer within \
                     the round's deadline; no decision was taken"
                )));
            }
            let slice = (now + Duration::from_secs(2)).min(self.deadline);
            if let Ok(s) = self.inner.connect_standby(c, self.me, slice) {
                let s = Arc::new(s.with_io_timeout(POLL * 4));
                return Ok(Some(PrefixStore::new(self.prefix.clone(), s)));
            }
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
            if !reported && kv.set(&report, &encode_set(&self.seen)).is_ok() {
                reported = true;
            }
            if reported {
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
                    "rank {c} (the coordinator) decided nothing within the round's deadline"
                )));
            }
            if self.probe(c) == Probe::Gone {
                return Ok(Outcome::CoordinatorGone);
            }
            if broken(&kv) {
                match self.connect(c)? {
                    Some(again) => kv = again,
                    None => return Ok(Outcome::CoordinatorGone),
                }
            }
            if !reported {
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
        let mut failed: BTreeSet<usize> = self.gone.clone();
        failed.extend(&self.seen);
        let mut peers: BTreeMap<usize, PrefixStore<Arc<TcpStore>>> = BTreeMap::new();
        let mut probed: BTreeMap<usize, Instant> = BTreeMap::new();
        while !pending.is_empty() {
            for r in pending.clone() {
                if let Some(b) = own.try_get(&format!("report/{r}"))? {
                    failed.extend(decode_set(me, r, n, &b)?);
                    pending.remove(&r);
                    continue;
                }
                if started.elapsed() < LOOK_FOR_DECISION_AFTER
                    || probed.get(&r).is_some_and(|t| t.elapsed() < POLL)
                {
                    continue;
                }
                probed.insert(r, Instant::now());
                match self.probe(r) {
                    Probe::Gone => {
                        failed.insert(r);
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
            if Instant::now() >= until {
                for r in &pending {
                    tracing::warn!(
                        rank = me,
                        peer = *r,
                        "agree_on_failed: rank {r} did not report in time; counted as failed"
                    );
                }
                failed.extend(std::mem::take(&mut pending));
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
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
                let Ok(s) = self.inner.connect_standby(r, self.me, short) else {
                    return Ok(None);
                };
                e.insert(PrefixStore::new(
                    self.prefix.clone(),
                    Arc::new(s.with_io_timeout(POLL * 4)),
                ))
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
        let round = inner.agrees.fetch_add(1, Ordering::SeqCst);
        let tag = derived_id(inner.comm_id, AGREE_TAG, round, &[]);
        let prefix = format!("sncl-agree/{tag:016x}");
        let own = PrefixStore::new(prefix.clone(), inner.own_standby_store("agree_on_failed")?);
        let seen = inner
            .failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut round = Round {
            inner,
            me,
            prefix,
            seen,
            gone: BTreeSet::new(),
            deadline: Instant::now() + inner.config.timeout * 2,
        };
        let decided = loop {
            // This rank never counts itself gone, so a candidate is left.
            let c = (0..inner.nranks)
                .find(|r| !round.gone.contains(r))
                .unwrap_or(me);
            if c == me {
                let d = round.coordinate(&own)?;
                break d;
            }
            match round.follow(c)? {
                Outcome::Decided(d) => break d,
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
                "the survivors counted this rank as failed ({decided:?})"
            )));
        }
        tracing::info!(rank = me, failed = ?decided, "agree_on_failed: agreed");
        Ok(decided.into_iter().collect())
    }
}
