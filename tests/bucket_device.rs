//! Fusion on device buffers: gradients on the (emulated) device through the
//! Bucketer (device views, beside a host gradient in the same bucketer)
//! equal a per-tensor host all-reduce of the same values, bit for bit,
//! across dtypes and bucket caps (values are exact in f16/f32, so the sums
//! do not depend on the algorithm the bucket size selects); the deprecated
//! DeviceBucketer still runs.

use std::time::{Duration, Instant};

use half::f16;
use sncl::device::{self, Backend, DeviceBuffer, DeviceSliceMut};
use sncl::{BucketConfig, Bucketer, Communicator, Config, ReduceOp};

#[test]
fn device_bucketed_equals_host_per_tensor() {
    let comms = Communicator::init_threads(3, Config::default()).unwrap();
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let r = c.rank();
                let dev = device::open(Backend::Emu, r).expect("emu");
                let stream = dev.create_stream().expect("stream");
                let deadline = || Instant::now() + Duration::from_secs(30);
                let sizes = [1usize, 300, 70_000, 5, 25_000, 17];
                for (cap, first, op) in [
                    (25 << 20, 1 << 20, ReduceOp::Sum),
                    (64 << 10, 4 << 10, ReduceOp::Avg),
                    (1, 1, ReduceOp::Sum),
                ] {
                    let cfg = BucketConfig {
                        cap_bytes: cap,
                        first_cap_bytes: first,
                        op,
                        ..Default::default()
                    };
                    let grads: Vec<Vec<f32>> = sizes
                        .iter()
                        .enumerate()
                        .map(|(t, &n)| {
                            (0..n)
                                .map(|i| ((i * 7 + t * 3 + r) % 11) as f32 * 0.25)
                                .collect()
                        })
                        .collect();
                    let halves: Vec<Vec<f16>> = sizes[..3]
                        .iter()
                        .map(|&n| {
                            (0..n)
                                .map(|i| f16::from_f32((i % 5 + r) as f32 * 0.5))
                                .collect()
                        })
                        .collect();
                    let upload = |bytes: &[u8]| {
                        let b = DeviceBuffer::new(&dev, bytes.len()).expect("alloc");
                        // SAFETY: `bytes` outlives the synchronisation below.
                        unsafe { dev.copy_h2d_async(b.ptr(), bytes.as_ptr(), bytes.len(), stream) }
                            .expect("h2d");
                        b
                    };
                    let mut dev_grads: Vec<DeviceBuffer> =
                        grads.iter().map(|g| upload(sncl::as_bytes(g))).collect();
                    let mut dev_halves: Vec<DeviceBuffer> =
                        halves.iter().map(|g| upload(sncl::as_bytes(g))).collect();
                    let mut host_grad = grads[1].clone();
                    dev.synchronize(stream, deadline()).expect("sync");
                    {
                        let mut b = Bucketer::new(c, cfg.clone());
                        let mut halves_left = dev_halves.iter_mut();
                        for (t, g) in dev_grads.iter_mut().enumerate() {
                            b.add(t, DeviceSliceMut::<f32>::new(g, stream)).unwrap();
                            if let Some(h) = halves_left.next() {
                                b.add(100 + t, DeviceSliceMut::<f16>::new(h, stream)).unwrap();
                            }
                        }
                        // A host gradient in the same bucketer.
                        b.add(200, &mut host_grad).unwrap();
                        b.finish().unwrap();
                    }
                    let mut want = grads[1].clone();
                    c.all_reduce_in_place(&mut want, op).unwrap();
                    assert!(
                        host_grad.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "rank {r} host gradient beside the device ones, cap {cap} {op:?}"
                    );
                    let download = |b: &DeviceBuffer, out: &mut [u8]| {
                        // SAFETY: `out` outlives the synchronisation.
                        unsafe { dev.copy_d2h_async(out.as_mut_ptr(), b.ptr(), out.len(), stream) }
                            .expect("d2h");
                        dev.synchronize(stream, deadline()).expect("sync");
                    };
                    for (t, g) in grads.iter().enumerate() {
                        let mut want = g.clone();
                        c.all_reduce_in_place(&mut want, op).unwrap();
                        let mut got = vec![0f32; g.len()];
                        download(&dev_grads[t], sncl::as_bytes_mut(&mut got));
                        let same = got
                            .iter()
                            .zip(&want)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        let bad = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits());
                        assert!(
                            same,
                            "rank {r} f32 tensor {t} cap {cap} {op:?}: element {bad:?}: {:?} vs {:?} (input {:?})",
                            bad.map(|i| got[i]),
                            bad.map(|i| want[i]),
                            bad.map(|i| g[i])
                        );
                    }
                    for (t, g) in halves.iter().enumerate() {
                        let mut want = g.clone();
                        c.all_reduce_in_place(&mut want, op).unwrap();
                        let mut got = vec![f16::ZERO; g.len()];
                        download(&dev_halves[t], sncl::as_bytes_mut(&mut got));
                        let same = got
                            .iter()
                            .zip(&want)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "rank {r} f16 tensor {t} cap {cap} {op:?}");
                    }
                }
            });
        }
    });
}

/// The device bucketer before the one typed API (kept for one release).
#[test]
#[allow(deprecated)]
fn deprecated_device_bucketer_still_runs() {
    let comms = Communicator::init_threads(2, Config::default()).unwrap();
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let dev = device::open(Backend::Emu, c.rank()).expect("emu");
                let stream = dev.create_stream().expect("stream");
                let host = vec![1.5f32; 1000];
                let buf = DeviceBuffer::new(&dev, 4 * 1000).expect("alloc");
                // SAFETY: `host` outlives the synchronisation below.
                unsafe { dev.copy_h2d_async(buf.ptr(), host.as_ptr().cast(), 4000, stream) }
                    .expect("h2d");
                let mut b = sncl::DeviceBucketer::new(c, BucketConfig::default(), stream);
                let e = b
                    .add::<f32>(&buf, 1001)
                    .expect_err("longer than the buffer");
                assert!(e.to_string().contains("cannot hold 1001"), "{e}");
                b.add::<f32>(&buf, 1000).unwrap();
                b.finish().unwrap();
                let mut got = vec![0f32; 1000];
                // SAFETY: `got` outlives the synchronisation below.
                unsafe { dev.copy_d2h_async(got.as_mut_ptr().cast(), buf.ptr(), 4000, stream) }
                    .expect("d2h");
                dev.synchronize(stream, Instant::now() + Duration::from_secs(30))
                    .expect("sync");
                // The default reduction is avg: 1.5 on every rank.
                assert!(got.iter().all(|&x| x == 1.5), "{:?}", &got[..4]);
            });
        }
    });
}
