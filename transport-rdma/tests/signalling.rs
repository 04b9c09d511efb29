//! Issue 36, risk 10: the NIC work per piece, as the strict emulated
//! provider counts it. 64 MiB go one way through the staging copy in
//! 512 KiB slots (128 pieces): the sender rings one doorbell per piece and
//! signals one work request in four; the receiver's credits cost one
//! doorbell per half FIFO. Every byte is checked.

mod common;

use std::time::{Duration, Instant};

use comm_core::transport::{Connection, Outgoing, Space};
use common::*;
use transport_rdma::RdmaConnection;

const SLOT_BYTES: usize = 512 << 10;
/// A piece's bytes: a slot less the piece header.
const PIECE: usize = SLOT_BYTES - comm_core::wire::HEADER_BYTES;
const PIECES: usize = (64 << 20) / SLOT_BYTES;

/// Sends `pieces` staged pieces of `len` bytes from `a` to `b`, checking
/// every byte, until the sender's last writes completed.
fn stream(a: &mut RdmaConnection, b: &mut RdmaConnection, pieces: usize, len: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut sent, mut got) = (0, 0);
    while got < pieces {
        assert!(Instant::now() < deadline, "sent {sent}, got {got}");
        while sent < pieces {
            let data = payload(0, 1, sent, len);
            let h = header(len, sent as u64 + 1);
            if !a.try_post_send(&h, Outgoing::copied(&data)).unwrap() {
                break;
            }
            sent += 1;
        }
        a.flush().unwrap();
        while b
            .try_recv(Space::Host, &mut |h, p| {
                assert_eq!(h.seq, got as u64 + 1);
                assert!(
                    p.host().expect("a host piece") == payload(0, 1, got, len).as_slice(),
                    "piece {got}"
                );
                Ok(())
            })
            .unwrap()
        {
            got += 1;
        }
    }
    // The sender finishes its last writes (its NIC would by itself).
    while !a.flush().unwrap() {
        assert!(Instant::now() < deadline);
    }
}

#[test]
fn staged_pieces_ring_one_doorbell_each_and_signal_one_in_four() {
    let strict = transport_rdma::IbSettings {
        emulate_strict: true,
        ..settings(1)
    };
    let (mut a, mut b) = pair_with(8, SLOT_BYTES, strict);
    let (a0, b0) = (a.verbs_counters(), b.verbs_counters());
    stream(&mut a, &mut b, PIECES, PIECE);
    let (a1, b1) = (a.verbs_counters(), b.verbs_counters());
    let pieces = PIECES as f64;
    let per_piece = |n: u64| n as f64 / pieces;
    let doorbells = per_piece(a1.doorbells - a0.doorbells);
    let completions = per_piece(a1.send_completions - a0.send_completions);
    let credits = per_piece(b1.doorbells - b0.doorbells);
    eprintln!(
        "{PIECES} pieces of {PIECE} bytes: sender {doorbells:.3} doorbells and {completions:.3} \
         signalled completions per piece; receiver {credits:.3} credit doorbells per piece"
    );
    assert!(doorbells <= 1.0, "{doorbells} doorbells per piece");
    assert!(
        completions <= 0.25 + 1.0 / pieces,
        "{completions} completions per piece"
    );
    assert!(
        credits <= 0.25 + 1.0 / pieces,
        "{credits} credit doorbells per piece"
    );
}

/// A staging slot is reused only once a completion covering the WRITE
/// that read it was polled, not as soon as the peer credits it
/// (ibv_post_send(3); the strict provider fails a WRITE whose source
/// changed before that completion). With 4 QPs over 8 slots a piece's
/// slot comes round after two more WRITEs on its QP, before the one in
/// four that is signalled: the connection posts a signalled zero-length
/// WRITE (a fence) instead of overwriting the slot.
#[test]
fn a_staging_slot_waits_for_the_completion_of_the_write_that_read_it() {
    const SMALL: usize = 64 << 10;
    let strict = transport_rdma::IbSettings {
        emulate_strict: true,
        ..settings(4)
    };
    let (mut a, mut b) = pair_with(8, SMALL, strict);
    let piece = SMALL - comm_core::wire::HEADER_BYTES;
    stream(&mut a, &mut b, 256, piece);
}

/// Issue 36, risk 10: `SNCL_IB_QPS_PER_CONN=auto` (the default) gives a
/// RoCE port 2 queue pairs per peer (ECMP spreads them over paths) and
/// other ports 1; an explicit count is kept.
#[test]
fn auto_queue_pairs_per_peer_are_two_on_roce_and_one_elsewhere() {
    let auto = |strict| transport_rdma::IbSettings {
        emulate_strict: strict,
        qps_per_conn: 0,
        ..settings(1)
    };
    let (a, _b) = pair_with(4, 64 << 10, auto(true));
    assert_eq!(a.qp_numbers().len(), 2, "the strict port is RoCE");
    let (a, _b) = pair_with(4, 64 << 10, auto(false));
    assert_eq!(a.qp_numbers().len(), 1, "the permissive emulation");
    let three = transport_rdma::IbSettings {
        qps_per_conn: 3,
        ..auto(true)
    };
    let (a, _b) = pair_with(4, 64 << 10, three);
    assert_eq!(a.qp_numbers().len(), 3);
}
