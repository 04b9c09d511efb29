//! `commbench plan`: per-training-step communication cost report (`sim::cost`).

use std::process::ExitCode;

use clap::Parser;
use sim::cost::{compare, Dim, Mapping, StepCost, Training};

use crate::sim_cmd::ClusterArgs;

/// Per global step: bytes per parallel dimension and tier, predicted and
/// exposed time, utilisation and the cost of the waiting (docs/COST.md).
#[derive(Parser, Debug, Clone)]
#[command(name = "commbench plan", bin_name = "commbench plan")]
pub struct PlanArgs {
    /// Model parameters (e.g. 70e9).
    #[arg(long = "params")]
    pub params: f64,
    /// Transformer layers.
    #[arg(long = "layers")]
    pub layers: usize,
    /// Hidden size.
    #[arg(long = "hidden")]
    pub hidden: usize,
    /// Sequence length (tokens).
    #[arg(long = "seq", default_value_t = 4096)]
    pub seq: usize,
    /// Micro-batch in sequences.
    #[arg(long = "micro-batch", default_value_t = 1)]
    pub micro_batch: usize,
    /// Global batch in sequences (default: micro-batch x dp x --grad-accum).
    #[arg(long = "global-batch")]
    pub global_batch: Option<usize>,
    /// Gradient-accumulation steps (micro-batches per pipeline per step), when no --global-batch.
    #[arg(long = "grad-accum", default_value_t = 1)]
    pub grad_accum: usize,
    /// Data type of gradients and activations (bf16, fp16, fp32).
    #[arg(long = "dtype", default_value = "bf16")]
    pub dtype: String,
    /// Data type of gradients (overrides --dtype).
    #[arg(long = "grad-dtype")]
    pub grad_dtype: Option<String>,
    /// Data type of activations (overrides --dtype).
    #[arg(long = "act-dtype")]
    pub act_dtype: Option<String>,
    /// Data-parallel degree (default: ranks / (tp x pp)).
    #[arg(long = "dp")]
    pub dp: Option<usize>,
    /// Tensor-parallel degree.
    #[arg(long = "tp", default_value_t = 1)]
    pub tp: usize,
    /// Pipeline stages.
    #[arg(long = "pp", default_value_t = 1)]
    pub pp: usize,
    /// Expert-parallel degree (carved out of dp).
    #[arg(long = "ep", default_value_t = 1)]
    pub ep: usize,
    /// Experts per MoE layer (default: ep).
    #[arg(long = "experts")]
    pub experts: Option<usize>,
    /// Experts per token.
    #[arg(long = "top-k", default_value_t = 2)]
    pub top_k: usize,
    /// Expert capacity factor.
    #[arg(long = "capacity-factor", default_value_t = 1.25)]
    pub capacity_factor: f64,
    /// Megatron sequence parallelism (TP all-reduces become reduce-scatter + all-gather).
    #[arg(long = "sequence-parallel")]
    pub sequence_parallel: bool,
    /// Full activation recomputation (2 more TP all-reduces per layer).
    #[arg(long = "recompute")]
    pub recompute: bool,
    /// ZeRO / FSDP stage: 0, 1, 2 or 3.
    #[arg(long = "zero", default_value_t = 0)]
    pub zero: u8,
    /// Mapping of dimensions onto tiers, innermost first (e.g. tp:intra,pp:inter,dp:inter).
    #[arg(long = "map", default_value = "tp:intra,ep:intra,pp:inter,dp:inter")]
    pub map: String,
    /// Mappings to rank against each other, separated by ';' (adds to --map).
    #[arg(long = "compare")]
    pub compare: Option<String>,
    /// Compute time of one global step without communication, ms.
    #[arg(long = "step-compute-ms")]
    pub step_compute_ms: Option<f64>,
    /// Instead: FLOPs per global step (default 6 x params x tokens, x4/3 with --recompute) ...
    #[arg(long = "flops")]
    pub flops: Option<f64>,
    /// ... and sustained FLOP/s of one accelerator.
    #[arg(long = "device-flops")]
    pub device_flops: Option<f64>,
    /// Price of one accelerator-hour.
    #[arg(long = "price-per-hour", default_value_t = 0.0)]
    pub price_per_hour: f64,
    /// Global steps of the training run (default: --train-tokens / tokens per step).
    #[arg(long = "steps")]
    pub steps: Option<f64>,
    /// Tokens of the training run, when no --steps.
    #[arg(long = "train-tokens", default_value_t = 1e12)]
    pub train_tokens: f64,
    /// DP gradient bucket in MB (the last bucket's all-reduce is exposed).
    #[arg(long = "dp-bucket-mb", default_value_t = 25.0)]
    pub dp_bucket_mb: f64,
    /// Compress the DP gradient all-reduce on the slow tier with this dense
    /// codec of sncl's compressed all-reduce (fp16, bf16, int8, mxfp8,
    /// mxfp4; ZeRO 0): messages between nodes carry the codec's encoded
    /// size over the gradients' (the wire bytes, whatever the gradients'
    /// type).
    #[arg(long = "compress")]
    pub compress: Option<String>,
    /// Override an overlap rule: DIM=FRACTION hidden behind compute, comma separated (e.g. dp=1,tp=0.5).
    #[arg(long = "overlap")]
    pub overlap: Option<String>,
    /// Write the report as JSON to FILE.
    #[arg(long = "json")]
    pub json: Option<String>,
    /// Draw where the time goes into FILE (SVG).
    #[arg(long = "svg")]
    pub svg: Option<String>,
    /// The cluster.
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

fn dtype_bytes(s: &str) -> Result<usize, String> {
    match s {
        "bf16" | "bfloat16" | "fp16" | "f16" | "half" => Ok(2),
        "fp32" | "f32" | "float" => Ok(4),
        "fp8" | "f8" => Ok(1),
        _ => Err(format!("unknown dtype {s:?} (bf16, fp16, fp32, fp8)")),
    }
}

/// Runs `commbench plan` with `argv` (without the program name).
pub fn main(argv: Vec<String>) -> ExitCode {
    let a: PlanArgs = match crate::parse_subcommand(&argv) {
        Ok(a) => a,
        Err(code) => return code,
    };
    match run(&a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("commbench plan: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(a: &PlanArgs) -> Result<(), String> {
    let cl = a.cluster.cluster()?;
    let n = cl.nranks();
    let tp_pp = a.tp.max(1) * a.pp.max(1);
    let dp = a.dp.unwrap_or(n / tp_pp);
    let global_batch = a
        .global_batch
        .unwrap_or(a.micro_batch * dp * a.grad_accum.max(1));
    let grad_bytes = dtype_bytes(a.grad_dtype.as_deref().unwrap_or(&a.dtype))?;
    let act_bytes = dtype_bytes(a.act_dtype.as_deref().unwrap_or(&a.dtype))?;
    let tokens = (global_batch * a.seq) as f64;
    let step_compute_ms = match (a.step_compute_ms, a.device_flops) {
        (Some(ms), _) => ms,
        (None, Some(dev)) => {
            let flops = a.flops.unwrap_or(
                6.0 * a.params * tokens * if a.recompute { 4.0 / 3.0 } else { 1.0 },
            );
            flops / (dev * n as f64) * 1e3
        }
        (None, None) => {
            return Err("give --step-compute-ms, or --device-flops (with --flops or the 6 x params x tokens default)".into())
        }
    };
    if !(step_compute_ms.is_finite() && step_compute_ms > 0.0) {
        return Err(format!("step compute {step_compute_ms} ms must be > 0"));
    }
    let mut overlap = Vec::new();
    for part in a.overlap.iter().flat_map(|s| s.split(',')) {
        let (d, f) = part
            .split_once('=')
            .ok_or_else(|| format!("--overlap {part:?}: expected DIM=FRACTION"))?;
        let d = Dim::from_name(d).ok_or_else(|| format!("--overlap: unknown dimension {d:?}"))?;
        let f: f64 = f
            .parse()
            .ok()
            .filter(|x: &f64| (0.0..=1.0).contains(x))
            .ok_or_else(|| format!("--overlap {part:?}: fraction must be in 0..1"))?;
        overlap.push((d, f));
    }
    let t = Training {
        params: a.params,
        layers: a.layers,
        hidden: a.hidden,
        seq: a.seq,
        micro_batch: a.micro_batch,
        global_batch,
        grad_bytes,
        act_bytes,
        dp,
        tp: a.tp,
        pp: a.pp,
        ep: a.ep,
        experts: a.experts.unwrap_or(a.ep),
        top_k: a.top_k,
        capacity_factor: a.capacity_factor,
        sequence_parallel: a.sequence_parallel,
        recompute: a.recompute,
        zero: a.zero,
        step_compute_ms,
        price_per_hour: a.price_per_hour,
        steps: a.steps.unwrap_or(a.train_tokens / tokens),
        dp_bucket_bytes: a.dp_bucket_mb * 1e6,
        overlap,
        dp_compress: match &a.compress {
            None => None,
            Some(spec) => {
                let codec =
                    sncl::Codec::parse(spec).map_err(|e| format!("--compress {spec}: {e}"))?;
                Some(
                    crate::sim_cmd::codec_share(&codec, grad_bytes)
                        .map_err(|e| format!("--compress {spec}: {e}"))?,
                )
            }
        },
    };
    let mut maps = vec![Mapping::parse(&a.map).map_err(|e| e.to_string())?];
    for m in a.compare.iter().flat_map(|s| s.split(';')) {
        if !m.trim().is_empty() {
            maps.push(Mapping::parse(m).map_err(|e| e.to_string())?);
        }
    }
    let (ranked, reason) = compare(&t, &maps, &cl).map_err(|e| e.to_string())?;
    println!(
        "# sncl commbench plan: {:.3e} params, {} layers, hidden {}, seq {}, micro-batch {}, global batch {} ({} micro-batches per step), dp {} tp {} pp {} ep {}, zero {}, sp {}, recompute {}",
        t.params, t.layers, t.hidden, t.seq, t.micro_batch, t.global_batch,
        ranked.first().map_or(0, |c| c.micro_batches), t.dp, t.tp, t.pp, t.ep, t.zero,
        t.sequence_parallel, t.recompute
    );
    println!(
        "# cluster: {} nodes x {} ranks, intra {:.1} GB/s {} us, inter {:.1} GB/s {} us; compute {:.1} ms/step; price {}/h; {:.0} steps",
        cl.nodes, cl.ranks_per_node, cl.intra.bytes_per_s / 1e9, cl.intra.latency_us,
        cl.inter.bytes_per_s / 1e9, cl.inter.latency_us, t.step_compute_ms, t.price_per_hour, t.steps
    );
    for c in &ranked {
        print_cost(c);
    }
    if maps.len() > 1 {
        println!("# {reason}");
    }
    if let Some(path) = &a.json {
        let best = &ranked[0];
        let mut v = cost_json(best);
        v["recommendation"] = serde_json::json!(reason);
        v["mappings"] = serde_json::Value::Array(ranked.iter().map(cost_json).collect());
        std::fs::write(
            path,
            serde_json::to_string_pretty(&v).unwrap_or_default() + "\n",
        )
        .map_err(|e| format!("writing {path}: {e}"))?;
    }
    if let Some(path) = &a.svg {
        crate::plot::step_chart(path, &ranked).map_err(|e| format!("writing {path}: {e}"))?;
    }
    Ok(())
}

fn print_cost(c: &StepCost) {
    println!("#");
    println!("# mapping {}", c.mapping);
    println!("#  dim  degree  per-node  nodes  collective                      ops   bytes/rank     intra(B)     inter(B)    time(ms)  exposed(ms)  algo   rule");
    for d in &c.dims {
        println!(
            "   {:<4} {:>6} {:>9} {:>6}  {:<28} {:>6.0} {:>12.4e} {:>12.4e} {:>12.4e} {:>11.2} {:>12.2}  {:<6} {}",
            d.dim.name(), d.degree, d.per_node, d.nodes, d.collective, d.ops, d.bytes_per_rank,
            d.intra_bytes, d.inter_bytes, d.time_ms, d.exposed_ms, d.algo, d.rule
        );
    }
    println!(
        "#  bubble {:.2} ms; exposed {:.2} ms; utilisation {:.4}; cross-domain share {:.4}; waiting cost {:.2} per step, {:.0} per run",
        c.bubble_ms, c.exposed_ms, c.utilisation, c.cross_domain_share, c.waiting_cost_per_step,
        c.waiting_cost_per_run
    );
}

fn cost_json(c: &StepCost) -> serde_json::Value {
    let dims: Vec<serde_json::Value> = c
        .dims
        .iter()
        .map(|d| {
            serde_json::json!({
                "dim": d.dim.name(), "degree": d.degree, "per_node": d.per_node, "nodes": d.nodes,
                "collective": d.collective, "ops": d.ops, "op_bytes": d.op_bytes,
                "bytes_per_rank": d.bytes_per_rank,
                "bytes_per_tier": {"intra": d.intra_bytes, "inter": d.inter_bytes},
                "time_ms": d.time_ms, "exposed_ms": d.exposed_ms, "algo": d.algo, "rule": d.rule,
            })
        })
        .collect();
    serde_json::json!({
        "mapping": c.mapping, "dims": dims, "micro_batches": c.micro_batches,
        "compute_ms": c.compute_ms, "bubble_ms": c.bubble_ms, "exposed_ms": c.exposed_ms,
        "utilisation": c.utilisation, "cross_domain_share": c.cross_domain_share,
        "waiting_cost_per_step": c.waiting_cost_per_step,
        "waiting_cost_per_run": c.waiting_cost_per_run,
    })
}
