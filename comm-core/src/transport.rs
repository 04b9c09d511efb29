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
    ///
    /// `header.checksum == Some(_)` asks for a checksummed piece
    /// (`SNCL_CHECKSUM=1`): the value given is ignored, and the transport
    /// computes the CRC32C of `data` in the pass that copies it
    /// (`wire::copy_checksummed`) or just before the kernel copies it, and
    /// sends that. A transport that forwarded the header unchanged would
    /// send a wrong CRC, which the receiver refuses.
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

    /// Segments the kernel retransmitted on this connection so far (TCP:
    /// `tcpi_total_retrans` of its sockets); `None` where the transport
    /// has no such count.
    fn retransmits(&self) -> Option<u64> {
        None
    }

    /// The connection's device-to-device path, if it has one (`nvlink`).
    /// The default is none: pieces of device memory are staged through
    /// host memory and travel as host pieces.
    fn device_link(&mut self) -> Option<&mut dyn DeviceLink> {
        None
    }
}

/// A device-to-device path of a [`Connection`]: pieces of device memory go
/// from the sender's memory into the receiver's device inbox without
/// crossing the host; only their headers travel through host memory.
///
/// `device` is the operation's device queue as
/// [`crate::mem::Memory::device_queue`] hands it out (an opaque value the
/// transport downcasts to the type it knows; comm-core never looks
/// inside). Addresses are device addresses as `u64`. Errors are
/// [`crate::Error::Transport`] for what the peer did (gone, aborted,
/// corrupt data), other errors for this rank's own failures (a device
/// call).
pub trait DeviceLink {
    /// Whether device pieces of `device` go over this link to the peer:
    /// `Ok(None)` while that is not decided yet (the peer has not
    /// published its inbox: try again later, within the operation's
    /// deadline), `Ok(Some(false))` when they cannot (another backend, no
    /// peer access): the caller stages them through host memory instead.
    /// Both sides of a pair decide the same way from what both published.
    fn ready(&mut self, device: &dyn std::any::Any) -> Result<Option<bool>, crate::Error>;

    /// The largest payload of one device piece (both sides agree).
    fn max_device_piece(&self) -> usize;

    /// Tries to send one piece: `len` bytes at device address `src`
    /// (`header.len == len`). `Ok(true)`: the copy into the peer's inbox
    /// is enqueued on the operation's stream (after the work already
    /// there); the header is published once the copy completes, during
    /// later calls or [`Connection::flush`]. `Ok(false)`: no free inbox
    /// slot now.
    fn try_send_device(
        &mut self,
        device: &dyn std::any::Any,
        header: &PieceHeader,
        src: u64,
    ) -> Result<bool, crate::Error>;

    /// Publishes sent device pieces whose copies completed (and releases
    /// inbox slots whose reading work completed). `Ok(true)` when no sent
    /// piece is left unpublished. The executor calls it with
    /// [`Connection::flush`] and drains it before a step ends.
    fn flush_device(&mut self) -> Result<bool, crate::Error>;

    /// If the next device piece has arrived, hands its header and its
    /// inbox address to `consume`, which enqueues the work that reads it
    /// on the operation's stream; the inbox slot is released once that
    /// work completes. `Ok(false)`: nothing yet.
    fn try_recv_device(
        &mut self,
        device: &dyn std::any::Any,
        consume: &mut dyn FnMut(&PieceHeader, u64) -> ConsumeResult,
    ) -> Result<bool, crate::Error>;
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
