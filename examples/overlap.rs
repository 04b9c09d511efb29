//! A simulated backward pass that overlaps gradient all-reduce with compute.
//!
//! Layers produce gradients one after another (real arithmetic: repeated
//! fused multiply-adds over the layer's parameters); each gradient goes to a
//! Bucketer, which starts a bucket's all-reduce as soon as it is full while
//! the next layers compute. With `--no-overlap` the same gradients are
//! all-reduced after the whole backward pass. It prints step time, compute
//! time and the exposed communication time (step − compute).
//!
//!     # one rank of a job (torchrun / mpirun / srun / SNCL_* / scripts/testbed.sh)
//!     cargo run --release --example overlap -- --layers 16 --params 1048576 --compute-ms 600
//!     # both modes, 2 thread ranks in this process
//!     cargo run --release --example overlap -- --threads 2

use std::time::Instant;

use sncl::{BucketConfig, Bucketer, Communicator, Config, ConfigFromEnv, ReduceOp};

struct Opts {
    layers: usize,
    params: usize,
    compute_ms: f64,
    steps: usize,
    threads: Option<usize>,
    mode: Option<bool>,
    bucket_mb: f64,
}

fn parse() -> Opts {
    let mut o = Opts {
        layers: 16,
        params: 1 << 20,
        compute_ms: 0.0,
        steps: 3,
        threads: None,
        mode: None,
        bucket_mb: 4.0,
    };
    let a: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < a.len() {
        let v = || a.get(i + 1).cloned().unwrap_or_default();
        match a[i].as_str() {
            "--layers" => o.layers = v().parse().expect("--layers N"),
            "--params" => o.params = v().parse().expect("--params N (floats per layer)"),
            "--compute-ms" => o.compute_ms = v().parse().expect("--compute-ms MS"),
            "--steps" => o.steps = v().parse().expect("--steps N"),
            "--bucket-mb" => o.bucket_mb = v().parse().expect("--bucket-mb MB (bucket cap)"),
            "--threads" => o.threads = Some(v().parse().expect("--threads N")),
            "--overlap" => {
                o.mode = Some(true);
                i -= 1;
            }
            "--no-overlap" => {
                o.mode = Some(false);
                i -= 1;
            }
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    o
}

/// One layer's backward: `passes` sweeps of FMA over its parameters.
fn backward(layer: usize, params: &[f32], grad: &mut [f32], passes: usize) {
    let s = 1.0 + layer as f32 * 1e-3;
    for p in 0..passes {
        let k = 1e-3 * (p + 1) as f32;
        for (g, w) in grad.iter_mut().zip(params) {
            *g = g.mul_add(0.5, w * s * k);
        }
    }
}

struct Report {
    step_ms: f64,
    compute_ms: f64,
}

fn step(
    comm: &Communicator,
    o: &Opts,
    params: &[Vec<f32>],
    grads: &mut [Vec<f32>],
    passes: usize,
    overlap: bool,
) -> Report {
    let t0 = Instant::now();
    let mut compute = 0.0;
    let cap = (o.bucket_mb * (1 << 20) as f64) as usize;
    let mut bucketer = overlap.then(|| {
        Bucketer::new(
            comm,
            BucketConfig {
                op: ReduceOp::Avg,
                cap_bytes: cap,
                first_cap_bytes: cap.min(1 << 20),
                ..Default::default()
            },
        )
    });
    // Each gradient goes to its bucket as soon as backward produced it; the
    // bucketer writes the averaged values back into it at `finish`.
    for (l, grad) in grads.iter_mut().enumerate().take(o.layers).rev() {
        let c0 = Instant::now();
        backward(l, &params[l], grad, passes);
        compute += c0.elapsed().as_secs_f64() * 1e3;
        if let Some(b) = bucketer.as_mut() {
            b.add(l, grad).expect("bucket");
        }
    }
    // `finish` consumes the bucketer, which ends the gradients' borrows.
    let bucketed = bucketer.map(|b| b.finish().expect("all-reduce")).is_some();
    if !bucketed {
        for l in (0..o.layers).rev() {
            comm.all_reduce_in_place(&mut grads[l], ReduceOp::Avg)
                .expect("all-reduce");
        }
    }
    Report {
        step_ms: t0.elapsed().as_secs_f64() * 1e3,
        compute_ms: compute,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn run(comm: &Communicator, o: &Opts) {
    let params: Vec<Vec<f32>> = (0..o.layers)
        .map(|l| {
            (0..o.params)
                .map(|i| ((i + l) % 13) as f32 * 0.01)
                .collect()
        })
        .collect();
    let mut grads: Vec<Vec<f32>> = (0..o.layers).map(|_| vec![0f32; o.params]).collect();
    // Communication time alone (no compute), then calibrate the compute so
    // that it is at least the communication time (or --compute-ms).
    let mut comm_only = Vec::new();
    step(comm, o, &params, &mut grads, 0, false); // warm-up: buffers, pages, connections
    for _ in 0..3 {
        comm_only.push(step(comm, o, &params, &mut grads, 0, false).step_ms);
    }
    let comm_ms = median(comm_only);
    let t = Instant::now();
    backward(0, &params[0], &mut grads[0], 1);
    let pass_ms = (t.elapsed().as_secs_f64() * 1e3).max(1e-3) * o.layers as f64;
    let target = if o.compute_ms > 0.0 {
        o.compute_ms
    } else {
        comm_ms * 1.1
    };
    let mut passes = [(target / pass_ms).ceil() as u64; 1];
    comm.all_reduce_in_place(&mut passes, ReduceOp::Max)
        .expect("agree on compute");
    let passes = passes[0].max(1) as usize;
    let modes: Vec<bool> = match o.mode {
        Some(m) => vec![m],
        None => vec![false, true],
    };
    let mut rows = Vec::new();
    for &overlap in &modes {
        let mut steps = Vec::new();
        let mut computes = Vec::new();
        for _ in 0..o.steps {
            comm.barrier().expect("barrier");
            let r = step(comm, o, &params, &mut grads, passes, overlap);
            steps.push(r.step_ms);
            computes.push(r.compute_ms);
        }
        let (s, c) = (median(steps), median(computes));
        rows.push((overlap, s, c));
    }
    if comm.rank() == 0 {
        let mb = (o.layers * o.params * 4) as f64 / 1e6;
        println!(
            "# overlap example: {} ranks, {} layers x {} floats = {mb:.1} MB of gradients per step",
            comm.size(),
            o.layers,
            o.params
        );
        println!("# communication alone (no compute): {comm_ms:.1} ms per step");
        println!("# mode         step(ms)  compute(ms)  exposed comm(ms)  exposed / comm-alone");
        for (overlap, s, c) in rows {
            let exposed = (s - c).max(0.0);
            println!(
                "{:<12} {:>10.1} {:>12.1} {:>17.1} {:>20.3}",
                if overlap { "overlap" } else { "no-overlap" },
                s,
                c,
                exposed,
                exposed / comm_ms
            );
        }
    }
}

fn main() {
    let o = parse();
    match o.threads {
        Some(n) => {
            let comms =
                Communicator::init_threads(n, Config::from_env().expect("config")).expect("init");
            std::thread::scope(|s| {
                for c in &comms {
                    let o = &o;
                    s.spawn(move || run(c, o));
                }
            });
        }
        None => {
            let comm = Communicator::from_env().expect("init from the launcher's environment");
            run(&comm, &o);
        }
    }
}
