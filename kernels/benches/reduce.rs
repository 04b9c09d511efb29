//! Throughput of the reduction kernels next to a plain copy of the same bytes.
//!
//! Throughput is reported per byte of one operand (the buffer size), like
//! nccl-tests' algorithm bandwidth: `reduce_into` touches 3× that in memory
//! (read `a`, read `b`, write `dst`), `reduce_inplace` 3× (read and write
//! `acc`, read `src`) and a copy 2×.
//!
//! Run: `cargo bench -p kernels --bench reduce -- --warm-up-time 1 --measurement-time 3`

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use kernels::{DataType, ReduceOp};

const SIZES: [(&str, usize); 3] = [("64KiB", 64 << 10), ("4MiB", 4 << 20), ("64MiB", 64 << 20)];

const TYPES: [DataType; 5] = [
    DataType::Float32,
    DataType::Float16,
    DataType::Bfloat16,
    DataType::Float64,
    DataType::Int32,
];

/// Bytes that are finite, non-trivial values for every benchmarked type.
fn fill(size: usize, seed: u8) -> Vec<u8> {
    // 0x3c / 0x3f high bytes keep f16, bf16, f32 and f64 values near 1.
    (0..size)
        .map(|i| {
            if i % 2 == 1 {
                0x3c
            } else {
                (i as u8).wrapping_mul(31).wrapping_add(seed)
            }
        })
        .collect()
}

fn bench_sizes(c: &mut Criterion) {
    for (name, size) in SIZES {
        let mut g = c.benchmark_group(format!("reduce/{name}"));
        g.throughput(Throughput::Bytes(size as u64));
        if size >= 1 << 20 {
            g.sample_size(20);
        }
        let a = fill(size, 1);
        let b = fill(size, 7);
        let mut dst = fill(size, 3);
        for dtype in TYPES {
            let t = dtype.name();
            g.bench_function(format!("into/{t}"), |bch| {
                bch.iter(|| kernels::reduce_into(dtype, ReduceOp::Sum, &mut dst, black_box(&a), &b))
            });
            // Max: IEEE maximum, commutative bit for bit (the compare-and-
            // settle sequence that deterministic mode relies on).
            g.bench_function(format!("max_into/{t}"), |bch| {
                bch.iter(|| kernels::reduce_into(dtype, ReduceOp::Max, &mut dst, black_box(&a), &b))
            });
            // Accumulating the same `b` over and over keeps the values
            // finite for long enough: it only adds ~1 per iteration.
            let mut acc = a.clone();
            g.bench_function(format!("inplace/{t}"), |bch| {
                bch.iter(|| kernels::reduce_inplace(dtype, ReduceOp::Sum, &mut acc, black_box(&b)))
            });
        }
        g.bench_function("copy", |bch| {
            bch.iter(|| kernels::copy(&mut dst, black_box(&a)))
        });
        g.bench_function("memcpy", |bch| {
            bch.iter(|| dst.copy_from_slice(black_box(&a)))
        });
        g.finish();
    }
}

/// Per-call cost at the 8-byte all_reduce size, and the scalar reference.
fn bench_small(c: &mut Criterion) {
    let mut g = c.benchmark_group("reduce/8B");
    g.throughput(Throughput::Bytes(8));
    let a = fill(8, 1);
    let b = fill(8, 7);
    let mut dst = fill(8, 3);
    for dtype in [DataType::Float32, DataType::Float16, DataType::Int64] {
        let t = dtype.name();
        g.bench_function(format!("into/{t}"), |bch| {
            bch.iter(|| {
                kernels::reduce_into(dtype, ReduceOp::Sum, black_box(&mut dst), black_box(&a), &b)
            })
        });
        g.bench_function(format!("scalar_into/{t}"), |bch| {
            bch.iter(|| {
                kernels::scalar::reduce_into(
                    dtype,
                    ReduceOp::Sum,
                    black_box(&mut dst),
                    black_box(&a),
                    &b,
                )
            })
        });
    }
    g.bench_function("copy", |bch| {
        bch.iter(|| kernels::copy(black_box(&mut dst), black_box(&a)))
    });
    g.finish();
}

criterion_group!(benches, bench_small, bench_sizes);
criterion_main!(benches);
