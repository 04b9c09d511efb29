//! How a transport fails: the error a connection reports
//! ([`TransportError`]) and what an aborting rank blames
//! ([`AbortCause`]), as abort notices carry it between ranks.

/// Why a transport could not move a piece.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The peer closed the connection or its process is gone.
    #[error("peer rank {peer} is gone ({detail})")]
    PeerGone {
        /// The peer's rank in the communicator.
        peer: usize,
        /// What was observed (EOF, reset, process not alive, ...).
        detail: String,
    },
    /// The peer aborted the communicator; `cause` is what it blames, as
    /// [`AbortCause::encode`] wrote it (transports carry it unchanged).
    #[error("peer rank {peer} aborted the communicator (cause: {})", AbortCause::describe(*cause))]
    PeerAborted {
        /// The peer that aborted.
        peer: usize,
        /// What the peer blames ([`AbortCause::decode`]).
        cause: Option<usize>,
    },
    /// A piece did not decode.
    #[error("corrupt data from peer rank {peer}: {detail}")]
    Corrupt {
        /// The peer.
        peer: usize,
        /// What was wrong.
        detail: String,
    },
    /// Any other I/O error.
    #[error("I/O error with peer rank {peer}: {source}")]
    Io {
        /// The peer.
        peer: usize,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// What an aborting rank blames, as it travels in abort notices (an
/// integer every transport carries unchanged: at least 29 bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbortCause {
    /// The rank is proven gone (its connection broke) or blamed by the rank
    /// that saw it go: survivors count it as failed.
    Failed(usize),
    /// The aborting rank timed out waiting on this rank: it is the likely
    /// culprit (unreachable, or stuck), but not proven failed — it may
    /// itself wait on another. Survivors name it; they do not count it as
    /// failed.
    Suspect(usize),
    /// The aborting rank found that this rank called a different operation
    /// (collective, root, count, type or reduction differ): nobody failed,
    /// the ranks' arguments disagree. Survivors name it; they do not count
    /// it as failed.
    Mismatch(usize),
}

impl AbortCause {
    /// Bit marking a suspect in the encoded form.
    const SUSPECT: usize = 1 << 28;
    /// Bit marking a mismatch in the encoded form.
    const MISMATCH: usize = 1 << 27;
    /// The rank's bits in the encoded form.
    const RANK: usize = Self::MISMATCH - 1;

    /// The encoded form for [`crate::transport::Connection::abort`].
    pub fn encode(self) -> usize {
        match self {
            AbortCause::Failed(r) => r & Self::RANK,
            AbortCause::Suspect(r) => (r & Self::RANK) | Self::SUSPECT,
            AbortCause::Mismatch(r) => (r & Self::RANK) | Self::MISMATCH,
        }
    }

    /// Decodes a cause received in an abort notice.
    pub fn decode(raw: usize) -> AbortCause {
        let rank = raw & Self::RANK;
        if raw & Self::SUSPECT != 0 {
            AbortCause::Suspect(rank)
        } else if raw & Self::MISMATCH != 0 {
            AbortCause::Mismatch(rank)
        } else {
            AbortCause::Failed(rank)
        }
    }

    /// The rank counted as failed, if the cause proves one.
    pub fn failed_rank(raw: Option<usize>) -> Option<usize> {
        match raw.map(AbortCause::decode) {
            Some(AbortCause::Failed(r)) => Some(r),
            _ => None,
        }
    }

    /// Words for an error message.
    pub fn describe(raw: Option<usize>) -> String {
        match raw.map(AbortCause::decode) {
            Some(AbortCause::Failed(r)) => format!("rank {r} failed"),
            Some(AbortCause::Suspect(r)) => format!(
                "rank {r} is unreachable or stuck: the aborting rank timed out waiting on it"
            ),
            Some(AbortCause::Mismatch(r)) => format!(
                "the ranks called different operations: rank {r}'s collective, root, count, type \
                 or reduction differs from the aborting rank's (both are named in their errors)"
            ),
            None => "unknown".into(),
        }
    }
}
