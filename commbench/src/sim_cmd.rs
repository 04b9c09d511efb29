//! `commbench sim`: predicted nccl-tests rows from the simulator (`sim` crate).

use std::process::ExitCode;

use clap::Parser;
use comm_core::algo::Algorithm;
use comm_core::topofile::{parse_bandwidth, parse_latency_us, TierSpec};
use comm_core::wire::Collective;
use sim::collective::{simulate_cached, Frame, Request, TreeRuns};
use sim::model::{Cluster, Nic, Placement, Slowdown, Tier};

use crate::args::parse_size;

/// The modelled cluster, from flags or a topology file (flags win).
#[derive(clap::Args, Debug, Clone)]
pub struct ClusterArgs {
    /// Topology file (format of SNCL_TOPO_FILE; `commbench calibrate` writes one).
    #[arg(long = "topo")]
    pub topo: Option<String>,
    /// Nodes (supernodes).
    #[arg(long = "nodes")]
    pub nodes: Option<usize>,
    /// Ranks (accelerators) per node.
    #[arg(long = "ranks-per-node")]
    pub ranks_per_node: Option<usize>,
    /// Intra-node tier per rank: BANDWIDTH,LATENCY (e.g. 900GB/s,1us).
    #[arg(long = "intra")]
    pub intra: Option<String>,
    /// Inter-node tier per NIC: BANDWIDTH,LATENCY (e.g. 50GB/s,5us).
    #[arg(long = "inter")]
    pub inter: Option<String>,
    /// NIC attachment: rank (one per rank, default) or node (one shared per node).
    #[arg(long = "nic")]
    pub nic: Option<String>,
    /// Fabric oversubscription factor (>= 1, default 1).
    #[arg(long = "oversubscription")]
    pub oversubscription: Option<f64>,
    /// Rank numbering: node-major (default) or round-robin.
    #[arg(long = "placement")]
    pub placement: Option<String>,
    /// Token-bucket burst of each NIC in bytes (K/M/G), 0 = none.
    #[arg(long = "burst", value_parser = parse_size)]
    pub burst: Option<usize>,
    /// A straggler node: `NODE[:FACTOR]`, its links and compute FACTOR
    /// (default 2) times slower; repeatable. Runs in the per-rank frame,
    /// which reports the critical path.
    #[arg(long = "straggler")]
    pub straggler: Vec<String>,
    /// A degraded link: NODE:FACTOR, the node's NICs FACTOR times slower;
    /// repeatable.
    #[arg(long = "slow-link")]
    pub slow_link: Vec<String>,
    /// Mixed transports: NODE:intra=BANDWIDTH,LATENCY or
    /// NODE:inter=BANDWIDTH,LATENCY, the node's links between its own
    /// ranks (or its NICs) those of another, slower transport (e.g.
    /// 5:inter=12.5GB/s,30us for a node on TCP where the others have
    /// RDMA); repeatable. Runs in the per-rank frame.
    #[arg(long = "node-transport")]
    pub node_transport: Vec<String>,
}

/// `NODE:intra=BW,LAT` / `NODE:inter=BW,LAT` of `--node-transport`: the
/// node and its (intra, inter) tiers.
fn node_transport(s: &str) -> Result<(usize, Option<Tier>, Option<Tier>), String> {
    let bad = || {
        format!(
            "--node-transport {s:?}: expected NODE:intra=BANDWIDTH,LATENCY or \
             NODE:inter=BANDWIDTH,LATENCY (e.g. 5:inter=12.5GB/s,30us)"
        )
    };
    let (node, rest) = s.split_once(':').ok_or_else(bad)?;
    let node = node.trim().parse::<usize>().map_err(|_| bad())?;
    let (which, link) = rest.split_once('=').ok_or_else(bad)?;
    let t = tier(link, "node-transport")?;
    match which.trim() {
        "intra" => Ok((node, Some(t), None)),
        "inter" => Ok((node, None, Some(t))),
        _ => Err(bad()),
    }
}

