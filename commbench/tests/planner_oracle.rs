//! The planner's measured oracle (issue 35 item 5): `scripts/sweep-planner.py
//! --quick` times the default against every forced algorithm (shm and tcp,
//! 2 ranks, all_reduce and broadcast, 8 B to 2 MiB, interleaved
//! repetitions) with this build's commbench and the built-in cost
//! constants, as a user who never calibrates runs. The test fails when a
//! default is more than 1.5× slower than the fastest algorithm beyond the
//! repetitions' spread at the same point in two sweeps in a row (a slow
//! sweep on a shared machine is noise, and noise moves: a CI run once saw
//! shm 32 KiB all_reduce miss in one sweep and tcp 2 MiB broadcast in the
//! next, with same-algorithm rows 2.3x apart; a wrong choice repeats). The
//! full sweep's 5 % judgement is in its table, printed here.

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

/// The points a sweep judged gross misses: from `PLANNER MISS above
/// 1.5x: shm2 all_reduce 32768 B: default ...`, `shm2 all_reduce 32768 B`.
fn misses(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.strip_prefix("PLANNER MISS above "))
        .filter_map(|rest| rest.split_once(": "))
        .filter_map(|(_, point)| point.split(':').next())
        .collect()
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
    if ok {
        return;
    }
    let failed: Vec<&str> = second
        .lines()
        .filter(|l| l.starts_with("FAILED: "))
        .collect();
    assert!(
        failed.is_empty(),
        "runs failed in the second sweep: {failed:?}"
    );
    let before = misses(&first);
    let repeated: Vec<&str> = misses(&second)
        .into_iter()
        .filter(|p| before.contains(p))
        .collect();
    assert!(
        repeated.is_empty(),
        "the planner's default was more than 1.5x slower than a forced algorithm at the same \
         point in two sweeps in a row: {repeated:?}"
    );
}

#[test]
fn a_miss_is_read_as_its_point() {
    let text = "PLANNER MISS above 1.5x: shm2 all_reduce 32768 B: default rd 16.8 us, \
                flat-ring 7.8 us (2.16x)\nother line";
    assert_eq!(misses(text), ["shm2 all_reduce 32768 B"]);
}
