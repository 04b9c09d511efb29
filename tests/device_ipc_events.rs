//! The kernel path's lane between processes that share a device without
//! MPS (`src/device/window/ipc_events.rs`): each round's steps ordered
//! between the processes by IPC events, no kernel spinning on another
//! process's kernel. Runs on the `cuda` backend only — on the strict CUDA
//! driver model, whose default is "no MPS" (`cuda-model/tests/
//! device_path.rs` runs this binary there), or on a GPU without MPS: the
//! emulated device runs every process's kernels at once (as MPS does), so
//! its ranks take the spinning kernels instead, and this test says so and
//! skips.
//!
//! * every collective of the lane (f32 and bf16; sum, bf16 avg) at counts
//!   from 1 element to several rounds of a 4 KiB lane, on 2 and 3
//!   processes, bit for bit against the host collectives of the same
//!   communicator, in place for the all-reduce too;
//! * ranks calling different operations (counts 100 and 60) both fail,
//!   each naming the other, well before the deadline, and write nothing;
//! * a peer killed, or aborting, while its peers wait for its part: they
//!   fail naming it well before the deadline.
//!
//! The test binary runs itself as the ranks (`IPC_EVENTS_TEST_ROLE`).

mod device_kit;

use std::time::{Duration, Instant};

use device_kit::{
    all_reduce_device, assert_names_dead_peer, bind_rank, cases_of, join_ranks, kill_this_process,
    run_case, spawn_ranks, spawned_rank, test_backend,
};
use sncl::device::Backend;
use sncl::{Collective, Communicator, Config};

const ROLE: &str = "IPC_EVENTS_TEST_ROLE";
const TIMEOUT: Duration = Duration::from_secs(20);

/// Why this process cannot run the test (printed by the parent), if so.
fn skip_reason() -> Option<String> {
    if test_backend() != Backend::Cuda {
        return Some(
            "the IPC-event lane needs the cuda backend (SNCL_TEST_DEVICE=cuda on the strict \
             driver model, or on a GPU without MPS): the emulated device runs the processes' \
             kernels at once, as MPS does"
                .into(),
        );
    }
    let dev = match sncl::device::open(Backend::Cuda, 0) {
        Ok(d) => d,
        Err(e) => return Some(format!("no CUDA device: {e}")),
    };
    dev.mps_enabled()
        .then(|| "MPS is on: processes sharing the device take the spinning kernels".into())
}

