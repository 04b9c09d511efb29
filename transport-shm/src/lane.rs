//! The lane of a shared-memory connection (`comm_core::transport::lane`):
//! this side writes its lines into the outbound segment and takes the
//! peer's from the inbound one. What each side knows of the other's
//! progress is cached here; the segments hold only the lines and the
//! acknowledgement words ([`crate::segment`]).

use std::sync::atomic::Ordering;

use comm_core::transport::lane::{Lane, LANE_PAYLOAD_BYTES};
use comm_core::transport::TransportError;
use comm_core::wire::{Fingerprint, PieceHeader};

use crate::segment::LANE_PAYLOAD;
use crate::ShmConnection;

const _: () = assert!(LANE_PAYLOAD >= LANE_PAYLOAD_BYTES);

/// What one side of a connection knows of its lanes.
#[derive(Default)]
pub(crate) struct LaneState {
    /// The last operation whose line this side took from the peer.
    taken: u64,
    /// The last operation whose line the peer is known to have taken.
    acked: u64,
    /// The operation each of this side's two lines holds.
    written: [u64; 2],
}

impl Lane for ShmConnection {
    fn post(
        &mut self,
        seq: u64,
        fingerprint: &Fingerprint,
        payload: &[u8],
    ) -> Result<bool, TransportError> {
        if payload.len() > LANE_PAYLOAD_BYTES || seq == 0 {
            return Err(TransportError::Corrupt {
                peer: self.peer,
                detail: format!(
                    "a lane line of {} bytes for operation {seq}: expected 1 to \
                     {LANE_PAYLOAD_BYTES} bytes and a sequence number from 1",
                    payload.len()
                ),
            });
        }
        let parity = (seq & 1) as usize;
        let before = self.lane.written[parity];
        if before > self.lane.acked {
            // Not learnt from the peer's lines (they carry its
            // acknowledgement): read its word.
            let word = self.outbound.lane_ack().load(Ordering::Acquire);
            self.lane.acked = self.lane.acked.max(word);
            if before > self.lane.acked {
                if let Some(e) = self.aborted_by_peer() {
                    return Err(e);
                }
                return Ok(false);
            }
        }
        self.outbound
            .write_lane(seq, self.lane.taken, &fingerprint.encode(), payload);
        self.lane.written[parity] = seq;
        Ok(true)
    }

    fn take(
        &mut self,
        seq: u64,
        payload: &mut [u8],
    ) -> Result<Option<Fingerprint>, TransportError> {
        let Some(line) = self.inbound.read_lane(seq) else {
            if let Some(e) = self.aborted_by_peer() {
                return Err(e);
            }
            return Ok(None);
        };
        let fingerprint =
            Fingerprint::decode(&line.fingerprint).map_err(|e| TransportError::Corrupt {
                peer: self.peer,
                detail: format!("lane line of operation {seq}: {e}"),
            })?;
        let n = payload.len().min(LANE_PAYLOAD);
        payload[..n].copy_from_slice(&line.payload[..n]);
        self.lane.taken = seq;
        self.lane.acked = self.lane.acked.max(line.ack);
        self.inbound.lane_ack().store(seq, Ordering::Release);
        Ok(Some(fingerprint))
    }

    fn peek(&self, seq: u64) -> Option<Fingerprint> {
        let line = self.inbound.read_lane(seq)?;
        Fingerprint::decode(&line.fingerprint).ok()
    }

