//! nvlink version 2 on the emulated device: device windows and the direct
//! all-reduce kernels (`kernels/cuda/sncl_direct.cu`, compiled for the host)
//! between rank processes whose windows are shared as CUDA IPC shares
//! device memory (`/dev/shm`).
//!
//! * correctness on 2, 3 and 4 processes: one-shot and two-shot (and the
//!   planner's choice), f32 sum and max, bf16 avg, several counts with odd
//!   ones, in place and out of place, compared bit for bit with the host
//!   all-reduce of the same communicator;
//! * a peer SIGKILLed while its peers wait in the kernel: the survivors
//!   fail within the deadline with an error naming it;
//! * a device failure on one rank at the launch (the emulated device's
//!   injected fault, standing in for a kernel that fails to compile; the
//!   NVRTC compile checks of the source are in device/tests/nvrtc_kernels.rs):
//!   every rank fails naming that rank, and that rank names its device.
//!
//! The test binary runs itself as the ranks (`DIRECT_TEST_ROLE`).

mod device_kit;
mod nvlink_common;

use std::process::Child;
use std::time::{Duration, Instant};

use device_kit::{
    assert_names_dead_peer, input, join_ranks as join, kill_this_process, spawn_ranks,
    spawned_rank, Rank,
};
use nvlink_common::{bind, config};
use sncl::device::{DeviceWindow, DirectAlgo, DirectChoice};
use sncl::{Collective, Communicator, DataType, RawOp, ReduceOp};

const ROLE: &str = "DIRECT_TEST_ROLE";
const TIMEOUT: Duration = Duration::from_secs(20);

/// Elements of the largest case (f32): 64 Ki + 3.
const MAX_COUNT: usize = (64 << 10) + 3;

/// Writes `bytes` into `win`, all-reduces, reads `out` (or `win` in place)
/// back; the host all-reduce of the same inputs must give the same bits.
fn window_case(
    r: &Rank,
    (win, out): (&DeviceWindow, Option<&DeviceWindow>),
    (dtype, op, count): (DataType, ReduceOp, usize),
    choice: DirectChoice,
) -> Result<DirectAlgo, String> {
    let (n, rank) = (r.comm.size(), r.comm.rank());
    let send = input(dtype, rank, count);
    let mut want = vec![0u8; send.len()];
    let mut raw = RawOp::new(Collective::AllReduce, dtype, count);
    raw.op = op;
    raw.send = send.as_ptr();
    raw.recv = want.as_mut_ptr();
    // SAFETY: both vectors cover `count` elements and outlive the call.
    unsafe { r.comm.run_raw(&raw) }.map_err(|e| format!("host: {e}"))?;
    let deadline = || Instant::now() + Duration::from_secs(60);
    let junk = vec![0x5au8; send.len()];
    // SAFETY: the host vectors outlive the synchronisations below; the
    // windows hold `count` elements (the caller sized them).
    unsafe {
        r.dev
            .copy_h2d_async(win.ptr(), send.as_ptr(), send.len(), r.stream)
            .map_err(|e| e.to_string())?;
        if let Some(o) = out {
            r.dev
                .copy_h2d_async(o.ptr(), junk.as_ptr(), junk.len(), r.stream)
                .map_err(|e| e.to_string())?;
        }
    }
    let algo = win.kind_for(dtype, count, choice);
    win.all_reduce(out, count, dtype, op, choice, r.stream)
        .map_err(|e| format!("direct {algo:?}: {e}"))?;
    let mut got = vec![0u8; send.len()];
    let mut kept = vec![0u8; send.len()];
    // SAFETY: as above.
    unsafe {
        let res = out.unwrap_or(win);
        r.dev
            .copy_d2h_async(got.as_mut_ptr(), res.ptr(), got.len(), r.stream)
            .map_err(|e| e.to_string())?;
        r.dev
            .copy_d2h_async(kept.as_mut_ptr(), win.ptr(), kept.len(), r.stream)
            .map_err(|e| e.to_string())?;
    }
    r.dev
        .synchronize(r.stream, deadline())
        .map_err(|e| e.to_string())?;
    let what = format!(
        "rank {rank}/{n} {algo:?} {} {} count {count} {}",
        dtype.name(),
        op.name(),
        if out.is_some() {
            "out of place"
        } else {
            "in place"
        }
    );
    if got != want {
        let first = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
        return Err(format!(
            "{what}: differs from the host's at byte {first} of {}",
            got.len()
        ));
    }
    if out.is_some() && kept != send {
        return Err(format!("{what}: the input changed"));
    }
    Ok(algo)
}

