//! A communicator's recovery attachment ([`Recovery`]): what
//! [`Communicator::shrink`](crate::Communicator::shrink) and
//! [`Communicator::agree_on_failed`](crate::Communicator::agree_on_failed)
//! keep beside the hot core (`crate::comm::Inner`): the peers seen to fail
//! and the standby stores (see `crate::shrink`).

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::Duration;

use sncl_bootstrap::TcpStoreServer;

/// A store every rank serves from creation and publishes with its
/// connection info, so that after a failure (the parent's store may have
/// died with rank 0) the survivors agree and rendezvous at addresses every
/// rank already knows: nothing is exchanged after the loss. Serving from
/// the start (not only once recovery begins) keeps a live rank answering
/// while strangers fill its backlog.
pub(crate) enum Standby {
    /// Serving.
    Serving(TcpStoreServer),
    /// Handed to a shrunk communicator (or never had one).
    Gone,
}

/// A communicator's recovery attachment: what shrink and the failure
/// agreement keep beside the hot core.
pub(crate) struct Recovery {
    /// Peers this rank saw fail (named by a failed operation).
    pub(crate) failed: Mutex<BTreeSet<usize>>,
    /// Where every rank's standby store listens (see [`Standby`]).
    pub(crate) standby_addrs: Vec<Option<SocketAddr>>,
    /// This rank's standby store (gone once a shrunk communicator took it).
    pub(crate) standby: Mutex<Standby>,
    /// Shrinks started on this communicator.
    pub(crate) shrinks: AtomicU64,
    /// Agreements started on this communicator.
    pub(crate) agrees: AtomicU64,
    /// Grows called on this communicator (each member calls every one, as
    /// a collective: the count names the try, see `crate::grow`).
    pub(crate) grows: AtomicU64,
}

impl Recovery {
    pub(crate) fn new(
        standby: Option<TcpStoreServer>,
        standby_addrs: Vec<Option<SocketAddr>>,
    ) -> Recovery {
        Recovery {
            failed: Mutex::new(BTreeSet::new()),
            standby_addrs,
            standby: Mutex::new(standby.map_or(Standby::Gone, Standby::Serving)),
            shrinks: AtomicU64::new(0),
            agrees: AtomicU64::new(0),
            grows: AtomicU64::new(0),
        }
    }

    /// Records that peer `p` was proven gone.
    pub(crate) fn note_failed(&self, p: usize) {
        self.failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(p);
    }

    /// The peers this rank saw fail so far.
    pub(crate) fn failed_so_far(&self) -> BTreeSet<usize> {
        self.failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// How long one liveness probe waits for a TCP connection.
pub(crate) const PROBE_WAIT: Duration = Duration::from_secs(1);

/// What one TCP connection to a rank's standby store says about the rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Probe {
    /// Its kernel accepted: the process exists (it may be slow or stopped).
    Alive,
    /// Refused: nothing listens, the process is gone.
    Gone,
    /// No answer in time: proves nothing.
    Unknown,
}

/// Probes the rank whose standby store listens at `addr`.
pub(crate) fn probe(addr: SocketAddr) -> Probe {
    match TcpStream::connect_timeout(&addr, PROBE_WAIT) {
        Ok(_) => Probe::Alive,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Probe::Gone,
        Err(_) => Probe::Unknown,
    }
}
