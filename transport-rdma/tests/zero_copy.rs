//! Lent pieces (`Outgoing::lent`) are RDMA-written straight from
//! the user's buffer through a registration cache (emulated verbs, which
//! register on demand): data arrives intact, one registration serves every
//! piece of a buffer and later operations on it, `flush` holds the buffer
//! until the writes completed, small pieces and `SNCL_IB_ZERO_COPY=0` keep
//! the staging copy.

mod common;

use std::time::{Duration, Instant};

use comm_core::transport::{Connection, Outgoing, Space};
use comm_core::wire::HEADER_BYTES;
use common::*;
use transport_rdma::{IbSettings, RdmaConnection, ZeroCopy};

const SLOT_BYTES: usize = (256 << 10) + HEADER_BYTES;
const PIECE: usize = SLOT_BYTES - HEADER_BYTES;

/// Sends `buf` in pieces as the executor would (lent), receives them on
/// `b`, and checks every byte; returns when `a` has flushed.
fn send_lent(a: &mut RdmaConnection, b: &mut RdmaConnection, buf: &[u8], seq0: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let pieces: Vec<&[u8]> = buf.chunks(PIECE).collect();
    let (mut sent, mut got) = (0, 0);
    while got < pieces.len() {
        assert!(
            Instant::now() < deadline,
            "stalled at {sent} sent, {got} received"
        );
        if sent < pieces.len() {
            let p = pieces[sent];
            // SAFETY: `buf` is borrowed, unchanged, until `a.flush()` is
            // true below.
            if a.try_post_send(&header(p.len(), seq0 + sent as u64), unsafe {
                Outgoing::lent(p)
            })
            .unwrap()
            {
                sent += 1;
            }
        }
        while b
            .try_recv(Space::Host, &mut |h, p| {
                let d = p.host().expect("a host piece");
                assert_eq!(h.seq, seq0 + got as u64);
                assert!(d == pieces[got], "piece {got} differs");
                Ok(())
            })
            .unwrap()
        {
            got += 1;
        }
        a.flush().unwrap();
    }
    while !a.flush().unwrap() {
        assert!(Instant::now() < deadline, "lent writes never completed");
    }
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len).map(|i| (i * 131 + salt as usize) as u8).collect()
}

#[test]
fn lent_pieces_are_written_from_the_users_buffer_and_registered_once() {
    let (mut a, mut b) = pair(8, SLOT_BYTES, 2);
    assert_eq!(
        a.zero_copy(),
        ZeroCopy::OnDemand,
        "the emulation registers on demand"
    );
    let mut buf = pattern(3 << 20, 1);
    send_lent(&mut a, &mut b, &buf, 1);
    let (made, bytes) = a.registrations();
    // 3 MiB in 2 MiB-aligned windows: at most 3 windows.
    assert!((1..=3).contains(&made), "{made} registrations");
    assert!(bytes >= 3 << 20, "{bytes} bytes registered");
    // The same buffer again, changed: no new registration, new contents.
    buf.iter_mut().for_each(|x| *x = x.wrapping_add(7));
    send_lent(&mut a, &mut b, &buf, 100);
    assert_eq!(a.registrations().0, made, "the cache was not used");
    // Another buffer registers its own windows: 4 MiB allocated while the
    // first one lives cannot lie inside the first one's windows (which
    // reach less than 2 MiB past either of its ends), wherever the
    // allocator puts it (tests of this binary run in parallel).
    let other = pattern(4 << 20, 9);
    drop(buf);
    send_lent(&mut a, &mut b, &other, 200);
    assert!(a.registrations().0 > made);
}

#[test]
fn small_lent_pieces_and_zero_copy_off_use_the_staging_copy() {
    let (mut a, mut b) = pair(8, SLOT_BYTES, 1);
    let small = pattern(40 << 10, 3);
    send_lent(&mut a, &mut b, &small, 1);
    assert_eq!(a.registrations().0, 0, "a 40 KiB piece was registered");

    let off = IbSettings {
        zero_copy: Some(false),
        ..settings(1)
    };
    let (mut a, mut b) = pair_with(8, SLOT_BYTES, off);
    assert_eq!(a.zero_copy(), ZeroCopy::Off);
    let big = pattern(2 << 20, 5);
    send_lent(&mut a, &mut b, &big, 1);
    assert_eq!(a.registrations().0, 0);
}

