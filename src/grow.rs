//! Growing a communicator (NCCL 2.29's `ncclCommGrow`): a larger
//! communicator of a running one's members and new ranks. With
//! [`Communicator::shrink`] it gives elastic training: lose a rank, shrink,
//! start a replacement, grow back.
//!
//! Rank 0 (the coordinator) hands out a *grow id*
//! ([`Communicator::grow_unique_id`], `ncclCommGetUniqueId`): the address
//! of its standby store (served from the communicator's creation on, see
//! `crate::shrink`) and the communicator's secret. The job's launcher
//! passes it to the new ranks out of band, as it passed the first unique
//! id. The members call [`Communicator::grow`] (they know rank 0's standby
//! address and the secret already, so they need no id), the new ranks
//! [`Communicator::join_grow`]; everyone then runs a communicator's
//! creation in that store, with the id's communicator id. Members keep
//! their ranks, new ranks are numbered from the parent's size up, every
//! connection is made anew (lazily where `SNCL_RUNTIME_CONNECT` says so)
//! and the planner plans for the new size.
//!
//! Rank 0 publishes the grow's sizes in the store before it joins the
//! creation; a new rank checks them (its rank is a new one, its size is
//! the members'), and claims its rank with an atomic counter, so that two
//! processes given the same rank fail at once instead of corrupting the
//! rendezvous. The grow ends with a barrier of the new communicator: a
//! rank that returns it knows that every rank built it.
//!
//! A grow can fail (a joiner that died after claiming its rank, a member
//! that gave up) and be tried again: every member counts the grows it
//! called (every member calls each, as a collective), and try `k` keeps
//! its records and claims under its own keys and, from the second try
//! on, builds under its own communicator id ([`try_comm_id`]), so it
//! never meets an earlier try's. Rank 0 publishes the try a new rank
//! joins ([`CURRENT_TRY`]) when it hands out the grow id and when its grow
//! starts; take the id for a retry from [`Communicator::grow_unique_id`]
//! after the failure.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use comm_core::{Config, Error, Result};
use sncl_bootstrap::tls::TlsIdentity;
use sncl_bootstrap::{Store, TcpStore, UniqueId};

use crate::{setup, Communicator};

/// The store keys of try `attempt` of a grow, under the grow id's prefix.
fn grow_key(comm_id: u64, attempt: u64, what: &str) -> String {
    format!("sncl/{comm_id:016x}/grow/{attempt}/{what}")
}

/// The key under which rank 0 publishes the try new ranks join.
const CURRENT_TRY: &str = "current";

/// The key of [`CURRENT_TRY`] for the grow id's `comm_id`.
fn current_try_key(comm_id: u64) -> String {
    format!("sncl/{comm_id:016x}/grow/{CURRENT_TRY}")
}

const GROW_TAG: u64 = 0x6772_6f77; // "grow"

/// The communicator id try `attempt` of a grow builds under: the grow id's
/// for the first, a derived one for each later try (so a retry's
/// rendezvous never reads the records of a try that failed).
fn try_comm_id(comm_id: u64, attempt: u64) -> u64 {
    match attempt {
        0 | 1 => comm_id,
        k => crate::shrink::derived_id(comm_id, GROW_TAG, k, &[]),
    }
}

/// Reads a decimal number rank 0 published for the grow (waiting as a
/// creation does: the members and the new processes start apart).
fn published(store: &dyn Store, key: &str, rank: usize, config: &Config) -> Result<usize> {
    let bytes = store
        .get(key, config.creation_timeout())
        .map_err(|e| setup::creation_error(e, config.creation_timeout()))?;
    std::str::from_utf8(&bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| Error::Bootstrap {
            rank,
            detail: format!("the grow's store holds {bytes:?} under {key}, not a number"),
        })
}

