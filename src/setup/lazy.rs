//! Connections made at their first use (`SNCL_RUNTIME_CONNECT=1`, the
//! default; issue 36, risk 7, and issue 34's lazy connections).
//!
//! A kind that [`connects_lazily`](PreparedTransport::connects_lazily)
//! (RDMA) is not connected at init: the setup keeps its prepared state
//! here, and an operation connects the peers it needs before it runs — a
//! collective the peers its schedule talks to (a ring's two neighbours, a
//! tree's parent and children), a point-to-point operation its peer. So a
//! job of N ranks pins, registers and connects only the pairs its
//! operations use instead of N−1 per rank, as NCCL does with
//! `NCCL_RUNTIME_CONNECT=1`.
//!
//! Both ranks of a pair connect it together: every rank of a collective
//! needs the same pairs at the same operation (schedules are symmetric),
//! and a point-to-point transfer's two sides meet in their matching
//! operations. The kind's `connect` publishes for every peer of a call
//! before it waits on any, so ranks that batch their peers differently do
//! not wait on each other in a circle. A point-to-point operation to a peer
//! not connected yet waits (within the operation's timeout) until the peer
//! reaches its matching operation, where an eager connection would have let
//! a small send finish first; a receive from any source connects the peers
//! that ask for this rank (`want/<from>-<to>` in the communicator's store).
//!
//! A wait for a peer is not blind: every [`POLL`] it checks this
//! communicator's abort, whether the peer noted an abort in the store
//! ([`LazyConnect::note_abort`], which a failing rank writes for the peers
//! it never connected), and whether the peer's process is still there (its
//! standby store answers), so a peer that failed is named within about a
//! second, as a connected peer's failure is.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use comm_core::transport::registry::{PreparedTransport, RankCard, SetupContext};
use comm_core::transport::{Connection, TransportError};
use comm_core::{Config, Error, Result};
use sncl_bootstrap::{PrefixStore, Store};
use sncl_runtime::exec::{self, AbortFlag, OpContext};

use super::registry::{check_memory_kinds, TRANSPORTS};
use crate::recovery::{probe, Probe};

/// How often a wait for a peer checks on it.
const POLL: Duration = Duration::from_millis(200);
/// How often a wait probes a peer's process.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// A kind connected at first use: its index in [`TRANSPORTS`], its
/// prepared state, its store namespace.
pub(crate) struct LazyKind {
    pub index: usize,
    pub prepared: Box<dyn PreparedTransport>,
    pub store: PrefixStore<Arc<dyn Store>>,
}

/// What a communicator keeps to connect peers at their first use.
pub(crate) struct LazyConnect {
    pub rank: usize,
    pub nranks: usize,
    pub comm_id: u64,
    pub secret: [u8; 16],
    pub node: String,
    pub ip: IpAddr,
    pub cards: Vec<RankCard>,
    pub kinds: Vec<LazyKind>,
    /// Per rank: the index in `kinds` of its kind, while not connected.
    pub pending: Vec<Option<usize>>,
    /// How many of `pending` are set (asked before every operation).
    pub pending_count: usize,
    /// The communicator's store namespace (abort notes, wants).
    pub comm_store: PrefixStore<Arc<dyn Store>>,
    /// Where every rank's standby store listens (liveness probes).
    pub standby: Vec<Option<SocketAddr>>,
}

impl LazyConnect {
    /// Peers not connected yet.
    pub(crate) fn pending(&self) -> usize {
        self.pending_count
    }

    /// Whether `peer` is waiting for its first use.
    pub(crate) fn is_pending(&self, peer: usize) -> bool {
        self.pending.get(peer).is_some_and(Option::is_some)
    }

