//! Host shared-memory transport: between two ranks of one node, one FIFO of
//! slots per direction in `/dev/shm`, created by the receiver. The receiver
//! hands each piece to the executor as a slice of the slot itself, so a
//! reduction reads the peer's data where it landed (one copy in total: the
//! sender's into the slot).
//!
//! Life cycle: the receiver creates its inbound segments (mode `0600`).
//! Between ranks of one pid namespace, whose processes can open each
//! other's descriptors, a segment is anonymous (a memfd the sender opens
//! through `/proc/<pid>/fd`, see [`private_file::create_anonymous`]): it is
//! never named in `/dev/shm`, and the kernel frees it with the last process
//! that maps it, even when every rank is killed during setup. Otherwise
//! (ranks in different containers sharing `/dev/shm`, or a process that is
//! not dumpable) it is a file under a name holding a random token and
//! ending in the creator's pid. Once every sender has opened them (the
//! communicator's init barrier) the names are withdrawn (the descriptors
//! closed, the files unlinked), so nothing is left behind if a process
//! crashes later; named segments left by a crash during init are found by
//! [`cleanup_stale`] (their creator pid is gone) and removed.
//!
//! Single copy for large pieces: where cross-memory attach works (see
//! [`cma`]), a sender may *lend* a piece ([`Outgoing::lent`]):
//! it posts a descriptor (address, length) instead of copying the bytes,
//! and the receiver reads them from the sender's memory into a cache-sized
//! bounce buffer, hands them to the executor and releases the slot; the
//! sender's `flush` reports done once every lent piece was released. The
//! sender's copy into the slot and the receiver's read of it from memory
//! disappear.
//!
//! Checksums (`SNCL_CHECKSUM=1`): the sender's copy into the slot computes
//! the payload's CRC32C block by block as it copies, and writes it into the
//! slot header after the payload; a lent piece is checksummed as it is
//! posted (the sender's only read of it). The receiver's executor verifies
//! it in the pass that reduces or copies the piece out of the slot.

pub mod cma;
mod kind;
mod lane;
/// Private files under `/dev/shm` (the `sncl-shm-files` crate, shared
/// with the emulated device).
pub use sncl_shm_files as private_file;
pub mod region;
mod segment;

use std::io;
use std::sync::atomic::Ordering;

use comm_core::transport::registry::MemoryKind;
use comm_core::transport::{
    unsupported_memory, Connection, ConsumeResult, Outgoing, Payload, Space, TransportError,
};
use comm_core::wire::PieceHeader;
use comm_core::Error;

#[doc(hidden)]
pub use kind::{anonymous_with, open_peer_segment, ShmKind, UnlinkOnDrop};
pub use private_file::{
    check_name, Published, ANONYMOUS_PREFIX, MAX_NAME_LEN, PREFIX, SEGMENT_MODE, SHM_DIR,
};
pub use segment::decode_slot_header;
pub use segment::{cleanup_stale, pid_alive, Segment, SlotData, IN_HEADER_BYTES};

// The configuration's bounds must fit the segment header's u32 geometry.
const _: () = assert!(comm_core::config::MAX_SHM_SLOTS <= u32::MAX as usize);
const _: () = assert!(comm_core::config::MAX_SHM_SLOT_BYTES <= u32::MAX as usize);

/// Name of a new segment carrying data from rank `from` to rank `to`,
/// created by process `pid`; `instance` tells apart segments of several
/// communicators with the same id in one process. A 128-bit random token
/// makes the name unguessable, so two calls with the same arguments give
/// different names. The pid comes last (the stale-segment cleanup reads it).
pub fn segment_name(
    comm_id: u64,
    from: usize,
    to: usize,
    instance: u64,
    pid: u32,
) -> io::Result<String> {
    let token = private_file::random_token()?;
    Ok(format!(
        "{PREFIX}{comm_id:016x}-{from}-{to}-{instance}-{token:032x}-{pid}"
    ))
}

static INSTANCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Creates the inbound segment for data from `from` to `to` (this rank):
/// anonymous (no name in `/dev/shm`, see [`Segment::create_anonymous`])
/// when `anonymous`, else a private file named by [`segment_name`].
/// Returns it with the name its peer opens it by.
pub fn create_inbound(
    comm_id: u64,
    from: usize,
    to: usize,
    (slots, slot_bytes): (usize, usize),
    anonymous: bool,
) -> io::Result<(Segment, String)> {
    let seg = if anonymous {
        Segment::create_anonymous(slots, slot_bytes)?
    } else {
        let instance = INSTANCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = segment_name(comm_id, from, to, instance, std::process::id())?;
        Segment::create(&name, slots, slot_bytes)?
    };
    let name = seg
        .published_name()
        .expect("a created segment has a name")
        .to_owned();
    Ok((seg, name))
}

/// A shared-memory connection to one peer.
pub struct ShmConnection {
    rank: usize,
    peer: usize,
    inbound: Segment,
    outbound: Segment,
    // Cached counters: each side re-reads the other's only when it must.
    sent: u64,
    acked: u64,
    received: u64,
    posted: u64,
    peer_pid: u32,
    /// Sender side: pieces of at least this many bytes are lent (None: never).
    lend_min: Option<usize>,
    /// Sender side: slots to be released before every lent piece was read.
    lent_until: u64,
    /// When `flush` last checked that the peer is alive.
    last_alive_check: std::time::Instant,
    /// Receiver side: whether the peer may lend (this side can read it).
    cma_reads: bool,
    /// Receiver side: lent pieces land here, one at a time.
    bounce: Vec<u8>,
    /// What this side knows of the lanes (`lane.rs`).
    lane: lane::LaneState,
}

/// How often a sender waiting for its lent pieces to be read checks that
/// the reader still lives.
const ALIVE_CHECK_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

impl ShmConnection {
    /// Joins this rank's inbound segment from `peer` with the peer's inbound
    /// segment from this rank (opened with [`Segment::open`]).
    pub fn new(rank: usize, peer: usize, inbound: Segment, outbound: Segment) -> ShmConnection {
        let peer_pid = outbound.creator_pid();
        ShmConnection {
            rank,
            peer,
            sent: outbound.head().load(Ordering::Acquire),
            acked: outbound.tail().load(Ordering::Acquire),
            received: inbound.tail().load(Ordering::Acquire),
            posted: inbound.head().load(Ordering::Acquire),
            inbound,
            outbound,
            peer_pid,
            lend_min: None,
            lent_until: 0,
            last_alive_check: std::time::Instant::now(),
            cma_reads: false,
            bounce: Vec::new(),
            lane: lane::LaneState::default(),
        }
    }

    /// Sender side: lend pieces of at least `min_bytes` bytes (posted as
    /// descriptors the peer reads with cross-memory attach) instead of
    /// copying them. Only when the peer proved it can read this process's
    /// memory (see `src/setup/shm.rs`).
    pub fn enable_lending(&mut self, min_bytes: usize) {
        self.lend_min = Some(min_bytes.max(1));
    }

    /// Receiver side: accept descriptors of lent pieces from the peer and
    /// read them from its memory. Without this, a descriptor is an error.
    pub fn enable_cma_reads(&mut self) {
        self.cma_reads = true;
    }

    /// The peer's process id (it created this side's outbound segment).
    pub fn peer_pid(&self) -> u32 {
        self.peer_pid
    }

    /// Whether this side lends large pieces.
    pub fn lends(&self) -> bool {
        self.lend_min.is_some()
    }

