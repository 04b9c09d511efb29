//! Hang reports and the flight recorder, end to end: rank 2 of 3 skips one
//! all-reduce; the others log what they wait for (every 10 s at INFO, and
//! at the deadline), time out, dump their flight recorders, rank 2 dumps
//! on demand, and `commbench trace` names rank 2.
//!
//! The scenario runs in a child process (this test binary again) so its
//! `tracing` output on stderr can be checked.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use sncl::{Communicator, Config, ReduceOp};

const BIN: &str = env!("CARGO_BIN_EXE_commbench");
const CHILD_ENV: &str = "SNCL_FLIGHT_TEST_DIR";
/// Longer than the 10 s report period, so one INFO report comes first.
const TIMEOUT_MS: u64 = 10_800;

/// Child side: runs the scenario with dumps in `$SNCL_FLIGHT_TEST_DIR`.
#[test]
#[ignore = "a child process's entry point, run by its parent test"]
fn child_skipping_rank() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    sncl::init_logging();
    let config = Config {
        timeout: Duration::from_millis(TIMEOUT_MS),
        debug_dump_dir: Some(PathBuf::from(dir)),
        ..Default::default()
    };
    let comms = Communicator::init_threads(3, config).expect("init");
    let results: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let mut v = vec![1.0f32; 4096];
                    c.all_reduce_in_place(&mut v, ReduceOp::Sum)
                        .expect("first all_reduce");
                    if c.rank() == 2 {
                        // Skips the second all_reduce; stays alive past the
                        // others' deadline, then dumps on demand.
                        std::thread::sleep(Duration::from_millis(TIMEOUT_MS + 2500));
                        let p = c.dump_flight_recorder().expect("dump on demand");
                        return format!("rank 2 dumped {}", p.display());
                    }
                    match c.all_reduce_in_place(&mut v, ReduceOp::Sum) {
                        Ok(()) => format!("rank {} UNEXPECTED success", c.rank()),
                        Err(e) => format!("rank {} failed: {e}", c.rank()),
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    });
    for r in results {
        eprintln!("RESULT {r}");
    }
}

fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).expect("stat").permissions().mode() & 0o777
}

#[test]
fn skipping_rank_is_named_by_hang_reports_dumps_and_trace() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("sncl-flight-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let exe = std::env::current_exe().expect("current exe");
    let out = Command::new(exe)
        .args([
            "--exact",
            "child_skipping_rank",
            "--nocapture",
            "--include-ignored",
        ])
        .env(CHILD_ENV, &dir)
        .env("SNCL_DEBUG", "INFO")
        .stdin(Stdio::null())
        .output()
        .expect("child");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed: {err}");
    for r in [0, 1] {
        assert!(err.contains(&format!("RESULT rank {r} failed")), "{err}");
    }
    assert!(err.contains("RESULT rank 2 dumped"), "{err}");
    // The periodic report (INFO) and the one at the deadline (ERROR) say
    // what is awaited: op, seq, step k of n, peer, bytes, time.
    let still: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("sncl hang: still waiting"))
        .collect();
    assert!(!still.is_empty(), "no periodic hang report: {err}");
    let dead: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("sncl hang: deadline passed"))
        .collect();
    assert!(!dead.is_empty(), "no hang report at the deadline: {err}");
    for l in still.iter().chain(&dead) {
        for want in [
            "all_reduce",
            "seq=2",
            "step=",
            "steps=",
            " bytes",
            "since_progress_ms=",
        ] {
            assert!(l.contains(want), "{want:?} missing from {l}");
        }
    }
    assert!(
        still
            .iter()
            .chain(&dead)
            .any(|l| l.contains("from rank 2: 0 of")),
        "no report names rank 2 with 0 bytes received: {err}"
    );
    // Every rank dumped, mode 0600.
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("read dir")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(files.len(), 3, "{files:?}\n{err}");
    for f in &files {
        assert_eq!(mode(f), 0o600, "{}", f.display());
    }
    let text = std::fs::read_to_string(&files[0]).expect("read");
    assert!(text.starts_with("{\"sncl_flight_recorder\":1"), "{text}");
    // commbench trace names rank 2.
    let o = Command::new(BIN)
        .arg("trace")
        .arg(&dir)
        .output()
        .expect("commbench trace");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        stdout.contains("verdict: rank(s) [2] did not reach all_reduce"),
        "{stdout}"
    );
    assert!(stdout.contains("rank 2: did NOT reach"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn trace_without_dumps_is_an_error() {
    let o = Command::new(BIN)
        .args(["trace", "/nonexistent/sncl-flight"])
        .output()
        .expect("commbench trace");
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/sncl-flight"));
}

/// An application abort dumps to the configured directory; on demand
/// without a directory is an error naming the setting.
#[test]
fn abort_dumps_and_on_demand_needs_a_directory() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("sncl-flight-abort-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let comms = Communicator::init_threads(
        2,
        Config {
            debug_dump_dir: Some(dir.clone()),
            flight_recorder_entries: 2,
            ..Default::default()
        },
    )
    .expect("init");
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                for _ in 0..3 {
                    let mut v = vec![1u32; 64];
                    c.all_reduce_in_place(&mut v, ReduceOp::Sum)
                        .expect("all_reduce");
                }
            });
        }
    });
    comms[0].abort();
    let file = dir.join(format!(
        "sncl-flight-{:016x}-rank0.jsonl",
        comms[0].comm_id()
    ));
    let text = std::fs::read_to_string(&file).expect("rank 0 dumped on abort");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].contains("aborted by the application"), "{text}");
    // The ring keeps the last 2 of 3 operations.
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[1].contains("\"seq\":2") && lines[2].contains("\"seq\":3"),
        "{text}"
    );
    assert!(comms[1].flight_recorder_json().contains("\"seq\":3"));
    let _ = std::fs::remove_dir_all(&dir);

    let plain = Communicator::init_threads(1, Config::default()).expect("init");
    let e = plain[0]
        .dump_flight_recorder()
        .expect_err("no directory set");
    assert!(e.to_string().contains("SNCL_DEBUG_DUMP_DIR"), "{e}");
}