/// `NODE[:FACTOR]` of `--straggler` / `--slow-link` (`default` when the
/// factor is left out; `None`: it may not be).
fn node_factor(s: &str, flag: &str, default: Option<f64>) -> Result<(usize, f64), String> {
    let (node, factor) = match s.split_once(':') {
        Some((n, f)) => (n, Some(f)),
        None => (s, None),
    };
    let node = node
        .trim()
        .parse::<usize>()
        .map_err(|_| format!("--{flag} {s:?}: expected NODE:FACTOR (a node number, e.g. 17:2)"))?;
    let factor = match factor {
        Some(f) => f
            .trim()
            .parse::<f64>()
            .map_err(|_| format!("--{flag} {s:?}: {f:?} is not a factor"))?,
        None => default.ok_or_else(|| format!("--{flag} {s:?}: expected NODE:FACTOR"))?,
    };
    Ok((node, factor))
}

fn tier(s: &str, what: &str) -> Result<Tier, String> {
    let (bw, lat) = s
        .split_once(',')
        .ok_or_else(|| format!("--{what} {s:?}: expected BANDWIDTH,LATENCY (e.g. 50GB/s,5us)"))?;
    Ok(Tier {
        bytes_per_s: parse_bandwidth(bw)
            .ok_or_else(|| format!("--{what}: {bw:?} is not a bandwidth"))?,
        latency_us: parse_latency_us(lat)
            .ok_or_else(|| format!("--{what}: {lat:?} is not a latency"))?,
    })
}

impl ClusterArgs {
    /// The cluster these flags (and the file) describe.
    pub fn cluster(&self) -> Result<Cluster, String> {
        let mut spec = match &self.topo {
            Some(p) => {
                let text =
                    std::fs::read_to_string(p).map_err(|e| format!("topology file {p}: {e}"))?;
                TierSpec::parse(&text, p).map_err(|e| e.to_string())?
            }
            None => TierSpec::default(),
        };
        if let Some(s) = &self.intra {
            spec.intra = Some(tier(s, "intra")?.link_cost());
        }
        if let Some(s) = &self.inter {
            spec.inter = Some(tier(s, "inter")?.link_cost());
        }
        let mut cl = Cluster::from_spec(&spec, self.nodes, self.ranks_per_node)
            .map_err(|e| e.to_string())?;
        match self.nic.as_deref() {
            None => {}
            Some("rank") => cl.nic = Nic::PerRank,
            Some("node") => cl.nic = Nic::PerNode,
            Some(x) => return Err(format!("--nic {x:?}: expected rank or node")),
        }
        match self.placement.as_deref() {
            None => {}
            Some("node-major") => cl.placement = Placement::NodeMajor,
            Some("round-robin") => cl.placement = Placement::RoundRobin,
            Some(x) => {
                return Err(format!(
                    "--placement {x:?}: expected node-major or round-robin"
                ));
            }
        }
        if let Some(o) = self.oversubscription {
            cl.oversubscription = o;
        }
        if let Some(b) = self.burst {
            cl.burst_bytes = b as f64;
        }
        for s in &self.straggler {
            let (node, factor) = node_factor(s, "straggler", Some(2.0))?;
            cl.slowdowns.push(Slowdown::straggler(node, factor));
        }
        for s in &self.slow_link {
            let (node, factor) = node_factor(s, "slow-link", None)?;
            cl.slowdowns.push(Slowdown::degraded_link(node, factor));
        }
        for s in &self.node_transport {
            let (node, intra, inter) = node_transport(s)?;
            let slow = Slowdown::other_transport(node, &cl, intra, inter)
                .map_err(|e| format!("--node-transport {s:?}: {e}"))?;
            cl.slowdowns.push(slow);
        }
        cl.validate().map_err(|e| e.to_string())?;
        Ok(cl)
    }
}

