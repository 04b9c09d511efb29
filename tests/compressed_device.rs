//! Compressed all-reduce on device buffers (the emulated device): the
//! result and the error-feedback residual are bit-identical to the host
//! `all_reduce_compressed` on the same data, for every codec the device
//! encodes, flat and hierarchical, sum and avg, over several steps; bad
//! arguments are errors.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sncl::device::{self, Backend, Device, DeviceBuffer, DeviceSliceMut, StreamHandle};
use sncl::{
    Codec, Communicator, CompressScope, Config, DeviceFeedback, ErrorFeedback, MemoryStore,
    ReduceOp, Store,
};

const CODECS: [&str; 9] = [
    "fp16",
    "bf16",
    "int8",
    "int8-sr:64",
    "topk-exact:0.05",
    "topk:0.05",
    "mxfp8",
    "mxfp8-e5m2",
    "mxfp4",
];

/// `n` ranks as threads; rank r on node r % nodes.
fn ranks(n: usize, nodes: usize, id: u64) -> Vec<Communicator> {
    let store = MemoryStore::new();
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let store: Arc<dyn Store> = Arc::new(store.for_rank(r));
            let cfg = Config {
                node_id: Some(format!("n{}", r % nodes)),
                timeout: Duration::from_secs(60),
                ..Config::default()
            };
            std::thread::spawn(move || Communicator::init_with_store(store, r, n, id, cfg))
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
}

/// Varied values (signs, magnitudes over several decades, a few zeros).
fn input(rank: usize, step: usize, len: usize) -> Vec<f32> {
    let mut x = ((rank as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15))
        ^ ((step as u64 + 7).wrapping_mul(0xbf58_476d_1ce4_e5b9));
    (0..len)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if i % 97 == 5 {
                return 0.0;
            }
            let mant = (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            mant * 10f32.powi(((x >> 8) % 5) as i32 - 2)
        })
        .collect()
}

struct DevRank {
    dev: Arc<dyn Device>,
    stream: StreamHandle,
}

fn upload(d: &DevRank, data: &[f32]) -> DeviceBuffer {
    let buf = DeviceBuffer::new(&d.dev, (data.len() * 4).max(4)).expect("alloc");
    // SAFETY: `data` outlives the synchronisation.
    unsafe {
        d.dev
            .copy_h2d_async(buf.ptr(), data.as_ptr().cast(), data.len() * 4, d.stream)
    }
    .expect("h2d");
    d.dev
        .synchronize(d.stream, Instant::now() + Duration::from_secs(30))
        .expect("sync");
    buf
}

fn download(d: &DevRank, buf: &DeviceBuffer, len: usize) -> Vec<f32> {
    let mut out = vec![0f32; len];
    // SAFETY: `out` outlives the synchronisation.
    unsafe {
        d.dev
            .copy_d2h_async(out.as_mut_ptr().cast(), buf.ptr(), len * 4, d.stream)
    }
    .expect("d2h");
    d.dev
        .synchronize(d.stream, Instant::now() + Duration::from_secs(30))
        .expect("sync");
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Every codec × op, `steps` steps with error feedback, on `comms`:
/// device result and residual == host result and residual, bit for bit.
fn device_matches_host(comms: &[Communicator], scope: CompressScope, lens: &[usize], steps: usize) {
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || -> Vec<String> {
                    let rank = c.rank();
                    let dev = device::open(Backend::Emu, rank).expect("emu");
                    let stream = dev.create_stream().expect("stream");
                    let d = DevRank { dev, stream };
                    let mut errs = Vec::new();
                    for spec in CODECS {
                        let codec = Codec::parse(spec).unwrap();
                        for &len in lens {
                            for op in [ReduceOp::Sum, ReduceOp::Avg] {
                                let mut host_fb = ErrorFeedback::new(0);
                                let mut dev_fb = DeviceFeedback::new();
                                for step in 0..steps {
                                    let data = input(rank, step, len);
                                    let mut host = data.clone();
                                    c.all_reduce_compressed(&mut host, op, &codec, Some(&mut host_fb), scope)
                                        .expect("host");
                                    let mut buf = upload(&d, &data);
                                    let view = DeviceSliceMut::<f32>::new(&mut buf, d.stream).narrow(0..len);
                                    if let Err(e) = c.all_reduce_compressed(
                                        view,
                                        op,
                                        &codec,
                                        Some(&mut dev_fb),
                                        scope,
                                    ) {
                                        errs.push(format!("rank {rank} {spec} len {len} {op:?} step {step}: {e}"));
                                        continue;
                                    }
                                    let got = download(&d, &buf, len);
                                    let what = format!("rank {rank} {spec} {scope:?} len {len} {op:?} step {step}");
                                    if bits(&got) != bits(&host) {
                                        let i = (0..len).find(|&i| got[i].to_bits() != host[i].to_bits()).unwrap();
                                        errs.push(format!("{what}: element {i} is {} on the device, {} on the host", got[i], host[i]));
                                    }
                                    let hr = host_fb.residual();
                                    if let Some(r) = dev_fb.residual() {
                                        let dr = download(&d, r, dev_fb.len());
                                        if bits(&dr) != bits(hr) {
                                            errs.push(format!("{what}: the residuals differ ({} vs {} elements)", dr.len(), hr.len()));
                                        }
                                    } else if hr.iter().any(|&x| x != 0.0) && len > 0 && c.size() > 1 {
                                        errs.push(format!("{what}: no device residual, the host has one"));
                                    }
                                }
                            }
                        }
                    }
                    errs
                })
            })
            .collect();
        hs.into_iter()
            .flat_map(|h| h.join().expect("no panic"))
            .collect()
    });
    assert!(
        errs.is_empty(),
        "{} differences:\n{}",
        errs.len(),
        errs.join("\n")
    );
}

