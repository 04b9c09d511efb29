//! `commbench calibrate`: measures each tier's latency and bandwidth on the
//! running job and writes a topology file (format of
//! `comm_core::topofile`) that the planner (`SNCL_TOPO_FILE`), `commbench
//! sim` and `commbench plan` (`--topo`) read.
//!
//! Run it as every rank of a job (like a measured `commbench` run), or on
//! one node as `commbench calibrate --np N` (the intra tier only). Rank 0
//! ping-pongs with one rank of its own node (intra) and one of another node
//! (inter): bandwidth is the slope between two message sizes, latency the
//! per-message intercept of that fit (at least half the round trip of 8
//! bytes), medians of `-n` repetitions. Then every rank of rank 0's node
//! sends to its counterpart on the other node at once: when that aggregate
//! is not well above one flow's rate, the node's ranks share one NIC.
//! Last, every rank reduces (`dst += src`, f32) a buffer of `--size` bytes
//! at the same time as all others, timed from a barrier to the barrier
//! after the slowest rank: bytes per rank over that time is the local copy /
//! reduction speed (`intra.reduce_bandwidth`), which the simulator and
//! `tune::choose_reducing` charge for copies and for reductions the
//! transfers do not hide.

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use comm_core::topofile::TierSpec;
use comm_core::tune::LinkCost;
use sncl::Communicator;

use crate::args::parse_size;

/// `commbench calibrate -o FILE`.
#[derive(Parser, Debug, Clone)]
#[command(name = "commbench calibrate", bin_name = "commbench calibrate")]
pub struct CalibrateArgs {
    /// Topology file to write (rank 0).
    #[arg(short = 'o', long = "output", default_value = "sncl-topo.txt")]
    pub output: String,
    /// Larger message of the bandwidth fit.
    #[arg(long = "size", default_value = "16M", value_parser = parse_size)]
    pub size: usize,
    /// Repetitions per measurement (median).
    #[arg(short = 'n', long = "iters", default_value_t = 5)]
    pub iters: usize,
    /// Token-bucket burst of the node links to record (bytes; not measured).
    #[arg(long = "burst", value_parser = parse_size)]
    pub burst: Option<usize>,
    /// Launch N local ranks as processes (as `commbench --np`): calibrates
    /// this node's tier over the transport the ranks use (shared memory, or
    /// TCP over loopback with `SNCL_TRANSPORT=tcp`).
    #[arg(long = "np")]
    pub np: Option<usize>,
    #[command(flatten)]
    pub bind: crate::binding::BindArgs,
}

