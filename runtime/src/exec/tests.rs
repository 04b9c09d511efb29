//! The executor's piece checks: communicator, fingerprint and checksum
//! mismatches are errors naming both sides.

use super::*;
use crate::schedule::{BufId, Region};
use crate::transport::registry::MemoryKind;
use crate::transport::{Outgoing, Payload, Space};
use crate::wire::{Collective, Fingerprint, PieceHeader};
use kernels::DataType;

/// Delivers pieces with the given headers, in order, each once; sends are
/// swallowed.
struct OnePiece {
    peer: usize,
    headers: std::collections::VecDeque<PieceHeader>,
    max_piece: usize,
}

impl Connection for OnePiece {
    fn peer(&self) -> usize {
        self.peer
    }
    fn max_piece(&self, _: MemoryKind) -> usize {
        self.max_piece
    }
    fn try_post_send(&mut self, _: &PieceHeader, _: Outgoing<'_>) -> Result<bool> {
        Ok(true)
    }
    fn try_recv(
        &mut self,
        _: Space<'_>,
        consume: &mut dyn FnMut(&PieceHeader, Payload<'_>) -> crate::transport::ConsumeResult,
    ) -> Result<bool> {
        let Some(header) = self.headers.pop_front() else {
            return Ok(false);
        };
        let data = vec![0u8; header.len as usize];
        consume(&header, Payload::Host(&data))?;
        Ok(true)
    }
    fn abort(&mut self, _: Option<usize>) {}
    fn kind(&self) -> &'static str {
        "test"
    }
}

fn recv_one(ours: u64, theirs: u64, their_fp: Fingerprint) -> Result<()> {
    recv_checked(ours, theirs, their_fp, false, None)
}

/// Receives one 8-byte piece of zeros whose header carries `sent`, on
/// a rank that checksums pieces when `checksum`.
fn recv_checked(
    ours: u64,
    theirs: u64,
    their_fp: Fingerprint,
    checksum: bool,
    sent: Option<u32>,
) -> Result<()> {
    recv_len(8, (ours, theirs), their_fp, checksum, sent)
}

/// As [`recv_checked`], for a piece of `len` zeros.
fn recv_len(
    len: usize,
    (ours, theirs): (u64, u64),
    their_fp: Fingerprint,
    checksum: bool,
    sent: Option<u32>,
) -> Result<()> {
    let ctx = OpContext {
        rank: 0,
        nranks: 2,
        comm_id: ours,
        seq: 3,
        fingerprint: sendrecv_fp(),
        dtype: DataType::Uint8,
        op: ReduceOp::Sum,
        timeout: Duration::from_secs(5),
        spin: Duration::ZERO,
        checksum,
    };
    let header = PieceHeader {
        checksum: sent,
        comm_id: theirs,
        seq: 3,
        fingerprint: Some(their_fp),
        len: len as u32,
    };
    recv_pieces(&ctx, len, vec![header], 1 << 20)
}

fn sendrecv_fp() -> Fingerprint {
    Fingerprint {
        collective: Collective::SendRecv,
        dtype: DataType::Uint8,
        op: ReduceOp::Sum,
        root: -1,
        count: 0,
        settings: 0,
    }
}

#[test]
fn checksummed_pieces_are_verified() {
    let fp = sendrecv_fp();
    let good = crate::wire::piece_checksum(&[0u8; 8]);
    recv_checked(7, 7, fp, true, Some(good)).expect("a matching CRC32C passes");
    // A receiver that does not checksum still verifies what it is given.
    let e = recv_checked(7, 7, fp, false, Some(good ^ 1)).expect_err("a bad CRC32C fails");
    let msg = e.to_string();
    assert!(
        matches!(
            e,
            Error::PeerFailed {
                failed_rank: Some(1),
                ..
            }
        ),
        "{e:?}"
    );
    for want in [
        "rank 0",
        "peer rank 1",
        "CRC32C",
        "bytes 0..8 of 8",
        "seq 3",
    ] {
        assert!(msg.contains(want), "{msg:?} lacks {want:?}");
    }
    let e = recv_checked(7, 7, fp, true, None).expect_err("a missing checksum fails");
    assert!(e.to_string().contains("SNCL_CHECKSUM"), "{e}");
}

/// A piece of several checksum blocks is verified as a whole while it
/// is written block by block.
#[test]
fn multi_block_pieces_are_verified_whole() {
    let fp = sendrecv_fp();
    let len = 2 * crate::wire::CHECKSUM_BLOCK + 5;
    let good = crate::wire::piece_checksum(&vec![0u8; len]);
    recv_len(len, (7, 7), fp, true, Some(good)).expect("a matching CRC32C passes");
    let e =
        recv_len(len, (7, 7), fp, true, Some(good ^ 0x8000_0000)).expect_err("a bad CRC32C fails");
    assert!(
        e.to_string().contains(&format!("bytes 0..{len} of {len}")),
        "{e}"
    );
}