impl Communicator {
    /// The id new ranks join this communicator's grow with (NCCL's
    /// `ncclCommGetUniqueId`): rank 0's standby store and the
    /// communicator's secret, so keep it as private as the first unique
    /// id. Rank 0 only; pass it to the new ranks (for instance as
    /// [`UniqueId::to_hex`]), which call [`Communicator::join_grow`] while
    /// the members call [`Communicator::grow`]. One grow per communicator:
    /// grow the result for the next.
    pub fn grow_unique_id(&self) -> Result<UniqueId> {
        let inner = &self.inner;
        if inner.rank != 0 {
            return Err(Error::InvalidArgument {
                rank: inner.rank,
                op: "grow_unique_id",
                detail: "rank 0 coordinates a grow and hands out its id; the other members \
                         call grow without one"
                    .into(),
            });
        }
        let store = inner.own_standby_store("grow_unique_id")?;
        let id = UniqueId {
            root: inner.standby_addr(0)?,
            secret: inner.secret,
        };
        // New ranks given this id join the next grow this rank calls.
        let next = inner.recovery.grows.load(Ordering::Acquire) + 1;
        store.set(&current_try_key(id.comm_id()), next.to_string().as_bytes())?;
        Ok(id)
    }

    /// A communicator of this one's ranks and `nranks - size()` new ones
    /// (NCCL's `ncclCommGrow` with `rank = -1`): every member calls it with
    /// the same `nranks` and keeps its rank; the new ranks call
    /// [`Communicator::join_grow`] with rank 0's
    /// [`Communicator::grow_unique_id`]. Returns when every rank built the
    /// new communicator; a rank missing past the timeout is an error on
    /// every rank that waited for it. The members must have no operation
    /// pending on this communicator. This communicator stays usable, but
    /// once the grow succeeded its rank 0 has handed its standby store to
    /// the new one, so it can grow or shrink no more: grow or shrink the
    /// result instead. A failed grow leaves it as it was, and can be
    /// called again (every member, with a grow id taken after the failure
    /// for the new ranks): each try has its own records.
    pub fn grow(&self, nranks: usize) -> Result<Communicator> {
        let inner = &self.inner;
        let (me, n) = (inner.rank, inner.nranks);
        if nranks <= n {
            return Err(Error::InvalidArgument {
                rank: me,
                op: "grow",
                detail: format!(
                    "a grow of {n} ranks to {nranks} adds none; the new size must exceed the old"
                ),
            });
        }
        setup::check_world(me, nranks, "grow")?;
        // Counted once its arguments pass (a call refused here is this
        // rank's mistake, not a try): every member calls every grow, so the
        // count names the same try on every member.
        let attempt = inner.recovery.grows.fetch_add(1, Ordering::AcqRel) + 1;
        if me == 0 {
            inner.own_standby_store("grow")?;
        }
        let id = UniqueId {
            root: inner.standby_addr(0)?,
            secret: inner.secret,
        };
        let comm_id = id.comm_id();
        // A grow waits for processes that are started for it, with a
        // launcher's skew: as long as a creation does.
        let wait = inner.config.creation_timeout();
        let deadline = Instant::now() + wait;
        let store = inner
            .connect_standby(0, me, deadline)
            .map_err(|e| Error::Bootstrap {
                rank: me,
                detail: format!(
                    "grow to {nranks} ranks: cannot reach the grow's store that rank 0 serves: {e}"
                ),
            })?;
        if me == 0 {
            store.set(
                &grow_key(comm_id, attempt, "parent_size"),
                n.to_string().as_bytes(),
            )?;
            store.set(
                &grow_key(comm_id, attempt, "size"),
                nranks.to_string().as_bytes(),
            )?;
            store.set(&current_try_key(comm_id), attempt.to_string().as_bytes())?;
        } else {
            // Every member grows to rank 0's size: another one is a clear
            // error now, not a wait for ranks that never come.
            let size = published(
                &store,
                &grow_key(comm_id, attempt, "size"),
                me,
                &inner.config,
            )?;
            if size != nranks {
                return Err(Error::InvalidArgument {
                    rank: me,
                    op: "grow",
                    detail: format!(
                        "this member grows to {nranks} ranks, rank 0 to {size}; every member \
                         passes the same size"
                    ),
                });
            }
        }
        let mut config = inner.config.clone();
        config.node_id = Some(inner.node_ids[me].clone());
        tracing::info!(
            rank = me,
            from = n,
            to = nranks,
            attempt,
            "growing the communicator"
        );
        let local_ip = store.local_ip();
        let mut child = setup::build(setup::SetupArgs {
            store: Arc::new(store),
            rank: me,
            nranks,
            comm_id: try_comm_id(comm_id, attempt),
            secret: inner.secret,
            wait,
            config,
            local_ip,
            server: None,
        })
        .map_err(|e| setup::creation_error(e, wait))?;
        let grown = Communicator::from_inner({
            // Rank 0's standby store serves the grown communicator from now
            // on; it is handed over only once the creation succeeded, so a
            // failed grow leaves the parent's recovery (agree_on_failed,
            // shrink) as it was.
            if me == 0 {
                child._server = inner.take_standby_server();
            }
            child
        });
        grown.built_by_all("grow")
    }