    /// Connects those of `peers` not connected yet (for operation `ctx`).
    pub(crate) fn connect(
        &mut self,
        config: &Config,
        conns: &mut [Option<Box<dyn Connection>>],
        peers: impl IntoIterator<Item = usize>,
        ctx: &OpContext,
        abort: &AbortFlag,
    ) -> Result<()> {
        let mut want: Vec<usize> = peers.into_iter().filter(|&p| self.is_pending(p)).collect();
        if want.is_empty() {
            return Ok(());
        }
        want.sort_unstable();
        want.dedup();
        for &p in &want {
            self.comm_store
                .set(&format!("want/{}-{p}", self.rank), b"")?;
        }
        let started = Instant::now();
        for k in 0..self.kinds.len() {
            let batch: Vec<usize> = want
                .iter()
                .copied()
                .filter(|&p| self.pending[p] == Some(k))
                .collect();
            if !batch.is_empty() {
                self.connect_kind(config, conns, k, &batch, ctx, abort)?;
            }
        }
        tracing::debug!(
            rank = self.rank,
            peers = ?want,
            ms = started.elapsed().as_millis() as u64,
            left = self.pending(),
            "connected at first use"
        );
        Ok(())
    }

    /// Connects the pending peers that asked for this rank (a receive from
    /// any source, which cannot know its sender in advance).
    pub(crate) fn connect_askers(
        &mut self,
        config: &Config,
        conns: &mut [Option<Box<dyn Connection>>],
        ctx: &OpContext,
        abort: &AbortFlag,
    ) -> Result<()> {
        let me = self.rank;
        let mut askers = Vec::new();
        for p in (0..self.nranks).filter(|&p| self.is_pending(p)) {
            if self
                .comm_store
                .try_get(&format!("want/{p}-{me}"))?
                .is_some()
            {
                askers.push(p);
            }
        }
        self.connect(config, conns, askers, ctx, abort)
    }

    fn connect_kind(
        &mut self,
        config: &Config,
        conns: &mut [Option<Box<dyn Connection>>],
        k: usize,
        batch: &[usize],
        ctx: &OpContext,
        abort: &AbortFlag,
    ) -> Result<()> {
        let failure = Mutex::new(None);
        let kind = &mut self.kinds[k];
        let watched = WatchedStore {
            inner: &kind.store,
            comm_store: &self.comm_store,
            peers: batch,
            standby: &self.standby,
            abort,
            failure: &failure,
            last_probe: Mutex::new(Instant::now()),
        };
        let setup = SetupContext {
            rank: self.rank,
            nranks: self.nranks,
            comm_id: self.comm_id,
            secret: self.secret,
            config,
            node: &self.node,
            ip: self.ip,
            deadline: Instant::now() + ctx.timeout,
            now: Instant::now,
            store: &watched,
        };
        let made = kind.prepared.connect(&setup, &self.cards, batch);
        if let Some(source) = failure.into_inner().unwrap_or_else(|e| e.into_inner()) {
            return Err(match source {
                Watch::Aborted => Error::Aborted {
                    rank: self.rank,
                    reason: Some("aborted while connecting to peers at first use".into()),
                },
                Watch::Peer(source) => exec::peer_failed(ctx, source),
            });
        }
        let name = TRANSPORTS[kind.index].name();
        for mut c in made? {
            let p = c.peer();
            if !batch.contains(&p) || conns[p].is_some() {
                return Err(Error::Bootstrap {
                    rank: self.rank,
                    detail: format!(
                        "transport {name} returned an unexpected connection to peer rank {p}"
                    ),
                });
            }
            check_memory_kinds(self.rank, TRANSPORTS[kind.index], &mut *c)?;
            conns[p] = Some(c);
            if self.pending[p].take().is_some() {
                self.pending_count -= 1;
            }
        }
        match batch.iter().find(|&&p| conns[p].is_none()) {
            Some(p) => Err(Error::Bootstrap {
                rank: self.rank,
                detail: format!("transport {name} returned no connection to peer rank {p}"),
            }),
            None => Ok(()),
        }
    }