#[test]
fn comm_id_mismatch_names_both_ids() {
    let e = recv_one(0x1111_2222_3333_4444, 0xaaaa_bbbb_cccc_dddd, sendrecv_fp())
        .expect_err("a piece of another communicator must fail");
    assert!(
        matches!(
            e,
            Error::CommMismatch {
                rank: 0,
                peer: 1,
                seq: 3,
                ours: 0x1111_2222_3333_4444,
                theirs: 0xaaaa_bbbb_cccc_dddd,
                their_seq: 3,
                ..
            }
        ),
        "{e:?}"
    );
    let msg = e.to_string();
    for want in [
        "rank 0",
        "peer rank 1",
        "seq 3",
        "1111222233334444",
        "aaaabbbbccccdddd",
    ] {
        assert!(msg.contains(want), "{msg:?} lacks {want:?}");
    }
}

#[test]
fn same_comm_other_collective_is_a_fingerprint_mismatch() {
    let mut theirs = sendrecv_fp();
    theirs.collective = Collective::AllReduce;
    let e = recv_one(7, 7, theirs).expect_err("a different collective must fail");
    assert!(matches!(e, Error::Mismatch { peer: 1, .. }), "{e:?}");
    recv_one(7, 7, sendrecv_fp()).expect("a matching piece is received");
}

/// Receives a message of `len` bytes from rank 1 (pieces of at most
/// `max_piece`), delivered as `headers` say.
fn recv_pieces(
    ctx: &OpContext,
    len: usize,
    headers: Vec<PieceHeader>,
    max_piece: usize,
) -> Result<()> {
    let mut sched = Schedule::new(2, 0);
    sched.push(vec![Op::Recv {
        peer: 1,
        dst: Region::new(BufId::Peer(0), 0, len),
    }]);
    let mut dst = vec![0u8; len];
    // SAFETY: `dst` outlives the execution and nothing else touches it;
    // the other buffers are empty.
    let bufs = unsafe {
        Buffers::new(
            std::ptr::NonNull::dangling().as_ptr(),
            0,
            std::ptr::NonNull::dangling().as_ptr(),
            0,
            std::ptr::NonNull::dangling().as_ptr(),
            0,
        )
        .with_peer_buffers(vec![(dst.as_mut_ptr(), dst.len())])
    };
    let conn = OnePiece {
        peer: 1,
        headers: headers.into(),
        max_piece,
    };
    let mut conns: Vec<Option<Box<dyn Connection>>> = vec![None, Some(Box::new(conn))];
    execute(&sched, ctx, &bufs, &mut conns, None, None)
}

/// The fingerprint travels once per message: a continuation piece without
/// it is accepted; a first piece without it, a continuation of another
/// operation, or a continuation with another fingerprint are refused.
#[test]
fn fingerprint_is_checked_once_per_message() {
    let ctx = OpContext {
        rank: 0,
        nranks: 2,
        comm_id: 7,
        seq: 3,
        fingerprint: sendrecv_fp(),
        dtype: DataType::Uint8,
        op: ReduceOp::Sum,
        timeout: Duration::from_secs(5),
        spin: Duration::ZERO,
        checksum: false,
    };
    let piece = |seq: u64, fingerprint: Option<Fingerprint>| PieceHeader {
        checksum: None,
        comm_id: 7,
        seq,
        fingerprint,
        len: 8,
    };
    let fp = Some(sendrecv_fp());
    recv_pieces(&ctx, 16, vec![piece(3, fp), piece(3, None)], 8)
        .expect("first piece with the fingerprint, then a short one");
    recv_pieces(&ctx, 16, vec![piece(3, fp), piece(3, fp)], 8)
        .expect("a fingerprint on every piece is fine too");
    let e = recv_pieces(&ctx, 16, vec![piece(3, None), piece(3, None)], 8)
        .expect_err("a first piece needs the fingerprint");
    assert!(
        matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains("first piece"),
        "{e}"
    );
    let e = recv_pieces(&ctx, 16, vec![piece(3, fp), piece(4, None)], 8)
        .expect_err("a continuation of another operation");
    assert!(e.to_string().contains("its seq 4"), "{e}");
    let mut other = sendrecv_fp();
    other.collective = Collective::AllReduce;
    let e = recv_pieces(&ctx, 16, vec![piece(3, fp), piece(3, Some(other))], 8)
        .expect_err("another fingerprint later in the message");
    assert!(matches!(e, Error::Mismatch { peer: 1, .. }), "{e:?}");
}
