//! Compressed all-reduce against the exact result, within the documented
//! bounds, flat on 1..8 ranks and hierarchical on a two-tier layout; and a
//! data-parallel training run that converges with top-k + error feedback
//! and with int8.

use std::sync::Arc;

use sncl::{
    Codec, Communicator, CompressScope, Config, ErrorFeedback, MemoryStore, ReduceOp, Store,
};

fn codecs() -> Vec<Codec> {
    [
        "fp16",
        "bf16",
        "int8",
        "mxfp8",
        "mxfp8-e5m2",
        "mxfp4",
        "topk:0.05",
        "topk-exact:0.05",
    ]
    .iter()
    .map(|s| Codec::parse(s).unwrap())
    .collect()
}

fn layout(n: usize, nodes: usize, id: u64) -> Vec<Communicator> {
    let store = MemoryStore::new();
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let store: Arc<dyn Store> = Arc::new(store.for_rank(r));
            let cfg = Config {
                node_id: Some(format!("n{}", r % nodes)),
                ..Config::default()
            };
            std::thread::spawn(move || Communicator::init_with_store(store, r, n, id, cfg))
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
}

fn input(r: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (((i * 31 + r * 17) % 97) as f32 - 48.0) * 0.37)
        .collect()
}

/// Checks every codec on `comms`; `encoded` is how many values each
/// cross-tier element sums (ranks, or nodes when hierarchical).
fn check(comms: &[Communicator], scope: CompressScope, encoded: usize) {
    std::thread::scope(|s| {
        for c in comms {
            s.spawn(move || {
                let n = c.size();
                for codec in codecs() {
                    for len in [0usize, 1, 7, 1000, 65_537] {
                        let mut buf = input(c.rank(), len);
                        c.all_reduce_compressed(&mut buf, ReduceOp::Sum, &codec, None, scope)
                            .unwrap();
                        let inputs: Vec<Vec<f32>> = (0..n).map(|r| input(r, len)).collect();
                        let exact: Vec<f32> = (0..len)
                            .map(|i| inputs.iter().map(|x| x[i]).sum())
                            .collect();
                        // Every encoded value is at most U = sum of |x_r| in magnitude.
                        let u: Vec<f32> = (0..len)
                            .map(|i| inputs.iter().map(|x| x[i].abs()).sum())
                            .collect();
                        let tol = match codec {
                            Codec::TopK { .. } => {
                                inputs.iter().map(|x| codec.error_bound(x)).sum::<f32>()
                                    * encoded as f32
                            }
                            _ => (encoded as f32 + 1.0) * codec.error_bound(&u),
                        } + 1e-4;
                        for i in 0..len {
                            assert!(
                                (buf[i] - exact[i]).abs() <= tol,
                                "{} {scope:?} n={n} len={len} elem {i}: {} vs {} (tol {tol})",
                                codec.name(),
                                buf[i],
                                exact[i]
                            );
                        }
                        // Identical on every rank.
                        let mut first = buf.clone();
                        c.broadcast(&mut first, 0).unwrap();
                        assert_eq!(first, buf, "{} results differ across ranks", codec.name());
                    }
                }
            });
        }
    });
}

#[test]
fn flat_within_bounds_on_1_to_8_ranks() {
    for n in 1..=8 {
        let comms = Communicator::init_threads(n, Config::default()).unwrap();
        check(&comms, CompressScope::Flat, n);
    }
}

#[test]
fn hierarchical_within_bounds() {
    let comms = layout(8, 4, 0xc0de_0001);
    check(&comms, CompressScope::Hier, 4);
}

/// Logistic regression, data parallel over 4 ranks, on a fixed synthetic
/// problem; returns the final full-data loss.
fn train(comms: &[Communicator], codec: Option<Codec>) -> f64 {
    const DIM: usize = 200;
    const PER_RANK: usize = 256;
    const STEPS: usize = 800;
    let truth: Vec<f32> = (0..DIM)
        .map(|j| ((j * 7919) % 13) as f32 / 6.0 - 1.0)
        .collect();
    let sample = |r: usize, k: usize| -> (Vec<f32>, f32) {
        let x: Vec<f32> = (0..DIM)
            .map(|j| ((((r * PER_RANK + k) * 131 + j * 71) % 101) as f32 / 50.0) - 1.0)
            .collect();
        let z: f32 = x.iter().zip(&truth).map(|(a, b)| a * b).sum();
        // 10% label noise: not separable, so the optimum loss is a plateau
        // both runs can reach.
        let flip = (r * PER_RANK + k) % 10 == 3;
        (x, if (z > 0.0) != flip { 1.0 } else { 0.0 })
    };
    let losses: Vec<f64> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let r = c.rank();
                    let data: Vec<_> = (0..PER_RANK).map(|k| sample(r, k)).collect();
                    let mut w = vec![0f32; DIM];
                    let mut ef = ErrorFeedback::new(DIM);
                    let sig = |z: f32| 1.0 / (1.0 + (-z).exp());
                    for _ in 0..STEPS {
                        let mut g = vec![0f32; DIM];
                        for (x, y) in &data {
                            let p = sig(x.iter().zip(&w).map(|(a, b)| a * b).sum());
                            for j in 0..DIM {
                                g[j] += (p - y) * x[j] / PER_RANK as f32;
                            }
                        }
                        match &codec {
                            Some(cd) => c
                                .all_reduce_compressed(
                                    &mut g,
                                    ReduceOp::Avg,
                                    cd,
                                    Some(&mut ef),
                                    CompressScope::Flat,
                                )
                                .unwrap(),
                            None => c.all_reduce_in_place(&mut g, ReduceOp::Avg).unwrap(),
                        }
                        for j in 0..DIM {
                            w[j] -= 0.5 * (g[j] + 1e-3 * w[j]);
                        }
                    }
                    let mut loss = [data
                        .iter()
                        .map(|(x, y)| {
                            let p = sig(x.iter().zip(&w).map(|(a, b)| a * b).sum())
                                .clamp(1e-7, 1.0 - 1e-7);
                            -(y * p.ln() + (1.0 - y) * (1.0 - p).ln()) as f64
                        })
                        .sum::<f64>()];
                    c.all_reduce_in_place(&mut loss, ReduceOp::Sum).unwrap();
                    loss[0] / (PER_RANK * c.size()) as f64
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    losses[0]
}

#[test]
fn compressed_training_converges_like_uncompressed() {
    let comms = Communicator::init_threads(4, Config::default()).unwrap();
    let exact = train(&comms, None);
    for spec in ["topk:0.01", "int8"] {
        let got = train(&comms, Some(Codec::parse(spec).unwrap()));
        eprintln!("final loss: uncompressed {exact:.5}, {spec} {got:.5}");
        assert!(
            (got - exact).abs() <= 0.02 * exact,
            "{spec}: final loss {got} vs uncompressed {exact} (more than 2% apart)"
        );
    }
}
