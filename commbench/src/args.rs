//! nccl-tests-compatible command line.

use clap::Parser;
use comm_core::algo::{self, Algorithm};
use sncl::{Collective, DataType, ReduceOp};

use crate::cases::Bench;

/// nccl-tests-style benchmark of sncl collectives.
#[derive(Parser, Debug, Clone)]
#[command(name = "commbench", version, about)]
pub struct Args {
    /// all_reduce, reduce_scatter, all_gather, broadcast, reduce, alltoall, gather, scatter or sendrecv
    #[arg(
        required_unless_present = "help_env",
        default_value = "",
        hide_default_value = true
    )]
    pub op: String,
    /// Print every SNCL_* setting (values, default, scope, meaning) and exit.
    #[arg(long = "help-env")]
    pub help_env: bool,
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
    /// Data type: int8, uint8, int32, uint32, int64, uint64, half, float, double, bfloat16, f8e4m3, f8e5m2 (or f32, bf16, ...), or all.
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    pub dtype: String,
    /// Reduction: sum, prod, min, max, avg, band, bor, bxor (integers only), or all.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    pub redop: String,
    /// Root rank for rooted collectives.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    pub root: usize,
    /// Launch N local ranks as processes (at most 8 per core without
    /// --oversubscribe). The job ends within 2 s of the first rank that
    /// fails, naming it and its last error line.
    #[arg(long = "np")]
    pub np: Option<usize>,
    /// Allow --np above 8 ranks per core (as mpirun's --oversubscribe).
    #[arg(long = "oversubscribe")]
    pub oversubscribe: bool,
    /// Run N ranks as threads of this one process (one communicator per
    /// thread, as nccl-tests' -t with one process); excludes --np.
    #[arg(short = 't', long = "threads", conflicts_with = "np")]
    pub threads: Option<usize>,
    // Help generated from the algorithm table (see `algo_help`).
    #[arg(long = "algo", help = algo_help())]
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
    /// Allocate the buffers in windows shared by the ranks of a node
    /// (`Communicator::alloc_window`, as nccl-tests' registered buffers):
    /// all_reduce over them runs directly (one copy) on a one-node job
    /// (other collectives keep plain buffers).
    #[arg(long = "window")]
    pub window: bool,
    /// nccl-tests' -G: capture the timed iterations into a CUDA graph and
    /// launch it this many times (--device cuda; 0: eager launches).
    #[arg(short = 'G', long = "cudagraph", default_value_t = 0)]
    pub cudagraph: usize,
    /// Where the codec applies: hier (cross-node phase only) or flat.
    #[arg(long = "compress-scope", default_value = "hier")]
    pub compress_scope: String,
    /// Where the buffers live: host, emu (the emulated device; a test
    /// double) or cuda. Default: cuda when CUDA device 0 opens, else host.
    /// Device runs support all_reduce, reduce_scatter, all_gather,
    /// broadcast and reduce, out of place; times come from device events.
    #[arg(long = "device")]
    pub device: Option<String>,
    /// Draw bus bandwidth against size per algorithm into FILE.svg (rank 0).
    #[arg(long = "plot")]
    pub plot: Option<String>,
    /// Every rank dumps its flight recorder (its last
    /// SNCL_FLIGHT_RECORDER_ENTRIES operations) to SNCL_DEBUG_DUMP_DIR at
    /// the end of the run, for `commbench trace DIR --chrome out.json`.
    #[arg(long = "flight-dump")]
    pub flight_dump: bool,
}

