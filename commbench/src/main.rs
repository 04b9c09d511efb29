//! commbench: nccl-tests-style benchmark for sncl.
//!
//! `commbench all_reduce -b 8 -e 64M -f 2 --np 4` launches 4 local ranks as
//! processes, `--threads 4` as threads of one process; without either it
//! runs as one rank of a job started by torchrun, mpirun, srun or `SNCL_*`
//! variables.

mod args;
mod binding;
mod calibrate;
mod cases;
mod chrome;
mod devbench;
mod graph;
mod launch;
mod launches;
mod plan_cmd;
mod plot;
mod sim_cmd;
mod sim_init;
mod soak;
mod tls_certs;
mod trace;
mod trace_cmd;

use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use comm_core::algo::Algorithm;
use sncl::{Communicator, DataType, ReduceOp};

use args::Args;
use cases::{Bench, Case, Timing};

/// Parses a subcommand's arguments (`argv` without the program name): on
/// `--help` prints it and exits 0, on bad arguments prints why and exits 2.
fn parse_subcommand<A: Parser>(argv: &[String]) -> Result<A, ExitCode> {
    A::try_parse_from(argv).map_err(|e| {
        let _ = e.print();
        ExitCode::from(if e.use_stderr() { 2 } else { 0 })
    })
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    match argv.get(1).map(String::as_str) {
        Some("sim") => return sim_cmd::main(argv[1..].to_vec()),
        Some("plan") => return plan_cmd::main(argv[1..].to_vec()),
        Some("calibrate") => return calibrate::main(argv[1..].to_vec()),
        Some("trace") => return trace_cmd::main(argv[1..].to_vec()),
        Some("soak") => return soak::main(argv[1..].to_vec()),
        Some("tls-certs") => return tls_certs::main(argv[1..].to_vec()),
        _ => {}
    }
    let args = Args::parse();
    if args.launches > 1 {
        return launches::main(&argv, args.launches, args.json.is_some());
    }
    if args.help_env {
        print!("{}", comm_core::settings::render_help());
        return ExitCode::SUCCESS;
    }
    let Some(bench) = Bench::parse(&args.op) else {
        eprintln!(
            "commbench: unknown operation {:?}; expected all_reduce, reduce_scatter, all_gather, broadcast, reduce, alltoall, gather, scatter or sendrecv",
            args.op
        );
        return ExitCode::from(2);
    };
    let notes = match args.check(bench) {
        Ok(notes) => notes,
        Err(e) => {
            eprintln!("commbench: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = args.algos(bench.collective()) {
        eprintln!("commbench: {e}");
        return ExitCode::from(2);
    }
    if args.flight_dump {
        use sncl::ConfigFromEnv;
        match sncl::Config::from_env() {
            Ok(c) if c.debug_dump_dir.is_some() => {}
            Ok(_) => {
                eprintln!(
                    "commbench: --flight-dump needs SNCL_DEBUG_DUMP_DIR (the directory the ranks dump to)"
                );
                return ExitCode::from(2);
            }
            Err(e) => {
                eprintln!("commbench: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let place = match devbench::Where::choose(args.device.as_deref()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("commbench: {e}");
            return ExitCode::from(1);
        }
    };
    if args.cudagraph > 0 && place != devbench::Where::Device(sncl::device::Backend::Cuda) {
        eprintln!("commbench: -G (CUDA graphs) needs --device cuda");
        return ExitCode::from(2);
    }
    if place != devbench::Where::Host {
        let host_only = [
            (
                args.average != 1,
                "-a (device runs report the average over ranks)",
            ),
            (
                args.agg_iters != 1,
                "-m (device runs time one operation per launch)",
            ),
            (
                args.blocking != 0,
                "-z 1 or 2 (device runs time stream-ordered launches)",
            ),
            (
                args.out_of_place == 0,
                "-O 0 (device runs are out of place only, so nothing would run)",
            ),
            (
                args.unalign != 0,
                "-u (device buffers come from the device's allocator)",
            ),
        ];
        if let Some((_, what)) = host_only.iter().find(|(on, _)| *on) {
            eprintln!("commbench: {what} applies to host buffers; drop it or use --device host");
            return ExitCode::from(2);
        }
    }
    if let Some(secs) = args.timeout_s {
        // Every rank reads it: threads of this process and --np children
        // (before any thread or rank starts).
        std::env::set_var("SNCL_TIMEOUT_MS", (secs.saturating_mul(1000)).to_string());
    }
    let rank = |comm: &Communicator| run(&args, comm, &notes);
    if let Some(np) = args.np {
        let threads = args.threads.unwrap_or(1);
        if let Err(e) = launch::check_subscription(np.saturating_mul(threads), args.oversubscribe) {
            eprintln!("commbench: {e}");
            return ExitCode::from(2);
        }
        return launch::launch_local(np, threads, args.bind.bind_to, rank);
    }
    if let Some(threads) = args.threads {
        // Under a launcher (mpirun, srun, torchrun, or --np's own children)
        // this process is one of several, each of -t ranks (nccl-tests' -t);
        // run by hand, it is the whole job.
        return match args::launcher_env() {
            Ok(Some(env)) => ExitCode::from(launch::run_thread_ranks(
                &env.unique_id(),
                (env.rank, env.world_size),
                threads,
                args.bind.cpus(),
                &rank,
            )),
            Ok(None) => launch::launch_threads(threads, rank),
            Err(e) => {
                eprintln!("commbench: {e}");
                ExitCode::from(2)
            }
        };
    }
    args.bind.bind_single_rank();
    ExitCode::from(outcome(
        Communicator::from_env().and_then(|comm| run(&args, &comm, &notes)),
    ))
}

/// The exit code of one rank's run: 0 when every result was right, 1 when
/// some was wrong or the run failed (the error goes to stderr).
fn outcome(r: sncl::Result<bool>) -> u8 {
    match r {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            eprintln!("commbench: {e}");
            1
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

/// Runs the sweep as one rank of `comm`; Ok(false) when some result was
/// wrong. Rank 0 prints the table, after the lines of `notes`.
fn run(args: &Args, comm: &Communicator, notes: &[String]) -> sncl::Result<bool> {
    let bench = Bench::parse(&args.op).expect("checked");
    let (n, rank) = (comm.size(), comm.rank());
    let dtypes = args.dtypes().expect("checked");
    let ops = if bench.reduces() {
        args.ops().expect("checked")
    } else {
        vec![ReduceOp::Sum]
    };
    let algos = args
        .algos(bench.collective())
        .map_err(|detail| sncl::Error::InvalidArgument {
            rank,
            op: "commbench",
            detail,
        })?;
    let roots = if bench.rooted() {
        args.root.ranks(n)
    } else {
        vec![0]
    };
    // The flags were checked before launch (Args::check).
    let compress = args.compression(bench).expect("checked");
    if let Some(root) = roots.iter().find(|&&r| r >= n) {
        return Err(sncl::Error::InvalidArgument {
            rank,
            op: "commbench",
            detail: format!("root {root} is out of range for {n} ranks"),
        });
    }
    let place = devbench::Where::choose(args.device.as_deref()).map_err(|detail| {
        sncl::Error::InvalidArgument {
            rank,
            op: "commbench",
            detail,
        }
    })?;
    let sizes = args.sizes();
    let mut dev = match place {
        devbench::Where::Host => None,
        // The largest size, for every rank's blocks (all_gather's receive).
        devbench::Where::Device(b) => {
            let largest = sizes.iter().copied().max().unwrap_or(0);
            Some(devbench::Dev::open(comm, b, largest.saturating_mul(n))?)
        }
    };
    let out = rank == 0;
    let algo_column = algos.len() > 1;
    if out {
        println!("# sncl commbench {}: {} ranks", args.op, n);
        println!(
            "# device: {}",
            dev.as_ref().map_or_else(
                || "host (buffers in host memory)".to_string(),
                |d| d.describe()
            )
        );
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
        println!("{}", args.parameter_line());
    }
    // nccl-tests' per-rank lines: pid, host and device of every rank.
    let line = rank_line(rank, dev.as_ref().map(|d| d.describe()));
    let lines = gather_lines(comm, &line)?;
    if out {
        println!("#");
        println!("# Using devices");
        for l in &lines {
            println!("{l}");
        }
        for line in notes {
            println!("{line}");
        }
        println!("#");
        // An algo column when --algo runs several, so each row says which.
        let pad = if algo_column {
            " ".repeat(11)
        } else {
            String::new()
        };
        println!("#                                                     {pad}         out-of-place                       in-place          ");
        println!(
            "#       size         count      type   redop    root{}     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
            if algo_column { format!(" {:>10}", "algo") } else { String::new() }
        );
        println!("#        (B)    (elements)                          {pad}     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       ");
    }
    let mut rows = Vec::new();
    let mut traffic = sncl::Stats::default();
    let mut series: Vec<plot::Series> = Vec::new();
    let mut any_wrong = false;
    let mut bw_sum = 0.0;
    let mut bw_rows = 0usize;
    let started = Instant::now();
    let mut last_progress = Instant::now();
    for (cycle, algo) in (0..args.run_cycles).flat_map(|c| algos.iter().map(move |a| (c, a))) {
        if out && args.run_cycles > 1 && algo == &algos[0] {
            println!("# cycle {} of {}", cycle + 1, args.run_cycles);
        }
        if algo.is_some() || args.algo.is_some() {
            comm.force_algorithm(bench.collective(), algo.map(Algorithm::name))?;
        }
        let name = algo.map_or("default", Algorithm::name);
        series.push(plot::Series {
            label: if args.run_cycles > 1 {
                format!("{name} (cycle {})", cycle + 1)
            } else {
                name.to_string()
            },
            points: Vec::new(),
        });
        // nccl-tests' order: type, then reduction, then root, then size
        // innermost (a sweep of sizes reads as one block).
        let mut cases = Vec::new();
        for &dtype in &dtypes {
            for &op in &ops {
                for &root in &roots {
                    cases.push((dtype, op, root));
                }
            }
        }
        for (dtype, op, root) in cases {
            if bench.reduces() && !op.supports(dtype) {
                continue;
            }
            for (si, &size) in sizes.iter().enumerate() {
                {
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
                        compress,
                        window: args.window || args.local_register > 0,
                        graph_launches: args.cudagraph,
                        agg: args.agg_iters,
                        average: args.average,
                        out_of_place: args.out_of_place != 0,
                        unalign: args.unalign,
                        config: sncl::CollConfig {
                            max_ctas: args.max_ctas,
                            ..sncl::CollConfig::tagged(args.tag_value())
                        },
                    };
                    let (oop, ip) = match &mut dev {
                        Some(d) => {
                            let (oop, ip) = devbench::run_case(comm, d, &case)?;
                            (Some(oop), ip)
                        }
                        None => cases::run_case(comm, &case)?,
                    };
                    // The bandwidth summary and the plot: out of place, or
                    // in place under -O 0.
                    let Some(headline) = oop.as_ref().or(ip.as_ref()) else {
                        continue;
                    };
                    let factor = bench.bus_factor(n);
                    let algo_name = match &case.compress {
                        Some((codec, _)) => format!("compressed-{}", codec.name()),
                        None => comm
                            .algorithm_for(bench.collective(), dtype, count)?
                            .to_string(),
                    };
                    for t in oop.iter().chain(ip.iter()) {
                        any_wrong |= t.wrong > 0 || t.own_wrong > 0;
                        traffic.merge(&t.traffic);
                    }
                    if out {
                        let fmt = |t: &Timing| {
                            let a = gbps(bytes, t.mean_us);
                            format!(
                                "{:>8.2} {:>7.2} {:>7.2} {:>6}",
                                t.mean_us,
                                a,
                                a * factor,
                                if case.check {
                                    t.wrong.to_string()
                                } else {
                                    "N/A".into()
                                }
                            )
                        };
                        let not_run =
                            || format!("{:>8} {:>7} {:>7} {:>6}", "N/A", "N/A", "N/A", "N/A");
                        let oop_s = oop.as_ref().map(fmt).unwrap_or_else(not_run);
                        let ip_s = ip.as_ref().map(fmt).unwrap_or_else(not_run);
                        println!(
                            "{:>12} {:>12} {:>9} {:>7} {:>7}{} {} {}",
                            bytes,
                            if bench.size_is_total() {
                                count * n
                            } else {
                                count
                            },
                            dtype.name(),
                            if bench.reduces() { op.name() } else { "none" },
                            if bench.rooted() { root as i64 } else { -1 },
                            if algo_column {
                                format!(" {:>10}", name)
                            } else {
                                String::new()
                            },
                            oop_s,
                            ip_s
                        );
                        let _ = std::io::stdout().flush();
                        bw_sum += gbps(bytes, headline.mean_us) * factor;
                        if let Some(last) = series.last_mut() {
                            last.points
                                .push((bytes as f64, gbps(bytes, headline.mean_us) * factor));
                        }
                        bw_rows += 1;
                        rows.push(json_row(
                            &args.op,
                            &algo_name,
                            dtype,
                            op,
                            bench,
                            root,
                            bytes,
                            count,
                            factor,
                            oop.as_ref(),
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
    traffic.rank = rank;
    let all_stats = gather_stats(comm, &traffic)?;
    if out && args.stats {
        print_stats(&all_stats);
        println!("# memory held by {}", comm.mem_stats());
    }
    if out {
        if let Some(path) = &args.stats_json {
            let text = format!(
                "[\n{}\n]\n",
                all_stats
                    .iter()
                    .map(stats_json)
                    .collect::<Vec<_>>()
                    .join(",\n")
            );
            std::fs::write(path, text).map_err(|e| sncl::Error::Io {
                rank,
                context: format!("writing {path}"),
                source: e,
            })?;
        }
        if let Some(path) = &args.plot {
            let title = format!("sncl {} on {} ranks", args.op, n);
            if let Err(e) = plot::draw(path, &title, &series) {
                eprintln!("commbench: cannot draw {path}: {e}");
            }
        }
    }
    if out {
        println!(
            "# Out of bounds values : {} {}",
            match (args.check, any_wrong) {
                (0, _) => "N/A",
                (_, true) => "some",
                _ => "0",
            },
            match (args.check, any_wrong) {
                (0, _) => "(not checked: -c 0)",
                (_, true) => "FAILED",
                _ => "OK",
            }
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
    if args.flight_dump {
        comm.dump_flight_recorder()?;
    }
    Ok(!any_wrong)
}

/// Bytes of one rank's line in the gathered header.
const RANK_LINE_BYTES: usize = 160;

/// This rank's header line, as nccl-tests prints it.
fn rank_line(rank: usize, device: Option<String>) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    format!(
        "#  Rank {rank:2} Group  0 Pid {:6} on {host:>10} device {} cpus {}",
        std::process::id(),
        device.unwrap_or_else(|| "host".into()),
        binding::describe_current()
    )
}

/// Every rank's `line`, in rank order (an all-gather of fixed-size lines).
fn gather_lines(comm: &Communicator, line: &str) -> sncl::Result<Vec<String>> {
    let mut mine = [b' '; RANK_LINE_BYTES];
    let bytes = line.as_bytes();
    let n = bytes.len().min(RANK_LINE_BYTES);
    mine[..n].copy_from_slice(&bytes[..n]);
    let mut all = vec![0u8; RANK_LINE_BYTES * comm.size()];
    comm.all_gather(&mine, &mut all)?;
    Ok(all
        .chunks(RANK_LINE_BYTES)
        .map(|c| String::from_utf8_lossy(c).trim_end().to_string())
        .collect())
}

/// Every rank's counters, on rank 0 (other ranks get an empty list).
fn gather_stats(comm: &Communicator, mine: &sncl::Stats) -> sncl::Result<Vec<sncl::Stats>> {
    let n = comm.size();
    let mut v = vec![
        mine.ops,
        mine.intra_sent,
        mine.intra_received,
        mine.inter_sent,
        mine.inter_received,
        mine.wait_time.as_nanos() as u64,
        mine.busy_time.as_nanos() as u64,
        mine.retransmits,
    ];
    // The transport kinds whose bytes `--stats` gathers from every rank:
    // the registry's, in its order (every rank's build has the same).
    let kinds = sncl::transport_names();
    for kind in &kinds {
        let (s, r) = mine
            .by_transport
            .iter()
            .find(|(k, _, _)| k == *kind)
            .map_or((0, 0), |(_, s, r)| (*s, *r));
        v.extend([s, r]);
    }
    let mut all = vec![0u64; v.len() * n];
    comm.all_gather(&v, &mut all)?;
    Ok(all
        .chunks(v.len())
        .enumerate()
        .map(|(r, c)| sncl::Stats {
            rank: r,
            ops: c[0],
            ops_by_collective: if r == comm.rank() {
                mine.ops_by_collective.clone()
            } else {
                Vec::new()
            },
            ops_by_tag: if r == comm.rank() {
                mine.ops_by_tag.clone()
            } else {
                Vec::new()
            },
            intra_sent: c[1],
            intra_received: c[2],
            inter_sent: c[3],
            inter_received: c[4],
            wait_time: std::time::Duration::from_nanos(c[5]),
            busy_time: std::time::Duration::from_nanos(c[6]),
            by_transport: kinds
                .iter()
                .enumerate()
                .filter(|(i, _)| c[8 + 2 * i] + c[9 + 2 * i] > 0)
                .map(|(i, k)| (k.to_string(), c[8 + 2 * i], c[9 + 2 * i]))
                .collect(),
            retransmits: c[7],
        })
        .collect())
}

fn print_stats(all: &[sncl::Stats]) {
    println!("# per-tier traffic of the benchmarked operations (bytes sent / received):");
    println!("#  rank        intra-sent        inter-sent     intra-recv     inter-recv  cross-tier   wait(ms)");
    let mut total = sncl::Stats::default();
    for s in all {
        println!(
            "# {:>5} {:>17} {:>17} {:>14} {:>14} {:>10.4} {:>10.2}",
            s.rank,
            s.intra_sent,
            s.inter_sent,
            s.intra_received,
            s.inter_received,
            s.cross_tier_share(),
            s.wait_time.as_secs_f64() * 1e3
        );
        total.merge(s);
    }
    println!(
        "# total: {} bytes sent, {} across nodes; cross-tier share {:.4}; {} ops per rank",
        total.intra_sent + total.inter_sent,
        total.inter_sent,
        total.cross_tier_share(),
        all.first().map_or(0, |s| s.ops)
    );
    let kinds: Vec<String> = total
        .by_transport
        .iter()
        .map(|(k, s, r)| format!("{k} {s} sent / {r} received"))
        .collect();
    println!("# bytes by transport: {}", kinds.join("; "));
    println!(
        "# TCP retransmitted segments (all ranks, since the connections opened): {}",
        total.retransmits
    );
    // Tags are counted where the operations ran: the printing rank's own.
    for s in all.iter().filter(|s| !s.ops_by_tag.is_empty()) {
        let tags: Vec<String> = s
            .ops_by_tag
            .iter()
            .map(|(tag, n, busy)| {
                format!(
                    "tag {}: {n} ops, {:.3} ms busy",
                    tag_label(*tag),
                    busy.as_secs_f64() * 1e3
                )
            })
            .collect();
        println!(
            "# operations by tag on rank {}: {}",
            s.rank,
            tags.join("; ")
        );
    }
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
    oop: Option<&Timing>,
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
        "oop": oop.map(t),
        "ip": ip.map(t),
        "median_us": oop.or(ip).map(|t| t.median_us),
    })
    .to_string()
}

/// A rank's counters as one JSON object (`--stats-json`).
fn stats_json(s: &sncl::Stats) -> String {
    let ops: serde_json::Map<String, serde_json::Value> = s
        .ops_by_collective
        .iter()
        .map(|(c, n)| (c.clone(), serde_json::Value::from(*n)))
        .collect();
    serde_json::json!({
        "rank": s.rank,
        "ops": s.ops,
        "ops_by_collective": ops,
        "intra_sent": s.intra_sent,
        "intra_received": s.intra_received,
        "inter_sent": s.inter_sent,
        "inter_received": s.inter_received,
        "cross_tier_share": s.cross_tier_share(),
        "wait_us": s.wait_time.as_secs_f64() * 1e6,
        "busy_us": s.busy_time.as_secs_f64() * 1e6,
        "retransmits": s.retransmits,
        "ops_by_tag": s
            .ops_by_tag
            .iter()
            .map(|(tag, n, busy)| {
                (tag.to_string(), serde_json::json!({
                    "ops": n,
                    "busy_us": busy.as_secs_f64() * 1e6,
                    "name": sncl::tags::name_of(*tag),
                }))
            })
            .collect::<serde_json::Map<String, serde_json::Value>>(),
        "by_transport": s
            .by_transport
            .iter()
            .map(|(k, sent, received)| (k.clone(), serde_json::json!({"sent": sent, "received": received})))
            .collect::<serde_json::Map<String, serde_json::Value>>(),
    })
    .to_string()
}

/// A tag as `--stats` prints it: its name and number where it has a name
/// in this process ([`sncl::tags::tag_of`]), else its number.
fn tag_label(tag: u64) -> String {
    match sncl::tags::name_of(tag) {
        Some(name) => format!("{name:?} ({tag})"),
        None => tag.to_string(),
    }
}
