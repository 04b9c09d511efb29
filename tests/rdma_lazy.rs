//! RDMA connections made at their first use (`SNCL_RUNTIME_CONNECT=1`, the
//! default; issue 36, risk 7 and issue 34): ranks as threads, one per
//! emulated "node", so every pair is an RDMA pair. Init connects nothing;
//! a ring all-reduce connects each rank to its two neighbours only; a
//! tagged send connects its pair, a receive from any source connects the
//! peer that asks; `SNCL_RUNTIME_CONNECT=0` connects every pair at init; a
//! peer that aborted before connecting is named at once. (64 nodes:
//! tests/rdma_lazy_scale.rs, a binary of its own since it counts the
//! process's device contexts.)

use std::time::{Duration, Instant};

mod lazy_kit;
use lazy_kit::{connected, init, ring_all_reduce, tagged_off_the_ring};

#[test]
fn init_connects_nothing_and_operations_connect_only_their_peers() {
    let n = 8;
    let comms = init(n, 0x1a2c_0001, true);
    for c in &comms {
        assert!(c.transports().iter().filter(|k| **k == "rdma").count() == n - 1);
    }
    assert_eq!(connected(&comms), vec![0; n], "nothing connected at init");

    // A ring all-reduce: each rank talks to its two neighbours.
    ring_all_reduce(&comms, 100_000);
    assert_eq!(connected(&comms), vec![2; n], "only the ring's pairs");
    // Again: nothing new.
    ring_all_reduce(&comms, 1000);
    assert_eq!(connected(&comms), vec![2; n]);

    // A tagged message between ranks 0 and 4 (not ring neighbours)
    // connects that pair; a receive from any source on rank 5 connects the
    // peer that sends to it (rank 1).
    tagged_off_the_ring(&comms);
    let after = connected(&comms);
    assert_eq!(after, vec![3, 3, 2, 2, 3, 3, 2, 2], "{after:?}");
}

#[test]
fn runtime_connect_0_connects_every_pair_at_init() {
    let n = 4;
    let comms = init(n, 0x1a2c_0002, false);
    assert_eq!(connected(&comms), vec![n - 1; n]);
    ring_all_reduce(&comms, 1000);
}

#[test]
fn a_peer_that_aborted_before_connecting_is_named_at_once() {
    let comms = init(2, 0x1a2c_0003, true);
    comms[1].abort();
    // Rank 1 notes its abort at its next call (it holds no connection to
    // tell rank 0 through).
    assert!(comms[1].barrier().is_err());
    let t0 = Instant::now();
    let e = comms[0]
        .send_tagged(&[1u8; 8], 1, 1)
        .unwrap_err()
        .to_string();
    let took = t0.elapsed();
    assert!(e.contains("rank 1") && e.contains("aborted"), "{e}");
    assert!(took < Duration::from_secs(5), "named after {took:?}: {e}");
}

#[test]
fn a_peer_gone_before_connecting_is_named_within_seconds() {
    let mut comms = init(2, 0x1a2c_0005, true);
    // Rank 1 goes away (its standby store with it) before rank 0 ever
    // needed it.
    drop(comms.pop());
    let t0 = Instant::now();
    let e = comms[0]
        .send_tagged(&[1u8; 8], 1, 1)
        .unwrap_err()
        .to_string();
    let took = t0.elapsed();
    assert!(e.contains("rank 1") && e.contains("gone"), "{e}");
    assert!(took < Duration::from_secs(5), "named after {took:?}: {e}");
    eprintln!("a peer gone before its first use named after {took:?}: {e}");
}