/// A 4-rank commbench run dumps every rank's flight recorder at its end
/// (`--flight-dump`), and `commbench trace --chrome` turns the dumps into a
/// Chrome/Perfetto trace whose tracks match them: one thread track per
/// rank, one slice per recorded operation in the same order, with the
/// recorded start, end and arguments. Without SNCL_DEBUG_DUMP_DIR the flag
/// is refused before any rank starts.
#[test]
fn four_rank_run_becomes_a_chrome_trace_matching_the_dumps() {
    let dir = std::env::temp_dir().join(format!("sncl-chrome-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dump dir");
    let refused = Command::new(BIN)
        .args([
            "all_reduce",
            "--np",
            "2",
            "-b",
            "8",
            "-e",
            "8",
            "--flight-dump",
        ])
        .env_remove("SNCL_DEBUG_DUMP_DIR")
        .output()
        .expect("commbench");
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("needs SNCL_DEBUG_DUMP_DIR"),
        "{refused:?}"
    );
    let run = Command::new(BIN)
        .args([
            "all_reduce",
            "--np",
            "4",
            "--oversubscribe",
            "-b",
            "8",
            "-e",
            "1K",
        ])
        .args(["-f", "8", "-n", "3", "-w", "1", "--flight-dump"])
        // Every benchmarked operation carries the caller's tag.
        .args(["--tag", "42", "--stats"])
        .env("SNCL_DEBUG_DUMP_DIR", &dir)
        .output()
        .expect("commbench run");
    assert!(run.status.success(), "{run:?}");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        stdout.contains("# operations by tag on rank 0: tag 42: "),
        "{stdout}"
    );
    let out = dir.join("trace.json");
    let trace = Command::new(BIN)
        .arg("trace")
        .arg("--chrome")
        .arg(&out)
        .arg(&dir)
        .output()
        .expect("commbench trace");
    assert!(trace.status.success(), "{trace:?}");
    let text = std::fs::read_to_string(&out).expect("the trace file");
    let t: serde_json::Value = serde_json::from_str(&text).expect("a JSON trace");
    let events = t["traceEvents"].as_array().expect("traceEvents");
    let mut dumps = 0;
    for entry in std::fs::read_dir(&dir).expect("dir") {
        let path = entry.expect("entry").path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !name.ends_with(".jsonl") {
            continue;
        }
        dumps += 1;
        let text = std::fs::read_to_string(&path).expect("dump");
        let mut lines = text.lines();
        let header: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
        let rank = header["rank"].as_u64().unwrap();
        let recorded: Vec<serde_json::Value> =
            lines.map(|l| serde_json::from_str(l).unwrap()).collect();
        let on_track = |e: &&serde_json::Value| e["ph"] == "X" && e["tid"].as_u64() == Some(rank);
        let (init, slices): (Vec<&serde_json::Value>, Vec<&serde_json::Value>) = events
            .iter()
            .filter(on_track)
            .partition(|e| e["cat"] == "init");
        // The phases of the rank's creation of the communicator come first.
        let phases: Vec<&str> = init.iter().map(|e| e["name"].as_str().unwrap()).collect();
        assert_eq!(
            phases,
            [
                "init: prepare",
                "init: rendezvous",
                "init: connect",
                "init: barrier"
            ],
            "rank {rank}"
        );
        assert_eq!(
            header["init"].as_array().map(Vec::len),
            Some(4),
            "rank {rank}"
        );
        assert!(!recorded.is_empty(), "rank {rank} recorded nothing");
        assert!(
            recorded.iter().any(|r| r["tag"] == 42),
            "rank {rank}: no operation tagged 42"
        );
        assert_eq!(slices.len(), recorded.len(), "rank {rank}");
        let t0 = t["otherData"]["t0_us"].as_u64().unwrap();
        for (s, r) in slices.iter().zip(&recorded) {
            assert_eq!(s["name"], r["op"], "rank {rank}");
            assert_eq!(s["args"]["seq"], r["seq"], "rank {rank}");
            assert_eq!(s["args"]["bytes"], r["bytes"], "rank {rank}");
            assert_eq!(s["args"]["tag"], r["tag"], "rank {rank}");
            let start = r["start_us"].as_u64().unwrap();
            assert_eq!(s["ts"].as_u64().unwrap(), start - t0, "rank {rank}");
            assert_eq!(
                s["dur"].as_u64().unwrap(),
                r["end_us"].as_u64().unwrap() - start,
                "rank {rank}"
            );
        }
        assert!(
            events.iter().any(|e| e["name"] == "thread_name"
                && e["tid"].as_u64() == Some(rank)
                && e["args"]["name"] == format!("rank {rank}")),
            "rank {rank} has no named track"
        );
    }
    assert_eq!(dumps, 4, "one dump per rank");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Device operations (the emulated device's kernel path) carry a named
/// tag and a CTA cap from `commbench --tag NAME --max-ctas N`: `--stats`
/// counts them by name, the dumps record each with its kernel and tag
/// name, and `commbench trace` reads those dumps.
#[test]
fn device_operations_carry_a_named_tag_to_stats_dumps_and_trace() {
    let dir = std::env::temp_dir().join(format!("sncl-device-tag-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let run = Command::new(BIN)
        .args([
            "all_reduce",
            "--device",
            "emu",
            "--np",
            "2",
            "-b",
            "64K",
            "-e",
            "64K",
        ])
        .args(["-n", "3", "-w", "1", "--flight-dump", "--stats"])
        .args(["--tag", "backward/bucket 3", "--max-ctas", "2"])
        .env("SNCL_DEBUG_DUMP_DIR", &dir)
        .output()
        .expect("commbench run");
    assert!(run.status.success(), "{run:?}");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        stdout.contains("# operations by tag on rank 0: tag \"backward/bucket 3\" (")
            && stdout.contains("): 4 ops, "),
        "{stdout}"
    );
    let dump = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with("rank0.jsonl"))
        .expect("rank 0's dump");
    let text = std::fs::read_to_string(&dump).unwrap();
    let tagged: Vec<serde_json::Value> = text
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["tag_name"] == "backward/bucket 3")
        .collect();
    assert_eq!(tagged.len(), 4, "{text}");
    assert!(
        tagged
            .iter()
            .all(|e| e["algo"].as_str().unwrap().starts_with("lane")),
        "{text}"
    );
    let trace = Command::new(BIN)
        .arg("trace")
        .arg(&dir)
        .output()
        .expect("commbench trace");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(trace.status.success(), "{trace:?}");
}
