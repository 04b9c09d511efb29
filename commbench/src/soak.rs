//! `commbench soak`: one rank of a long run of all-reduces (launched by
//! `scripts/soak.sh`, or any launcher) that samples this process's RSS,
//! open file descriptors and threads every `--sample-every` operations and
//! judges leaks: RSS within `--rss-tolerance` percent between the first and
//! the last sample, fds and threads unchanged.
//!
//! Sizes are random (a seeded generator every rank runs identically) from
//! `--min-bytes` to `--max-bytes`; the `--large` operations of
//! `--large-bytes` are spread evenly among the small ones, so the first
//! sample already follows some of them (the scratch space is grown by then).

use std::process::ExitCode;

use clap::Parser;
use sncl::{Communicator, ReduceOp};

use crate::args::parse_size;

/// Options of `commbench soak`.
#[derive(Parser, Debug, Clone)]
#[command(name = "commbench soak", bin_name = "commbench soak")]
pub struct SoakArgs {
    /// Small all-reduces.
    #[arg(long = "small", default_value_t = 100_000)]
    pub small: u64,
    /// Large all-reduces.
    #[arg(long = "large", default_value_t = 1000)]
    pub large: u64,
    /// Smallest small all-reduce, bytes.
    #[arg(long = "min-bytes", default_value = "8")]
    pub min_bytes: String,
    /// Largest small all-reduce, bytes.
    #[arg(long = "max-bytes", default_value = "4K")]
    pub max_bytes: String,
    /// Size of a large all-reduce, bytes.
    #[arg(long = "large-bytes", default_value = "16M")]
    pub large_bytes: String,
    /// Sample every this many operations.
    #[arg(long = "sample-every", default_value_t = 10_000)]
    pub sample_every: u64,
    /// Allowed RSS growth from the first to the last sample, percent.
    #[arg(long = "rss-tolerance", default_value_t = 5.0)]
    pub rss_tolerance: f64,
    /// Seed of the size sequence (must be the same on every rank).
    #[arg(long = "seed", default_value_t = 0x5eed)]
    pub seed: u64,
}

/// One sample of this process.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// Operations done.
    pub ops: u64,
    /// Resident set, KiB.
    pub rss_kib: u64,
    /// Open file descriptors.
    pub fds: usize,
    /// Threads.
    pub threads: u64,
}

fn status_field(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Samples this process from /proc.
pub fn sample(ops: u64) -> std::io::Result<Sample> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let bad = |k: &str| std::io::Error::other(format!("/proc/self/status has no {k}"));
    Ok(Sample {
        ops,
        rss_kib: status_field(&status, "VmRSS:").ok_or_else(|| bad("VmRSS"))?,
        threads: status_field(&status, "Threads:").ok_or_else(|| bad("Threads"))?,
        // Minus the directory handle read_dir holds while counting.
        fds: std::fs::read_dir("/proc/self/fd")?
            .count()
            .saturating_sub(1),
    })
}