fn child(role: &str) {
    let (rank, n, id) = spawned_rank("IPC_EVENTS_TEST");
    let cfg = Config {
        timeout: TIMEOUT,
        // Several rounds from a few thousand elements on.
        device: comm_core::config::DeviceSettings {
            lane_bytes: 4096,
            ..Default::default()
        },
        ..Default::default()
    };
    let comm = Communicator::init_rank_with_config(&id, rank, n, cfg).expect("init");
    let r = bind_rank(comm);
    match role {
        "matrix" => {
            let colls = [
                Collective::AllReduce,
                Collective::ReduceScatter,
                Collective::AllGather,
                Collective::Broadcast,
                Collective::Reduce,
                Collective::AllToAll,
                Collective::Gather,
                Collective::Scatter,
            ];
            let cases = cases_of(&colls, &[1, 7, 1003, 5000]);
            for c in &cases {
                run_case(&r, c).unwrap_or_else(|e| panic!("rank {rank}: {c:?}: {e}"));
            }
            // In place, several rounds: every rank's sum of 1..=n.
            let count = 3000;
            let ones: Vec<f32> = vec![(rank + 1) as f32; count];
            let bytes: Vec<u8> = ones.iter().flat_map(|v| v.to_le_bytes()).collect();
            let sync = || {
                let deadline = Instant::now() + TIMEOUT;
                r.dev.synchronize(r.stream, deadline).expect("stream");
            };
            // SAFETY: `bytes` outlives the synchronisation; the buffer holds it.
            unsafe {
                r.dev
                    .copy_h2d_async(r.send.ptr(), bytes.as_ptr(), bytes.len(), r.stream)
            }
            .expect("upload");
            sync();
            all_reduce_device(&r, &r.send, count).unwrap_or_else(|e| panic!("rank {rank}: {e}"));
            let mut back = vec![0u8; bytes.len()];
            // SAFETY: `back` outlives the synchronisation.
            unsafe {
                r.dev
                    .copy_d2h_async(back.as_mut_ptr(), r.send.ptr(), back.len(), r.stream)
            }
            .expect("download");
            sync();
            let want = (n * (n + 1) / 2) as f32;
            for (i, v) in back.chunks_exact(4).enumerate() {
                let got = f32::from_le_bytes(v.try_into().expect("4 bytes"));
                assert_eq!(got, want, "rank {rank}: element {i} in place");
            }
            let counts = r.comm.direct_all_reduces();
            let expected = cases.len() as u64 + 1;
            assert_eq!(
                counts.kernel_path_ipc_events, expected,
                "rank {rank}: every device collective ordered by IPC events: {counts:?}"
            );
            eprintln!("rank {rank}/{n}: ipc-events matrix ok");
        }
        "mismatch" => {
            all_reduce_device(&r, &r.send, 8).expect("a first all-reduce sets the lane up");
            let count = if rank == 0 { 100 } else { 60 };
            let pattern: Vec<u8> = (0..count * 4).map(|i| (i % 251) as u8).collect();
            let sync = || {
                let deadline = Instant::now() + TIMEOUT;
                r.dev.synchronize(r.stream, deadline).expect("stream");
            };
            // SAFETY: `pattern` outlives the synchronisation.
            unsafe {
                r.dev
                    .copy_h2d_async(r.recv.ptr(), pattern.as_ptr(), pattern.len(), r.stream)
            }
            .expect("upload");
            sync();
            let start = Instant::now();
            let e = all_reduce_device(&r, &r.recv, count)
                .expect_err("the ranks called different operations");
            let took = start.elapsed();
            // The stream goes on, and the buffer holds what it held.
            let mut back = vec![0u8; pattern.len()];
            // SAFETY: `back` outlives the synchronisation.
            unsafe {
                r.dev
                    .copy_d2h_async(back.as_mut_ptr(), r.recv.ptr(), back.len(), r.stream)
            }
            .expect("download");
            sync();
            assert!(
                back == pattern,
                "rank {rank}: the failed call wrote its buffer"
            );
            let peer = 1 - rank;
            assert!(
                e.contains("different operations") && e.contains(&format!("rank {peer}")),
                "rank {rank}: {e}"
            );
            assert!(
                took < TIMEOUT / 2,
                "rank {rank}: failed after {took:?}: {e}"
            );
            eprintln!("rank {rank}: mismatch named after {took:?}: {e}");
        }
        "death" | "abort" => {
            // One all-reduce completes; then the last rank leaves (SIGKILL,
            // or an abort) instead of calling the next one, while its peers
            // wait in the enqueue for its part.
            all_reduce_device(&r, &r.send, 8).expect("a first all-reduce");
            let last = n - 1;
            if rank == last {
                std::thread::sleep(Duration::from_millis(300));
                if role == "abort" {
                    r.comm.abort();
                    eprintln!("rank {rank}: aborted");
                    std::thread::sleep(Duration::from_secs(2));
                    return;
                }
                eprintln!("rank {rank}: killing itself while its peers wait");
                kill_this_process();
            }
            let start = Instant::now();
            let e = all_reduce_device(&r, &r.send, 1000).expect_err("the last rank left");
            assert_names_dead_peer(rank, &e, last, start.elapsed(), TIMEOUT / 4);
        }
        other => panic!("unknown role {other}"),
    }
}

/// Runs `role` as `n` rank processes; every rank must succeed (but one
/// that kills itself: `killed`).
fn run_ranks(n: usize, role: &str, test: &str, killed: Option<usize>) {
    let results = join_ranks(spawn_ranks(n, test, "IPC_EVENTS_TEST", &[(ROLE, role)]));
    for (rank, ok, text) in &results {
        eprintln!("n={n} rank {rank}:\n{text}");
        if Some(*rank) == killed {
            assert!(!ok, "rank {rank} was killed");
        } else {
            assert!(ok, "n={n} rank {rank} failed:\n{text}");
        }
    }
}

#[test]
fn every_lane_collective_between_processes_without_mps() {
    if let Ok(role) = std::env::var(ROLE) {
        return child(&role);
    }
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    for n in [2, 3] {
        run_ranks(
            n,
            "matrix",
            "every_lane_collective_between_processes_without_mps",
            None,
        );
    }
}

#[test]
fn ranks_calling_different_operations_fail_naming_each_other() {
    if let Ok(role) = std::env::var(ROLE) {
        return child(&role);
    }
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    run_ranks(
        2,
        "mismatch",
        "ranks_calling_different_operations_fail_naming_each_other",
        None,
    );
}

/// A peer that dies (SIGKILL) or aborts instead of calling the next
/// collective: its peers, waiting in the enqueue for its part, fail within
/// a quarter of the deadline naming it (its process is gone, or its board
/// says its lane broke), not at the deadline.
#[test]
fn a_peer_that_dies_or_aborts_is_named_before_the_deadline() {
    if let Ok(role) = std::env::var(ROLE) {
        return child(&role);
    }
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let test = "a_peer_that_dies_or_aborts_is_named_before_the_deadline";
    run_ranks(3, "death", test, Some(2));
    run_ranks(2, "abort", test, None);
}
