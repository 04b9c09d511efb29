//! The one narrow, non-blocking interface every transport implements
//! (shape taken from NCCL's net plugin: try to send, try to receive, "not now"
//! is an answer), on regions: a sender posts a piece's [`Payload`] — host
//! bytes or a device region — and flushes until its posted pieces complete;
//! a receiver is handed each arrived piece's payload where the transport
//! holds it. Transports only move bytes; ordering, matching and flow of
//! operations, and every copy and reduction ([`crate::mem::Memory`]), live
//! in the executor.

use crate::wire::PieceHeader;

mod failure;
pub mod footprint;
pub mod lane;
pub use failure::{AbortCause, TransportError};

/// Result of handing a received piece to the executor's consumer.
pub type ConsumeResult = Result<(), crate::Error>;

/// A range of device memory a piece lies in, with the operation's device
/// queue as [`crate::mem::Memory::device_queue`] hands it out (an opaque
/// value the transport downcasts to the type it knows; comm-core never
/// looks inside). The transport finds its own registration of the range
/// (rdma caches them per allocation), so none travels here.
#[derive(Clone, Copy)]
pub struct DeviceRegion<'a> {
    /// The operation's device queue: device work the transport enqueues
    /// (a copy, an event) goes on its stream, after the work already there.
    pub queue: &'a dyn std::any::Any,
    /// The device address of the first byte.
    pub addr: u64,
    /// Bytes.
    pub len: usize,
}

impl std::fmt::Debug for DeviceRegion<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceRegion({:#x}, {} bytes)", self.addr, self.len)
    }
}

/// The bytes of one piece, where they lie: what a sender posts and what a
/// receiver is handed.
#[derive(Clone, Copy, Debug)]
pub enum Payload<'a> {
    /// Host memory. Received: a slice of the transport's receive slot (no
    /// copy: a reduction reads straight from it).
    Host(&'a [u8]),
    /// Device memory. Received: the transport's device inbox slot, which
    /// the consumer reads with work it enqueues on the region's queue; the
    /// slot is released once that work completes.
    Device(DeviceRegion<'a>),
}

impl<'a> Payload<'a> {
    /// The memory the bytes lie in.
    pub fn kind(&self) -> MemoryKind {
        match self {
            Payload::Host(_) => MemoryKind::Host,
            Payload::Device(_) => MemoryKind::Device,
        }
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        match self {
            Payload::Host(b) => b.len(),
            Payload::Device(r) => r.len,
        }
    }

    /// Whether the piece has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes, if they lie in host memory.
    pub fn host(self) -> Option<&'a [u8]> {
        match self {
            Payload::Host(b) => Some(b),
            Payload::Device(_) => None,
        }
    }
}

/// A piece posted for sending ([`Connection::try_post_send`]): its payload
/// and whether the transport may keep referring to it after taking it.
#[derive(Clone, Copy, Debug)]
pub struct Outgoing<'a> {
    payload: Payload<'a>,
    lent: bool,
}

impl<'a> Outgoing<'a> {
    /// Host bytes the transport copies out before it reports them taken
    /// (`data` may be reused at once).
    pub fn copied(data: &'a [u8]) -> Self {
        Outgoing {
            payload: Payload::Host(data),
            lent: false,
        }
    }

    /// Host bytes the transport may *lend* instead of copying: after it
    /// took them it may keep referring to them (a single-copy transport
    /// lets the receiver read them where they lie) until
    /// [`Connection::flush`] returns `Ok(true)`. The executor lends only
    /// memory whose pieces outlive the step
    /// ([`crate::mem::Memory::pieces_outlive_step`]) and drains `flush`
    /// before a step ends. A transport that does not lend copies them.
    ///
    /// # Safety
    /// `data` stays valid for reads and unchanged until the connection it
    /// is posted to returns `Ok(true)` from `flush`, or until the operation
    /// fails (after which the transport must not read it in this process).
    pub unsafe fn lent(data: &'a [u8]) -> Self {
        Outgoing {
            payload: Payload::Host(data),
            lent: true,
        }
    }

