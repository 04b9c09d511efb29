//! nccl-tests-compatible command line.

use clap::Parser;
use sncl::{DataType, ReduceOp};

/// nccl-tests-style benchmark of sncl collectives.
#[derive(Parser, Debug, Clone)]
#[command(name = "commbench", version, about)]
pub struct Args {
    /// all_reduce, reduce_scatter, all_gather, broadcast, reduce, alltoall, gather, scatter or sendrecv
    pub op: String,
    /// Minimum size in bytes (K, M, G suffixes).
    #[arg(short = 'b', long = "minbytes", default_value = "32M", value_parser = parse_size)]
    pub minbytes: usize,
    /// Maximum size in bytes.
    #[arg(short = 'e', long = "maxbytes", default_value = "32M", value_parser = parse_size)]
    pub maxbytes: usize,
    /// Increment factor between sizes (overrides -i).
    #[arg(short = 'f', long = "stepfactor")]
    pub stepfactor: Option<f64>,
    /// Increment between sizes in bytes.
    #[arg(short = 'i', long = "stepbytes", default_value = "1M", value_parser = parse_size)]
    pub stepbytes: usize,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    pub iters: usize,
    /// Warm-up iterations per size.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 1)]
    pub warmup: usize,
    /// Check results (1) or not (0).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    pub check: u8,
    /// Data type: int8, uint8, int32, uint32, int64, uint64, half, float, double, bfloat16 (or f32, bf16, ...), or all.
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    pub dtype: String,
    /// Reduction: sum, prod, min, max, avg, or all.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    pub redop: String,
    /// Root rank for rooted collectives.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    pub root: usize,
    /// Launch N local ranks as processes.
    #[arg(long = "np")]
    pub np: Option<usize>,
    /// Force an algorithm (ring, tree, rd, pairwise); several separated by commas run one after another.
    #[arg(long = "algo")]
    pub algo: Option<String>,
    /// Write the rows as JSON to FILE (rank 0).
    #[arg(long = "json")]
    pub json: Option<String>,
    /// Print per-tier traffic of the benchmarked operations (intra- and
    /// inter-node bytes, the cross-tier share, op counts, wait time).
    #[arg(long = "stats")]
    pub stats: bool,
    /// Write every rank's per-tier counters as JSON to FILE (rank 0).
    #[arg(long = "stats-json")]
    pub stats_json: Option<String>,
    /// Compress all_reduce (float sum/avg): fp16, bf16, int8, topk:RATIO
    /// (e.g. topk:0.01 keeps 1%). busbw is on the uncompressed size.
    #[arg(long = "compress")]
    pub compress: Option<String>,
    /// Where the codec applies: hier (cross-node phase only) or flat.
    #[arg(long = "compress-scope", default_value = "hier")]
    pub compress_scope: String,
    /// Draw bus bandwidth against size per algorithm into FILE.svg (rank 0).
    #[arg(long = "plot")]
    pub plot: Option<String>,
}

/// Parses "8", "64K", "16M", "1G" (powers of 1024).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, mul) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1usize << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>()
        .map(|n| n * mul)
        .map_err(|_| format!("{s:?} is not a size (e.g. 8, 64K, 16M, 1G)"))
}

impl Args {
    /// The data types to run.
    pub fn dtypes(&self) -> Result<Vec<DataType>, String> {
        if self.dtype == "all" {
            return Ok(DataType::ALL.to_vec());
        }
        self.dtype
            .split(',')
            .map(|d| DataType::from_name(d).ok_or_else(|| format!("unknown data type {d:?}")))
            .collect()
    }

    /// The reductions to run (nccl-tests' five for `all`).
    pub fn ops(&self) -> Result<Vec<ReduceOp>, String> {
        if self.redop == "all" {
            return Ok(vec![
                ReduceOp::Sum,
                ReduceOp::Prod,
                ReduceOp::Max,
                ReduceOp::Min,
                ReduceOp::Avg,
            ]);
        }
        self.redop
            .split(',')
            .map(|o| ReduceOp::from_name(o).ok_or_else(|| format!("unknown reduction {o:?}")))
            .collect()
    }

    /// The sizes of the sweep.
    pub fn sizes(&self) -> Vec<usize> {
        let mut v = Vec::new();
        let mut s = self.minbytes;
        loop {
            v.push(s);
            let next = match self.stepfactor {
                Some(f) if f > 1.0 => ((s.max(1) as f64) * f) as usize,
                _ => s + self.stepbytes.max(1),
            };
            if next > self.maxbytes || next <= s {
                break;
            }
            s = next;
        }
        v
    }
}
