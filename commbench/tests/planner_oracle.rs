//! The planner's measured oracle (issue 35 item 5): `scripts/sweep-planner.py
//! --quick` times the default against every forced algorithm (shm and tcp,
//! 2 ranks, all_reduce and broadcast, 8 B to 2 MiB, interleaved
//! repetitions) with this build's commbench and the built-in cost
//! constants, as a user who never calibrates runs. The test fails when a
//! default is more than 1.5× slower than the fastest algorithm beyond the
//! repetitions' spread, twice in a row (one slow sweep on a shared machine
//! is noise; a wrong choice repeats). The full sweep's 5 % judgement is in
//! its table, printed here.

use std::process::Command;

fn sweep() -> (bool, String) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("commbench/ has a parent")
        .to_path_buf();
    let out = Command::new("python3")
        .arg(root.join("scripts/sweep-planner.py"))
        .args(["--quick", "--no-calibrate", "--fail-above", "1.5"])
        .args(["--commbench", env!("CARGO_BIN_EXE_commbench")])
        .env_remove("SNCL_TOPO_FILE")
        .env_remove("SNCL_ALGO")
        .output()
        .expect("running scripts/sweep-planner.py (python3)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn the_default_is_never_far_slower_than_the_fastest_algorithm() {
    let (ok, first) = sweep();
    eprintln!("{first}");
    if ok {
        return;
    }
    let (ok, second) = sweep();
    eprintln!("second sweep:\n{second}");
    assert!(
        ok,
        "the planner's default was more than 1.5x slower than a forced algorithm in two sweeps in a row"
    );
}