    /// Device memory. The transport reads it after taking it, with work
    /// on the region's queue (after the work already there that produced
    /// it); the piece is complete once [`Connection::flush`] returns
    /// `Ok(true)`, and the caller keeps the region unchanged until then.
    pub fn device(region: DeviceRegion<'a>) -> Self {
        Outgoing {
            payload: Payload::Device(region),
            lent: true,
        }
    }

    /// The bytes posted.
    pub fn payload(&self) -> Payload<'a> {
        self.payload
    }

    /// Whether the transport may keep referring to the bytes until `flush`
    /// (always for device memory).
    pub fn is_lent(&self) -> bool {
        self.lent
    }
}

/// The memory a receive (or a readiness query) is about: host memory, or
/// device memory of the operation whose device queue this is.
#[derive(Clone, Copy)]
pub enum Space<'a> {
    /// Host memory: pieces arrive as host bytes.
    Host,
    /// Device memory of this queue's operation: pieces arrive in the
    /// transport's device inbox.
    Device(&'a dyn std::any::Any),
}

impl Space<'_> {
    /// The memory kind.
    pub fn kind(&self) -> MemoryKind {
        match self {
            Space::Host => MemoryKind::Host,
            Space::Device(_) => MemoryKind::Device,
        }
    }
}

/// The error of a connection asked to move memory its transport does not
/// (`what`: "posted", "received"): the setup's check against
/// [`registry::TransportKind::memory_kinds`] keeps the executor from it,
/// so this is a guard, not a path.
pub fn unsupported_memory(
    rank: usize,
    conn: &dyn Connection,
    kind: MemoryKind,
    what: &str,
) -> crate::Error {
    let moves: Vec<&str> = conn.memory_kinds().iter().map(|k| k.name()).collect();
    crate::Error::InvalidArgument {
        rank,
        op: "a transport",
        detail: format!(
            "transport {} moves {} memory only; a {} piece was {what} on its connection with \
             peer rank {}",
            conn.kind(),
            moves.join(" and "),
            kind.name(),
            conn.peer()
        ),
    }
}

/// One directed-pair connection (both directions) to one peer: sends and
/// receives are posted on regions of the memory kinds the transport moves
/// ([`Connection::memory_kinds`]), completions are reported by
/// [`Connection::flush`].
///
/// Pieces are delivered in the order they were sent, per memory kind (an
/// operation's pieces with one peer are all of one kind). A piece never
/// exceeds [`Connection::max_piece`] bytes of its kind; both sides derive
/// piece boundaries from the same lengths, so headers only confirm them.
/// Errors are [`crate::Error::Transport`] for what the peer did (gone,
/// aborted, corrupt data) and other errors for this rank's own failures
/// (a device call, memory the transport does not move).
pub trait Connection: Send {
    /// The peer's rank.
    fn peer(&self) -> usize;

