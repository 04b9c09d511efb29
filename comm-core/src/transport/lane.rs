//! Lanes: one cache line per operation and direction for the smallest
//! all-reduces, where a transport's peers share memory (NCCL's LL idea
//! taken to a one-shot protocol). Each rank writes its contribution and
//! the operation's fingerprint into its line to every peer, stamped with
//! the operation's sequence number (stored last, release ordering), and
//! folds the peers' lines in rank order: no schedule, no piece headers, no
//! FIFO flow control. A direction has two lines, used by the parity of the
//! sequence number; a line is rewritten only once the reader has taken
//! what it held (the reader acknowledges in its own lines and in a word of
//! its own), so a writer running ahead never overwrites a value its peer
//! has not read.

use super::TransportError;
use crate::wire::{Fingerprint, PieceHeader};

/// Payload bytes a lane line carries: all-reduces of at most this many
/// bytes may take the lanes.
pub const LANE_PAYLOAD_BYTES: usize = 32;

/// The most ranks a lane all-reduce serves (the runtime keeps their lines
/// on the stack).
pub const MAX_LANE_RANKS: usize = 16;

/// Whether a communicator of `nranks` ranks is of a size lanes serve.
pub fn lanes_fit(nranks: usize) -> bool {
    (2..=MAX_LANE_RANKS).contains(&nranks)
}

/// The lane side of a connection whose peer shares its memory.
pub trait Lane {
    /// Writes this rank's line for operation `seq` (≥ 1): `fingerprint`
    /// and `payload` (at most [`LANE_PAYLOAD_BYTES`]). `Ok(false)`: the
    /// peer has not yet taken what the line held before (operation
    /// `seq - 2` or older on the same parity); try again within the
    /// operation's deadline.
    fn post(
        &mut self,
        seq: u64,
        fingerprint: &Fingerprint,
        payload: &[u8],
    ) -> Result<bool, TransportError>;

    /// If the peer's line for operation `seq` is published: copies its
    /// payload into `payload` (the first `payload.len()` bytes),
    /// acknowledges it, and returns the peer's fingerprint. `Ok(None)`:
    /// not yet. Bytes that do not decode are [`TransportError::Corrupt`].
    fn take(&mut self, seq: u64, payload: &mut [u8])
        -> Result<Option<Fingerprint>, TransportError>;

    /// The fingerprint of the peer's line for `seq` where it is published,
    /// without taking it: a rank waiting in another operation at `seq`
    /// learns that the peer runs a small all-reduce there.
    fn peek(&self, seq: u64) -> Option<Fingerprint>;

    /// The header of the next piece the peer posted on the connection's
    /// ordinary path and this rank has not received, without receiving it:
    /// a rank waiting on lanes learns that the peer runs another
    /// operation.
    fn next_piece(&self) -> Option<PieceHeader>;
}
