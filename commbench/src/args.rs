//! nccl-tests-compatible command line.

use clap::Parser;
use comm_core::algo::{self, Algorithm};
use sncl::{Collective, DataType, ReduceOp};

use crate::cases::Bench;

/// The subcommands, dispatched before these flags are parsed (each has its
/// own `--help`).
const SUBCOMMANDS: &str = "Subcommands (each with its own --help):
  commbench sim OP ...        predicted time, bandwidth and cross-tier share, by simulation
  commbench plan ...          a training step's communication cost per parallel dimension
  commbench calibrate -o F    measure this machine's tiers into a topology file
  commbench trace DIR         name the rank a hung job waits for; --chrome OUT: a Perfetto trace
  commbench soak ...          long runs that watch memory, descriptors and threads";

/// nccl-tests-style benchmark of sncl collectives.
#[derive(Parser, Debug, Clone)]
#[command(name = "commbench", version, about, after_help = SUBCOMMANDS)]
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
    /// Warm-up iterations per size (nccl-tests' default, 5).
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    pub warmup: usize,
    /// Check results (1) or not (0).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    pub check: u8,
    /// nccl-tests' GPUs per thread: sncl binds one device per rank, so 1
    /// (run more ranks, --np or -t, for more devices).
    #[arg(short = 'g', long = "ngpus", default_value_t = 1)]
    pub ngpus: usize,
    /// Data type: int8, uint8, int32, uint32, int64, uint64, half, float, double, bfloat16, f8e4m3, f8e5m2 (or f32, bf16, ...), or all.
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    pub dtype: String,
    /// Reduction: sum, prod, min, max, avg, band, bor, bxor (integers only), or all.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    pub redop: String,
    /// Root rank for rooted collectives, or `all` (every rank in turn).
    #[arg(short = 'r', long = "root", default_value = "0", value_parser = parse_root)]
    pub root: Root,
    /// Launch N local ranks as processes (at most 8 per core without
    /// --oversubscribe). The job ends within 2 s of the first rank that
    /// fails, naming it and its last error line.
    #[arg(long = "np")]
    pub np: Option<usize>,
    /// Allow --np above 8 ranks per core (as mpirun's --oversubscribe).
    #[arg(long = "oversubscribe")]
    pub oversubscribe: bool,
    /// nccl-tests' -t: ranks as threads of each process (one communicator
    /// per thread). Alone, the whole job is this process; with --np P, or
    /// under mpirun / srun / torchrun with P processes, the job is P × N
    /// ranks (process p runs ranks p×N .. p×N+N-1).
    #[arg(short = 't', long = "threads", visible_alias = "nthreads")]
    pub threads: Option<usize>,
    // Help generated from the algorithm table (see `algo_help`).
    #[arg(long = "algo", help = algo_help())]
    pub algo: Option<String>,
    /// Write the rows as JSON to FILE (rank 0; nccl-tests' -J).
    #[arg(short = 'J', long = "json", visible_alias = "output_file")]
    pub json: Option<String>,
    /// nccl-tests' -a: a size's time from the ranks' times: 0 rank 0's, 1
    /// the average (default), 2 the minimum, 3 the maximum (host buffers).
    #[arg(short = 'a', long = "average", default_value_t = 1)]
    pub average: u8,
    /// nccl-tests' -m: operations per timed iteration, issued back to back
    /// (the time printed is per operation; host buffers).
    #[arg(short = 'm', long = "agg_iters", default_value_t = 1)]
    pub agg_iters: usize,
    /// nccl-tests' -N: run the whole sweep this many times, each printed.
    #[arg(short = 'N', long = "run_cycles", default_value_t = 1)]
    pub run_cycles: usize,
    /// nccl-tests' -T: seconds an operation waits for a silent peer before
    /// it fails (sets SNCL_TIMEOUT_MS for every rank).
    #[arg(short = 'T', long = "timeout")]
    pub timeout_s: Option<u64>,
    /// nccl-tests' -p (0/1): sncl's ranks initialise in parallel either way.
    #[arg(short = 'p', long = "parallel_init", default_value_t = 0)]
    pub parallel_init: u8,
    /// nccl-tests' -z (0/1/2: 1 waits and barriers after each operation, 2
    /// waits only): host collectives return once complete either way;
    /// device runs time stream-ordered launches, so only 0 there.
    #[arg(short = 'z', long = "blocking", default_value_t = 0)]
    pub blocking: u8,
    /// nccl-tests' -O (0/1): 0 skips the out-of-place runs (in-place
    /// columns only; collectives without an in-place form are refused).
    #[arg(short = 'O', long = "out_of_place", default_value_t = 1)]
    pub out_of_place: u8,
    /// nccl-tests' -u: start every buffer this many elements past its
    /// allocation, so it is not aligned beyond its element size (host
    /// buffers; Rust slices stay aligned to their element type).
    #[arg(short = 'u', long = "unalign", default_value_t = 0)]
    pub unalign: usize,
    /// nccl-tests' -R (0/1/2): 1 or 2 allocates the buffers in windows, as
    /// --window does (sncl's registered buffers).
    #[arg(short = 'R', long = "local_register", default_value_t = 0)]
    pub local_register: u8,
    /// nccl-tests' -C: refused (sncl reports wall time; see --help).
    #[arg(short = 'C', long = "report_cputime", default_value_t = 0)]
    pub report_cputime: u8,
    /// nccl-tests' -S: refused (every operation's start and end are in the
    /// flight recorder: --flight-dump).
    #[arg(short = 'S', long = "report_timestamps", default_value_t = 0)]
    pub report_timestamps: u8,
    /// Print per-tier traffic of the benchmarked operations (intra- and
    /// inter-node bytes, the cross-tier share, op counts, wait time).
    #[arg(long = "stats")]
    pub stats: bool,
    /// Tag every benchmarked operation (`sncl::CollConfig::tag`) with a
    /// number, or with a name (its `sncl::tags::tag_of`, printed by name):
    /// shown with each operation by `commbench trace` and per tag by
    /// `--stats` (0: untagged).
    #[arg(long = "tag", default_value = "0")]
    pub tag: String,
    /// With --device: cap each operation's kernel at N thread blocks
    /// (`sncl::CollConfig::max_ctas`, NCCL's maxCTAs; 0: sncl's grid).
    #[arg(long = "max-ctas", default_value_t = 0)]
    pub max_ctas: u32,
    /// Write every rank's per-tier counters as JSON to FILE (rank 0).
    #[arg(long = "stats-json")]
    pub stats_json: Option<String>,
    /// Compress all_reduce (float sum/avg): fp16, bf16, int8, mxfp8,
    /// mxfp8-e5m2, mxfp4, topk:RATIO
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
    /// Device runs time every operation out of place, from device events.
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
    /// Run the whole benchmark N times, each a fresh launch (new processes
    /// or threads, new communicator), and report per size the minimum,
    /// median and maximum over the launches of each launch's median: how
    /// far one launch's speed can differ from the next's (1: one launch).
    #[arg(long = "launches", default_value_t = 1)]
    pub launches: usize,
    #[command(flatten)]
    pub bind: crate::binding::BindArgs,
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

