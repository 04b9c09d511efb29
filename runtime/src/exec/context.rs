//! What every part of the executor knows about the running operation:
//! its identity ([`OpContext`]), the abort flag, each op's progress, and
//! how a transport failure becomes the operation's error.

use std::time::Duration;

use kernels::{DataType, ReduceOp};

use crate::error::Error;
use crate::transport::TransportError;
use crate::wire::Fingerprint;

/// Identity of one operation on one rank.
#[derive(Clone, Copy, Debug)]
pub struct OpContext {
    /// This rank.
    pub rank: usize,
    /// Ranks in the communicator.
    pub nranks: usize,
    /// Communicator id carried in every piece.
    pub comm_id: u64,
    /// Sequence number of the operation.
    pub seq: u64,
    /// Fingerprint every piece must carry.
    pub fingerprint: Fingerprint,
    /// Element type.
    pub dtype: DataType,
    /// Reduction operator (for reducing ops).
    pub op: ReduceOp,
    /// Deadline without progress.
    pub timeout: Duration,
    /// How long a waiter spins before it yields the core.
    pub spin: Duration,
    /// Pieces carry the CRC32C of their payload and received pieces are
    /// verified before use (`SNCL_CHECKSUM=1`).
    pub checksum: bool,
}

/// Set from any thread to make the running operation give up at its next
/// wait (the communicator's abort).
pub type AbortFlag = std::sync::atomic::AtomicBool;

#[derive(Clone, Copy, Default)]
pub(super) struct OpState {
    pub(super) done: usize,
    pub(super) finished: bool,
}

impl OpState {
    /// Records `n` more bytes of the op's `total` moved; whether it is
    /// finished now.
    pub(super) fn advance(&mut self, n: usize, total: usize) -> bool {
        self.done += n;
        self.finished = self.done == total;
        self.finished
    }
}

/// The error of operation `ctx` for what a transport reported of a peer
/// (`source`): the failed rank it proves, if any, named.
pub fn peer_failed(ctx: &OpContext, source: TransportError) -> Error {
    let failed_rank = match &source {
        TransportError::PeerGone { peer, .. } => Some(*peer),
        // The aborting peer only passes the failure on; blame its cause
        // (a suspect is named in the message, not counted as failed).
        TransportError::PeerAborted { cause, .. } => {
            crate::transport::AbortCause::failed_rank(*cause)
        }
        TransportError::Corrupt { peer, .. } | TransportError::Io { peer, .. } => Some(*peer),
    };
    Error::PeerFailed {
        rank: ctx.rank,
        op: ctx.fingerprint,
        seq: ctx.seq,
        failed_rank,
        source,
    }
}

pub(super) fn in_op(ctx: &OpContext, e: Error) -> Error {
    match e {
        Error::Transport { source, .. } => peer_failed(ctx, source),
        other => other,
    }
}
