//! The `nvlink` transport between processes on the emulated device (each
//! process its own emulated device; inboxes shared through `/dev/shm` as
//! CUDA IPC shares device memory): the collectives on 2, 3 and 4
//! processes, and a peer that dies in the middle of an operation (the
//! others fail with an error naming it, well before the deadline).
//!
//! The test binary runs itself as the ranks (`NVLINK_TEST_ROLE`).

mod device_kit;
mod nvlink_common;

use std::process::Child;
use std::time::{Duration, Instant};

use device_kit::{assert_names_dead_peer, join_ranks as join, run_case, spawn_ranks, spawned_rank};
use nvlink_common::{bind, cases, config};
use sncl::device::DeviceBuffer;
use sncl::{Communicator, DataType, ReduceOp};

const ROLE: &str = "NVLINK_TEST_ROLE";
const TIMEOUT: Duration = Duration::from_secs(20);

/// A child rank: joins the communicator named in the environment and
/// plays its role; panics (non-zero exit) on a failure.
fn child(role: &str) {
    let (rank, n, id) = spawned_rank("NVLINK_TEST");
    let cfg = sncl::Config {
        timeout: TIMEOUT,
        ..config()
    };
    let comm = Communicator::init_rank_with_config(&id, rank, n, cfg).expect("init");
    let r = bind(comm);
    match role {
        "matrix" => {
            for c in cases(&[7, 20_011]) {
                run_case(&r, &c).unwrap_or_else(|e| panic!("rank {rank}: {e}"));
            }
            eprintln!("rank {rank}/{n}: matrix ok");
        }
        "death" => {
            let count = 4 << 20;
            let buf = DeviceBuffer::new(&r.dev, count * 4).expect("buffer");
            // One operation that completes (the links are up), then one
            // the last rank leaves in the middle of.
            for i in 0..2 {
                let start = Instant::now();
                // SAFETY: `buf` lives until the process exits.
                let w = unsafe {
                    r.comm.all_reduce_device_raw(
                        buf.ptr(),
                        buf.ptr(),
                        count,
                        DataType::Float32,
                        ReduceOp::Sum,
                        r.stream,
                    )
                }
                .expect("enqueue");
                if i == 1 && rank == n - 1 {
                    std::thread::sleep(Duration::from_millis(30));
                    eprintln!("rank {rank}: dying in the middle of the operation");
                    std::process::exit(0);
                }
                let res = w.wait();
                if i == 0 {
                    res.expect("the first all_reduce");
                    continue;
                }
                let e = res
                    .expect_err("the peer died: the operation fails")
                    .to_string();
                let took = start.elapsed();
                assert_names_dead_peer(rank, &e, n - 1, took, TIMEOUT);
            }
        }
        other => panic!("unknown role {other}"),
    }
}

fn spawn(n: usize, role: &str, test: &str) -> Vec<Child> {
    spawn_ranks(n, test, "NVLINK_TEST", &[(ROLE, role)])
}

#[test]
fn nvlink_processes_2_3_4() {
    if let Ok(role) = std::env::var(ROLE) {
        return child(&role);
    }
    for n in [2, 3, 4] {
        let results = join(spawn(n, "matrix", "nvlink_processes_2_3_4"));
        for (rank, ok, text) in &results {
            assert!(ok, "n={n} rank {rank} failed:\n{text}");
            assert!(text.contains("matrix ok"), "n={n} rank {rank}:\n{text}");
        }
        eprintln!("n={n}: every process ok");
    }
}

#[test]
fn nvlink_peer_death_mid_operation_names_the_peer() {
    if let Ok(role) = std::env::var(ROLE) {
        return child(&role);
    }
    let start = Instant::now();
    let results = join(spawn(
        3,
        "death",
        "nvlink_peer_death_mid_operation_names_the_peer",
    ));
    for (rank, ok, text) in &results {
        assert!(ok, "rank {rank} failed:\n{text}");
        if *rank < 2 {
            assert!(text.contains("failed after"), "rank {rank}:\n{text}");
        }
        eprintln!("rank {rank}:\n{text}");
    }
    assert!(start.elapsed() < TIMEOUT + Duration::from_secs(10));
}
