//! A job over shared memory never names a segment in `/dev/shm` (its
//! ranks share a pid namespace, so every segment is anonymous): a job
//! whose ranks are all SIGKILLed, during setup or later, leaves nothing
//! there, without a later job to clean up.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

mod ranks;
use ranks::{free_port, job_secret};

fn rank(rank: usize, world: usize, root: &str, secret: &str) -> Child {
    ranks::rank_cmd(
        &[
            "all_reduce",
            "-b",
            "8",
            "-e",
            "4M",
            "-f",
            "8",
            "-n",
            "3",
            "-w",
            "1",
        ],
        (rank, world),
        root,
        secret,
        &[("SNCL_TRANSPORT", "shm"), ("SNCL_TIMEOUT_MS", "30000")],
    )
    .stdout(Stdio::null())
    .spawn()
    .unwrap()
}

/// The sncl entries of `/dev/shm` whose names end in one of `pids`.
fn named_by(pids: &[u32]) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| {
                    n.starts_with("sncl-") && pids.iter().any(|p| n.ends_with(&format!("-{p}")))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_shared_memory_job_names_nothing_in_dev_shm() {
    let world = 4;
    let root = format!("127.0.0.1:{}", free_port());
    let secret = job_secret();
    let mut ranks: Vec<Child> = (0..world).map(|r| rank(r, world, &root, &secret)).collect();
    let pids: Vec<u32> = ranks.iter().map(Child::id).collect();
    // Watch /dev/shm through setup and the run.
    let mut seen = Vec::new();
    let mut samples = 0;
    let t0 = Instant::now();
    while ranks.iter_mut().any(|c| c.try_wait().unwrap().is_none()) {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the job did not end"
        );
        seen.extend(named_by(&pids));
        samples += 1;
    }
    for (r, c) in ranks.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "rank {r}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    eprintln!("{samples} samples of /dev/shm during the job");
    assert!(
        samples > 10,
        "too few samples ({samples}) to have watched setup"
    );
    seen.sort();
    seen.dedup();
    assert!(
        seen.is_empty(),
        "the job named segments in /dev/shm: {seen:?}"
    );
}