#[test]
fn flat_matches_host_bit_for_bit() {
    for n in [1, 3] {
        let comms = ranks(n, 1, 40 + n as u64);
        device_matches_host(&comms, CompressScope::Flat, &[0, 1, 7, 1000, 4099], 3);
    }
}

#[test]
fn hierarchical_matches_host_bit_for_bit() {
    // 4 ranks on 2 nodes: node reduce-scatter, compressed across, all-gather.
    let comms = ranks(4, 2, 77);
    device_matches_host(&comms, CompressScope::Hier, &[1, 7, 4099], 2);
}

/// The deprecated safe device form (a count and a stream) keeps its checks.
#[test]
#[allow(deprecated)]
fn bad_arguments_are_errors() {
    let comms = ranks(1, 1, 91);
    let dev = device::open(Backend::Emu, 0).expect("emu");
    let stream = dev.create_stream().expect("stream");
    let mut buf = DeviceBuffer::new(&dev, 64).expect("alloc");
    let c = &comms[0];
    let fp16 = Codec::parse("fp16").unwrap();
    let e = c
        .all_reduce_compressed_device(
            &mut buf,
            16,
            ReduceOp::Max,
            &fp16,
            None,
            CompressScope::Flat,
            stream,
        )
        .expect_err("max");
    assert!(e.to_string().contains("sum or avg"), "{e}");
    let e = c
        .all_reduce_compressed_device(
            &mut buf,
            17,
            ReduceOp::Sum,
            &fp16,
            None,
            CompressScope::Flat,
            stream,
        )
        .expect_err("too short");
    assert!(e.to_string().contains("64 bytes"), "{e}");
}

#[test]
fn enqueue_returns_before_the_stream_runs_it() {
    // Each rank holds its stream with a value wait, enqueues, finds its
    // buffer untouched (read on a second stream), releases the stream, and
    // gets the host form's result from the handle.
    let comms = ranks(3, 1, 93);
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || -> Vec<String> {
                    let rank = c.rank();
                    let dev = device::open(Backend::Emu, rank).expect("emu");
                    let stream = dev.create_stream().expect("stream");
                    let side = DevRank {
                        dev: dev.clone(),
                        stream: dev.create_stream().expect("stream"),
                    };
                    let d = DevRank { dev, stream };
                    let flag = d.dev.alloc_pinned(4).expect("pinned");
                    let flag_u32 = flag.as_ptr().cast::<u32>();
                    // SAFETY: a live, aligned pinned u32 (see below).
                    let flag_atomic = unsafe { std::sync::atomic::AtomicU32::from_ptr(flag_u32) };
                    flag_atomic.store(0, std::sync::atomic::Ordering::Release);
                    let mut errs = Vec::new();
                    for (step, spec) in ["int8", "fp16", "topk-exact:0.05", "topk:0.05"]
                        .into_iter()
                        .enumerate()
                    {
                        let codec = Codec::parse(spec).unwrap();
                        let data = input(rank, step, 3001);
                        let mut host = data.clone();
                        c.all_reduce_compressed(
                            &mut host,
                            ReduceOp::Sum,
                            &codec,
                            None,
                            CompressScope::Flat,
                        )
                        .expect("host");
                        let mut buf = upload(&d, &data);
                        let go = step as u32 + 1;
                        // SAFETY: `flag` is a live, aligned pinned u32 of this
                        // device, freed after the last wait below.
                        unsafe { d.dev.stream_wait_u32(d.stream, flag_u32, go) }.expect("hold");
                        let ptr = buf.ptr();
                        let t0 = Instant::now();
                        let work = c
                            .enqueue_all_reduce_compressed_device(
                                &mut buf,
                                3001,
                                ReduceOp::Sum,
                                &codec,
                                None,
                                CompressScope::Flat,
                                d.stream,
                            )
                            .expect("enqueue");
                        let took = t0.elapsed();
                        let mut now = vec![0f32; 3001];
                        // SAFETY: `buf` is live and `now` outlives the
                        // synchronisation; the held stream has not run the
                        // encode, and nothing on `side`'s stream writes it.
                        unsafe {
                            side.dev.copy_d2h_async(
                                now.as_mut_ptr().cast(),
                                ptr,
                                3001 * 4,
                                side.stream,
                            )
                        }
                        .expect("d2h");
                        side.dev
                            .synchronize(side.stream, Instant::now() + Duration::from_secs(30))
                            .expect("sync");
                        if bits(&now) != bits(&data) {
                            errs.push(format!(
                                "rank {rank} {spec}: the buffer changed while the stream was held"
                            ));
                        }
                        // The blocking form would wait out the 60 s timeout.
                        if took > Duration::from_secs(20) {
                            errs.push(format!("rank {rank} {spec}: enqueue took {took:?}"));
                        }
                        // A release store lets the stream go on.
                        flag_atomic.store(go, std::sync::atomic::Ordering::Release);
                        if let Err(e) = work.wait() {
                            errs.push(format!("rank {rank} {spec}: {e}"));
                            continue;
                        }
                        let got = download(&d, &buf, 3001);
                        if bits(&got) != bits(&host) {
                            errs.push(format!("rank {rank} {spec}: not the host form's result"));
                        }
                    }
                    // SAFETY: allocated above with 4 bytes; the streams are idle.
                    unsafe { d.dev.free_pinned(flag, 4) }.expect("free");
                    errs
                })
            })
            .collect();
        hs.into_iter()
            .flat_map(|h| h.join().expect("no panic"))
            .collect()
    });
    assert!(errs.is_empty(), "{}", errs.join("\n"));
}