/// The launch this process is part of, if a launcher (mpirun, srun,
/// torchrun, `--np`) started it; `None` when it was run by hand.
pub fn launcher_env() -> sncl::Result<Option<sncl::LaunchEnv>> {
    use sncl::ReadEnvironment;
    comm_core::settings::Environment::from_process().and_then(|vars| sncl::LaunchEnv::detect(&vars))
}

/// `-r`: one root, or every rank in turn (nccl-tests' `-r all`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Root {
    One(usize),
    All,
}

impl Root {
    /// The roots to run on `n` ranks.
    pub fn ranks(self, n: usize) -> Vec<usize> {
        match self {
            Root::One(r) => vec![r],
            Root::All => (0..n).collect(),
        }
    }
}

/// Parses `-r`: a rank number or `all`.
pub fn parse_root(s: &str) -> Result<Root, String> {
    match s.trim() {
        "all" => Ok(Root::All),
        t => t
            .parse()
            .map(Root::One)
            .map_err(|_| format!("{t:?} is not a rank number or all")),
    }
}

/// Parses "8", "64K", "16M", "1G" (powers of 1024), as every byte-valued
/// setting does (`comm_core::units::parse_bytes`).
pub fn parse_size(s: &str) -> Result<usize, String> {
    comm_core::units::parse_bytes(s)
        .ok_or_else(|| format!("{:?} is not a size (e.g. 8, 64K, 16M, 1G)", s.trim()))
}