    /// A failing rank notes, for the peers it never connected, that it
    /// aborted and what it blames (as an abort notice on a connection
    /// would tell them): a peer waiting to connect to it stops at once.
    pub(crate) fn note_abort(&self, cause: Option<usize>) {
        if self.pending() == 0 {
            return;
        }
        let v = cause.map_or_else(|| "-".to_string(), |c| c.to_string());
        if let Err(e) = self
            .comm_store
            .set(&format!("aborted/{}", self.rank), v.as_bytes())
        {
            tracing::debug!(
                rank = self.rank,
                "noting the abort for unconnected peers: {e}"
            );
        }
    }
}

/// Why a wait for a peer stopped early.
enum Watch {
    /// This communicator was aborted.
    Aborted,
    /// The peer failed.
    Peer(TransportError),
}

/// The kind's store namespace, whose waits give up (with the reason in
/// `failure`) where this communicator aborts or a peer of the batch fails.
struct WatchedStore<'a> {
    inner: &'a PrefixStore<Arc<dyn Store>>,
    comm_store: &'a PrefixStore<Arc<dyn Store>>,
    peers: &'a [usize],
    standby: &'a [Option<SocketAddr>],
    abort: &'a AbortFlag,
    failure: &'a Mutex<Option<Watch>>,
    last_probe: Mutex<Instant>,
}

impl WatchedStore<'_> {
    fn fail(&self, why: Watch) {
        *self.failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
    }

    /// Whether to stop waiting: records why.
    fn check(&self) -> bool {
        if self.abort.load(Ordering::SeqCst) {
            self.fail(Watch::Aborted);
            return true;
        }
        for &p in self.peers {
            if let Ok(Some(v)) = self.comm_store.try_get(&format!("aborted/{p}")) {
                let cause = String::from_utf8_lossy(&v).parse::<usize>().ok();
                self.fail(Watch::Peer(TransportError::PeerAborted { peer: p, cause }));
                return true;
            }
        }
        let mut last = self.last_probe.lock().unwrap_or_else(|e| e.into_inner());
        if last.elapsed() >= PROBE_EVERY {
            *last = Instant::now();
            for &p in self.peers {
                if let Some(addr) = self.standby.get(p).copied().flatten() {
                    if probe(addr) == Probe::Gone {
                        self.fail(Watch::Peer(TransportError::PeerGone {
                            peer: p,
                            detail: format!(
                                "its process no longer answers at {addr} (found while connecting \
                                 to it at first use)"
                            ),
                        }));
                        return true;
                    }
                }
            }
        }
        false
    }

    /// Runs `attempt` with slices of `timeout`, checking between them.
    fn sliced<T>(&self, timeout: Duration, attempt: impl Fn(Duration) -> Result<T>) -> Result<T> {
        in_slices(timeout, POLL, attempt, |e| self.check().then_some(e))
    }
}

/// Runs a store wait `attempt` in slices of at most `poll` until `timeout`:
/// after a slice that ran out, `stop` sees its error and may end the wait
/// with an error of its own (`Some`) or let it go on (`None`). An attempt
/// that fails before its slice ran out (not a timeout) ends it at once.
pub(crate) fn in_slices<T>(
    timeout: Duration,
    poll: Duration,
    attempt: impl Fn(Duration) -> Result<T>,
    stop: impl Fn(Error) -> Option<Error>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let slice = left.min(poll).max(Duration::from_millis(1));
        let t0 = Instant::now();
        match attempt(slice) {
            Ok(v) => return Ok(v),
            Err(e) if t0.elapsed() < slice || left <= slice => return Err(e),
            Err(e) => {
                if let Some(e) = stop(e) {
                    return Err(e);
                }
            }
        }
    }
}

impl Store for WatchedStore<'_> {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.set(key, value)
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.sliced(timeout, |t| self.inner.get(key, t))
    }

    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.inner.try_get(key)
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        self.sliced(timeout, |t| self.inner.wait(keys, t))
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.inner.add(key, delta)
    }
}
