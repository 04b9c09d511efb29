//! Issue 36's scale target on the emulated provider: 64 "nodes" × 1 rank
//! (threads of this process, one per node, so every pair is an RDMA pair).
//! Alone in its test binary, because it counts the process's device
//! contexts.

use std::time::Instant;

mod lazy_kit;
use lazy_kit::{connected, init, ring_all_reduce};

/// Issue 36's target: 64 emulated nodes × 1 rank; init completes with one
/// device context (this process's; each rank would have its own process on
/// a cluster: tests/emulated.rs in transport-rdma checks 1 per process) and
/// no connection; a ring all-reduce then connects 2 peers per rank.
#[test]
fn sixty_four_nodes_init_without_connections() {
    let n = 64;
    let t0 = Instant::now();
    let comms = init(n, 0x1a2c_0004, true);
    let init_took = t0.elapsed();
    assert_eq!(connected(&comms), vec![0; n]);
    assert_eq!(
        transport_rdma::emu::contexts_open(),
        0,
        "no connection, no context yet"
    );
    let t1 = Instant::now();
    ring_all_reduce(&comms, 4096);
    let first_op = t1.elapsed();
    assert_eq!(connected(&comms), vec![2; n]);
    assert_eq!(
        transport_rdma::emu::contexts_open(),
        1,
        "one device context for the process's 128 connections"
    );
    eprintln!(
        "64 ranks (threads, emulated RDMA): init {init_took:?}, first ring all-reduce (connects \
         128 pairs) {first_op:?}"
    );
}