/// The matrix one rank runs (every rank the same, in the same order).
fn matrix(r: &Rank) {
    let rank = r.comm.rank();
    let bytes = MAX_COUNT * 4;
    let a = r.comm.alloc_device_window(bytes).expect("window a");
    let b = r.comm.alloc_device_window(bytes).expect("window b");
    let mut seen = std::collections::BTreeSet::new();
    for count in [1, 7, 1000, 20_011, MAX_COUNT] {
        for (dtype, op) in [
            (DataType::Float32, ReduceOp::Sum),
            (DataType::Bfloat16, ReduceOp::Avg),
            (DataType::Float32, ReduceOp::Max),
        ] {
            for choice in [
                DirectChoice::OneShot,
                DirectChoice::TwoShot,
                DirectChoice::Auto,
            ] {
                for out in [None, Some(&b)] {
                    let algo = window_case(r, (&a, out), (dtype, op, count), choice)
                        .unwrap_or_else(|e| panic!("rank {rank}: {e}"));
                    seen.insert(format!("{algo:?}"));
                }
            }
        }
    }
    // Host collectives still run between direct ones (stream order).
    assert_eq!(seen.len(), 2, "{seen:?}");
    eprintln!("rank {rank}/{}: direct matrix ok", r.comm.size());
}

/// A child rank: joins the communicator named in the environment and
/// plays its role; panics (non-zero exit) on a failure.
fn child(role: &str) {
    let (rank, n, id) = spawned_rank("DIRECT_TEST");
    let cfg = sncl::Config {
        timeout: TIMEOUT,
        ..config()
    };
    let comm = Communicator::init_rank_with_config(&id, rank, n, cfg).expect("init");
    let r = bind(comm);
    match role {
        "matrix" => matrix(&r),
        "death" => {
            let count = 100_000;
            let win = r.comm.alloc_device_window(count * 4).expect("window");
            // One operation that completes, then one the last rank never
            // joins: it is SIGKILLed while its peers wait in the kernel.
            for choice in [DirectChoice::TwoShot, DirectChoice::OneShot] {
                let start = Instant::now();
                if choice == DirectChoice::OneShot && rank == n - 1 {
                    std::thread::sleep(Duration::from_millis(200));
                    eprintln!("rank {rank}: killing itself while its peers wait");
                    kill_this_process();
                }
                let res = win.all_reduce(
                    None,
                    count,
                    DataType::Float32,
                    ReduceOp::Sum,
                    choice,
                    r.stream,
                );
                if choice == DirectChoice::TwoShot {
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
    spawn_ranks(n, test, "DIRECT_TEST", &[(ROLE, role)])
}

#[test]
fn direct_all_reduce_processes_2_3_4() {
    if let Ok(role) = std::env::var(ROLE) {
        return child(&role);
    }
    for n in [2, 3, 4] {
        let start = Instant::now();
        let results = join(spawn(n, "matrix", "direct_all_reduce_processes_2_3_4"));
        for (rank, ok, text) in &results {
            assert!(ok, "n={n} rank {rank} failed:\n{text}");
            assert!(
                text.contains("direct matrix ok"),
                "n={n} rank {rank}:\n{text}"
            );
        }
        eprintln!("n={n}: every process ok in {:?}", start.elapsed());
    }
}

#[test]
fn direct_peer_killed_mid_operation_is_named() {
    if let Ok(role) = std::env::var(ROLE) {
        return child(&role);
    }
    let start = Instant::now();
    let results = join(spawn(
        3,
        "death",
        "direct_peer_killed_mid_operation_is_named",
    ));
    for (rank, ok, text) in &results {
        eprintln!("rank {rank}:\n{text}");
        if *rank < 2 {
            assert!(ok, "rank {rank} failed:\n{text}");
            assert!(text.contains("failed after"), "rank {rank}:\n{text}");
        } else {
            assert!(!ok, "rank 2 was killed");
        }
    }
    assert!(start.elapsed() < TIMEOUT + Duration::from_secs(15));
}

/// Threads of one process, each with its own emulated device: rank 1's
/// device faults at the direct kernel's launch.
#[test]
fn direct_launch_failure_fails_every_rank_naming_it() {
    if device_kit::test_backend() != sncl::device::Backend::Emu {
        eprintln!("skipped: faults are injected through the emulated device only");
        return;
    }
    let _serial = nvlink_common::serial();
    let ranks = nvlink_common::ranks(3);
    let count = 5000;
    let results: Vec<Result<(), String>> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .map(|r| {
                s.spawn(move || {
                    let win = r
                        .comm
                        .alloc_device_window(count * 4)
                        .map_err(|e| e.to_string())?;
                    if r.comm.rank() == 1 {
                        r.dev
                            .inject_fault("direct kernel failed to compile (injected)")
                            .map_err(|e| e.to_string())?;
                    }
                    win.all_reduce(
                        None,
                        count,
                        DataType::Float32,
                        ReduceOp::Sum,
                        DirectChoice::TwoShot,
                        r.stream,
                    )
                    .map_err(|e| e.to_string())
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("no panic"))
            .collect()
    });
    for (rank, r) in results.iter().enumerate() {
        let e = r.as_ref().expect_err("every rank fails");
        eprintln!("rank {rank}: {e}");
        assert!(e.contains("rank 1"), "rank {rank}: {e}");
        if rank == 1 {
            assert!(e.contains("emu device 1"), "{e}");
            assert!(e.contains("failed to compile (injected)"), "{e}");
        }
    }
}

/// Bad arguments are errors before anything runs: a count past the
/// window, a forced one-shot in place past its scratch.
#[test]
fn direct_bad_arguments_are_refused() {
    let _serial = nvlink_common::serial();
    let ranks = nvlink_common::ranks(2);
    std::thread::scope(|s| {
        for r in &ranks {
            s.spawn(move || {
                let win = r.comm.alloc_device_window(4 << 20).expect("window");
                let e = win
                    .all_reduce(
                        None,
                        (1 << 20) + 1,
                        DataType::Float32,
                        ReduceOp::Sum,
                        DirectChoice::Auto,
                        r.stream,
                    )
                    .expect_err("too many elements")
                    .to_string();
                assert!(e.contains("do not fit"), "{e}");
                let e = win
                    .all_reduce(
                        None,
                        1 << 20,
                        DataType::Float32,
                        ReduceOp::Sum,
                        DirectChoice::OneShot,
                        r.stream,
                    )
                    .expect_err("one-shot in place past the scratch")
                    .to_string();
                assert!(e.contains("two-shot"), "{e}");
                let e = win
                    .all_reduce(
                        None,
                        16,
                        DataType::Int32,
                        ReduceOp::BitAnd,
                        DirectChoice::Auto,
                        r.stream,
                    )
                    .expect_err("bitwise ops have no direct kernel")
                    .to_string();
                assert!(e.contains("band"), "{e}");
            });
        }
    });
}

/// Deterministic mode: the direct kernels fold in rank order, so the
/// window all-reduce is refused on every rank, naming the mode (the
/// communicator's all-reduce on the same memory runs the canonical order).
#[test]
fn direct_all_reduce_is_refused_in_deterministic_mode() {
    let _serial = nvlink_common::serial();
    let cfg = sncl::Config {
        deterministic: true,
        ..config()
    };
    let comms = Communicator::init_threads(2, cfg).expect("init over nvlink");
    let ranks: Vec<_> = comms.into_iter().map(bind).collect();
    std::thread::scope(|s| {
        for r in &ranks {
            s.spawn(move || {
                let win = r.comm.alloc_device_window(1 << 20).expect("window");
                let e = win
                    .all_reduce(
                        None,
                        16,
                        DataType::Float32,
                        ReduceOp::Sum,
                        DirectChoice::Auto,
                        r.stream,
                    )
                    .expect_err("refused in deterministic mode")
                    .to_string();
                assert!(e.contains("SNCL_DETERMINISTIC"), "{e}");
            });
        }
    });
}

/// Ranks that allocate a window with different sizes fail, each naming
/// the peer and both sizes.
#[test]
fn direct_window_sizes_must_agree() {
    let _serial = nvlink_common::serial();
    let ranks = nvlink_common::ranks(2);
    std::thread::scope(|s| {
        for r in &ranks {
            s.spawn(move || {
                let bytes = 4096 * (1 + r.comm.rank());
                let e = r
                    .comm
                    .alloc_device_window(bytes)
                    .expect_err("sizes differ")
                    .to_string();
                let peer = 1 - r.comm.rank();
                assert!(e.contains(&format!("peer rank {peer}")), "{e}");
                assert!(e.contains("same size"), "{e}");
            });
        }
    });
}

/// One-shot out of place needs no scratch: a count past the in-place
/// scratch (1 MiB) runs, and gives the host's bits.
#[test]
fn direct_one_shot_out_of_place_past_the_scratch() {
    let _serial = nvlink_common::serial();
    let ranks = nvlink_common::ranks(2);
    let count = (1 << 18) + 5; // 1 MiB + 20 bytes of f32
    let results: Vec<Result<DirectAlgo, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .map(|r| {
                s.spawn(move || {
                    let a = r
                        .comm
                        .alloc_device_window(count * 4)
                        .map_err(|e| e.to_string())?;
                    let b = r
                        .comm
                        .alloc_device_window(count * 4)
                        .map_err(|e| e.to_string())?;
                    let k = (DataType::Float32, ReduceOp::Sum, count);
                    window_case(r, (&a, Some(&b)), k, DirectChoice::OneShot)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("no panic"))
            .collect()
    });
    for r in results {
        assert_eq!(r, Ok(DirectAlgo::OneShot));
    }
}
