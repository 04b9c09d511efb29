//! TCP pairs connected at their first use (`SNCL_RUNTIME_CONNECT=1` and at
//! least `SNCL_RUNTIME_CONNECT_TCP_RANKS` ranks, 64 by default; issue 34):
//! ranks as threads over TCP. Init connects nothing; a ring all-reduce
//! connects each rank to its two neighbours; tagged messages and a receive
//! from any source connect their pairs; below the threshold every pair is
//! connected at init; a peer that aborted or went away before connecting
//! is named within seconds; 64 ranks (the default threshold) time their
//! init and first all-reduce.

use std::time::{Duration, Instant};

use comm_core::algo::Algorithm;
use comm_core::config::TransportChoice;
use comm_core::wire::Collective;
use sncl::{Communicator, Config};

mod lazy_kit;
use lazy_kit::{connected, ring_all_reduce, tagged_off_the_ring};

/// TCP between every pair, all-reduces on the ring, TCP lazy from
/// `lazy_from` ranks.
fn config(lazy_from: usize) -> Config {
    Config {
        timeout: Duration::from_secs(60),
        transport: TransportChoice::Tcp,
        runtime_connect_tcp_ranks: lazy_from,
        algo: vec![(Collective::AllReduce, Algorithm::Ring)],
        ..Config::default()
    }
}

#[test]
fn init_connects_nothing_and_operations_connect_only_their_peers() {
    let n = 8;
    let comms = Communicator::init_threads(n, config(2)).expect("init");
    assert_eq!(connected(&comms), vec![0; n], "nothing connected at init");
    ring_all_reduce(&comms, 100_000);
    assert_eq!(connected(&comms), vec![2; n], "only the ring's pairs");
    ring_all_reduce(&comms, 1000);
    assert_eq!(connected(&comms), vec![2; n]);
    // A tagged message between ranks 0 and 4 (not ring neighbours), and a
    // receive from any source on rank 5 that rank 1 sends to.
    tagged_off_the_ring(&comms);
    let after = connected(&comms);
    assert_eq!(after, vec![3, 3, 2, 2, 3, 3, 2, 2], "{after:?}");
    // An all-to-all talks to everyone: the rest connect, in batches whose
    // sockets may arrive before their batch (kept, not refused).
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let send: Vec<u32> = (0..n as u32).map(|p| c.rank() as u32 * 100 + p).collect();
                let mut recv = vec![0u32; n];
                c.alltoall(&send[..], &mut recv[..]).unwrap();
                let want: Vec<u32> = (0..n as u32).map(|p| p * 100 + c.rank() as u32).collect();
                assert_eq!(recv, want);
            });
        }
    });
    assert_eq!(connected(&comms), vec![n - 1; n]);
    ring_all_reduce(&comms, 50_000);
}

#[test]
fn below_the_threshold_every_pair_connects_at_init() {
    let n = 4;
    let comms = Communicator::init_threads(n, config(5)).expect("init");
    assert_eq!(connected(&comms), vec![n - 1; n]);
    ring_all_reduce(&comms, 1000);
}

#[test]
fn a_peer_that_aborted_or_left_before_connecting_is_named_within_seconds() {
    let mut comms = Communicator::init_threads(3, config(2)).expect("init");
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
    // Rank 2 goes away (its standby store with it) before rank 0 needed it.
    drop(comms.pop());
    let mut fresh = Communicator::init_threads(2, config(2)).expect("init");
    drop(fresh.pop());
    let t0 = Instant::now();
    let e = fresh[0]
        .send_tagged(&[1u8; 8], 1, 1)
        .unwrap_err()
        .to_string();
    let took = t0.elapsed();
    assert!(e.contains("rank 1") && e.contains("gone"), "{e}");
    assert!(took < Duration::from_secs(5), "named after {took:?}: {e}");
}

#[test]
fn sixty_four_ranks_connect_two_peers_each_for_a_ring() {
    let n = 64;
    let t0 = Instant::now();
    let comms =
        Communicator::init_threads(n, config(sncl::RUNTIME_CONNECT_TCP_RANKS)).expect("init");
    let init = t0.elapsed();
    assert_eq!(connected(&comms), vec![0; n], "the default threshold is 64");
    let t1 = Instant::now();
    ring_all_reduce(&comms, 1024);
    let first = t1.elapsed();
    let per_rank = connected(&comms);
    assert!(per_rank.iter().all(|&c| c <= 2), "{per_rank:?}");
    eprintln!(
        "64 ranks over TCP, threads: init {:.0} ms, first ring all-reduce {:.0} ms (connects \
         {} pairs), {} connections per rank",
        init.as_secs_f64() * 1e3,
        first.as_secs_f64() * 1e3,
        per_rank.iter().sum::<usize>() / 2,
        per_rank[0]
    );
}
