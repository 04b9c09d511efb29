//! Recovery after a rank failed: [`Communicator::shrink`] (NCCL's
//! `ncclCommShrink`) builds a communicator of the survivors, and
//! [`Communicator::agree_on_failed`] lets the survivors agree on who failed.
//!
//! Neither uses the parent's connections (a failure aborted them) nor the
//! parent's store (it may have died with rank 0). Instead every rank opened
//! a *standby listener* when the parent was created and published its
//! address with its connection info, so every rank knows every rank's
//! standby address. After the loss the lowest surviving rank turns its
//! standby listener into a new store (a [`TcpStoreServer`]) and the
//! survivors connect to it: a deterministic choice, with nothing to
//! exchange. Connections that arrive before that rank gets there wait in
//! the listener's backlog; a dead rank's listener refuses them.

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use comm_core::{Error, Result};
use sncl_bootstrap::{PrefixStore, Store, TcpStore, TcpStoreServer};

use crate::comm::{Inner, Standby};
use crate::{setup, Communicator};

/// FNV-1a over the parent id, a domain tag, a sequence number and a list.
fn derived_id(parent: u64, tag: u64, seq: u64, list: &[usize]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let words = [parent, tag, seq, list.len() as u64];
    let bytes = words
        .iter()
        .chain(list.iter().map(|&r| r as u64).collect::<Vec<_>>().iter())
        .flat_map(|v| v.to_le_bytes())
        .collect::<Vec<_>>();
    for b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

const SHRINK_TAG: u64 = 0x7368_7269_6e6b; // "shrink"
const AGREE_TAG: u64 = 0x0061_6772_6565; // "agree"

impl Inner {
    /// Makes this rank's standby listener serve a store (once) and keeps it
    /// serving in the parent.
    fn serve_standby(&self, op: &'static str) -> Result<()> {
        let mut sb = self.standby.lock().unwrap_or_else(|e| e.into_inner());
        match std::mem::replace(&mut *sb, Standby::Gone) {
            Standby::Listening(l) => {
                let server =
                    TcpStoreServer::from_listener(l, self.secret).map_err(|e| Error::Io {
                        rank: self.rank,
                        context: format!(
                            "{op}: serving the survivors' store on the standby listener"
                        ),
                        source: e,
                    })?;
                tracing::info!(rank = self.rank, addr = %server.local_addr(), "{op}: serving the survivors' store");
                *sb = Standby::Serving(server);
                Ok(())
            }
            s @ Standby::Serving(_) => {
                *sb = s;
                Ok(())
            }
            Standby::Gone => Err(Error::InvalidArgument {
                rank: self.rank,
                op,
                detail: "this rank's standby store was already handed to a communicator shrunk \
                         from this one; shrink that communicator instead"
                    .into(),
            }),
        }
    }

    /// Where rank `host`'s standby listener listens.
    fn standby_addr(&self, host: usize) -> Result<SocketAddr> {
        self.standby_addrs
            .get(host)
            .copied()
            .flatten()
            .ok_or_else(|| Error::Bootstrap {
                rank: self.rank,
                detail: format!(
                    "rank {host} published no standby store address when this communicator \
                     was created, so it cannot serve the survivors' store"
                ),
            })
    }

    /// Takes the serving store out of the parent (for the new communicator
    /// to keep).
    fn take_standby_server(&self) -> Option<TcpStoreServer> {
        let mut sb = self.standby.lock().unwrap_or_else(|e| e.into_inner());
        match std::mem::replace(&mut *sb, Standby::Gone) {
            Standby::Serving(s) => Some(s),
            other => {
                *sb = other;
                None
            }
        }
    }

    /// Connects to rank `host`'s standby store.
    fn connect_standby(
        &self,
        host: usize,
        rank_label: usize,
        deadline: Instant,
    ) -> Result<TcpStore> {
        let addr = self.standby_addr(host)?;
        Ok(TcpStore::connect(addr, self.secret, rank_label, deadline)?
            .with_io_timeout(self.config.timeout))
    }
}

/// Whether something listens at `addr`: a dead process's listener refuses
/// at once; an unreachable host times out after `wait`.
fn listening(addr: SocketAddr, wait: Duration) -> bool {
    TcpStream::connect_timeout(&addr, wait).is_ok()
}

fn encode_set(s: &BTreeSet<usize>) -> Vec<u8> {
    s.iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
        .into_bytes()
}

fn decode_set(rank: usize, from: usize, b: &[u8]) -> Result<BTreeSet<usize>> {
    let s = String::from_utf8_lossy(b);
    s.split(',')
        .filter(|x| !x.is_empty())
        .map(|x| {
            x.parse().map_err(|_| Error::Bootstrap {
                rank,
                detail: format!(
                    "agree_on_failed: rank {from} sent a malformed failed-rank list {s:?}"
                ),
            })
        })
        .collect()
}

impl Communicator {
    /// A communicator of this one's ranks without `exclude` (like
    /// `ncclCommShrink`): the survivors keep their order and are numbered
    /// from 0. Every surviving rank calls it with the same list; an
    /// excluded rank must not (it gets an error). Works on an aborted or
    /// failed communicator, including when rank 0 (the parent's store host)
    /// is excluded: the lowest surviving rank serves the new store on the
    /// standby listener it opened at creation (see the module docs). The
    /// survivors must not have operations pending on this communicator
    /// (call [`Communicator::abort`] first, as `SNCL_SHRINK_ABORT` does).
    ///
    /// A rank can shrink a given communicator once; shrink the result for a
    /// later loss.
    pub fn shrink(&self, exclude: &[usize]) -> Result<Communicator> {
        let inner = &self.inner;
        let (me, n) = (inner.rank, inner.nranks);
        let invalid = |detail: String| Error::InvalidArgument {
            rank: me,
            op: "shrink",
            detail,
        };
        let excluded: BTreeSet<usize> = exclude.iter().copied().collect();
        if let Some(&bad) = excluded.iter().find(|&&r| r >= n) {
            return Err(invalid(format!(
                "excluded rank {bad} is out of range for {n} ranks"
            )));
        }
        if excluded.contains(&me) {
            return Err(invalid(format!(
                "rank {me} is in the exclude list {exclude:?}; only survivors call shrink"
            )));
        }
        let survivors: Vec<usize> = (0..n).filter(|r| !excluded.contains(r)).collect();
        let new_rank = survivors.iter().position(|&r| r == me).expect("a survivor");
        let host = survivors[0];
        let seq = inner.shrinks.fetch_add(1, Ordering::SeqCst);
        let excluded: Vec<usize> = excluded.into_iter().collect();
        let comm_id = derived_id(inner.comm_id, SHRINK_TAG, seq, &excluded);
        let deadline = Instant::now() + inner.config.timeout;
        if me == host {
            inner.serve_standby("shrink")?;
        }
        let store = inner
            .connect_standby(host, new_rank, deadline)
            .map_err(|e| Error::Bootstrap {
                rank: me,
                detail: format!(
                    "shrink (excluding {excluded:?}): cannot reach the survivors' store that \
                     rank {host} (the lowest survivor) serves: {e}"
                ),
            })?;
        let server = if me == host {
            inner.take_standby_server()
        } else {
            None
        };
        let mut config = inner.config.clone();
        config.node_id = Some(inner.node_ids[me].clone());
        tracing::info!(
            rank = me,
            new_rank,
            nranks = survivors.len(),
            ?excluded,
            store_host = host,
            "shrinking the communicator"
        );
        let local_ip = store.local_ip();
        let child = setup::build(setup::SetupArgs {
            store: Arc::new(store),
            rank: new_rank,
            nranks: survivors.len(),
            comm_id,
            secret: inner.secret,
            config,
            local_ip,
            server,
        })?;
        Ok(Communicator::from_inner(child))
    }

    /// The ranks that failed, as the survivors agree: each survivor reports
    /// the peers it saw fail (a peer named by a failed operation), the
    /// lowest rank none of them knows to be dead collects the reports
    /// (through a store on its standby listener), adds any rank that did
    /// not report within the timeout, and hands every survivor the union.
    /// Every surviving rank calls it; the result (sorted) can be passed to
    /// [`Communicator::shrink`]. A rank that finds itself in the result was
    /// judged failed (it answered too late) and gets an error.
    pub fn agree_on_failed(&self) -> Result<Vec<usize>> {
        let inner = &self.inner;
        let me = inner.rank;
        let round = inner.agrees.fetch_add(1, Ordering::SeqCst);
        let tag = derived_id(inner.comm_id, AGREE_TAG, round, &[]);
        let mut known: BTreeSet<usize> = inner
            .failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let deadline = Instant::now() + inner.config.timeout;
        // The coordinator: the lowest rank not known to be dead and still
        // listening.
        let (coord, store) = loop {
            // This rank never counts itself, so some rank is left.
            let c = (0..inner.nranks).find(|r| !known.contains(r)).unwrap_or(me);
            if c == me {
                inner.serve_standby("agree_on_failed")?;
            } else if !inner
                .standby_addr(c)
                .is_ok_and(|a| listening(a, Duration::from_secs(1)))
            {
                tracing::info!(
                    rank = me,
                    peer = c,
                    "agree_on_failed: rank {c} does not answer"
                );
                known.insert(c);
                continue;
            }
            match inner.connect_standby(c, me, deadline) {
                Ok(s) => break (c, s),
                Err(e) if c != me => {
                    tracing::info!(rank = me, peer = c, error = %e, "agree_on_failed: rank {c} unreachable");
                    known.insert(c);
                }
                Err(e) => return Err(e),
            }
        };
        let kv = PrefixStore::new(format!("sncl-agree/{tag:016x}"), Arc::new(store));
        kv.set(&format!("report/{me}"), &encode_set(&known))?;
        let result = if coord == me {
            let mut all = known.clone();
            for r in (0..inner.nranks).filter(|r| !known.contains(r) && *r != me) {
                let left = deadline.saturating_duration_since(Instant::now());
                match kv.get(&format!("report/{r}"), left) {
                    Ok(b) => all.extend(decode_set(me, r, &b)?),
                    Err(e) => {
                        tracing::warn!(rank = me, peer = r, error = %e, "agree_on_failed: rank {r} did not report; counted as failed");
                        all.insert(r);
                    }
                }
            }
            kv.set("result", &encode_set(&all))?;
            all
        } else {
            let b = kv
                .get("result", inner.config.timeout * 2)
                .map_err(|e| Error::Bootstrap {
                    rank: me,
                    detail: format!(
                        "agree_on_failed: rank {coord} (the coordinator) sent no result: {e}"
                    ),
                })?;
            decode_set(me, coord, &b)?
        };
        if result.contains(&me) {
            return Err(Error::Bootstrap {
                rank: me,
                detail: format!(
                    "agree_on_failed: the survivors counted this rank as failed ({result:?})"
                ),
            });
        }
        Ok(result.into_iter().collect())
    }
}
