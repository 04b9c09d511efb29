//! Setup refuses shared-memory segment names a peer publishes when they are
//! paths, links or not text, and says which rank, which peer and what was
//! wrong; the configuration's bounds match the transports' own limits; a
//! late rank joins within `SNCL_INIT_TIMEOUT_MS`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sncl::{Communicator, Config, Error, MemoryStore, Store};

const NODE: &str = "setup-hardening-node";

/// Runs rank 0 of 2 while a fake rank 1 on the same node publishes `name`
/// as the segment rank 0 must open; returns rank 0's error.
fn init_with_peer_segment_name(name: &[u8]) -> Error {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).unwrap();
    let comm_id = u64::from_ne_bytes(b);
    let config = Config {
        node_id: Some(NODE.to_string()),
        timeout: Duration::from_secs(10),
        ..Config::default()
    };
    let store = MemoryStore::new();
    let prefix = format!("sncl/{comm_id:016x}");
    let info = format!("{NODE}\n127.0.0.1:9\n{}", config.shared_digest());
    store
        .set(&format!("{prefix}/info/1"), info.as_bytes())
        .unwrap();
    store.set(&format!("{prefix}/shm/0/1"), name).unwrap();
    let rank0: Arc<dyn Store> = Arc::new(store.for_rank(0));
    match Communicator::init_with_store(rank0, 0, 2, comm_id, config) {
        Ok(_) => panic!(
            "rank 0 opened peer segment {:?}",
            String::from_utf8_lossy(name)
        ),
        Err(e) => e,
    }
}

#[test]
fn a_path_published_as_a_segment_name_is_refused() {
    for bad in ["../etc/passwd", "/etc/passwd", "sncl-../x"] {
        let e = init_with_peer_segment_name(bad.as_bytes());
        let s = e.to_string();
        assert!(matches!(e, Error::Bootstrap { rank: 0, .. }), "{s}");
        assert!(s.contains("peer rank 1") && s.contains(bad), "{s}");
    }
}

#[test]
fn a_non_utf8_segment_name_is_refused() {
    let e = init_with_peer_segment_name(b"sncl-\xff\xfe");
    let s = e.to_string();
    assert!(matches!(e, Error::Bootstrap { rank: 0, .. }), "{s}");
    assert!(s.contains("peer rank 1") && s.contains("not UTF-8"), "{s}");
}

#[test]
fn a_link_published_as_a_segment_name_is_refused() {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).unwrap();
    let name = format!(
        "sncl-test-link-{:016x}-{}",
        u64::from_ne_bytes(b),
        std::process::id()
    );
    let link = Path::new(transport_shm::SHM_DIR).join(&name);
    std::os::unix::fs::symlink("/etc/passwd", &link).unwrap();
    let e = init_with_peer_segment_name(name.as_bytes());
    let _ = std::fs::remove_file(&link);
    let s = e.to_string();
    assert!(matches!(e, Error::Io { rank: 0, .. }), "{s}");
    assert!(
        s.contains("peer rank 1") && s.contains(&name) && s.contains("symbolic link"),
        "{s}"
    );
}

// comm-core cannot see transport-tcp, so the bounds it applies to the
// environment are checked against the transport's own limits here.
const _: () = assert!(comm_core::config::MAX_NSOCKS == transport_tcp::MAX_NSOCKS);
const _: () = assert!(comm_core::config::MAX_TCP_PIECE_BYTES <= transport_tcp::MAX_PIECE_LIMIT);

#[test]
fn largest_slots_and_slot_bytes_together_exceed_the_segment_bound() {
    let c = Config {
        shm: sncl::ShmSettings {
            slots: comm_core::config::MAX_SHM_SLOTS,
            slot_bytes: comm_core::config::MAX_SHM_SLOT_BYTES,
            ..Default::default()
        },
        ..Config::default()
    };
    let e = c
        .validate()
        .expect_err("over MAX_SHM_SEGMENT_BYTES")
        .to_string();
    assert!(
        e.contains("SNCL_SHM_SLOTS") && e.contains("SNCL_SHM_SLOT_BYTES"),
        "{e}"
    );
}

/// Rank 0 serves the store; destroying its communicator right after
/// creation must not take the store away from ranks still reading the
/// setup's last key (they used to fail with "the root closed the
/// connection").
#[test]
fn rank_0_destroying_a_fresh_communicator_does_not_fail_its_peers_creation() {
    for round in 0..20 {
        let id = sncl::Communicator::unique_id("127.0.0.1:0".parse().unwrap()).unwrap();
        let ranks: Vec<_> = (0..4)
            .map(|rank| {
                std::thread::spawn(move || {
                    let comm = sncl::Communicator::init_rank(&id, rank, 4)?;
                    if rank == 0 {
                        drop(comm);
                    } else {
                        // Peers stay a moment, as a peer that is slower to
                        // leave setup would.
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                    Ok::<(), Error>(())
                })
            })
            .collect();
        for (rank, h) in ranks.into_iter().enumerate() {
            if let Err(e) = h.join().unwrap() {
                panic!("round {round}: rank {rank}'s creation failed: {e}");
            }
        }
    }
}

/// Ranks arrive with the launcher's skew: a rank 800 ms late joins a
/// communicator whose operation timeout is 200 ms when
/// `SNCL_INIT_TIMEOUT_MS` covers the skew, and the communicator then runs
/// under the short timeout; without it, creation fails within the
/// operation timeout (the old and default behaviour).
#[test]
fn a_late_rank_joins_within_the_init_timeout() {
    use std::time::Instant;
    let run = |init_timeout: Duration| {
        let id = sncl::Communicator::unique_id("127.0.0.1:0".parse().unwrap()).unwrap();
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                std::thread::spawn(move || {
                    if rank == 1 {
                        std::thread::sleep(Duration::from_millis(800));
                    }
                    let config = Config {
                        timeout: Duration::from_millis(200),
                        init_timeout,
                        ..Config::default()
                    };
                    let t0 = Instant::now();
                    let comm = Communicator::init_rank_with_config(&id, rank, 2, config)
                        .map_err(|e| (t0.elapsed(), e.to_string()))?;
                    let mut x = [rank as f32 + 1.0; 8];
                    comm.all_reduce_in_place(&mut x, sncl::ReduceOp::Sum)
                        .map_err(|e| (t0.elapsed(), e.to_string()))?;
                    assert_eq!(x, [3.0; 8], "rank {rank}");
                    Ok::<(), (Duration, String)>(())
                })
            })
            .collect();
        ranks
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    };
    for (rank, r) in run(Duration::from_secs(10)).into_iter().enumerate() {
        if let Err((t, e)) = r {
            panic!("rank {rank} failed after {t:?} with a 10 s init timeout: {e}");
        }
    }
    let (t, e) = run(Duration::ZERO)
        .into_iter()
        .next()
        .unwrap()
        .expect_err("rank 0 waited 800 ms for rank 1 under a 200 ms timeout");
    assert!(
        t < Duration::from_millis(700),
        "rank 0 failed only after {t:?}: {e}"
    );
    assert!(
        e.contains("rank 0") && e.contains("SNCL_INIT_TIMEOUT_MS"),
        "the error names the rank and the setting that bounds creation: {e}"
    );
}
