//! Enqueueing device collectives never waits for the progress thread: an
//! operation the progress thread is running (here one whose caller's stream
//! is held back, so it waits for that stream) must not keep the caller's
//! thread from enqueueing the next one. Before the fix the progress thread
//! waited for the caller's stream with the communicator's state held, and
//! the next enqueue's checks waited for the state: the caller never got to
//! release its stream, a hang until the timeout (seen as a flaky failure of
//! `compressed_device.rs`, whose compressed all-reduce enqueues three
//! collectives back to back).

mod device_kit;

use device_kit::{bind_rank, test_backend};

use std::time::{Duration, Instant};

use comm_core::config::TransportChoice;
use sncl::device::{self, DevicePtr, StreamHandle};
use sncl::{Communicator, Config, DataType, ReduceOp};

/// Fills `count` f32 at `p` with `v` and waits for it on `stream`.
fn fill(r: &device_kit::Rank, p: DevicePtr, v: f32, count: usize, stream: StreamHandle) {
    let host = vec![v; count];
    // SAFETY: `host` lives until the stream is synchronised below.
    unsafe {
        r.dev
            .copy_h2d_async(p, host.as_ptr().cast(), count * 4, stream)
    }
    .expect("h2d");
    r.dev
        .synchronize(stream, Instant::now() + Duration::from_secs(30))
        .expect("sync");
}

/// Reads `count` f32 at `p` through `stream`.
fn read(r: &device_kit::Rank, p: DevicePtr, count: usize, stream: StreamHandle) -> Vec<f32> {
    let mut out = vec![0f32; count];
    // SAFETY: `out` lives until the stream is synchronised below.
    unsafe {
        r.dev
            .copy_d2h_async(out.as_mut_ptr().cast(), p, count * 4, stream)
    }
    .expect("d2h");
    r.dev
        .synchronize(stream, Instant::now() + Duration::from_secs(30))
        .expect("sync");
    out
}

/// Host-driven all-reduces (TCP between the ranks: no kernel path).
#[test]
fn a_second_host_driven_enqueue_does_not_wait_for_the_first() {
    second_enqueue_does_not_wait(TransportChoice::Tcp, 0);
}

/// Kernel-path all-reduces (thread ranks on emulated devices: the lane),
/// whose first the progress thread watches while the stream is held.
#[test]
fn a_second_kernel_path_enqueue_does_not_wait_for_the_first() {
    second_enqueue_does_not_wait(TransportChoice::Auto, 2);
}

/// Two all-reduces on a stream each rank holds back: the second enqueue
/// returns at once even though the progress thread is already on the
/// first, and both sums are right once the stream goes on; `kernel_path`
/// of them ran on the kernel path.
fn second_enqueue_does_not_wait(transport: TransportChoice, kernel_path: u64) {
    if test_backend() != device::Backend::Emu {
        eprintln!("skipped: the stream gate is a pinned word of the emulated device's");
        return;
    }
    // Setup offers the device transport only where a device is open.
    let _ = device::open(device::Backend::Emu, 0);
    let timeout = Duration::from_secs(20);
    let cfg = Config {
        timeout,
        transport,
        ..Default::default()
    };
    let ranks: Vec<_> = Communicator::init_threads(2, cfg)
        .expect("init")
        .into_iter()
        .map(bind_rank)
        .collect();
    let count = 1000;
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .map(|r| {
                s.spawn(move || -> Result<(), String> {
                    let rank = r.comm.rank();
                    let side = r.dev.create_stream().map_err(|e| e.to_string())?;
                    let (a, b) = (r.send.ptr(), r.recv.ptr());
                    fill(r, a, 1.0, count, side);
                    fill(r, b, 10.0, count, side);
                    let gate = device::PinnedBuffer::new(&r.dev, 64).map_err(|e| e.to_string())?;
                    let word = gate.as_ptr() as *mut u32;
                    // SAFETY: 64 pinned bytes owned by `gate`, which
                    // outlives every use of the stream below.
                    unsafe {
                        word.write_volatile(0);
                        r.dev.stream_wait_u32(r.stream, word, 1)
                    }
                    .map_err(|e| e.to_string())?;
                    let run = |p: DevicePtr| {
                        // SAFETY: the ranges live until the waits below.
                        unsafe {
                            r.comm.all_reduce_device_raw(
                                p,
                                p,
                                count,
                                DataType::Float32,
                                ReduceOp::Sum,
                                r.stream,
                            )
                        }
                        .map_err(|e| e.to_string())
                    };
                    let first = run(a)?;
                    // The progress thread takes the first now and waits
                    // for the held stream.
                    std::thread::sleep(Duration::from_millis(200));
                    let t0 = Instant::now();
                    let second = run(b)?;
                    let took = t0.elapsed();
                    // SAFETY: as above; the device only reads the word.
                    unsafe { std::sync::atomic::AtomicU32::from_ptr(word) }
                        .store(1, std::sync::atomic::Ordering::Release);
                    let waited = (first.wait(), second.wait());
                    if took > Duration::from_secs(5) {
                        return Err(format!(
                            "rank {rank}: the second enqueue took {took:?} (it waited for the \
                             progress thread)"
                        ));
                    }
                    waited.0.map_err(|e| format!("rank {rank} first: {e}"))?;
                    waited.1.map_err(|e| format!("rank {rank} second: {e}"))?;
                    let (ga, gb) = (read(r, a, count, side), read(r, b, count, side));
                    if ga.iter().any(|&x| x != 2.0) || gb.iter().any(|&x| x != 20.0) {
                        return Err(format!(
                            "rank {rank}: sums {} and {} (expected 2 and 20)",
                            ga[0], gb[0]
                        ));
                    }
                    let ran = r.comm.direct_all_reduces().kernel_path;
                    if ran != kernel_path {
                        return Err(format!(
                            "rank {rank}: {ran} kernel-path all-reduces, expected {kernel_path}"
                        ));
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter()
            .filter_map(|h| h.join().expect("no panic").err())
            .collect()
    });
    assert!(errs.is_empty(), "{}", errs.join("\n"));
}
