//! Host shared-memory transport: between two ranks of one node, one FIFO of
//! slots per direction in `/dev/shm`, created by the receiver. The receiver
//! hands each piece to the executor as a slice of the slot itself, so a
//! reduction reads the peer's data where it landed (one copy in total: the
//! sender's into the slot).
//!
//! Life cycle: the receiver creates its inbound segments (mode `0600`) under
//! names holding a random token and ending in its pid; once every sender has opened them (the communicator's init
//! barrier) the names are unlinked, so nothing is left behind even if a
//! process crashes later. Segments left by a crash during init are found by
//! [`cleanup_stale`] (their creator pid is gone) and removed.

pub mod private_file;
mod segment;

use std::io;
use std::sync::atomic::Ordering;

use comm_core::transport::{Connection, ConsumeResult, TransportError};
use comm_core::wire::PieceHeader;
use comm_core::Error;

pub use private_file::{check_name, MAX_NAME_LEN, PREFIX, SEGMENT_MODE, SHM_DIR};
#[doc(hidden)]
pub use segment::decode_slot_header;
pub use segment::{cleanup_stale, pid_alive, Segment};

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

/// Creates the inbound segment for data from `from` to `to` (this rank).
pub fn create_inbound(
    comm_id: u64,
    from: usize,
    to: usize,
    slots: usize,
    slot_bytes: usize,
) -> io::Result<(Segment, String)> {
    let instance = INSTANCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = segment_name(comm_id, from, to, instance, std::process::id())?;
    let seg = Segment::create(&name, slots, slot_bytes)?;
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
}

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
        }
    }

    /// Removes the names of both segments (the mappings stay).
    pub fn unlink(&self) {
        self.inbound.unlink();
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

    fn max_piece(&self) -> usize {
        self.outbound.slot_bytes()
    }

    fn try_send(&mut self, header: &PieceHeader, data: &[u8]) -> Result<bool, TransportError> {
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
        self.outbound.write_slot(self.sent, header, data);
        self.sent += 1;
        self.outbound.head().store(self.sent, Ordering::Release);
        Ok(true)
    }

    fn try_recv(
        &mut self,
        consume: &mut dyn FnMut(&PieceHeader, &[u8]) -> ConsumeResult,
    ) -> Result<bool, Error> {
        if self.received == self.posted {
            self.posted = self.inbound.head().load(Ordering::Acquire);
            if self.received == self.posted {
                if let Some(e) = self.aborted_by_peer() {
                    return Err(Error::Transport {
                        rank: self.rank,
                        source: e,
                    });
                }
                return Ok(false);
            }
        }
        let (h, data) = self
            .inbound
            .read_slot(self.received)
            .map_err(|d| Error::Transport {
                rank: self.rank,
                source: TransportError::Corrupt {
                    peer: self.peer,
                    detail: d.to_string(),
                },
            })?;
        consume(&h, data)?;
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
            fingerprint: Fingerprint {
                collective: Collective::AllReduce,
                dtype: DataType::Uint8,
                op: ReduceOp::Sum,
                root: -1,
                count: 0,
            },
        }
    }

    #[test]
    fn fifo_orders_and_applies_backpressure() {
        let id = std::process::id() as u64 ^ 0xabc;
        let (in0, n0) = create_inbound(id, 1, 0, 2, 4096).unwrap();
        let (in1, n1) = create_inbound(id, 0, 1, 2, 4096).unwrap();
        let mut c0 = ShmConnection::new(0, 1, in0, Segment::open(&n1).unwrap());
        let mut c1 = ShmConnection::new(1, 0, in1, Segment::open(&n0).unwrap());
        c0.unlink();
        c1.unlink();
        assert!(c0.try_send(&hdr(3), &[1, 2, 3]).unwrap());
        assert!(c0.try_send(&hdr(0), &[]).unwrap());
        assert!(!c0.try_send(&hdr(1), &[9]).unwrap(), "two slots only");
        let mut got = Vec::new();
        while c1
            .try_recv(&mut |h, d| {
                assert_eq!(h.len as usize, d.len());
                got.push(d.to_vec());
                Ok(())
            })
            .unwrap()
        {}
        assert_eq!(got, vec![vec![1, 2, 3], vec![]]);
        assert!(c0.try_send(&hdr(1), &[9]).unwrap());
        c0.abort(Some(5));
        // Pending data is still delivered, then the abort shows.
        assert!(c1
            .try_recv(&mut |_, d| {
                assert_eq!(d, &[9]);
                Ok(())
            })
            .unwrap());
        let e = c1.try_recv(&mut |_, _| Ok(())).unwrap_err().to_string();
        assert!(e.contains("aborted") && e.contains("rank 5"), "{e}");
    }

    #[test]
    fn a_peer_that_exited_after_sending_is_read_to_the_end_before_it_is_gone() {
        let id = std::process::id() as u64 ^ 0xdef;
        let (in0, n0) = create_inbound(id, 1, 0, 4, 4096).unwrap();
        let (in1, n1) = create_inbound(id, 0, 1, 4, 4096).unwrap();
        let mut c0 = ShmConnection::new(0, 1, in0, Segment::open(&n1).unwrap());
        let mut c1 = ShmConnection::new(1, 0, in1, Segment::open(&n0).unwrap());
        c0.unlink();
        c1.unlink();
        assert!(c0.try_send(&hdr(2), &[4, 2]).unwrap());
        // The sender's process is gone (pid 0x7ffffffe does not exist).
        c1.peer_pid = 0x7fff_fffe;
        c1.check_alive().expect("its last piece is still unread");
        assert!(c1
            .try_recv(&mut |_, d| {
                assert_eq!(d, &[4, 2]);
                Ok(())
            })
            .unwrap());
        let e = c1.check_alive().unwrap_err().to_string();
        assert!(e.contains("rank 0 is gone"), "{e}");
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
