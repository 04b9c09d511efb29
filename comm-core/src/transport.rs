//! The one narrow, non-blocking interface every transport implements
//! (shape taken from NCCL's net plugin: try to send, try to receive, "not now"
//! is an answer). Transports only move bytes; ordering, matching and flow of
//! operations live in the executor.

use crate::wire::PieceHeader;

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
}

impl AbortCause {
    /// Bit marking a suspect in the encoded form.
    const SUSPECT: usize = 1 << 28;

    /// The encoded form for [`crate::transport::Connection::abort`].
    pub fn encode(self) -> usize {
        match self {
            AbortCause::Failed(r) => r & (Self::SUSPECT - 1),
            AbortCause::Suspect(r) => (r & (Self::SUSPECT - 1)) | Self::SUSPECT,
        }
    }

    /// Decodes a cause received in an abort notice.
    pub fn decode(raw: usize) -> AbortCause {
        if raw & Self::SUSPECT != 0 {
            AbortCause::Suspect(raw & !Self::SUSPECT)
        } else {
            AbortCause::Failed(raw)
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
            None => "unknown".into(),
        }
    }
}

/// Result of handing a received piece to the executor's consumer.
pub type ConsumeResult = Result<(), crate::Error>;

/// One directed-pair connection (both directions) to one peer.
///
/// Pieces are delivered in the order they were sent. A piece never exceeds
/// [`Connection::max_piece`] bytes; both sides derive piece boundaries from
/// the same lengths, so headers only confirm them.
pub trait Connection: Send {
    /// The peer's rank.
    fn peer(&self) -> usize;

    /// The largest payload of one piece.
    fn max_piece(&self) -> usize;

    /// Tries to send one piece. `Ok(true)`: the bytes were taken (copied out;
    /// `data` may be reused). `Ok(false)`: no room now, try later.
    fn try_send(&mut self, header: &PieceHeader, data: &[u8]) -> Result<bool, TransportError>;

    /// As [`Connection::try_send`], but the transport may *lend* `data`
    /// instead of copying it: after `Ok(true)` it may keep referring to the
    /// bytes (a single-copy transport lets the receiver read them where
    /// they lie) until [`Connection::flush`] returns `Ok(true)`. The
    /// executor calls this only for memory whose pieces outlive the step
    /// ([`crate::mem::Memory::pieces_outlive_step`]) and drains `flush`
    /// before a step ends. The default copies, as `try_send`.
    ///
    /// # Safety
    /// `data` stays valid for reads and unchanged until this connection's
    /// `flush` returns `Ok(true)`, or until the operation fails (after which
    /// the transport must not read it in this process).
    unsafe fn try_send_lent(
        &mut self,
        header: &PieceHeader,
        data: &[u8],
    ) -> Result<bool, TransportError> {
        self.try_send(header, data)
    }

    /// If the next piece has arrived, hands it to `consume` as a borrowed
    /// slice (no copy: a reduction may read straight from the slot) and
    /// releases it afterwards; returns `Ok(true)`. `Ok(false)`: nothing yet.
    /// An error from `consume` is passed through and the piece is not released.
    fn try_recv(
        &mut self,
        consume: &mut dyn FnMut(&PieceHeader, &[u8]) -> ConsumeResult,
    ) -> Result<bool, crate::Error>;

    /// Moves any bytes this side has buffered (TCP). Returns `Ok(true)` when
    /// nothing is left buffered. Called by the executor while it waits.
    fn flush(&mut self) -> Result<bool, TransportError> {
        Ok(true)
    }

    /// Cheap liveness probe, called while waiting a long time for this peer.
    fn check_alive(&mut self) -> Result<(), TransportError> {
        Ok(())
    }

    /// Tells the peer this communicator is aborted; `cause` is the rank blamed.
    fn abort(&mut self, cause: Option<usize>);

    /// Short name for logs ("shm", "tcp").
    fn kind(&self) -> &'static str;
}

pub mod registry;

/// The longest transport name (see [`registry::check_name`]).
pub const MAX_TRANSPORT_NAME: usize = 23;

#[cfg(test)]
mod tests {
    use super::AbortCause;

    #[test]
    fn abort_causes_round_trip_and_only_failures_count() {
        for r in [0usize, 1, 7, 65_663, (1 << 28) - 1] {
            for c in [AbortCause::Failed(r), AbortCause::Suspect(r)] {
                assert_eq!(AbortCause::decode(c.encode()), c);
                // Every transport carries at least 30 bits (RDMA: rank + 1).
                assert!(c.encode() + 1 < 1 << 30);
            }
            // Older peers wrote the failed rank itself.
            assert_eq!(AbortCause::decode(r), AbortCause::Failed(r));
            assert_eq!(AbortCause::failed_rank(Some(r)), Some(r));
            let s = AbortCause::Suspect(r).encode();
            assert_eq!(AbortCause::failed_rank(Some(s)), None);
            assert!(AbortCause::describe(Some(s)).contains(&format!("rank {r} is unreachable")));
        }
        assert_eq!(AbortCause::describe(None), "unknown");
    }
}