    /// Waits for a free slot; `Ok(false)` when there is none now.
    fn slot_free(&mut self) -> Result<bool, TransportError> {
        let slots = self.outbound.slots();
        if self.sent - self.acked >= slots {
            self.acked = self.outbound.tail().load(Ordering::Acquire);
            if self.sent - self.acked >= slots {
                if let Some(e) = self.aborted_by_peer() {
                    return Err(e);
                }
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn transport_error(&self, source: TransportError) -> Error {
        Error::Transport {
            rank: self.rank,
            source,
        }
    }

    /// Reads a piece of `len` bytes the peer lent at `address` into the
    /// bounce buffer.
    fn read_lent(&mut self, seq: u64, address: u64, len: usize) -> Result<(), Error> {
        if !self.cma_reads {
            return Err(self.transport_error(TransportError::Corrupt {
                peer: self.peer,
                detail: format!(
                    "peer lent a piece (seq {seq}) for a cross-memory read, but single copy \
                     was not agreed for this direction"
                ),
            }));
        }
        if self.bounce.len() < len {
            self.bounce.resize(self.inbound.slot_bytes().max(len), 0);
        }
        let pid = self.peer_pid;
        match cma::read_from(pid, address, &mut self.bounce[..len]) {
            Ok(()) => Ok(()),
            Err(e) => {
                let gone = matches!(e.raw_os_error(), Some(libc::ESRCH))
                    || (e.raw_os_error() == Some(libc::EFAULT) && !pid_alive(pid));
                // A peer that aborted (and published why) before it exited
                // passes its cause on: blame the cause, not the messenger.
                let source = if let Some(a) = self.aborted_by_peer() {
                    a
                } else if gone {
                    TransportError::PeerGone {
                        peer: self.peer,
                        detail: format!(
                            "process {pid} went away while this rank read {len} bytes it \
                             lent (seq {seq}): {e}"
                        ),
                    }
                } else {
                    TransportError::Io {
                        peer: self.peer,
                        source: std::io::Error::new(
                            e.kind(),
                            format!(
                                "cross-memory read of {len} bytes at {address:#x} lent by \
                                 process {pid} (seq {seq}): {e}"
                            ),
                        ),
                    }
                };
                Err(self.transport_error(source))
            }
        }
    }

    /// Removes the names of both segments (the mappings stay).
    pub fn unlink(&self) {
        self.inbound.unlink();
    }

    /// Copies a piece into the next slot.
    fn send_copy(&mut self, header: &PieceHeader, data: &[u8]) -> Result<bool, TransportError> {
        if !self.slot_free()? {
            return Ok(false);
        }
        self.outbound.write_slot(self.sent, header, data);
        self.sent += 1;
        self.outbound.head().store(self.sent, Ordering::Release);
        Ok(true)
    }

    /// Lends a piece (posts its address) where lending is on and the piece
    /// is large enough, else copies it. The caller promises (see
    /// [`Outgoing::lent`]) that `data` stays valid and unchanged until
    /// `flush` returns true, which it does only once the peer released
    /// this slot (after its read).
    fn send_lent(&mut self, header: &PieceHeader, data: &[u8]) -> Result<bool, TransportError> {
        let lend = self.lend_min.is_some_and(|m| data.len() >= m);
        if !lend || data.len() > self.outbound.slot_bytes() {
            return self.send_copy(header, data);
        }
        if !self.slot_free()? {
            return Ok(false);
        }
        // A lent piece is not copied on this side: its checksum is this
        // side's only read of it (the reader's pass verifies it).
        let mut h = *header;
        if h.checksum.is_some() {
            h.checksum = Some(comm_core::wire::piece_checksum(data));
        }
        self.outbound
            .write_lent(self.sent, &h, data.as_ptr() as u64);
        self.sent += 1;
        self.lent_until = self.sent;
        self.outbound.head().store(self.sent, Ordering::Release);
        Ok(true)
    }

    fn aborted_by_peer(&self) -> Option<TransportError> {
        let a = self.inbound.abort_by_sender().load(Ordering::Acquire);
        let b = self.outbound.abort_by_receiver().load(Ordering::Acquire);
        let w = if a != 0 { a } else { b };
        (w != 0).then(|| TransportError::PeerAborted {
            peer: self.peer,
            cause: (w != u64::MAX).then(|| (w - 1) as usize),
        })
    }
}

impl Connection for ShmConnection {
    fn peer(&self) -> usize {
        self.peer
    }

    fn max_piece(&self, _kind: MemoryKind) -> usize {
        self.outbound.slot_bytes()
    }

    /// Host pieces only (shm moves host memory): copied into the next
    /// slot, or lent (single copy, where agreed).
    fn try_post_send(&mut self, header: &PieceHeader, piece: Outgoing<'_>) -> Result<bool, Error> {
        let Payload::Host(data) = piece.payload() else {
            return Err(unsupported_memory(
                self.rank,
                self,
                MemoryKind::Device,
                "posted",
            ));
        };
        let r = if piece.is_lent() {
            self.send_lent(header, data)
        } else {
            self.send_copy(header, data)
        };
        r.map_err(|e| self.transport_error(e))
    }

    fn flush(&mut self) -> Result<bool, Error> {
        if self.acked >= self.lent_until {
            return Ok(true);
        }
        self.acked = self.outbound.tail().load(Ordering::Acquire);
        if self.acked >= self.lent_until {
            return Ok(true);
        }
        // The executor does not probe liveness while it drains: a reader
        // that died holding our lent pieces must not leave us waiting until
        // the operation's timeout.
        if self.last_alive_check.elapsed() >= ALIVE_CHECK_EVERY {
            self.last_alive_check = std::time::Instant::now();
            self.check_alive().map_err(|e| self.transport_error(e))?;
        }
        Ok(false)
    }

    fn try_recv(
        &mut self,
        space: Space<'_>,
        consume: &mut dyn FnMut(&PieceHeader, Payload<'_>) -> ConsumeResult,
    ) -> Result<bool, Error> {
        if let Space::Device(_) = space {
            return Err(unsupported_memory(
                self.rank,
                self,
                MemoryKind::Device,
                "received",
            ));
        }
        if self.received == self.posted {
            // The next slot's own stamp, not `head`: one cache-line pair
            // brings the news, the header and a small payload (LL-style).
            if self.inbound.is_published(self.received) {
                self.posted = self.received + 1;
            } else {
                if let Some(e) = self.aborted_by_peer() {
                    return Err(Error::Transport {
                        rank: self.rank,
                        source: e,
                    });
                }
                return Ok(false);
            }
        }
        let (h, data) = self.inbound.read_slot(self.received).map_err(|d| {
            self.transport_error(TransportError::Corrupt {
                peer: self.peer,
                detail: d.to_string(),
            })
        })?;
        match data {
            SlotData::Inline(data) => consume(&h, Payload::Host(data))?,
            SlotData::Lent(address) => {
                let len = h.len as usize;
                self.read_lent(h.seq, address, len)?;
                // A sender whose operation failed may have reused the
                // memory it lent: never hand on what was read after that.
                if let Some(e) = self.aborted_by_peer() {
                    return Err(self.transport_error(e));
                }
                consume(&h, Payload::Host(&self.bounce[..len]))?;
            }
        }
        self.received += 1;
        self.inbound.tail().store(self.received, Ordering::Release);
        Ok(true)
    }

    fn check_alive(&mut self) -> Result<(), TransportError> {
        if let Some(e) = self.aborted_by_peer() {
            return Err(e);
        }
        // A peer that finished its part and exited may have left pieces
        // for us: they are delivered first (`try_recv`); gone is an error
        // only once nothing it sent is left unread.
        let unread = self.inbound.head().load(Ordering::Acquire) != self.received;
        if !unread && !pid_alive(self.peer_pid) {
            return Err(TransportError::PeerGone {
                peer: self.peer,
                detail: format!("process {} no longer exists", self.peer_pid),
            });
        }
        Ok(())
    }

    fn abort(&mut self, cause: Option<usize>) {
        let w = cause.map(|c| c as u64 + 1).unwrap_or(u64::MAX);
        self.outbound.abort_by_sender().store(w, Ordering::Release);
        self.inbound.abort_by_receiver().store(w, Ordering::Release);
    }

    fn kind(&self) -> &'static str {
        "shm"
    }

    /// The inbound segment (this rank created it for the peer to write),
    /// the outbound one (the peer's, mapped here) and the bounce buffer of
    /// lent pieces.
    fn footprint(&self, report: &mut comm_core::transport::footprint::FootprintReport<'_>) {
        use comm_core::transport::footprint::{Purpose, Residence};
        report(
            Purpose::Fifo,
            Residence::Shared,
            self.inbound.mapped_bytes() as u64,
        );
        report(
            Purpose::Fifo,
            Residence::Mapped,
            self.outbound.mapped_bytes() as u64,
        );
        report(
            Purpose::Staging,
            Residence::Host,
            self.bounce.capacity() as u64,
        );
    }

    fn lane(&mut self) -> Option<&mut dyn comm_core::transport::lane::Lane> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use comm_core::wire::{Collective, Fingerprint};
    use comm_core::{DataType, ReduceOp};

    fn hdr(len: usize) -> PieceHeader {
        PieceHeader {
            checksum: None,
            comm_id: 1,
            seq: 1,
            len: len as u32,
            fingerprint: Some(Fingerprint {
                collective: Collective::AllReduce,
                dtype: DataType::Uint8,
                op: ReduceOp::Sum,
                root: -1,
                count: 0,
                settings: 0,
            }),
        }
    }

    #[test]
    fn fifo_orders_and_applies_backpressure() {
        let id = std::process::id() as u64 ^ 0xabc;
        let (in0, n0) = create_inbound(id, 1, 0, (2, 4096), true).unwrap();
        let (in1, n1) = create_inbound(id, 0, 1, (2, 4096), true).unwrap();
        let mut c0 = ShmConnection::new(0, 1, in0, Segment::open(&n1).unwrap());
        let mut c1 = ShmConnection::new(1, 0, in1, Segment::open(&n0).unwrap());
        c0.unlink();
        c1.unlink();
        assert!(c0
            .try_post_send(&hdr(3), Outgoing::copied(&[1, 2, 3]))
            .unwrap());
        assert!(c0.try_post_send(&hdr(0), Outgoing::copied(&[])).unwrap());
        assert!(
            !c0.try_post_send(&hdr(1), Outgoing::copied(&[9])).unwrap(),
            "two slots only"
        );
        let mut got = Vec::new();
        while c1
            .try_recv(Space::Host, &mut |h, p| {
                let d = p.host().expect("a host piece");
                assert_eq!(h.len as usize, d.len());
                got.push(d.to_vec());
                Ok(())
            })
            .unwrap()
        {}
        assert_eq!(got, vec![vec![1, 2, 3], vec![]]);
        assert!(c0.try_post_send(&hdr(1), Outgoing::copied(&[9])).unwrap());
        c0.abort(Some(5));
        // Pending data is still delivered, then the abort shows.
        assert!(c1
            .try_recv(Space::Host, &mut |_, p| {
                let d = p.host().expect("a host piece");
                assert_eq!(d, &[9]);
                Ok(())
            })
            .unwrap());
        let e = c1
            .try_recv(Space::Host, &mut |_, _| Ok(()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("aborted") && e.contains("rank 5"), "{e}");
    }

    fn pair(slots: usize) -> (ShmConnection, ShmConnection) {
        let id = std::process::id() as u64 ^ 0xc3a;
        let (in0, n0) = create_inbound(id, 1, 0, (slots, 4096), false).unwrap();
        let (in1, n1) = create_inbound(id, 0, 1, (slots, 4096), false).unwrap();
        let c0 = ShmConnection::new(0, 1, in0, Segment::open(&n1).unwrap());
        let c1 = ShmConnection::new(1, 0, in1, Segment::open(&n0).unwrap());
        c0.unlink();
        c1.unlink();
        (c0, c1)
    }

    fn drain(c: &mut ShmConnection) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        while c
            .try_recv(Space::Host, &mut |h, p| {
                let d = p.host().expect("a host piece");
                assert_eq!(h.len as usize, d.len());
                got.push(d.to_vec());
                Ok(())
            })
            .unwrap()
        {}
        got
    }

    #[test]
    fn lent_pieces_are_read_in_place_and_flush_waits_for_the_reader() {
        let (mut c0, mut c1) = pair(4);
        c0.enable_lending(1000);
        c1.enable_cma_reads();
        let big: Vec<u8> = (0..4096u32).map(|i| (i * 31 + 7) as u8).collect();
        let small = [5u8; 999];
        assert!(c0.flush().unwrap(), "nothing lent yet");
        // SAFETY: `big` and `small` outlive the flush below and are not changed.
        unsafe {
            assert!(c0
                .try_post_send(&hdr(big.len()), Outgoing::lent(&big))
                .unwrap());
            assert!(c0
                .try_post_send(&hdr(small.len()), Outgoing::lent(&small))
                .unwrap());
            assert!(c0
                .try_post_send(&hdr(10), Outgoing::lent(&big[100..110]))
                .unwrap());
        }
        assert!(!c0.flush().unwrap(), "the lent piece was not read yet");
        let got = drain(&mut c1);
        assert_eq!(
            got,
            vec![big.clone(), small.to_vec(), big[100..110].to_vec()]
        );
        assert!(c0.flush().unwrap(), "the reader released every lent piece");
    }

    /// A header asking for a checksum arrives with the CRC32C of the
    /// payload, computed by the sender's copy (slot) or read (lent piece);
    /// the value the caller put in is not what travels.
    #[test]
    fn checksummed_pieces_carry_the_crc_of_their_payload() {
        let (mut c0, mut c1) = pair(4);
        c0.enable_lending(2000);
        c1.enable_cma_reads();
        let big: Vec<u8> = (0..4096u32).map(|i| (i * 13 + 1) as u8).collect();
        let ask = PieceHeader {
            checksum: Some(0xdead_beef),
            ..hdr(big.len())
        };
        assert!(c0.try_post_send(&ask, Outgoing::copied(&big)).unwrap());
        // SAFETY: `big` outlives the flush below and is not changed.
        let lent = unsafe { Outgoing::lent(&big) };
        assert!(c0.try_post_send(&ask, lent).unwrap());
        assert!(c0
            .try_post_send(&hdr(3), Outgoing::copied(&big[..3]))
            .unwrap());
        let mut crcs = Vec::new();
        while c1
            .try_recv(Space::Host, &mut |h, p| {
                let d = p.host().expect("a host piece");
                assert_eq!(d, &big[..d.len()]);
                crcs.push(h.checksum);
                Ok(())
            })
            .unwrap()
        {}
        let want = Some(comm_core::wire::piece_checksum(&big));
        assert_eq!(crcs, vec![want, want, None]);
        assert!(c0.flush().unwrap());
    }

    #[test]
    fn lending_off_copies_and_an_unagreed_descriptor_is_an_error() {
        let (mut c0, mut c1) = pair(4);
        let big = vec![9u8; 4096];
        // SAFETY: `big` outlives the connection's use of it.
        let lent = unsafe { Outgoing::lent(&big) };
        assert!(c0.try_post_send(&hdr(big.len()), lent).unwrap());
        assert!(c0.flush().unwrap(), "a copied piece needs no flush");
        assert_eq!(drain(&mut c1), vec![big.clone()]);
        c0.enable_lending(1);
        // SAFETY: as above.
        let lent = unsafe { Outgoing::lent(&big) };
        assert!(c0.try_post_send(&hdr(big.len()), lent).unwrap());
        let e = c1
            .try_recv(Space::Host, &mut |_, _| Ok(()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("single copy was not agreed") && e.contains("peer rank 0"),
            "{e}"
        );
    }

    #[test]
    fn a_bad_lent_address_is_an_error_naming_the_peer() {
        let (mut c0, mut c1) = pair(2);
        c1.enable_cma_reads();
        // A descriptor of an address not mapped in the sender (written as
        // a lent `try_post_send` would, without lending invalid memory).
        c0.outbound.write_lent(c0.sent, &hdr(64), 8);
        c0.sent += 1;
        c0.outbound.head().store(c0.sent, Ordering::Release);
        let e = c1
            .try_recv(Space::Host, &mut |_, _| Ok(()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("peer rank 0") && e.contains("cross-memory read"),
            "{e}"
        );
    }

    #[test]
    fn a_peer_that_exited_after_sending_is_read_to_the_end_before_it_is_gone() {
        let id = std::process::id() as u64 ^ 0xdef;
        let (in0, n0) = create_inbound(id, 1, 0, (4, 4096), true).unwrap();
        let (in1, n1) = create_inbound(id, 0, 1, (4, 4096), true).unwrap();
        let mut c0 = ShmConnection::new(0, 1, in0, Segment::open(&n1).unwrap());
        let mut c1 = ShmConnection::new(1, 0, in1, Segment::open(&n0).unwrap());
        c0.unlink();
        c1.unlink();
        assert!(c0
            .try_post_send(&hdr(2), Outgoing::copied(&[4, 2]))
            .unwrap());
        // The sender's process is gone (pid 0x7ffffffe does not exist).
        c1.peer_pid = 0x7fff_fffe;
        c1.check_alive().expect("its last piece is still unread");
        assert!(c1
            .try_recv(Space::Host, &mut |_, p| {
                let d = p.host().expect("a host piece");
                assert_eq!(d, &[4, 2]);
                Ok(())
            })
            .unwrap());
        let e = c1.check_alive().unwrap_err().to_string();
        assert!(e.contains("rank 0 is gone"), "{e}");
    }

    /// shm moves host memory only: a device region posted or a device
    /// receive asked for is an error naming the transport, the peer and
    /// the memory kind (the setup keeps the executor from both).
    #[test]
    fn device_memory_is_refused_naming_transport_peer_and_kind() {
        let (mut c0, mut c1) = pair(2);
        assert_eq!(c0.memory_kinds(), &[MemoryKind::Host]);
        let queue = ();
        let region = comm_core::transport::DeviceRegion {
            queue: &queue,
            addr: 0x1000,
            len: 8,
        };
        let e = c0
            .try_post_send(&hdr(8), Outgoing::device(region))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("transport shm moves host memory only")
                && e.contains("a device piece was posted")
                && e.contains("peer rank 1"),
            "{e}"
        );
        let e = c1
            .try_recv(Space::Device(&queue), &mut |_, _| Ok(()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("transport shm")
                && e.contains("device piece was received")
                && e.contains("peer rank 0"),
            "{e}"
        );
        assert_eq!(
            c0.ready(&queue).unwrap(),
            Some(false),
            "staged through the host"
        );
    }

    #[test]
    fn stale_segments_of_dead_processes_are_removed() {
        // pid 0x7ffffffe does not exist.
        let name = segment_name(42, 0, 1, 0, 0x7fff_fffe).unwrap();
        let seg = Segment::create(&name, 2, 4096).unwrap();
        drop(seg);
        assert!(std::path::Path::new("/dev/shm").join(&name).exists());
        cleanup_stale();
        assert!(!std::path::Path::new("/dev/shm").join(&name).exists());
    }
}
