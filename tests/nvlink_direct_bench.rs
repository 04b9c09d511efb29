//! The nvlink version 2 measurement (scripts/gpu-check.sh, section
//! `direct-256M`): 2 rank processes on device 0, f32 sum all-reduce of
//! `DIRECT_BENCH_MIB` MiB (default 4 on the emulated device; 256 on the GPU)
//! by version 1 (copy engine into the peer's inbox, reduce kernel), one-shot
//! (out of place: in place needs scratch) and two-shot (in place, the
//! registered-buffer case docs/perf-notes/NOTEBOOK.md §14 sizes), with the device-to-device copy
//! rate of the same run and each busbw as a fraction of it (target on an
//! H200: two-shot >= 0.35).
//!
//! `SNCL_TEST_DEVICE=cuda` selects the GPU (default `emu`). Skipped unless
//! `DIRECT_BENCH_MIB` is set:
//! `DIRECT_BENCH_MIB=4 cargo test --test nvlink_direct_bench -- --nocapture`.

mod device_kit;

use std::time::{Duration, Instant};

use device_kit::{join_ranks, spawn_ranks, spawned_rank};
use sncl::device::{self, Backend, DeviceWindow, DirectChoice};
use sncl::{Communicator, DataType, ReduceOp};

const ROLE: &str = "DIRECT_BENCH_ROLE";

fn backend() -> Backend {
    match std::env::var("SNCL_TEST_DEVICE").as_deref() {
        Ok("cuda") => Backend::Cuda,
        _ => Backend::Emu,
    }
}

fn mib() -> usize {
    std::env::var("DIRECT_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4)
}

/// Median seconds of `reps` runs of `f` (after one warm-up).
fn time(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(|a, b| a.total_cmp(b));
    t[reps / 2]
}

fn child() {
    let (rank, n, id) = spawned_rank("DIRECT_BENCH");
    let be = backend();
    // Every rank on device 0 (emu: each process its own emulated device 0).
    let dev = device::open(be, 0).expect("device 0");
    let cfg = sncl::Config {
        timeout: Duration::from_secs(60),
        ..Default::default()
    };
    let comm = Communicator::init_rank_with_config(&id, rank, n, cfg).expect("init");
    comm.bind_device(dev.clone()).expect("bind");
    let stream = dev.create_stream().expect("stream");
    let bytes = mib() << 20;
    let count = bytes / 4;
    let a: DeviceWindow = comm.alloc_device_window(bytes).expect("window a");
    let b = comm.alloc_device_window(bytes).expect("window b");
    let deadline = || Instant::now() + Duration::from_secs(60);
    let reps = 5;
    let copy = time(reps, || {
        // SAFETY: both windows hold `bytes`.
        unsafe { dev.copy_d2d_async(b.ptr(), a.ptr(), bytes, stream) }.expect("copy");
        dev.synchronize(stream, deadline()).expect("sync");
    });
    let d2d = bytes as f64 / copy / 1e9;
    let busbw = |t: f64| bytes as f64 * 2.0 * (n - 1) as f64 / n as f64 / t / 1e9;
    let v1 = time(reps, || {
        // SAFETY: the window outlives the wait.
        let w = unsafe {
            comm.all_reduce_device_raw(
                a.ptr(),
                a.ptr(),
                count,
                DataType::Float32,
                ReduceOp::Sum,
                stream,
            )
        }
        .expect("v1 enqueue");
        w.wait().expect("v1");
        dev.synchronize(stream, deadline()).expect("sync");
    });
    let one = time(reps, || {
        a.all_reduce(
            Some(&b),
            count,
            DataType::Float32,
            ReduceOp::Sum,
            DirectChoice::OneShot,
            stream,
        )
        .expect("one-shot");
    });
    let two = time(reps, || {
        a.all_reduce(
            None,
            count,
            DataType::Float32,
            ReduceOp::Sum,
            DirectChoice::TwoShot,
            stream,
        )
        .expect("two-shot");
    });
    if rank == 0 {
        println!(
            "direct bench: {} {} ranks, {} MiB f32 sum; d2d copy {d2d:.1} GB/s (bytes copied / time)",
            dev.name(),
            n,
            mib()
        );
        for (name, t) in [
            ("v1 copy engine", v1),
            ("one-shot (out of place)", one),
            ("two-shot (in place)", two),
        ] {
            println!(
                "  {name:24} {:8.3} ms  busbw {:7.1} GB/s  = {:.3} x d2d",
                t * 1e3,
                busbw(t),
                busbw(t) / d2d
            );
        }
        println!("  target (H200, 2 procs one GPU): two-shot >= 0.35 x d2d");
    }
}

#[test]
fn direct_busbw() {
    if std::env::var(ROLE).is_ok() {
        return child();
    }
    if std::env::var("DIRECT_BENCH_MIB").is_err() {
        eprintln!("skipping: a measurement; set DIRECT_BENCH_MIB (scripts/gpu-check.sh does)");
        return;
    }
    let results = join_ranks(spawn_ranks(
        2,
        "direct_busbw",
        "DIRECT_BENCH",
        &[(ROLE, "1")],
    ));
    for (rank, ok, text) in &results {
        print!("{text}");
        assert!(ok, "rank {rank} failed");
    }
}
