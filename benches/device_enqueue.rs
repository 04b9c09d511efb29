//! What the caller's thread spends in one device collective: the enqueue of
//! an all-reduce on device buffers (checks, the event recorded on the
//! caller's stream, the stream's wait, the hand-off to the progress
//! thread), not its execution. One rank; the device comes from
//! `SNCL_TEST_DEVICE` (`emu`, the default, or `cuda`: on a GPU or on the
//! strict driver model, `scripts/cuda-model.sh target/release/deps/device_enqueue-* --bench`).
//! The target: median ≤ 5 µs.

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

criterion_group!(benches, enqueue);
criterion_main!(benches);