/// `--algo`'s help: the algorithms of every collective commbench runs, from
/// the algorithm table (`comm_core::algo::ALGORITHMS`).
pub fn algo_help() -> String {
    let per: Vec<String> = Collective::ALL
        .into_iter()
        .filter(|c| Bench::parse(c.name()).is_some())
        .map(|c| {
            let rows: Vec<String> = algo::rows(c).map(|r| r.describe()).collect();
            format!("{}: {}", c.name(), rows.join(", "))
        })
        .collect();
    format!(
        "Force an algorithm; several separated by commas run one after another. Per operation: {}",
        per.join("; ")
    )
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

    /// Checks what [`Args::dtypes`], [`Args::ops`] and the sizes cannot
    /// check alone: `-b` not above `-e`, and (for a reducing collective)
    /// every reduction applying to every data type. With `-o all` or `-d
    /// all` the pairs that do not apply are skipped instead; the returned
    /// lines (nccl-tests comments) say which.
    pub fn check(&self, reduces: bool) -> Result<Vec<String>, String> {
        if self.minbytes > self.maxbytes {
            return Err(format!(
                "-b {} bytes (minimum size) is larger than -e {} bytes (maximum size)",
                self.minbytes, self.maxbytes
            ));
        }
        let (dtypes, ops) = (self.dtypes()?, self.ops()?);
        if !reduces {
            return Ok(Vec::new());
        }
        let sweep = self.dtype == "all" || self.redop == "all";
        let mut notes = Vec::new();
        for op in &ops {
            let bad: Vec<&str> = dtypes
                .iter()
                .filter(|d| !op.supports(**d))
                .map(|d| d.name())
                .collect();
            if bad.is_empty() {
                continue;
            }
            if !sweep {
                return Err(format!(
                    "reduction {} does not apply to data type {} (bitwise reductions take integer types)",
                    op.name(),
                    bad.join(", ")
                ));
            }
            notes.push(format!(
                "# skipping {} on {}: the reduction does not apply to these types",
                op.name(),
                bad.join(", ")
            ));
        }
        Ok(notes)
    }

    /// The algorithms `--algo` forces for `coll`, in order (`[None]`, the
    /// planner's choice, without `--algo`). A name the collective does not
    /// have is an error listing the ones it has.
    pub fn algos(&self, coll: Collective) -> Result<Vec<Option<Algorithm>>, String> {
        let Some(spec) = &self.algo else {
            return Ok(vec![None]);
        };
        spec.split(',')
            .map(|name| {
                Algorithm::parse_for(coll, name.trim())
                    .map(Some)
                    .map_err(|e| format!("--algo {spec}: {e}"))
            })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Args {
        Args::try_parse_from(["commbench", "all_reduce"].iter().chain(extra)).expect("parses")
    }

    #[test]
    fn min_above_max_is_an_error_naming_both() {
        let e = args(&["-b", "2K", "-e", "1K"]).check(true).unwrap_err();
        assert!(e.contains("2048") && e.contains("1024"), "{e}");
        assert_eq!(args(&["-b", "1K", "-e", "1K"]).check(true), Ok(vec![]));
    }

    #[test]
    fn algo_names_come_from_the_table() {
        assert_eq!(args(&[]).algos(Collective::AllReduce), Ok(vec![None]));
        let a = args(&["--algo", "hier, flat-ring,rd"]);
        assert_eq!(
            a.algos(Collective::AllReduce),
            Ok(vec![
                Some(Algorithm::Hier),
                Some(Algorithm::FlatRing),
                Some(Algorithm::Rd)
            ])
        );
        let e = a.algos(Collective::Broadcast).unwrap_err();
        assert!(e.contains("broadcast has no flat-ring"), "{e}");
        assert!(e.contains(&algo::names(Collective::Broadcast)), "{e}");
        let e = args(&["--algo", "ring,"])
            .algos(Collective::AllReduce)
            .unwrap_err();
        assert!(e.contains("unknown algorithm \"\""), "{e}");
        // Every row of every collective commbench runs is accepted and in
        // the help.
        let help = algo_help();
        for row in algo::ALGORITHMS {
            if Bench::parse(row.coll.name()).is_none() {
                continue;
            }
            let a = args(&["--algo", row.algo.name()]);
            assert_eq!(a.algos(row.coll), Ok(vec![Some(row.algo)]));
            let (_, per_op) = help.split_once("Per operation: ").expect("help lists");
            let list = per_op
                .split("; ")
                .find_map(|p| p.split_once(": ").filter(|(c, _)| *c == row.coll.name()))
                .map(|(_, l)| l)
                .unwrap_or_else(|| panic!("{} not in {help}", row.coll.name()));
            assert!(list.contains(row.algo.name()), "{help}");
        }
    }

    #[test]
    fn inapplicable_reductions() {
        let e = args(&["-o", "bxor", "-d", "float"])
            .check(true)
            .unwrap_err();
        assert!(e.contains("bxor") && e.contains("float"), "{e}");
        let e = args(&["-o", "sum,band", "-d", "int32,half"])
            .check(true)
            .unwrap_err();
        assert!(e.contains("band") && e.contains("half"), "{e}");
        // Not reducing: the reduction is not used.
        assert_eq!(
            args(&["-o", "bxor", "-d", "float"]).check(false),
            Ok(vec![])
        );
        // A sweep skips the pairs, one line per reduction.
        let notes = args(&["-o", "bxor", "-d", "all"]).check(true).unwrap();
        assert_eq!(notes.len(), 1);
        assert!(notes[0].starts_with('#'), "{notes:?}");
        for t in ["bxor", "half", "float", "double", "bfloat16"] {
            assert!(notes[0].contains(t), "{notes:?}");
        }
        assert!(!notes[0].contains("int32"), "{notes:?}");
        assert_eq!(args(&["-o", "all", "-d", "all"]).check(true), Ok(vec![]));
    }

    #[test]
    fn fp8_datatypes() {
        assert_eq!(
            args(&["-d", "f8e4m3,f8e5m2"]).dtypes(),
            Ok(vec![DataType::Float8e4m3, DataType::Float8e5m2])
        );
        assert_eq!(
            args(&["-o", "sum,min,max", "-d", "f8e4m3,f8e5m2"]).check(true),
            Ok(vec![])
        );
        let e = args(&["-o", "band", "-d", "f8e5m2"])
            .check(true)
            .unwrap_err();
        assert!(e.contains("band") && e.contains("f8e5m2"), "{e}");
    }
}