    /// Joins a grow as new rank `rank` of `nranks` (NCCL's `ncclCommGrow`
    /// with no parent): `id` is the grow id the members' rank 0 handed out
    /// ([`Communicator::grow_unique_id`]), `rank` one of the new ranks
    /// (from the members' size up) and `nranks` the size the members grow
    /// to. Settings as for [`Communicator::init_rank_with_config`]; the
    /// settings every rank must share are rank 0's, as at any creation.
    /// A rank that is not a new one, a size that is not the members', or
    /// a rank another process already joined as is an error naming both
    /// sides, before this rank takes part.
    pub fn join_grow(
        id: &UniqueId,
        rank: usize,
        nranks: usize,
        config: Config,
    ) -> Result<Communicator> {
        crate::init_logging();
        setup::check_world(rank, nranks, "join_grow")?;
        let tls = TlsIdentity::from_settings(&config.tcp.tls)?;
        let wait = config.creation_timeout();
        let deadline = Instant::now() + wait;
        let store = TcpStore::connect_tls(id.root, id.secret, rank, deadline, tls.as_ref())
            .map_err(|e| Error::Bootstrap {
                rank,
                detail: format!(
                    "join_grow: cannot reach the grow's store at {} (rank 0's standby store; \
                     is the grow id current and this job's?): {e}",
                    id.root
                ),
            })?
            .with_io_timeout(config.timeout);
        let comm_id = id.comm_id();
        let attempt = published(&store, &current_try_key(comm_id), rank, &config)? as u64;
        let parent = published(
            &store,
            &grow_key(comm_id, attempt, "parent_size"),
            rank,
            &config,
        )?;
        let size = published(&store, &grow_key(comm_id, attempt, "size"), rank, &config)?;
        let bad = |detail: String| Error::InvalidArgument {
            rank,
            op: "join_grow",
            detail,
        };
        if nranks != size {
            return Err(bad(format!(
                "this rank joins a grow to {nranks} ranks, the members grow to {size}"
            )));
        }
        if rank < parent {
            return Err(bad(format!(
                "rank {rank} is a member's: the {parent} members keep ranks 0..{parent}, new \
                 ranks are {parent}..{size}"
            )));
        }
        if store.add(&grow_key(comm_id, attempt, &format!("claim/{rank}")), 1)? != 1 {
            return Err(bad(format!(
                "another process already joined this grow as rank {rank} (each new rank must \
                 be given to one process)"
            )));
        }
        tracing::info!(rank, nranks, attempt, "joining a grow");
        let local_ip = store.local_ip();
        let inner = setup::build(setup::SetupArgs {
            store: Arc::new(store),
            rank,
            nranks,
            comm_id: try_comm_id(comm_id, attempt),
            secret: id.secret,
            wait,
            config,
            local_ip,
            server: None,
        })
        .map_err(|e| setup::creation_error(e, wait))?;
        Communicator::from_inner(inner).built_by_all("join_grow")
    }

    /// Ends a grow: a barrier of the new communicator, so that a rank that
    /// returns it knows that every rank built it.
    fn built_by_all(self, op: &'static str) -> Result<Communicator> {
        self.barrier().map_err(|e| Error::Bootstrap {
            rank: self.rank(),
            detail: format!("{op}: the new communicator's first barrier failed: {e}"),
        })?;
        Ok(self)
    }
}
