//! Fusion on device buffers: gradients on the (emulated) device through the
//! DeviceBucketer equal a per-tensor host all-reduce of the same values,
//! bit for bit, across dtypes and bucket caps (values are exact in f16/f32,
//! so the sums do not depend on the algorithm the bucket size selects).

use std::time::{Duration, Instant};

use half::f16;
use sncl::device::{self, Backend, DeviceBuffer};
use sncl::{BucketConfig, Communicator, Config, DeviceBucketer, ReduceOp};

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
                    let dev_grads: Vec<DeviceBuffer> =
                        grads.iter().map(|g| upload(sncl::as_bytes(g))).collect();
                    let dev_halves: Vec<DeviceBuffer> =
                        halves.iter().map(|g| upload(sncl::as_bytes(g))).collect();
                    dev.synchronize(stream, deadline()).expect("sync");
                    {
                        let mut b = DeviceBucketer::new(c, cfg.clone(), stream);
                        for (t, g) in dev_grads.iter().enumerate() {
                            b.add::<f32>(g, sizes[t]).unwrap();
                            if t < dev_halves.len() {
                                b.add::<f16>(&dev_halves[t], sizes[t]).unwrap();
                            }
                        }
                        b.finish().unwrap();
                        assert_eq!(b.in_flight(), 0);
                    }
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