    /// The memory this connection moves: [`MemoryKind::Host`], and
    /// [`MemoryKind::Device`] where it has a device path (the setup checks
    /// this against its kind's [`registry::TransportKind::memory_kinds`]).
    fn memory_kinds(&self) -> &'static [MemoryKind] {
        &[MemoryKind::Host]
    }

    /// The largest payload of one piece of memory `kind` (both sides agree).
    fn max_piece(&self, kind: MemoryKind) -> usize;

    /// Whether device pieces of the operation with `device` queue go over
    /// this connection device to device: `Ok(None)` while that is not
    /// decided yet (the peer has not published its side: try again later,
    /// within the operation's deadline), `Ok(Some(false))` when they
    /// cannot (no device path, another backend, no peer access): the
    /// caller stages them through host memory and posts them as host
    /// pieces. Both sides of a pair decide the same way from what both
    /// published. The default (host only): `Ok(Some(false))`.
    fn ready(&mut self, device: &dyn std::any::Any) -> Result<Option<bool>, crate::Error> {
        let _ = device;
        Ok(Some(false))
    }

    /// Tries to post one piece (`header.len == piece.payload().len()`).
    /// `Ok(true)`: taken — host bytes copied out, unless lent
    /// ([`Outgoing::lent`]); device bytes: their copy is enqueued. The
    /// piece completes during later calls or [`Connection::flush`].
    /// `Ok(false)`: no room now, try later. A payload of memory the
    /// transport does not move is an error ([`unsupported_memory`]).
    ///
    /// `header.checksum == Some(_)` asks for a checksummed piece
    /// (`SNCL_CHECKSUM=1`, host pieces): the value given is ignored, and
    /// the transport computes the CRC32C of the payload in the pass that
    /// copies it (`wire::copy_checksummed`), just before the kernel copies
    /// it, or (lent) as it posts it, and sends that. A transport that
    /// forwarded the header unchanged would send a wrong CRC, which the
    /// receiver refuses.
    fn try_post_send(
        &mut self,
        header: &PieceHeader,
        piece: Outgoing<'_>,
    ) -> Result<bool, crate::Error>;

    /// If the next piece of memory `space` has arrived, hands it to
    /// `consume` — host: a borrowed slice of the receive slot (no copy: a
    /// reduction may read straight from it), released afterwards; device:
    /// the inbox slot's region, released once the work `consume` enqueued
    /// on the queue completes — and returns `Ok(true)`. `Ok(false)`:
    /// nothing yet. An error from `consume` is passed through and the
    /// piece is not released.
    fn try_recv(
        &mut self,
        space: Space<'_>,
        consume: &mut dyn FnMut(&PieceHeader, Payload<'_>) -> ConsumeResult,
    ) -> Result<bool, crate::Error>;

    /// Completes posted sends: moves what this side buffered (TCP),
    /// publishes device pieces whose copies completed, releases what the
    /// peer is done with. `Ok(true)` when every piece posted so far is
    /// complete (no lent bytes or device region is referred to any more).
    /// The executor calls it while it waits and drains it before a step
    /// ends.
    fn flush(&mut self) -> Result<bool, crate::Error> {
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

    /// Reports the memory this connection holds on this rank
    /// ([`footprint`]); the default reports none.
    fn footprint(&self, report: &mut footprint::FootprintReport<'_>) {
        let _ = report;
    }

    /// The connection's lane ([`lane`]), where its peer shares this rank's
    /// memory; `None` (the default) where it does not.
    fn lane(&mut self) -> Option<&mut dyn lane::Lane> {
        None
    }

    /// Segments the kernel retransmitted on this connection so far (TCP:
    /// `tcpi_total_retrans` of its sockets); `None` where the transport
    /// has no such count.
    fn retransmits(&self) -> Option<u64> {
        None
    }
}

pub mod registry;

/// The longest transport name (see [`registry::check_name`]).
pub const MAX_TRANSPORT_NAME: usize = 23;

/// Memory a transport kind's connections move between two ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// Host (CPU) memory, as byte slices: every kind moves it.
    Host,
    /// Device (GPU) memory, device to device: the kind's connections take
    /// device regions ([`Payload::Device`]). Whether a pair
    /// can use it is decided at its first device operation (the devices
    /// must reach each other; GPUDirect must be available); where it
    /// cannot, device pieces are staged through host memory, as they
    /// always are over a kind that does not list `Device`.
    Device,
}

impl MemoryKind {
    /// The name in logs and errors (`host`, `device`).
    pub fn name(self) -> &'static str {
        match self {
            MemoryKind::Host => "host",
            MemoryKind::Device => "device",
        }
    }
}

/// Checks a transport name's form (`SNCL_TRANSPORT`, a kind's
/// [`registry::TransportKind::name`]).
pub fn check_name(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() || name.len() > MAX_TRANSPORT_NAME {
        return Err(format!(
            "a transport name has 1 to {} characters, got {}",
            MAX_TRANSPORT_NAME,
            name.len()
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
    {
        return Err(format!(
            "transport name {name:?} may hold only a-z, 0-9, '-' and '_'"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::AbortCause;

    #[test]
    fn abort_causes_round_trip_and_only_failures_count() {
        for r in [0usize, 1, 7, 65_663, (1 << 27) - 1] {
            for c in [
                AbortCause::Failed(r),
                AbortCause::Suspect(r),
                AbortCause::Mismatch(r),
            ] {
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
            let m = AbortCause::Mismatch(r).encode();
            assert_eq!(AbortCause::failed_rank(Some(m)), None);
            assert!(AbortCause::describe(Some(m)).contains(&format!("rank {r}'s collective, root")));
        }
        assert_eq!(AbortCause::describe(None), "unknown");
    }
}