/// The share of its bytes a message between nodes keeps under the codec
/// `spec` (`sncl::Codec::parse`'s specs) with elements of `dtype`:
/// all-reduce of float sum/avg only, and only where nodes exchange data.
pub fn compression_ratio(
    spec: &str,
    coll: Collective,
    dtype: sncl::DataType,
    cl: &Cluster,
) -> Result<f64, String> {
    if coll != Collective::AllReduce {
        return Err(format!(
            "--compress {spec}: only all_reduce has a compressed form, not {}",
            coll.name()
        ));
    }
    if dtype != sncl::DataType::Float32 {
        return Err(format!(
            "--compress {spec}: the compressed all-reduce takes float (f32) data, not {}",
            dtype.name()
        ));
    }
    if cl.nodes < 2 {
        return Err(format!(
            "--compress {spec}: one node has no slow tier to compress (the codec applies \
             between nodes)"
        ));
    }
    let codec = sncl::Codec::parse(spec).map_err(|e| format!("--compress {spec}: {e}"))?;
    codec_share(&codec, dtype.size()).map_err(|e| format!("--compress {spec}: {e}"))
}

/// The share of the bytes of `elem`-byte elements that a dense `codec`'s
/// encoding of a large vector keeps (mxfp8 of f32: 8.25 / 32). Top-k is an
/// error: its sparse all-gather moves (ranks − 1) encodings per rank,
/// which scaling an all-reduce's messages does not model.
pub fn codec_share(codec: &sncl::Codec, elem: usize) -> Result<f64, String> {
    if let sncl::Codec::TopK { .. } = codec {
        return Err(
            "top-k's sparse all-gather is not modelled (only the dense codecs: fp16, bf16, \
             int8, mxfp8, mxfp4)"
                .into(),
        );
    }
    const N: usize = 1 << 20;
    Ok(codec.max_encoded_len(N) as f64 / (N * elem.max(1)) as f64)
}

/// `commbench sim OP ...`: predicted time, algbw, busbw and cross-tier share
/// per size and algorithm.
#[derive(Parser, Debug, Clone)]
#[command(name = "commbench sim", bin_name = "commbench sim")]
pub struct SimArgs {
    /// all_reduce, reduce_scatter, all_gather, broadcast or reduce; or
    /// init: the creation of a communicator on the cluster's ranks.
    pub op: String,
    /// Minimum size in bytes (K, M, G suffixes).
    #[arg(short = 'b', long = "minbytes", default_value = "32M", value_parser = parse_size)]
    pub minbytes: usize,
    /// Maximum size in bytes.
    #[arg(short = 'e', long = "maxbytes", default_value = "32M", value_parser = parse_size)]
    pub maxbytes: usize,
    /// Factor between sizes.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2.0)]
    pub stepfactor: f64,
    /// Data type (float, half, bfloat16, double, ...).
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    pub dtype: String,
    /// Algorithms, comma separated (hier, ring, flat-ring, tree, rd, auto = the planner's choice).
    #[arg(long = "algo", default_value = "auto")]
    pub algo: String,
    /// Pipeline chunk in bytes (SNCL_CHUNK_BYTES).
    #[arg(long = "chunk-bytes", default_value = "256K", value_parser = parse_size)]
    pub chunk_bytes: usize,
    /// Frame: auto, per-rank or symmetric.
    #[arg(long = "frame", default_value = "auto")]
    pub frame: String,
    /// all_reduce of float only: a dense codec of the compressed all-reduce
    /// (fp16, bf16, int8, mxfp8, mxfp8-e5m2, mxfp4): every message between
    /// nodes carries the codec's share of its bytes (with hier, the
    /// compressed all-reduce's traffic; the codec's compute is not
    /// modelled). busbw is on the uncompressed size.
    #[arg(long = "compress")]
    pub compress: Option<String>,
    /// Write the rows as JSON to FILE.
    #[arg(long = "json")]
    pub json: Option<String>,
    /// Write the predicted operations as a Chrome/Perfetto trace to FILE
    /// (the format of `commbench trace --chrome`, to open beside a
    /// measured run's).
    #[arg(long = "chrome")]
    pub chrome: Option<String>,
    /// The cluster.
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// `init`'s bootstrap model.
    #[command(flatten)]
    pub init: crate::sim_init::InitArgs,
}

