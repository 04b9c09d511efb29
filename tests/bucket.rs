//! Fusion: many tensors through the Bucketer equal a per-tensor all-reduce.

use sncl::{BucketConfig, Bucketer, Communicator, Config, ReduceOp};

#[test]
fn bucketed_equals_unbucketed_across_dtypes_and_caps() {
    let comms = Communicator::init_threads(4, Config::default()).unwrap();
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let r = c.rank();
                let sizes = [1usize, 300, 70_000, 5, 250_000, 17, 1 << 20];
                for (cap, first) in [(25 << 20, 1 << 20), (64 << 10, 4 << 10), (1, 1)] {
                    let cfg = BucketConfig {
                        cap_bytes: cap,
                        first_cap_bytes: first,
                        op: ReduceOp::Sum,
                        ..Default::default()
                    };
                    let mut grads: Vec<Vec<f32>> = sizes
                        .iter()
                        .enumerate()
                        .map(|(t, &n)| (0..n).map(|i| ((i * 7 + t * 3 + r) % 11) as f32).collect())
                        .collect();
                    let mut ints: Vec<Vec<f64>> = sizes[..3]
                        .iter()
                        .map(|&n| (0..n).map(|i| (i % 5 + r) as f64).collect())
                        .collect();
                    let inputs = (grads.clone(), ints.clone());
                    let mut b = Bucketer::new(c, cfg);
                    let mut int_slots = ints.iter_mut();
                    for (t, g) in grads.iter_mut().enumerate() {
                        b.add(t, g).unwrap();
                        if let Some(i) = int_slots.next() {
                            b.add(100 + t, i).unwrap();
                        }
                    }
                    b.finish().unwrap();
                    for (t, g) in inputs.0.iter().enumerate() {
                        let mut want = g.clone();
                        c.all_reduce_in_place(&mut want, ReduceOp::Sum).unwrap();
                        assert_eq!(grads[t], want, "tensor {t} cap {cap}");
                    }
                    for (t, g) in inputs.1.iter().enumerate() {
                        let mut want = g.clone();
                        c.all_reduce_in_place(&mut want, ReduceOp::Sum).unwrap();
                        assert_eq!(ints[t], want, "f64 tensor {t} cap {cap}");
                    }
                }
            });
        }
    });
}
