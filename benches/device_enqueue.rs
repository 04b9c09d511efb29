//! What the caller's thread spends in one device collective: the enqueue of
//! an all-reduce on device buffers, not its execution. Two cases: one rank
//! (the host-driven path: checks, the event recorded on the caller's
//! stream, the stream's wait, the hand-off to the progress thread), and
//! rank 0 of two thread ranks on one device (the kernel path: checks, the
//! context check, the capture check, the launch, the completion event;
//! rank 1 enqueues the same operations on its own thread). The device
//! comes from `SNCL_TEST_DEVICE` (`emu`, the default, or `cuda`: on a GPU
//! or on the strict driver model, `scripts/cuda-model.sh
//! target/release/deps/device_enqueue-* --bench`). The target:
//! median ≤ 5 µs.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use sncl::device::{self, Backend, DeviceBuffer};
use sncl::{Communicator, Config, DataType, ReduceOp};

fn backend() -> Backend {
    match std::env::var("SNCL_TEST_DEVICE").as_deref() {
        Ok("cuda") => Backend::Cuda,
        _ => Backend::Emu,
    }
}

fn enqueue(c: &mut Criterion) {
    let comm = Communicator::init_threads(1, Config::default())
        .expect("one rank")
        .pop()
        .expect("the rank");
    let dev = device::open(backend(), 0).expect("a device");
    comm.bind_device(dev.clone()).expect("bind");
    let stream = dev.create_stream().expect("a stream");
    let buf = DeviceBuffer::new(&dev, 4096).expect("a buffer");
    let mut group = c.benchmark_group("device_enqueue");
    group.measurement_time(Duration::from_secs(3));
    group.bench_function(format!("all_reduce_8B_{}", backend().name()), |b| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            let mut works = Vec::with_capacity(64);
            for i in 0..iters {
                let start = Instant::now();
                // SAFETY: `buf` outlives every handle, each waited for below.
                let w = unsafe {
                    comm.all_reduce_device_raw(
                        buf.ptr(),
                        buf.ptr(),
                        2,
                        DataType::Float32,
                        ReduceOp::Sum,
                        stream,
                    )
                }
                .expect("enqueue");
                spent += start.elapsed();
                works.push(w);
                if works.len() == 64 || i + 1 == iters {
                    for w in works.drain(..) {
                        w.wait().expect("all_reduce");
                    }
                }
            }
            spent
        })
    });
    group.finish();
    dev.synchronize(stream, Instant::now() + Duration::from_secs(30))
        .expect("sync");
}

/// Rank 0's enqueue of an 8-byte all-reduce on the kernel path, two thread
/// ranks on one device; rank 1 mirrors every batch rank 0 runs.
fn enqueue_kernel_path(c: &mut Criterion) {
    let dev = device::open(backend(), 0).expect("a device");
    let comms = Communicator::init_threads(2, Config::default()).expect("two ranks");
    let mut ranks = Vec::new();
    for comm in comms {
        comm.bind_device(dev.clone()).expect("bind");
        let stream = dev.create_stream().expect("a stream");
        let buf = DeviceBuffer::new(&dev, 4096).expect("a buffer");
        ranks.push((comm, stream, buf));
    }
    // Both ranks connect (and open the lane) together.
    std::thread::scope(|s| {
        for (comm, _, _) in &ranks {
            s.spawn(move || comm.connect_device().expect("connect_device"));
        }
    });
    // A batch: `n` all-reduces, each handle waited for once 64 are out.
    let batch = |(comm, stream, buf): &(Communicator, device::StreamHandle, DeviceBuffer),
                 n: u64|
     -> Duration {
        let mut spent = Duration::ZERO;
        let mut works = Vec::with_capacity(64);
        for i in 0..n {
            let start = Instant::now();
            // SAFETY: `buf` outlives every handle, each waited for below.
            let w = unsafe {
                comm.all_reduce_device_raw(
                    buf.ptr(),
                    buf.ptr(),
                    2,
                    DataType::Float32,
                    ReduceOp::Sum,
                    *stream,
                )
            }
            .expect("enqueue");
            spent += start.elapsed();
            works.push(w);
            if works.len() == 64 || i + 1 == n {
                for w in works.drain(..) {
                    w.wait().expect("all_reduce");
                }
            }
        }
        spent
    };
    let (tx, rx) = std::sync::mpsc::channel::<u64>();
    let (rank0, rank1) = ranks.split_at(1);
    std::thread::scope(|s| {
        let peer = &rank1[0];
        s.spawn(move || {
            for n in rx {
                batch(peer, n);
            }
        });
        let mut group = c.benchmark_group("device_enqueue");
        group.measurement_time(Duration::from_secs(3));
        group.bench_function(
            format!("all_reduce_8B_kernel_path_2_ranks_{}", backend().name()),
            |b| {
                b.iter_custom(|iters| {
                    tx.send(iters).expect("rank 1");
                    batch(&rank0[0], iters)
                })
            },
        );
        group.finish();
        drop(tx);
    });
    assert!(
        ranks[0].0.direct_all_reduces().kernel_path > 0,
        "the all-reduces did not take the kernel path"
    );
}

criterion_group!(benches, enqueue, enqueue_kernel_path);
criterion_main!(benches);
