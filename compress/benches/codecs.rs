//! Encode / decode throughput of every codec on a 64 MiB f32 tensor, next to
//! a memcpy of the same 64 MiB. Throughput is counted on the f32 bytes.
//!
//! `cargo bench -p compress -- --warm-up-time 1 --measurement-time 3`

use compress::Codec;
use criterion::{black_box, criterion_group, criterion_main, Criterion, SamplingMode, Throughput};

/// 16 Mi f32 = 64 MiB.
const N: usize = 16 << 20;

/// Deterministic gradient-like data (sum of four uniforms, scaled).
fn data() -> Vec<f32> {
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..N)
        .map(|_| (next() + next() + next() + next() - 2.0) * 1e-3)
        .collect()
}

/// One group per codec: a memcpy of the 64 MiB right before the codec's
/// encode, decode and decode_add, so that each ratio compares measurements
/// taken close together (the machine is shared and its load drifts).
fn codecs(c: &mut Criterion) {
    let src = data();
    let mut dst = vec![0f32; N];
    let mut out = vec![0f32; N];
    let specs = [
        "fp16",
        "bf16",
        "int8",
        "int8-sr",
        "mxfp8",
        "mxfp4",
        "topk:0.01",
        "topk-exact:0.01",
    ];
    for spec in specs {
        let codec = Codec::parse(spec).unwrap();
        let mut g = c.benchmark_group(spec);
        g.throughput(Throughput::Bytes((N * 4) as u64));
        g.sample_size(10);
        g.sampling_mode(SamplingMode::Flat);
        g.bench_function("memcpy", |b| {
            b.iter(|| black_box(&mut dst[..]).copy_from_slice(black_box(&src)))
        });
        let mut enc = Vec::with_capacity(codec.max_encoded_len(N));
        codec.encode(&src, &mut enc);
        g.bench_function("encode", |b| {
            b.iter(|| codec.encode(black_box(&src), &mut enc))
        });
        g.bench_function("decode", |b| {
            b.iter(|| codec.decode(black_box(&enc), N, &mut out).unwrap())
        });
        g.bench_function("decode_add", |b| {
            b.iter(|| codec.decode_add(black_box(&enc), N, &mut out).unwrap())
        });
        g.finish();
    }
}

criterion_group!(benches, codecs);
criterion_main!(benches);
