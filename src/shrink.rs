//! Recovery after a rank failed: [`Communicator::shrink`] (NCCL's
//! `ncclCommShrink`) builds a communicator of the survivors, and
//! [`Communicator::agree_on_failed`] lets the survivors agree on who failed.
//!
//! Neither uses the parent's connections (a failure aborted them) nor the
//! parent's store (it may have died with rank 0). Instead every rank serves
//! a *standby store* (a [`TcpStoreServer`]) from the parent's creation on
//! and published its address with its connection info, so every rank knows
//! every rank's standby address. After the loss the survivors rendezvous
//! in the lowest survivor's standby store: a deterministic choice, with
//! nothing to exchange; a dead rank's listener refuses connections.
//! (The agreement itself is in `crate::agree`.)

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use comm_core::{Error, Result};
use sncl_bootstrap::tls::TlsIdentity;
use sncl_bootstrap::{MemoryStore, TcpStore, TcpStoreServer};

use crate::comm::Inner;
use crate::recovery::Standby;
use crate::{setup, Communicator};

/// FNV-1a over the parent id, a domain tag, a sequence number and a list.
pub(crate) fn derived_id(parent: u64, tag: u64, seq: u64, list: &[usize]) -> u64 {
    let words = [parent, tag, seq, list.len() as u64];
    comm_core::hash::fnv1a(
        words
            .into_iter()
            .chain(list.iter().map(|&r| r as u64))
            .flat_map(u64::to_le_bytes),
    )
}

const SHRINK_TAG: u64 = 0x7368_7269_6e6b; // "shrink"

impl Inner {
    /// This rank's own standby store, read and written in memory; an
    /// error when a shrunk communicator took it over.
    pub(crate) fn own_standby_store(&self, op: &'static str) -> Result<MemoryStore> {
        let sb = self
            .recovery
            .standby
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match &*sb {
            Standby::Serving(s) => Ok(s.local_store()),
            Standby::Gone => Err(Error::InvalidArgument {
                rank: self.rank,
                op,
                detail: "this rank's standby store was already handed to a communicator shrunk \
                         from this one; shrink that communicator instead"
                    .into(),
            }),
        }
    }

    /// Where rank `host`'s standby store listens.
    pub(crate) fn standby_addr(&self, host: usize) -> Result<SocketAddr> {
        self.recovery
            .standby_addrs
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
    pub(crate) fn take_standby_server(&self) -> Option<TcpStoreServer> {
        let mut sb = self
            .recovery
            .standby
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match std::mem::replace(&mut *sb, Standby::Gone) {
            Standby::Serving(s) => Some(s),
            other => {
                *sb = other;
                None
            }
        }
    }

    /// Connects to rank `host`'s standby store.
    pub(crate) fn connect_standby(
        &self,
        host: usize,
        rank_label: usize,
        deadline: Instant,
    ) -> Result<TcpStore> {
        let addr = self.standby_addr(host)?;
        let tls = TlsIdentity::from_settings(&self.config.tcp.tls)?;
        Ok(
            TcpStore::connect_tls(addr, self.secret, rank_label, deadline, tls.as_ref())?
                .with_io_timeout(self.config.timeout),
        )
    }
}

impl Communicator {
    /// Where this rank's standby store listens (see
    /// [`Communicator::agree_on_failed`] and [`Communicator::shrink`]): a
    /// TCP port the rank serves from creation on, on the address it
    /// publishes for its peers (firewalls must let the job's ranks reach
    /// it). A parent that handed its store to a shrunk communicator still
    /// reports the address (the shrunk communicator serves it); `None`
    /// only for a communicator built without a rendezvous.
    pub fn standby_store_addr(&self) -> Option<SocketAddr> {
        self.inner
            .recovery
            .standby_addrs
            .get(self.inner.rank)
            .copied()
            .flatten()
    }

    /// A communicator of this one's ranks without `exclude` (like
    /// `ncclCommShrink`): the survivors keep their order and are numbered
    /// from 0. Every surviving rank calls it with the same list; an
    /// excluded rank must not (it gets an error). Works on an aborted or
    /// failed communicator, including when rank 0 (the parent's store host)
    /// is excluded: the new communicator's store is the standby store the
    /// lowest surviving rank serves from creation (see the module docs). The
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
        let seq = inner.recovery.shrinks.fetch_add(1, Ordering::SeqCst);
        let excluded: Vec<usize> = excluded.into_iter().collect();
        let comm_id = derived_id(inner.comm_id, SHRINK_TAG, seq, &excluded);
        let deadline = Instant::now() + inner.config.timeout;
        if me == host {
            inner.own_standby_store("shrink")?;
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
        let mut child = setup::build(setup::SetupArgs {
            store: Arc::new(store),
            rank: new_rank,
            nranks: survivors.len(),
            comm_id,
            secret: inner.secret,
            wait: config.timeout,
            config,
            local_ip,
            server: None,
        })?;
        // The host's standby store serves the shrunk communicator from now
        // on; handed over only once the creation succeeded, so a failed
        // shrink leaves the parent's recovery (agree_on_failed, a grow id)
        // as it was.
        if me == host {
            child._server = inner.take_standby_server();
        }
        Ok(Communicator::from_inner(child))
    }
}