/// The verdict on a run's samples: None when it passes, else why not.
pub fn judge(samples: &[Sample], rss_tolerance: f64) -> Option<String> {
    let (first, last) = match samples {
        [] | [_] => return Some(format!("{} sample(s): too few to judge", samples.len())),
        [f, .., l] => (f, l),
    };
    let mut why = Vec::new();
    let growth = (last.rss_kib as f64 - first.rss_kib as f64) / first.rss_kib.max(1) as f64 * 100.0;
    if growth > rss_tolerance {
        why.push(format!(
            "RSS grew {growth:.1} % ({} KiB at {} ops -> {} KiB at {} ops; allowed {rss_tolerance} %)",
            first.rss_kib, first.ops, last.rss_kib, last.ops
        ));
    }
    if last.fds != first.fds {
        why.push(format!("fds {} -> {}", first.fds, last.fds));
    }
    if last.threads != first.threads {
        why.push(format!("threads {} -> {}", first.threads, last.threads));
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// xorshift64*: the same sequence on every rank.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// `commbench soak ...` (one rank; the job comes from the environment).
pub fn main(argv: Vec<String>) -> ExitCode {
    let args: SoakArgs = match crate::parse_subcommand(&argv) {
        Ok(a) => a,
        Err(code) => return code,
    };
    let sizes = (
        parse_size(&args.min_bytes),
        parse_size(&args.max_bytes),
        parse_size(&args.large_bytes),
    );
    let (min, max, large) = match sizes {
        (Ok(a), Ok(b), Ok(c)) if a >= 4 && a <= b && args.sample_every > 0 => (a, b, c),
        _ => {
            eprintln!(
                "commbench soak: need 4 <= --min-bytes <= --max-bytes, valid sizes and --sample-every > 0 (got {:?} {:?} {:?})",
                args.min_bytes, args.max_bytes, args.large_bytes
            );
            return ExitCode::from(2);
        }
    };
    sncl::init_logging();
    let comm = match Communicator::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("commbench soak: init failed: {e}");
            return ExitCode::from(1);
        }
    };
    let r = comm.rank();
    let total = args.small + args.large;
    let large_every = total.checked_div(args.large).unwrap_or(u64::MAX);
    let mut small_buf = vec![1.0f32; max / 4];
    let mut large_buf = vec![1.0f32; large / 4];
    let mut rng = args.seed | 1;
    let (mut smalls, mut larges) = (0u64, 0u64);
    let mut samples = Vec::new();
    let started = std::time::Instant::now();
    for i in 1..=total {
        let is_large = larges < args.large && (i % large_every == 0 || smalls == args.small);
        let res = if is_large {
            larges += 1;
            comm.all_reduce_in_place(&mut large_buf, ReduceOp::Max)
        } else {
            smalls += 1;
            let bytes = min + (next(&mut rng) as usize) % (max - min + 1);
            let n = (bytes / 4).max(1);
            comm.all_reduce_in_place(&mut small_buf[..n], ReduceOp::Max)
        };
        if let Err(e) = res {
            eprintln!("SOAK FAIL rank {r}: operation {i}: {e}");
            return ExitCode::from(1);
        }
        if i % args.sample_every == 0 || i == total {
            match sample(i) {
                Ok(s) => {
                    println!(
                        "SAMPLE rank={r} ops={} small={smalls} large={larges} rss_kib={} fds={} threads={} elapsed_s={:.1}",
                        s.ops,
                        s.rss_kib,
                        s.fds,
                        s.threads,
                        started.elapsed().as_secs_f64()
                    );
                    samples.push(s);
                }
                Err(e) => {
                    eprintln!("SOAK FAIL rank {r}: cannot sample /proc/self: {e}");
                    return ExitCode::from(1);
                }
            }
        }
    }
    // No rank leaves (closing its connections to the others) before every
    // rank took its last sample.
    if let Err(e) = comm.barrier() {
        eprintln!("SOAK FAIL rank {r}: the closing barrier: {e}");
        return ExitCode::from(1);
    }
    match judge(&samples, args.rss_tolerance) {
        None => {
            println!(
                "SOAK PASS rank {r}: {total} all-reduces ({smalls} small, {larges} large) in {:.1} s",
                started.elapsed().as_secs_f64()
            );
            ExitCode::SUCCESS
        }
        Some(why) => {
            println!("SOAK FAIL rank {r}: {why}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(ops: u64, rss_kib: u64, fds: usize, threads: u64) -> Sample {
        Sample {
            ops,
            rss_kib,
            fds,
            threads,
        }
    }

    #[test]
    fn judge_flags_growth_fds_and_threads() {
        assert_eq!(judge(&[s(1, 1000, 5, 2), s(2, 1049, 5, 2)], 5.0), None);
        let e = judge(&[s(1, 1000, 5, 2), s(2, 1100, 6, 3)], 5.0).unwrap();
        assert!(
            e.contains("RSS grew 10.0") && e.contains("fds 5 -> 6") && e.contains("threads 2 -> 3"),
            "{e}"
        );
        assert!(judge(&[s(1, 1, 1, 1)], 5.0).is_some());
    }

    #[test]
    fn sampling_reads_this_process() {
        let x = sample(7).unwrap();
        assert!(x.rss_kib > 0 && x.threads >= 1 && x.fds >= 3, "{x:?}");
    }
}
