//! The small all-reduces' lane choice with ranks whose own connections
//! differ (src/comm/lane.rs). Its own test binary: it opens an emulated
//! device, which gives every communicator set up afterwards in the process
//! the device transport, and so no lanes, where `lanes.rs` expects them.

mod rank_kit;

use std::time::Duration;

use rank_kit::*;
use sncl::{Communicator, Config, ReduceOp};

/// Ranks whose own connections differ: ranks 0 and 1 may use the device
/// transport between them (an emulated device is open), rank 2 turns it off,
/// so all of rank 2's peers are over shm (lanes) while ranks 0 and 1 have
/// one peer without. Every rank must make the same choice for its small
/// all-reduces: before the choice came from the published records, rank 2
/// took the lanes and its peers the ordinary path, a mismatch (or a wait
/// until the deadline).
#[test]
fn ranks_whose_own_connections_differ_choose_alike() {
    let _ = sncl::device::open(sncl::device::Backend::Emu, 0);
    let store = sncl::MemoryStore::new();
    let n = 3;
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let store: std::sync::Arc<dyn sncl::Store> = std::sync::Arc::new(store.for_rank(r));
            let mut cfg = Config {
                timeout: Duration::from_secs(10),
                ..Config::default()
            };
            if r == 2 {
                cfg.nvlink.mode = sncl::NvlinkMode::Off;
            }
            std::thread::spawn(move || Communicator::init_with_store(store, r, n, 97, cfg))
        })
        .collect();
    let comms: Vec<Communicator> = hs.into_iter().map(|h| h.join().unwrap().unwrap()).collect();
    assert_eq!(
        comms[0].transports()[1],
        "nvlink",
        "{:?}",
        comms[0].transports()
    );
    assert_eq!(comms[2].transports(), ["shm", "shm", "self"]);
    let results = within(Duration::from_secs(60), "mixed kinds", move || {
        timed_on_ranks(&comms, |r, c| -> Result<String, String> {
            for i in 0..20u8 {
                let mut v = [r as u8 + i];
                c.all_reduce_in_place(&mut v[..], ReduceOp::Min)
                    .map_err(|e| format!("rank {r} op {i}: {e}"))?;
                if v != [i] {
                    return Err(format!("rank {r} op {i}: min {v:?}"));
                }
            }
            Ok(last_algorithm(c))
        })
    });
    let algos: Vec<String> = results
        .into_iter()
        .map(|(r, _)| r.unwrap_or_else(|e| panic!("{e}")))
        .collect();
    assert!(algos.iter().all(|a| *a == algos[0]), "{algos:?}");
    assert_ne!(algos[0], "one-shot", "lanes with a pair that has none");
}