/// Runs `commbench sim` with `argv` (without the program name).
pub fn main(argv: Vec<String>) -> ExitCode {
    let a: SimArgs = match crate::parse_subcommand(&argv) {
        Ok(a) => a,
        Err(code) => return code,
    };
    match run(&a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("commbench sim: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(a: &SimArgs) -> Result<(), String> {
    if a.op == "init" {
        // Only the rank count matters there: the tiers may be left out.
        let shape = match (a.cluster.nodes, a.cluster.ranks_per_node) {
            (Some(n), Some(r)) => (n, r),
            _ => {
                let cl = a.cluster.cluster()?;
                (cl.nodes, cl.ranks_per_node)
            }
        };
        return crate::sim_init::run(shape, &a.init);
    }
    let coll = Collective::from_name(&a.op)
        .filter(|c| {
            matches!(
                c,
                Collective::AllReduce
                    | Collective::AllGather
                    | Collective::ReduceScatter
                    | Collective::Broadcast
                    | Collective::Reduce
            )
        })
        .ok_or_else(|| {
            format!(
                "unknown operation {:?}; expected all_reduce, reduce_scatter, all_gather, broadcast or reduce",
                a.op
            )
        })?;
    let dtype = sncl::DataType::from_name(&a.dtype)
        .ok_or_else(|| format!("unknown data type {:?}", a.dtype))?;
    if a.minbytes > a.maxbytes || a.stepfactor <= 1.0 {
        return Err(format!(
            "-b {} must not exceed -e {} and -f {} must be > 1",
            a.minbytes, a.maxbytes, a.stepfactor
        ));
    }
    let frame = match a.frame.as_str() {
        "auto" => Frame::Auto,
        "per-rank" => Frame::PerRank,
        "symmetric" => Frame::Symmetric,
        x => {
            return Err(format!(
                "--frame {x:?}: expected auto, per-rank or symmetric"
            ));
        }
    };
    let algos: Vec<Option<Algorithm>> = a
        .algo
        .split(',')
        .map(|s| match s {
            "auto" => Ok(None),
            _ => Algorithm::from_name(s)
                .map(Some)
                .ok_or_else(|| format!("--algo: unknown algorithm {s:?}")),
        })
        .collect::<Result<_, _>>()?;
    let cl = a.cluster.cluster()?;
    let n = cl.nranks();
    let inter_ratio = match &a.compress {
        None => None,
        Some(spec) => Some(compression_ratio(spec, coll, dtype, &cl)?),
    };
    println!(
        "# sncl commbench sim {}: {} ranks = {} nodes x {} ({}), intra {:.3} GB/s {} us, inter {:.3} GB/s {} us per {}, oversubscription {}, burst {} B",
        a.op,
        n,
        cl.nodes,
        cl.ranks_per_node,
        match cl.placement {
            Placement::NodeMajor => "node-major",
            Placement::RoundRobin => "round-robin",
        },
        cl.intra.bytes_per_s / 1e9,
        cl.intra.latency_us,
        cl.inter.bytes_per_s / 1e9,
        cl.inter.latency_us,
        if cl.nic == Nic::PerRank {
            "rank"
        } else {
            "node"
        },
        cl.oversubscription,
        cl.burst_bytes
    );
    println!(
        "#       size         count      type       algo       time    algbw    busbw  cross-tier   wait-max  frame"
    );
    println!(
        "#        (B)    (elements)                            (us)   (GB/s)   (GB/s)     share        (us)"
    );
    let mut rows = Vec::new();
    let mut slices = Vec::new();
    let mut tree_runs = TreeRuns::default();
    let mut size = a.minbytes.max(dtype.size());
    loop {
        for algo in &algos {
            let req = Request {
                coll,
                algo: *algo,
                bytes: size,
                elem: dtype.size(),
                chunk_bytes: a.chunk_bytes,
                frame,
                aggregate: None,
                inter_ratio,
            };
            match simulate_cached(&cl, &req, &mut tree_runs) {
                Ok(p) => {
                    println!(
                        "{:>12} {:>13} {:>9} {:>10} {:>10.1} {:>8.3} {:>8.3} {:>10.4} {:>10.1}  {}",
                        size,
                        p.count,
                        dtype.name(),
                        p.algo.name(),
                        p.time_us,
                        p.algbw_gbs,
                        p.busbw_gbs,
                        p.cross_share(),
                        p.wait_max_us,
                        if p.symmetric { "symmetric" } else { "per-rank" }
                    );
                    let bound = p.critical.as_ref().and_then(|c| c.bottleneck(&cl));
                    let waits = sim::waits::summary(&cl, &p, sim::waits::LONGEST_DRAWN);
                    if let Some(b) = &bound {
                        println!("{}", bottleneck_line(&cl, b, &p.wait_us));
                        if let Some(line) = waits_line(&waits) {
                            println!("{line}");
                        }
                    }
                    let path = p
                        .critical
                        .as_ref()
                        .map(|c| path_slices(&cl, c))
                        .unwrap_or_default();
                    slices.push(crate::chrome::SimulatedSlice {
                        op: a.op.clone(),
                        dur_us: p.time_us,
                        args: serde_json::json!({
                            "algo": p.algo.name(), "bytes": size, "count": p.count,
                            "dtype": dtype.name(), "busbw_gbs": p.busbw_gbs,
                            "cross_tier_share": p.cross_share(), "wait_max_us": p.wait_max_us,
                        }),
                        path,
                        waits: wait_bars(&cl, &waits, p.time_us),
                    });
                    rows.push(
                        serde_json::json!({
                            "op": a.op, "algo": p.algo.name(), "type": dtype.name(),
                            "redop": if matches!(coll, Collective::AllGather | Collective::Broadcast) { "none" } else { "sum" },
                            "root": if matches!(coll, Collective::Broadcast | Collective::Reduce) { 0 } else { -1 },
                            "size": size, "count": p.count, "nranks": n,
                            "oop": {"time_us": p.time_us, "algbw": p.algbw_gbs, "busbw": p.busbw_gbs,
                                    "wrong": 0, "median_us": p.time_us},
                            "ip": null, "median_us": p.time_us, "predicted": true,
                            "frame": if p.symmetric { "symmetric" } else { "per-rank" },
                            "intra_bytes": p.intra_bytes, "inter_bytes": p.inter_bytes,
                            "cross_tier_share": p.cross_share(),
                            "wait_max_us": p.wait_max_us, "wait_mean_us": p.wait_mean_us,
                            "critical_path": bound.as_ref().map(|b| serde_json::json!({
                                "path_us": b.path_us,
                                "node": b.node.0, "node_us": b.node.1,
                                "rank": b.rank.0, "rank_us": b.rank.1,
                                "link": {"from": b.link.0 .0, "to": b.link.0 .1,
                                         "tier": if b.link.0 .2 { "inter" } else { "intra" },
                                         "us": b.link.1},
                                "per_node_us": b.per_node_us,
                            })),
                            "waits": waits_json(&waits),
                        })
                        .to_string(),
                    );
                }
                Err(e) => println!(
                    "# {:>10} {:>10}: not simulated: {e}",
                    size,
                    algo.map_or("auto", |x| x.name())
                ),
            }
        }
        let next = ((size as f64) * a.stepfactor) as usize;
        if next > a.maxbytes || next <= size {
            break;
        }
        size = next;
    }
    println!("#");
    if let Some(path) = &a.json {
        std::fs::write(path, format!("[\n{}\n]\n", rows.join(",\n")))
            .map_err(|e| format!("writing {path}: {e}"))?;
    }
    if let Some(path) = &a.chrome {
        let label = format!("commbench sim {} on {n} ranks", a.op);
        let trace = crate::chrome::simulated_trace(&label, &slices);
        std::fs::write(path, trace.to_string()).map_err(|e| format!("writing {path}: {e}"))?;
    }
    Ok(())
}

/// The comment line under a per-rank row: what bound the collective (the
/// critical path's node, rank and link) and how long ranks waited.
fn bottleneck_line(cl: &Cluster, b: &sim::critical::Bottleneck, wait_us: &[f64]) -> String {
    let share = |us: f64| 100.0 * us / b.path_us.max(f64::MIN_POSITIVE);
    let ((from, to, inter), link_us) = b.link;
    let slowest = wait_us
        .iter()
        .enumerate()
        .max_by(|x, y| x.1.total_cmp(y.1))
        .map_or((0, 0.0), |(r, w)| (r, *w));
    let slow = |node: usize| match (cl.slowdown_of(node), cl.extra_latency_of(node)) {
        ((1.0, 1.0, 1.0), (0.0, 0.0)) => String::new(),
        ((a, e, c), (0.0, 0.0)) => format!(" (slowed: intra x{a}, inter x{e}, compute x{c})"),
        ((a, e, c), (li, le)) => {
            format!(" (slowed: intra x{a} +{li} us, inter x{e} +{le} us, compute x{c})")
        }
    };
    format!(
        "#   critical path {:.1} us: node {}{} {:.0}%, rank {} {:.0}%, link {} -> {} ({}) {:.0}%; longest wait rank {} (node {}) {:.1} us",
        b.path_us,
        b.node.0,
        slow(b.node.0),
        share(b.node.1),
        b.rank.0,
        share(b.rank.1),
        from,
        to,
        if inter { "inter" } else { "intra" },
        share(link_us),
        slowest.0,
        cl.node_of(slowest.0),
        slowest.1,
    )
}

/// The comment line under the critical path's: the nodes whose ranks
/// waited longest on average (`None` when nobody waited).
fn waits_line(w: &sim::waits::Waits) -> Option<String> {
    let top = w.nodes_by_mean(3);
    if top.is_empty() {
        return None;
    }
    let nodes: Vec<String> = top
        .iter()
        .map(|s| {
            format!(
                "node {} {:.1} us (longest rank {} {:.1} us)",
                s.node, s.mean_us, s.max_rank, s.max_us
            )
        })
        .collect();
    Some(format!("#   mean wait by node: {}", nodes.join(", ")))
}

/// The waits of one row in `--json`: the longest by rank and every node's.
fn waits_json(w: &sim::waits::Waits) -> serde_json::Value {
    serde_json::json!({
        "longest": w.longest.iter().map(|x| serde_json::json!({
            "rank": x.rank, "node": x.node, "us": x.us,
        })).collect::<Vec<_>>(),
        "per_node": w.per_node.iter().map(|s| serde_json::json!({
            "node": s.node, "mean_us": s.mean_us, "max_us": s.max_us, "max_rank": s.max_rank,
        })).collect::<Vec<_>>(),
    })
}

/// The waits drawn under an operation of `time_us`: the ranks that waited
/// longest and the nodes by mean wait (at most [`crate::chrome::WAIT_TRACKS`]
/// of each), each bar as long as its wait.
fn wait_bars(cl: &Cluster, w: &sim::waits::Waits, time_us: f64) -> crate::chrome::WaitBars {
    let share = |us: f64| us / time_us.max(f64::MIN_POSITIVE);
    let slowed = |node: usize| {
        cl.slowdown_of(node) != (1.0, 1.0, 1.0) || cl.extra_latency_of(node) != (0.0, 0.0)
    };
    crate::chrome::WaitBars {
        ranks: w
            .longest
            .iter()
            .take(crate::chrome::WAIT_TRACKS)
            .map(|x| {
                (
                    format!("rank {} (node {}) waited", x.rank, x.node),
                    x.us,
                    serde_json::json!({"rank": x.rank, "node": x.node, "wait_us": x.us,
                                       "share_of_op": share(x.us), "node_slowed": slowed(x.node)}),
                )
            })
            .collect(),
        nodes: w
            .nodes_by_mean(crate::chrome::WAIT_TRACKS)
            .iter()
            .map(|s| {
                (
                    format!("node {} mean wait", s.node),
                    s.mean_us,
                    serde_json::json!({"node": s.node, "mean_us": s.mean_us, "max_us": s.max_us,
                                       "max_rank": s.max_rank, "share_of_op": share(s.mean_us),
                                       "slowed": slowed(s.node)}),
                )
            })
            .collect(),
    }
}

/// The critical path as Perfetto slices in time order: one per stretch,
/// named by what it was spent on, with the ranks' nodes.
fn path_slices(
    cl: &Cluster,
    path: &sim::critical::CriticalPath,
) -> Vec<(String, f64, serde_json::Value)> {
    use sim::critical::Part;
    path.segments
        .iter()
        .rev()
        .map(|s| match s.part {
            Part::Local { rank } => (
                format!("local work, rank {rank}"),
                s.us,
                serde_json::json!({"rank": rank, "node": cl.node_of(rank as usize)}),
            ),
            Part::Transfer { from, to, inter } => (
                format!("{} {from} -> {to}", if inter { "inter" } else { "intra" }),
                s.us,
                serde_json::json!({
                    "from": from, "to": to,
                    "from_node": cl.node_of(from as usize), "to_node": cl.node_of(to as usize),
                }),
            ),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A straggler: the ranks that wait on it are drawn with their waits
    /// (bars from the operation's start), the nodes by mean wait too, and
    /// `--json` carries the same ranks and every node's waits.
    #[test]
    fn the_waits_on_a_straggler_are_drawn_and_written() {
        let dir = std::env::temp_dir();
        let id = std::process::id();
        let chrome = dir.join(format!("sncl-sim-waits-{id}.trace"));
        let json = dir.join(format!("sncl-sim-waits-{id}.json"));
        let a = SimArgs::try_parse_from([
            "commbench sim",
            "all_reduce",
            "-b",
            "64M",
            "-e",
            "64M",
            "--algo",
            "hier",
            "--nodes",
            "8",
            "--ranks-per-node",
            "16",
            "--intra",
            "400GB/s,2us",
            "--inter",
            "50GB/s,5us",
            "--straggler",
            "5:3",
            "--chrome",
            chrome.to_str().unwrap(),
            "--json",
            json.to_str().unwrap(),
        ])
        .unwrap();
        run(&a).unwrap();
        let read = |p: &std::path::Path| -> serde_json::Value {
            let v = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
            let _ = std::fs::remove_file(p);
            v
        };
        let (trace, rows) = (read(&chrome), read(&json));
        let events = trace["traceEvents"].as_array().unwrap();
        let op = events.iter().find(|e| e["cat"] == "simulated").unwrap();
        let f = |v: &serde_json::Value| v.as_f64().unwrap();
        let bars: Vec<&serde_json::Value> = events.iter().filter(|e| e["cat"] == "wait").collect();
        let ranks: Vec<&&serde_json::Value> =
            bars.iter().filter(|e| e["args"]["rank"].is_u64()).collect();
        let nodes: Vec<&&serde_json::Value> = bars
            .iter()
            .filter(|e| e["args"]["mean_us"].is_f64())
            .collect();
        assert_eq!(ranks.len(), crate::chrome::WAIT_TRACKS, "{trace}");
        assert!(!nodes.is_empty() && nodes.len() <= 8, "{trace}");
        for b in &bars {
            assert!(f(&b["dur"]) > 0.0 && f(&b["dur"]) <= f(&op["dur"]), "{b}");
            assert_eq!(f(&b["ts"]), f(&op["ts"]));
        }
        assert!(ranks.windows(2).all(|w| f(&w[0]["dur"]) >= f(&w[1]["dur"])));
        // The longest waits are the fast nodes' ranks, waiting on node 5.
        assert_ne!(nodes[0]["args"]["node"], 5, "{trace}");
        assert_eq!(f(&ranks[0]["dur"]), f(&op["args"]["wait_max_us"]));
        let row = &rows[0]["waits"];
        let longest = row["longest"].as_array().unwrap();
        assert_eq!(longest.len(), ranks.len());
        for (x, b) in longest.iter().zip(&ranks) {
            assert_eq!(x["rank"], b["args"]["rank"]);
            assert!(f(&x["us"]) > 0.0);
        }
        let per_node = row["per_node"].as_array().unwrap();
        assert_eq!(per_node.len(), 8);
        assert!(per_node.iter().filter(|s| f(&s["mean_us"]) > 0.0).count() >= 7);
    }
}