impl Args {
    /// `--tag`'s tag: the number given, or the tag of the name given.
    pub fn tag_value(&self) -> u64 {
        self.tag
            .parse()
            .unwrap_or_else(|_| sncl::tags::tag_of(&self.tag))
    }

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
            .map(|o| match o {
                "mulsum" | "premulsum" => {
                    Err("-o mulsum: premultiplied sums are a C ABI operator \
                     (snclRedOpCreatePreMulSum, a local scaling before a sum); commbench \
                     drives the Rust API, whose sum plus your own scaling is the same"
                        .to_string())
                }
                o => ReduceOp::from_name(o).ok_or_else(|| format!("unknown reduction {o:?}")),
            })
            .collect()
    }

    /// Checks what [`Args::dtypes`], [`Args::ops`] and the sizes cannot
    /// check alone: `-b` not above `-e`, and (for a reducing collective)
    /// every reduction applying to every data type. With `-o all` or `-d
    /// all` the pairs that do not apply are skipped instead; the returned
    /// lines (nccl-tests comments) say which.
    pub fn check(&self, bench: Bench) -> Result<Vec<String>, String> {
        self.check_sweep()?;
        self.compression(bench)?;
        if let (true, Some(n), Root::One(root)) = (bench.rooted(), self.known_world(), self.root) {
            if root >= n {
                return Err(format!(
                    "-r {root}: the root must be a rank of the job, 0 to {}",
                    n.saturating_sub(1)
                ));
            }
        }
        if self.out_of_place == 0 && (!bench.has_in_place() || self.compress.is_some()) {
            return Err(format!(
                "-O 0 leaves nothing to run: {} has no in-place form",
                if self.compress.is_some() {
                    "a compressed all_reduce"
                } else {
                    self.op.as_str()
                }
            ));
        }
        let reduces = bench.reduces();
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

    /// The job's rank count where the flags tell it before launch: --np ×
    /// -t, or -t alone in a process no launcher started. (Under mpirun,
    /// srun, torchrun or --np's own children, -t is per process and the
    /// world is checked once the communicator exists.)
    pub fn known_world(&self) -> Option<usize> {
        match (self.np, self.threads) {
            (Some(p), t) => Some(p.saturating_mul(t.unwrap_or(1))),
            (None, Some(t)) => {
                let launched = launcher_env().ok().flatten().is_some();
                (!launched).then_some(t)
            }
            (None, None) => None,
        }
    }

    /// The flags of the sweep itself, as nccl-tests reads them.
    fn check_sweep(&self) -> Result<(), String> {
        if self.ngpus != 1 {
            return Err(format!(
                "-g {}: sncl binds one device per rank; run {} ranks (--np or -t) for {} devices",
                self.ngpus, self.ngpus, self.ngpus
            ));
        }
        if self.check > 1 {
            return Err(format!("-c {}: expected 0 (no check) or 1", self.check));
        }
        if self.iters == 0 {
            return Err("-n 0: at least one timed iteration (-n 1 or more)".into());
        }
        let zero_one = [
            ("-p", self.parallel_init),
            ("-O", self.out_of_place),
            ("-C", self.report_cputime),
            ("-S", self.report_timestamps),
        ];
        if let Some((flag, v)) = zero_one.iter().find(|(_, v)| *v > 1) {
            return Err(format!("{flag} {v}: expected 0 or 1"));
        }
        if self.blocking > 2 {
            return Err(format!(
                "-z {}: expected 0, 1 (wait and barrier) or 2 (wait)",
                self.blocking
            ));
        }
        if self.unalign > 4096 {
            return Err(format!(
                "-u {}: an offset of at most 4096 elements (any offset past the alignment \
                 shows the effect)",
                self.unalign
            ));
        }
        if self.average > 3 {
            return Err(format!(
                "-a {}: expected 0 (rank 0's time), 1 (average), 2 (minimum) or 3 (maximum)",
                self.average
            ));
        }
        if self.local_register > 2 {
            return Err(format!("-R {}: expected 0, 1 or 2", self.local_register));
        }
        if self.agg_iters == 0 {
            return Err("-m 0: at least one operation per iteration".into());
        }
        if self.run_cycles == 0 {
            return Err("-N 0: nccl-tests runs forever with it; give a number of cycles".into());
        }
        if self.timeout_s == Some(0) {
            return Err("-T 0: the timeout is at least 1 second".into());
        }
        if self.report_cputime != 0 {
            return Err(
                "-C 1: sncl reports wall time only (a waiting rank spins, so its CPU \
                        time is its wall time)"
                    .into(),
            );
        }
        if self.report_timestamps != 0 {
            return Err(
                "-S 1: no timestamp column; every operation's start and end are in \
                        the flight recorder (--flight-dump, then commbench trace --chrome)"
                    .into(),
            );
        }
        let sweeps = self.minbytes < self.maxbytes;
        match self.stepfactor {
            Some(f) if !(f.is_finite() && f > 1.0) && sweeps => Err(format!(
                "-f {f}: the size factor must be above 1 (-b {} to -e {} would never end)",
                self.minbytes, self.maxbytes
            )),
            None if self.stepbytes == 0 && sweeps => {
                Err("-i 0: the size increment must be at least 1 byte (or use -f)".into())
            }
            _ => Ok(()),
        }
    }

    /// `--compress`'s codec and scope; it applies to a float all-reduce with
    /// sum or avg, with a codec and scope that parse.
    pub fn compression(
        &self,
        bench: Bench,
    ) -> Result<Option<(sncl::Codec, sncl::CompressScope)>, String> {
        let Some(spec) = &self.compress else {
            return Ok(None);
        };
        let float_sum = self.dtypes()? == [DataType::Float32]
            && self
                .ops()?
                .iter()
                .all(|o| matches!(o, ReduceOp::Sum | ReduceOp::Avg));
        if bench != Bench::AllReduce || !float_sum {
            return Err(format!(
                "--compress {spec} applies to all_reduce of float with sum or avg (got {} -d {} -o {})",
                self.op, self.dtype, self.redop
            ));
        }
        let codec = sncl::Codec::parse(spec).map_err(|e| format!("--compress {spec}: {e}"))?;
        let scope = match self.compress_scope.as_str() {
            "hier" => sncl::CompressScope::Hier,
            "flat" => sncl::CompressScope::Flat,
            other => return Err(format!("--compress-scope {other}: expected hier or flat")),
        };
        Ok(Some((codec, scope)))
    }

    /// nccl-tests' parameter line (`# nThread 1 nGpus 1 minBytes ...`),
    /// so that a log says how to reproduce itself.
    pub fn parameter_line(&self) -> String {
        let step = match self.stepfactor {
            Some(f) => format!("{f}(factor)"),
            None => format!("{}(bytes)", self.stepbytes),
        };
        format!(
            "# nThread {} nGpus {} minBytes {} maxBytes {} step: {step} warmup iters: {} iters: {} \
             agg iters: {} validation: {} graph: {}",
            self.threads.unwrap_or(1),
            self.ngpus,
            self.minbytes,
            self.maxbytes,
            self.warmup,
            self.iters,
            self.agg_iters,
            self.check,
            self.cudagraph
        )
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
        let e = args(&["-b", "2K", "-e", "1K"])
            .check(Bench::AllReduce)
            .unwrap_err();
        assert!(e.contains("2048") && e.contains("1024"), "{e}");
        assert_eq!(
            args(&["-b", "1K", "-e", "1K"]).check(Bench::AllReduce),
            Ok(vec![])
        );
    }

    /// nccl-tests' flags that make no sweep, or no sense on sncl, are
    /// refused before any rank starts, naming the flag and what it takes.
    #[test]
    fn nonsense_values_are_refused_naming_the_flag() {
        for (flags, want) in [
            (&["-f", "1", "-b", "8", "-e", "64"][..], "-f 1"),
            (&["-f", "0.5", "-b", "8", "-e", "64"], "-f 0.5"),
            (&["-i", "0", "-b", "8", "-e", "64"], "-i 0"),
            (&["-n", "0"], "-n 0"),
            (&["-c", "2"], "-c 2"),
            (&["-g", "2"], "-g 2"),
            (&["--compress", "int8", "-d", "half"], "--compress int8"),
            (&["--compress", "zstd"], "--compress zstd"),
            (
                &["--compress", "int8", "--compress-scope", "x"],
                "--compress-scope x",
            ),
            (&["-N", "0"], "-N 0"),
            (&["-m", "0"], "-m 0"),
            (&["-a", "4"], "-a 4"),
            (&["-T", "0"], "-T 0"),
            (&["-R", "3"], "-R 3"),
            (&["-p", "2"], "-p 2"),
            (&["-C", "1"], "-C 1"),
            (&["-S", "1"], "-S 1"),
        ] {
            let e = args(flags).check(Bench::AllReduce).unwrap_err();
            assert!(e.starts_with(want), "{flags:?}: {e}");
        }
        // A root outside the job, for rooted collectives only.
        let e = args(&["--np", "4", "-r", "4"])
            .check(Bench::Broadcast)
            .unwrap_err();
        assert!(e.contains("0 to 3"), "{e}");
        assert!(args(&["--np", "4", "-r", "4"])
            .check(Bench::AllReduce)
            .is_ok());
        // One size needs no step; nccl-tests' README line is accepted.
        assert!(args(&["-f", "1", "-b", "8", "-e", "8"])
            .check(Bench::AllReduce)
            .is_ok());
        let readme = args(&["-b", "8", "-e", "128M", "-f", "2", "-g", "1"]);
        assert!(readme.check(Bench::AllReduce).is_ok());
        assert_eq!(readme.warmup, 5, "nccl-tests' default warm-up");
        assert_eq!(
            readme.parameter_line(),
            "# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 \
             iters: 20 agg iters: 1 validation: 1 graph: 0"
        );
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
            .check(Bench::AllReduce)
            .unwrap_err();
        assert!(e.contains("bxor") && e.contains("float"), "{e}");
        let e = args(&["-o", "sum,band", "-d", "int32,half"])
            .check(Bench::AllReduce)
            .unwrap_err();
        assert!(e.contains("band") && e.contains("half"), "{e}");
        // Not reducing: the reduction is not used.
        assert_eq!(
            args(&["-o", "bxor", "-d", "float"]).check(Bench::AllGather),
            Ok(vec![])
        );
        // A sweep skips the pairs, one line per reduction.
        let notes = args(&["-o", "bxor", "-d", "all"])
            .check(Bench::AllReduce)
            .unwrap();
        assert_eq!(notes.len(), 1);
        assert!(notes[0].starts_with('#'), "{notes:?}");
        for t in ["bxor", "half", "float", "double", "bfloat16"] {
            assert!(notes[0].contains(t), "{notes:?}");
        }
        assert!(!notes[0].contains("int32"), "{notes:?}");
        assert_eq!(
            args(&["-o", "all", "-d", "all"]).check(Bench::AllReduce),
            Ok(vec![])
        );
    }

    #[test]
    fn fp8_datatypes() {
        assert_eq!(
            args(&["-d", "f8e4m3,f8e5m2"]).dtypes(),
            Ok(vec![DataType::Float8e4m3, DataType::Float8e5m2])
        );
        assert_eq!(
            args(&["-o", "sum,min,max", "-d", "f8e4m3,f8e5m2"]).check(Bench::AllReduce),
            Ok(vec![])
        );
        let e = args(&["-o", "band", "-d", "f8e5m2"])
            .check(Bench::AllReduce)
            .unwrap_err();
        assert!(e.contains("band") && e.contains("f8e5m2"), "{e}");
    }
}