/// Runs `commbench calibrate` with `argv` (without the program name).
pub fn main(argv: Vec<String>) -> ExitCode {
    let a: CalibrateArgs = match crate::parse_subcommand(&argv) {
        Ok(a) => a,
        Err(code) => return code,
    };
    if a.size < 2 || a.iters == 0 {
        eprintln!("commbench calibrate: --size must be >= 2 bytes and -n >= 1");
        return ExitCode::from(2);
    }
    if let Some(np) = a.np {
        return crate::launch::launch_local(np, 1, a.bind.bind_to, |c| run(&a, c).map(|()| true));
    }
    a.bind.bind_single_rank();
    match Communicator::from_env().and_then(|c| run(&a, &c)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("commbench calibrate: {e}");
            ExitCode::from(1)
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Round trip of `bytes` out and 8 bytes back between `a` and `b`, µs
/// (median over `iters`; measured on `a`, 0 elsewhere).
fn pingpong(
    comm: &Communicator,
    a: usize,
    b: usize,
    bytes: usize,
    iters: usize,
) -> sncl::Result<f64> {
    let me = comm.rank();
    let mut buf = vec![0u8; bytes];
    let mut ack = [0u8; 8];
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters + 1 {
        if me == a {
            let t = Instant::now();
            comm.send(&buf, b)?;
            comm.recv(&mut ack, b)?;
            times.push(t.elapsed().as_secs_f64() * 1e6);
        } else if me == b {
            comm.recv(&mut buf, a)?;
            comm.send(&ack, a)?;
        }
    }
    comm.barrier()?;
    if times.len() > 1 {
        times.remove(0); // warm-up
        Ok(median(times))
    } else {
        Ok(0.0)
    }
}

/// alpha-beta of the path a -> b from two sizes.
fn fit(
    comm: &Communicator,
    a: usize,
    b: usize,
    size: usize,
    iters: usize,
) -> sncl::Result<LinkCost> {
    let small = pingpong(comm, a, b, 8, iters)?;
    let half = pingpong(comm, a, b, size / 2, iters)?;
    let full = pingpong(comm, a, b, size, iters)?;
    // Only `a` measured (the others hold zeros): only it reports.
    let speaks = comm.rank() == a;
    let slope = (full - half) / (size - size / 2) as f64; // µs per byte
                                                          // Per-message cost of large messages: the fit's intercept less the
                                                          // small acknowledgement's one-way time (TCP ramp-up after the idle gap
                                                          // of each step shows here, not in an 8-byte ping-pong).
    let intercept = full - size as f64 * slope.max(0.0) - small / 2.0;
    if slope <= 0.0 {
        // Noise (a loaded machine) made the larger message no slower: fall
        // back to the full message's time less the small round trip, so the
        // file never says an infinite bandwidth.
        let bw = size as f64 / (full - small / 2.0).max(1e-3);
        if speaks {
            note(&format!(
                "# calibrate: ranks {a} -> {b}: {full:.1} us for {size} B is not above {half:.1} us for half of it (noise); bandwidth from the full message"
            ));
        }
        return Ok(LinkCost {
            alpha_us: (small / 2.0).max(0.0),
            bytes_per_us: bw,
        });
    }
    // The intercept of two large sizes is ill-conditioned on slow links: a
    // 4 % error in the slope at 100 Mbit/s and 8 MiB is 30 ms of intercept
    // (measured: 60.7 ms on a bed whose 8-byte half round trip is ~50 us).
    // Beyond INTERCEPT_MAX_RATIO x the half round trip, trust the latter.
    let half_rtt = (small / 2.0).max(0.0);
    let alpha = if intercept > INTERCEPT_MAX_RATIO * half_rtt.max(1.0) {
        if speaks {
            note(&format!(
                "# calibrate: ranks {a} -> {b}: fit intercept {intercept:.1} us > {INTERCEPT_MAX_RATIO} x half round trip {half_rtt:.1} us; using the half round trip"
            ));
        }
        half_rtt
    } else {
        intercept.max(half_rtt)
    };
    if speaks {
        note(&format!("# calibrate: ranks {a} -> {b}: half round trip {half_rtt:.1} us, fit intercept {intercept:.1} us"));
    }
    Ok(LinkCost {
        alpha_us: alpha,
        bytes_per_us: 1.0 / slope,
    })
}

/// Bytes per µs one rank reduces (`dst += src` over f32, [`REDUCE_PASSES`]
/// passes over `size` bytes of `dst`) while every rank does the same: the
/// time runs from a barrier to the barrier after the last rank's passes, so
/// ranks that share cores and memory share the rate; median of `iters` on
/// rank 0, `None` elsewhere.
fn local_reduce_rate(comm: &Communicator, size: usize, iters: usize) -> sncl::Result<Option<f64>> {
    let len = (size / 4).max(1);
    let src = vec![1.0f32; len];
    let mut dst = vec![0.5f32; len];
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters + 1 {
        comm.barrier()?;
        let t = Instant::now();
        for _ in 0..REDUCE_PASSES {
            for (d, s) in dst.iter_mut().zip(&src) {
                *d += *s;
            }
            std::hint::black_box(&mut dst);
        }
        // Until the last rank is done: with more ranks than cores the ranks
        // take turns, and rank 0's own loop alone would show a core's speed.
        comm.barrier()?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    times.remove(0); // warm-up (page faults)
    let t = median(times).max(1e-3);
    Ok((comm.rank() == 0).then_some((REDUCE_PASSES * len * 4) as f64 / t))
}

/// Latency of one step of a collective inside a node, µs: an 8-byte ring
/// all-reduce (2 (m − 1) steps) among the m ranks of each node, all nodes
/// at once, after [`STEP_WARMUP`] operations; median over `iters` batches
/// of [`STEP_BATCH`] operations, on rank 0 (`None` elsewhere, and where
/// rank 0's node has one rank). Unlike the ping-pong between two ranks
/// while the others wait, every rank is busy, as in a collective: where a
/// node runs more ranks than cores, each step waits for the scheduler
/// (measured on 2 cores, 4 ranks over TCP: 30–50 µs a step against a
/// 3 µs ping-pong), which the planner must price to choose between a ring
/// and recursive doubling.
fn collective_step_latency(
    comm: &Communicator,
    topo: &comm_core::topo::Topology,
    iters: usize,
) -> sncl::Result<Option<f64>> {
    let node = topo.node_of[comm.rank()];
    let Some(local) = comm.split(Some(node as u32), comm.rank() as i64)? else {
        return Ok(None);
    };
    let m = local.size();
    if m < 2 {
        return Ok(None);
    }
    local.force_algorithm(sncl::Collective::AllReduce, Some("ring"))?;
    let mut v = [1.0f32; 2];
    for _ in 0..STEP_WARMUP {
        local.all_reduce_in_place(&mut v, sncl::ReduceOp::Max)?;
    }
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        comm.barrier()?;
        let t = Instant::now();
        for _ in 0..STEP_BATCH {
            local.all_reduce_in_place(&mut v, sncl::ReduceOp::Max)?;
        }
        times.push(t.elapsed().as_secs_f64() * 1e6 / (STEP_BATCH * 2 * (m - 1)) as f64);
    }
    comm.barrier()?;
    Ok((comm.rank() == 0).then(|| median(times)))
}

/// Operations before the step latency is timed (connections and caches
/// warm).
const STEP_WARMUP: usize = 20;
/// Operations per timed batch of the step latency.
const STEP_BATCH: usize = 50;

/// Writes one diagnostic line to stderr in a single write, so that the
/// lines of ranks sharing the launcher's stderr (`--np`) do not interleave.
fn note(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("{line}\n").as_bytes());
}

/// Largest accepted ratio of the fit's intercept to the 8-byte half round trip.
const INTERCEPT_MAX_RATIO: f64 = 8.0;

/// Passes over the buffer per local-reduction measurement.
const REDUCE_PASSES: usize = 8;

fn run(a: &CalibrateArgs, comm: &Communicator) -> sncl::Result<()> {
    let ids: Vec<String> = comm.node_ids().to_vec();
    let n = comm.size();
    let topo = comm_core::topo::Topology::from_node_ids(&ids);
    let my_node = topo.node_of[0];
    let local0 = &topo.nodes[my_node];
    let intra_peer = local0.get(1).copied();
    let other = (0..topo.nnodes()).find(|&k| k != my_node);
    let inter_peer = other.map(|k| topo.nodes[k][0]);
    let mut intra = match intra_peer {
        Some(p) => Some(fit(comm, 0, p, a.size, a.iters)?),
        None => None,
    };
    let step = collective_step_latency(comm, &topo, a.iters)?;
    if let (Some(l), Some(step)) = (intra.as_mut(), step) {
        if comm.rank() == 0 {
            note(&format!(
                "# calibrate: a step of an 8-byte ring all-reduce on each node: {step:.1} us (ping-pong latency {:.1} us); the larger is intra.latency",
                l.alpha_us
            ));
        }
        l.alpha_us = l.alpha_us.max(step);
    }
    let inter = match inter_peer {
        Some(p) => Some(fit(comm, 0, p, a.size, a.iters)?),
        None => None,
    };
    // Concurrent flows from rank 0's node to the other node: shared NIC?
    let mut shared_nic = None;
    if let (Some(k), Some(one)) = (other, inter) {
        let pairs: Vec<(usize, usize)> = local0
            .iter()
            .zip(topo.nodes[k].iter())
            .map(|(&x, &y)| (x, y))
            .collect();
        if pairs.len() > 1 {
            let me = comm.rank();
            let mut buf = vec![0u8; a.size];
            let mut ack = [0u8; 8];
            let mut times = Vec::new();
            for _ in 0..a.iters.min(3) {
                comm.barrier()?;
                let t = Instant::now();
                for &(x, y) in &pairs {
                    if me == x {
                        comm.send(&buf, y)?;
                        comm.recv(&mut ack, y)?;
                    } else if me == y {
                        comm.recv(&mut buf, x)?;
                        comm.send(&ack, x)?;
                    }
                }
                comm.barrier()?;
                times.push(t.elapsed().as_secs_f64() * 1e6);
            }
            let agg = (pairs.len() * a.size) as f64 / median(times); // bytes per µs
            shared_nic = Some(agg < 1.5 * one.bytes_per_us);
            if me == 0 {
                println!(
                    "# {} concurrent flows between two nodes: {:.1} MB/s in all (one flow {:.1} MB/s)",
                    pairs.len(),
                    agg,
                    one.bytes_per_us
                );
            }
        }
    }
    let reduce = local_reduce_rate(comm, a.size, a.iters)?;
    if comm.rank() != 0 {
        return Ok(());
    }
    let mut spec = TierSpec {
        intra,
        inter,
        ..TierSpec::default()
    };
    let rpn = topo.nodes.iter().map(Vec::len).max().unwrap_or(1);
    spec.cluster.nodes = Some(topo.nnodes());
    spec.cluster.ranks_per_node = Some(rpn);
    let node_major = (0..n).all(|r| topo.node_of[r] == r / rpn);
    let round_robin = (0..n).all(|r| topo.node_of[r] == r % topo.nnodes());
    spec.cluster.placement = if node_major {
        Some("node-major".into())
    } else if round_robin {
        Some("round-robin".into())
    } else {
        None
    };
    spec.cluster.nic = shared_nic.map(|s| if s { "node" } else { "rank" }.into());
    spec.cluster.burst_bytes = a.burst.map(|b| b as f64);
    spec.cluster.reduce_bytes_per_s = reduce.map(|r| r * 1e6);
    if let Some(r) = reduce {
        println!("# local reduce (all ranks at once): {r:.1} MB/s per rank");
    }
    for (name, l) in [("intra", intra), ("inter", inter)] {
        match l {
            Some(l) => println!(
                "# {name}: latency {:.2} us, bandwidth {:.1} MB/s",
                l.alpha_us, l.bytes_per_us
            ),
            None => println!("# {name}: not measured (no such pair of ranks)"),
        }
    }
    let text = format!(
        "# written by commbench calibrate ({n} ranks, {} nodes)\n{}",
        topo.nnodes(),
        spec.to_text()
    );
    std::fs::write(&a.output, &text).map_err(|e| sncl::Error::Io {
        rank: 0,
        context: format!("writing {}", a.output),
        source: e,
    })?;
    println!("# wrote {}", a.output);
    print!("{text}");
    Ok(())
}