#[test]
fn the_registration_cache_stays_within_its_limit() {
    let limited = IbSettings {
        reg_cache_mb: 2,
        ..settings(1)
    };
    let (mut a, mut b) = pair_with(8, SLOT_BYTES, limited);
    for k in 0..4u8 {
        let buf = pattern(3 << 20, k);
        send_lent(&mut a, &mut b, &buf, 1 + 100 * k as u64);
        assert!(
            a.registrations().1 <= 2 << 20,
            "{} bytes registered after flush (limit 2 MiB)",
            a.registrations().1
        );
    }
}

#[test]
fn an_abort_waits_for_lent_writes_then_returns() {
    let (mut a, mut b) = pair(8, SLOT_BYTES, 1);
    let buf = pattern(1 << 20, 4);
    let mut sent = 0;
    for (i, p) in buf.chunks(PIECE).enumerate() {
        // SAFETY: `buf` outlives the abort below, which waits for the writes.
        if a.try_post_send(&header(p.len(), i as u64 + 1), unsafe { Outgoing::lent(p) })
            .unwrap()
        {
            sent += 1;
        }
    }
    assert!(sent > 0);
    let t = Instant::now();
    a.abort(Some(0));
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "abort took {:?}",
        t.elapsed()
    );
    // Nothing lent is in flight any more: flush reports drained.
    assert!(a.flush().unwrap_or(true));
    // The pieces sent before the abort still arrive, then the abort shows.
    let mut got = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        assert!(
            Instant::now() < deadline,
            "the abort never reached the receiver"
        );
        match b.try_recv(Space::Host, &mut |_, _| Ok(())) {
            Ok(true) => got += 1,
            Ok(false) => {}
            Err(e) => {
                assert!(e.to_string().contains("aborted"), "{e}");
                break;
            }
        }
    }
    assert_eq!(got, sent);
}

/// Issue 36, risk 10: a lent piece's payload and header go to the NIC as
/// one chain — one doorbell per piece, not two (the emulated provider
/// counts). The payload is signalled (`flush` waits for it).
#[test]
fn a_lent_piece_rings_one_doorbell() {
    let (mut a, mut b) = pair(8, SLOT_BYTES, 1);
    let buf = pattern(40 * PIECE, 3);
    send_lent(&mut a, &mut b, &buf, 1); // warm: registrations made
    let before = a.verbs_counters();
    send_lent(&mut a, &mut b, &buf, 1000);
    let after = a.verbs_counters();
    let pieces = buf.len().div_ceil(PIECE) as u64;
    let doorbells = after.doorbells - before.doorbells;
    let wrs = after.send_wrs - before.send_wrs;
    eprintln!("{pieces} pieces: {doorbells} doorbells, {wrs} send work requests");
    assert!(wrs >= 2 * pieces, "payload and header per piece: {wrs}");
    // The sender's doorbells: one per piece (credits go the other way).
    assert!(
        doorbells <= pieces,
        "{doorbells} doorbells for {pieces} pieces"
    );
}

/// Issue 36, risk 8: on the strict device an on-demand registration's
/// first touch by a WRITE faults and stalls the QP (about 1 ms, as ODP
/// does on a NIC); the registration cache asks for a prefetch
/// (`ibv_advise_mr`) of each window it lends from, so a fresh buffer's
/// first pass takes no fault.
#[test]
fn a_fresh_lent_buffer_takes_no_odp_fault_on_the_strict_device() {
    let strict = IbSettings {
        emulate_strict: true,
        ..settings(1)
    };
    let (mut a, mut b) = pair_with(8, SLOT_BYTES, strict);
    assert_eq!(a.zero_copy(), ZeroCopy::OnDemand);
    let buf = pattern(8 << 20, 4);
    let t0 = Instant::now();
    send_lent(&mut a, &mut b, &buf, 1);
    let took = t0.elapsed();
    let faults = a.verbs_counters().odp_faults;
    eprintln!(
        "8 MiB in {} lent pieces, first pass: {faults} ODP faults, {took:?}",
        buf.len().div_ceil(PIECE)
    );
    assert_eq!(faults, 0, "a lent piece's pages were not prefetched");
}