    fn next_piece(&self) -> Option<PieceHeader> {
        if !self.inbound.is_published(self.received) {
            return None;
        }
        self.inbound.read_slot(self.received).ok().map(|(h, _)| h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment::Segment;
    use comm_core::transport::Connection;
    use comm_core::wire::Collective;
    use comm_core::{DataType, ReduceOp};

    fn pair() -> (ShmConnection, ShmConnection) {
        let id = std::process::id() as u64 ^ 0x1a9e;
        let (in0, n0) = crate::create_inbound(id, 1, 0, (4, 4096), false).unwrap();
        let (in1, n1) = crate::create_inbound(id, 0, 1, (4, 4096), false).unwrap();
        let c0 = ShmConnection::new(0, 1, in0, Segment::open(&n1).unwrap());
        let c1 = ShmConnection::new(1, 0, in1, Segment::open(&n0).unwrap());
        c0.unlink();
        c1.unlink();
        (c0, c1)
    }

    fn fp(count: u64) -> Fingerprint {
        Fingerprint {
            collective: Collective::AllReduce,
            dtype: DataType::Uint8,
            op: ReduceOp::Sum,
            root: -1,
            count,
            settings: 0,
        }
    }

    fn take(c: &mut ShmConnection, seq: u64) -> Option<(Fingerprint, Vec<u8>)> {
        let mut b = [0u8; 8];
        let f = c.take(seq, &mut b).unwrap()?;
        Some((f, b.to_vec()))
    }

    #[test]
    fn lines_cross_both_ways_by_parity_many_times() {
        let (mut a, mut b) = pair();
        for seq in 1..=1000u64 {
            let (x, y) = (seq.to_le_bytes(), (!seq).to_le_bytes());
            assert!(a.post(seq, &fp(seq), &x).unwrap());
            assert!(b.post(seq, &fp(seq), &y).unwrap());
            assert_eq!(take(&mut b, seq), Some((fp(seq), x.to_vec())));
            assert_eq!(take(&mut a, seq), Some((fp(seq), y.to_vec())));
            // Taken lines are not taken again as a later operation's.
            assert_eq!(take(&mut a, seq + 2), None);
        }
    }

    #[test]
    fn a_writer_never_overwrites_a_line_its_peer_has_not_taken() {
        let (mut a, mut b) = pair();
        assert!(a.post(1, &fp(1), &[1]).unwrap());
        assert!(a.post(2, &fp(1), &[2]).unwrap());
        // Operation 3 goes into operation 1's line, which b has not read.
        assert!(!a.post(3, &fp(1), &[3]).unwrap());
        assert_eq!(take(&mut b, 1).map(|t| t.1[0]), Some(1));
        // b's acknowledgement word lets it through (a read none of b's lines).
        assert!(a.post(3, &fp(1), &[3]).unwrap());
        assert!(
            !a.post(4, &fp(1), &[4]).unwrap(),
            "operation 2 not taken yet"
        );
        assert_eq!(take(&mut b, 2).map(|t| t.1[0]), Some(2));
        assert_eq!(take(&mut b, 3).map(|t| t.1[0]), Some(3));
        // Acknowledgements also ride in b's own lines.
        assert!(b.post(1, &fp(1), &[9]).unwrap());
        assert!(take(&mut a, 1).is_some());
        assert!(a.post(4, &fp(1), &[4]).unwrap());
    }

    #[test]
    fn peeks_see_lines_and_pieces_without_taking_them() {
        let (mut a, mut b) = pair();
        assert_eq!(b.peek(5), None);
        assert!(a.post(5, &fp(7), &[5]).unwrap());
        assert_eq!(b.peek(5), Some(fp(7)));
        assert_eq!(b.peek(7), None, "a stamp names one operation");
        assert_eq!(take(&mut b, 5).map(|t| t.0), Some(fp(7)));
        assert_eq!(b.next_piece(), None);
        let h = PieceHeader {
            checksum: None,
            comm_id: 3,
            seq: 6,
            len: 1,
            fingerprint: Some(fp(1)),
        };
        let piece = comm_core::transport::Outgoing::copied(&[1]);
        assert!(a.try_post_send(&h, piece).unwrap());
        assert_eq!(b.next_piece(), Some(h));
        assert_eq!(b.next_piece(), Some(h), "still unread");
    }

    #[test]
    fn an_aborted_peer_and_bytes_that_are_no_fingerprint_are_errors() {
        let (mut a, mut b) = pair();
        a.outbound.write_lane(1, 0, &[0xff; 16], &[1]);
        let e = b.take(1, &mut [0u8; 1]).unwrap_err().to_string();
        assert!(e.contains("lane line of operation 1"), "{e}");
        assert!(
            a.post(0, &fp(1), &[1]).is_err(),
            "sequence numbers start at 1"
        );
        assert!(a.post(1, &fp(1), &[0; 33]).is_err(), "33 bytes");
        b.abort(Some(0));
        let e = a.take(1, &mut [0u8; 1]).unwrap_err().to_string();
        assert!(e.contains("aborted"), "{e}");
    }
}
