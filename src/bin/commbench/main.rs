//! commbench: nccl-tests-style benchmark for sncl.
//!
//! `commbench all_reduce -b 8 -e 64M -f 2 --np 4` launches 4 local ranks as
//! processes; without `--np` it runs as one rank of a job started by
//! torchrun, mpirun, srun or `SNCL_*` variables.

mod args;
mod cases;
mod launch;

use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use sncl::{Communicator, DataType, ReduceOp};

use args::Args;
use cases::{Bench, Case, Timing};

fn main() -> ExitCode {
    let args = Args::parse();
    if Bench::parse(&args.op).is_none() {
        eprintln!(
            "commbench: unknown operation {:?}; expected all_reduce, reduce_scatter, all_gather, broadcast, reduce, alltoall, gather, scatter or sendrecv",
            args.op
        );
        return ExitCode::from(2);
    }
    if let Err(e) = args.dtypes().and(args.ops()) {
        eprintln!("commbench: {e}");
        return ExitCode::from(2);
    }
    if let Some(np) = args.np {
        return launch::launch_local(np);
    }
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("commbench: {e}");
            ExitCode::from(1)
        }
    }
}

fn gbps(bytes: usize, us: f64) -> f64 {
    if us <= 0.0 {
        0.0
    } else {
        bytes as f64 / us / 1e3
    }
}

/// Runs the sweep; Ok(false) when some result was wrong.
fn run(args: &Args) -> sncl::Result<bool> {
    let comm = Communicator::from_env()?;
    let bench = Bench::parse(&args.op).expect("checked");
    let (n, rank) = (comm.size(), comm.rank());
    let dtypes = args.dtypes().expect("checked");
    let ops = if bench.reduces() {
        args.ops().expect("checked")
    } else {
        vec![ReduceOp::Sum]
    };
    let algos: Vec<Option<String>> = match &args.algo {
        Some(a) => a.split(',').map(|s| Some(s.trim().to_string())).collect(),
        None => vec![None],
    };
    let root = if bench.rooted() { args.root } else { 0 };
    if bench.rooted() && root >= n {
        return Err(sncl::Error::InvalidArgument {
            rank,
            op: "commbench",
            detail: format!("root {root} is out of range for {n} ranks"),
        });
    }
    let out = rank == 0;
    if out {
        println!("# sncl commbench {}: {} ranks", args.op, n);
        for r in 0..n.min(64) {
            let _ = r;
        }
        println!(
            "# transports of rank 0: {}",
            comm.transports()
                .iter()
                .enumerate()
                .filter(|(p, _)| *p != 0)
                .map(|(p, t)| format!("{p}:{t}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
        println!("#");
        println!("#                                                              out-of-place                       in-place          ");
        println!("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong");
        println!("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       ");
    }
    let mut rows = Vec::new();
    let mut any_wrong = false;
    let mut bw_sum = 0.0;
    let mut bw_rows = 0usize;
    let sizes = args.sizes();
    let started = Instant::now();
    let mut last_progress = Instant::now();
    for algo in &algos {
        if algo.is_some() || args.algo.is_some() {
            comm.force_algorithm(bench.collective(), algo.as_deref())?;
        }
        for (si, &size) in sizes.iter().enumerate() {
            for &dtype in &dtypes {
                for &op in &ops {
                    if bench.reduces() && !op.supports(dtype) {
                        continue;
                    }
                    let ts = dtype.size();
                    let count = if bench.size_is_total() {
                        size / ts / n
                    } else {
                        size / ts
                    };
                    let bytes = if bench.size_is_total() {
                        count * n * ts
                    } else {
                        count * ts
                    };
                    let case = Case {
                        bench,
                        dtype,
                        op,
                        root,
                        count,
                        iters: args.iters.max(1),
                        warmup: args.warmup,
                        check: args.check != 0,
                    };
                    let (oop, ip) = cases::run_case(&comm, &case)?;
                    let factor = bench.bus_factor(n);
                    let algo_name = comm.algorithm_for(bench.collective(), dtype, count)?;
                    any_wrong |= oop.wrong > 0 || ip.map(|t| t.wrong > 0).unwrap_or(false);
                    if out {
                        let fmt = |t: &Timing| {
                            let a = gbps(bytes, t.mean_us);
                            format!(
                                "{:>8.2} {:>7.2} {:>7.2} {:>6}",
                                t.mean_us,
                                a,
                                a * factor,
                                t.wrong
                            )
                        };
                        let ip_s = ip.as_ref().map(fmt).unwrap_or_else(|| {
                            format!("{:>8} {:>7} {:>7} {:>6}", "N/A", "N/A", "N/A", "N/A")
                        });
                        println!(
                            "{:>12} {:>12} {:>9} {:>7} {:>7} {} {}",
                            bytes,
                            if bench.size_is_total() {
                                count * n
                            } else {
                                count
                            },
                            dtype.name(),
                            if bench.reduces() { op.name() } else { "none" },
                            if bench.rooted() { root as i64 } else { -1 },
                            fmt(&oop),
                            ip_s
                        );
                        let _ = std::io::stdout().flush();
                        bw_sum += gbps(bytes, oop.mean_us) * factor;
                        bw_rows += 1;
                        rows.push(json_row(
                            &args.op,
                            algo_name,
                            dtype,
                            op,
                            bench,
                            root,
                            bytes,
                            count,
                            factor,
                            &oop,
                            ip.as_ref(),
                            n,
                        ));
                        if last_progress.elapsed().as_secs() >= 5 {
                            eprintln!(
                                "[commbench] {} of {} sizes done, {:.0} s elapsed",
                                si + 1,
                                sizes.len(),
                                started.elapsed().as_secs_f64()
                            );
                            last_progress = Instant::now();
                        }
                    }
                }
            }
        }
    }
    if out {
        println!(
            "# Out of bounds values : {} {}",
            if any_wrong { "some" } else { "0" },
            if any_wrong { "FAILED" } else { "OK" }
        );
        println!(
            "# Avg bus bandwidth    : {:.4}",
            if bw_rows > 0 {
                bw_sum / bw_rows as f64
            } else {
                0.0
            }
        );
        println!("#");
        if let Some(path) = &args.json {
            let text = format!("[\n{}\n]\n", rows.join(",\n"));
            std::fs::write(path, text).map_err(|e| sncl::Error::Io {
                rank,
                context: format!("writing {path}"),
                source: e,
            })?;
        }
    }
    Ok(!any_wrong)
}

#[allow(clippy::too_many_arguments)]
fn json_row(
    op_name: &str,
    algo: &str,
    dtype: DataType,
    op: ReduceOp,
    bench: Bench,
    root: usize,
    bytes: usize,
    count: usize,
    factor: f64,
    oop: &Timing,
    ip: Option<&Timing>,
    n: usize,
) -> String {
    let t = |t: &Timing| {
        let a = gbps(bytes, t.mean_us);
        serde_json::json!({
            "time_us": t.mean_us, "algbw": a, "busbw": a * factor,
            "wrong": t.wrong, "median_us": t.median_us,
        })
    };
    serde_json::json!({
        "op": op_name,
        "algo": algo,
        "type": dtype.name(),
        "redop": if bench.reduces() { op.name() } else { "none" },
        "root": if bench.rooted() { root as i64 } else { -1 },
        "size": bytes,
        "count": if bench.size_is_total() { count * n } else { count },
        "nranks": n,
        "oop": t(oop),
        "ip": ip.map(t),
        "median_us": oop.median_us,
    })
    .to_string()
}
