//! The errors sncl reports. Each names the rank that reports it, the
//! operation and the peer involved, and what was expected.

use crate::transport::TransportError;
use crate::wire::Fingerprint;

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in sncl.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad arguments, rejected before anything is sent.
    #[error("rank {rank}: invalid argument to {op}: {detail}")]
    InvalidArgument {
        /// Reporting rank.
        rank: usize,
        /// The call.
        op: &'static str,
        /// What was wrong and what was expected.
        detail: String,
    },
    /// Bad configuration (environment, `SNCL_ALGO`, ...).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// No progress from the peers an operation waits on within the deadline.
    /// The text starts "Timed out" (as gloo's and NCCL's timeouts do), so
    /// code that recognises those by wording recognises this one.
    #[error("Timed out: rank {rank}: {op} (seq {seq}) made no progress for {timeout_ms} ms (the communicator's timeout); waiting on peer rank(s) {waiting_on:?}")]
    Timeout {
        /// Reporting rank.
        rank: usize,
        /// The operation.
        op: Fingerprint,
        /// Its sequence number.
        seq: u64,
        /// Ranks it was waiting for.
        waiting_on: Vec<usize>,
        /// The deadline.
        timeout_ms: u64,
    },
    /// A peer died or aborted during an operation.
    #[error("rank {rank}: {op} (seq {seq}) failed: {source}")]
    PeerFailed {
        /// Reporting rank.
        rank: usize,
        /// The operation.
        op: Fingerprint,
        /// Its sequence number.
        seq: u64,
        /// The rank blamed for the failure (the dead peer when known).
        failed_rank: Option<usize>,
        /// What the transport saw.
        #[source]
        source: TransportError,
    },
    /// Two ranks called different collectives at the same point.
    #[error("rank {rank}: mismatched collective from peer rank {peer}: this rank runs {ours} as seq {seq}, the peer sent {theirs} as seq {their_seq}")]
    Mismatch {
        /// Reporting rank.
        rank: usize,
        /// The peer.
        peer: usize,
        /// This rank's sequence number.
        seq: u64,
        /// This rank's operation.
        ours: Fingerprint,
        /// The peer's sequence number.
        their_seq: u64,
        /// The peer's operation.
        theirs: Fingerprint,
    },
    /// A piece of another communicator arrived: the two ranks disagree on
    /// the communicator (ids built differently, or a stale connection).
    #[error("rank {rank}: {op} (seq {seq}): peer rank {peer} sent a piece of communicator {theirs:016x} (its seq {their_seq}), but this communicator is {ours:016x}")]
    CommMismatch {
        /// Reporting rank.
        rank: usize,
        /// The peer.
        peer: usize,
        /// This rank's sequence number.
        seq: u64,
        /// This rank's operation.
        op: Fingerprint,
        /// This communicator's id.
        ours: u64,
        /// The id the peer's piece carried.
        theirs: u64,
        /// The peer's sequence number.
        their_seq: u64,
    },
    /// A transport failure outside of an operation (setup, teardown).
    #[error("rank {rank}: transport error: {source}")]
    Transport {
        /// Reporting rank.
        rank: usize,
        /// The cause.
        #[source]
        source: TransportError,
    },
    /// Rendezvous / bootstrap failure.
    #[error("rank {rank}: bootstrap failed: {detail}")]
    Bootstrap {
        /// Reporting rank (or the rank being set up).
        rank: usize,
        /// What happened and what to do.
        detail: String,
    },
    /// The communicator was aborted earlier (by the user or after a failure).
    #[error("rank {rank}: communicator is aborted{}", reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default())]
    Aborted {
        /// Reporting rank.
        rank: usize,
        /// The first failure, if any.
        reason: Option<String>,
    },
    /// A device call (allocation, copy, kernel launch, stream or event
    /// operation) failed on this rank. Carries the device error's text, so
    /// this crate does not depend on the device layer.
    #[error("rank {rank}: {op}{}: {what} on {device}: {detail}", seq.map(|s| format!(" (seq {s})")).unwrap_or_default())]
    Device {
        /// Reporting rank (the rank whose device failed).
        rank: usize,
        /// The operation (`all_reduce`, `bind_device`, ...).
        op: &'static str,
        /// Its sequence number, once it has one (a failure at enqueue, or
        /// before the operation started, has none).
        seq: Option<u64>,
        /// The device: backend, ordinal and name (`cuda device 0 (...)`).
        device: String,
        /// What was being done on the device.
        what: String,
        /// The device error's text.
        detail: String,
    },
    /// Operating-system error outside of a peer connection.
    #[error("rank {rank}: {context}: {source}")]
    Io {
        /// Reporting rank.
        rank: usize,
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// The rank that reports the error (none for configuration errors).
    pub fn rank(&self) -> Option<usize> {
        match self {
            Error::InvalidArgument { rank, .. }
            | Error::Timeout { rank, .. }
            | Error::PeerFailed { rank, .. }
            | Error::Mismatch { rank, .. }
            | Error::CommMismatch { rank, .. }
            | Error::Transport { rank, .. }
            | Error::Bootstrap { rank, .. }
            | Error::Aborted { rank, .. }
            | Error::Device { rank, .. }
            | Error::Io { rank, .. } => Some(*rank),
            Error::Config(_) => None,
        }
    }

    /// The rank blamed for a peer failure, if this error names one.
    pub fn failed_rank(&self) -> Option<usize> {
        match self {
            Error::PeerFailed { failed_rank, .. } => *failed_rank,
            // A rank that stopped making progress is the likeliest culprit.
            Error::Timeout { waiting_on, .. } if waiting_on.len() == 1 => Some(waiting_on[0]),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_error_names_rank_op_seq_device_and_cause() {
        let e = Error::Device {
            rank: 3,
            op: "all_reduce",
            seq: Some(7),
            device: "emu device 1 (emulated)".into(),
            what: "copying to the device".into(),
            detail: "injected fault".into(),
        };
        assert_eq!(
            e.to_string(),
            "rank 3: all_reduce (seq 7): copying to the device on emu device 1 (emulated): injected fault"
        );
        assert_eq!(e.rank(), Some(3));
        assert_eq!(e.failed_rank(), None);
        let e = Error::Device {
            rank: 0,
            op: "bind_device",
            seq: None,
            device: "cuda device 0 (H200)".into(),
            what: "creating the collectives' stream".into(),
            detail: "out of memory".into(),
        };
        assert_eq!(
            e.to_string(),
            "rank 0: bind_device: creating the collectives' stream on cuda device 0 (H200): out of memory"
        );
    }
}
