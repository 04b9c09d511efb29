//! Link faults on the two-tier test bed (`scripts/testbed.sh --fault`), with
//! `SNCL_TIMEOUT_MS=10000` (30000 for the flap): 4 nodes x 1 rank behind a 100 Mbit/s switch.
//!
//! * a node's link taken down for good while a large all_reduce runs: every
//!   rank ends with an error within the deadline (no hang, nobody killed by
//!   the bed), and every surviving rank's error names the unreachable rank;
//! * a 2-second flap: the operation completes with correct results.
//!
//! Needs root and `ip netns`; skips with the reason otherwise.

mod bed;

use bed::{repo_root, skip_reason};

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// The node whose link fails; with one rank per node it holds rank 2.
const FAULTY: usize = 2;
const TIMEOUT_MS: u64 = 10_000;
/// The flap test's deadline: after an outage of D seconds the kernel's
/// exponential retransmission backoff resumes a TCP flow up to about
/// 2 D + RTO later, and a loaded CI machine once saw rank 3 make no progress
/// for 10 s across a 2 s flap (not reproduced here in 12 runs, with and
/// without CPU hogs, nor with 5 s and 7 s flaps). The flap test is about
/// completing, not about the deadline, so it gets a generous one.
const FLAP_TIMEOUT_MS: u64 = 30_000;

struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
    elapsed: Duration,
    logs: PathBuf,
}

fn run_bed(fault: &str, bytes: &str, iters: &str, warmup: &str, timeout_ms: u64) -> Run {
    let root = repo_root();
    // One directory per run: tests of this file run concurrently, some with
    // the same fault.
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let logs = std::env::temp_dir().join(format!(
        "sncl-faults-{}-{}-{}",
        fault.replace([':', '@', '+'], "_"),
        std::process::id(),
        RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&logs);
    let start = Instant::now();
    let out = Command::new(root.join("scripts/testbed.sh"))
        .args(["--nodes", "4", "--rate", "100mbit", "--timeout", "120"])
        .args(["--fail-grace", "30", "--fault", fault, "--keep-logs"])
        .arg(&logs)
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_commbench"))
        .args([
            "all_reduce",
            "-b",
            bytes,
            "-e",
            bytes,
            "-n",
            iters,
            "-w",
            warmup,
            "-c",
            "1",
        ])
        .env("SNCL_TIMEOUT_MS", timeout_ms.to_string())
        .output()
        .expect("running scripts/testbed.sh");
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        elapsed: start.elapsed(),
        logs,
    }
}

/// What a failing test prints: the bed's output and every rank's log.
fn report(run: &Run) -> String {
    let mut text = format!("stdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
    for rank in 0..4 {
        let log = std::fs::read_to_string(run.logs.join(format!("rank{rank}.log")))
            .unwrap_or_else(|e| format!("(no log: {e})"));
        text.push_str(&format!("\n--- rank{rank}.log ---\n{log}"));
    }
    text
}

/// The error line commbench printed for `rank`.
fn rank_error(run: &Run, rank: usize) -> String {
    let log = std::fs::read_to_string(run.logs.join(format!("rank{rank}.log"))).unwrap_or_default();
    log.lines()
        .filter(|l| l.starts_with("commbench:"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The per-rank exit statuses testbed.sh reports after a failure.
fn statuses(run: &Run) -> Vec<i32> {
    run.stderr
        .lines()
        .find_map(|l| l.split_once("exit statuses of ranks 0..3:"))
        .map(|(_, s)| {
            s.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn link_down_ends_every_rank_with_an_error_within_the_deadline() {
    if let Some(why) = skip_reason() {
        eprintln!("skipping the test-bed fault test: {why}");
        return;
    }
    // 64 MiB at 100 Mbit/s: several seconds per all_reduce; the link goes
    // down 3 s after the ranks start, in the middle of one.
    let run = run_bed(&format!("down:{FAULTY}@3"), "64M", "3", "0", TIMEOUT_MS);
    let report = report(&run);
    assert!(
        !run.ok,
        "the job succeeded without node {FAULTY}:\n{report}"
    );
    // Status 1 = commbench reported an error; 124 / 128+n = the bed killed a hung rank.
    assert_eq!(statuses(&run), vec![1; 4], "{report}");
    for rank in 0..4 {
        let e = rank_error(&run, rank);
        assert!(!e.is_empty(), "rank {rank} printed no error:\n{report}");
    }
    // Start-up, 3 s, the 10 s deadline, and slack for a loaded machine.
    assert!(
        run.elapsed < Duration::from_secs(35),
        "took {:?}:\n{report}",
        run.elapsed
    );
    let _ = std::fs::remove_dir_all(&run.logs);
}

/// A rank that times out aborts its peers naming the rank it waited on as
/// a *suspect* (`AbortCause::Suspect`): every survivor names the
/// unreachable node's rank in its error, without counting it as proven
/// failed (that takes a broken connection).
#[test]
fn link_down_every_survivor_names_the_unreachable_peer() {
    if let Some(why) = skip_reason() {
        eprintln!("skipping the test-bed fault test: {why}");
        return;
    }
    let run = run_bed(&format!("down:{FAULTY}@3"), "64M", "3", "0", TIMEOUT_MS);
    let errors: Vec<String> = (0..4).map(|r| rank_error(&run, r)).collect();
    for (rank, e) in errors.iter().enumerate().filter(|(r, _)| *r != FAULTY) {
        assert!(
            e.contains(&format!("rank {FAULTY}")) || e.contains(&format!("[{FAULTY}]")),
            "surviving rank {rank} does not name unreachable rank {FAULTY}: {e:?}\nall errors: {errors:#?}"
        );
    }
    let _ = std::fs::remove_dir_all(&run.logs);
}

#[test]
fn two_second_flap_completes_with_correct_results() {
    if let Some(why) = skip_reason() {
        eprintln!("skipping the test-bed fault test: {why}");
        return;
    }
    // 16 MiB all_reduces, 8 of them (1 warm-up + 3 x out-of-place and in
    // place), about 2 s each: the link of node 2 is down from 2 s to 4 s.
    let run = run_bed(
        &format!("flap:{FAULTY}@2+2"),
        "16M",
        "3",
        "1",
        FLAP_TIMEOUT_MS,
    );
    let report = report(&run);
    assert!(run.ok, "the job failed across a 2 s flap:\n{report}");
    assert!(run.stderr.contains("link of node 2 (v2) up"), "{report}");
    assert!(
        run.stdout.contains("Out of bounds values : 0 OK"),
        "{report}"
    );
    let _ = std::fs::remove_dir_all(&run.logs);
}
