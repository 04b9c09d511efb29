//! A job over shared memory never names a segment in `/dev/shm` (its
//! ranks share a pid namespace, so every segment is anonymous): a job
//! whose ranks are all SIGKILLed, during setup or later, leaves nothing
//! there, without a later job to clean up.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const COMMBENCH: &str = env!("CARGO_BIN_EXE_commbench");

fn rank(rank: usize, world: usize, root: &str, secret: &str) -> Child {
    Command::new(COMMBENCH)
        .args([
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
        ])
        .env_remove("SNCL_SECRET_FILE")
        .env("SNCL_RANK", rank.to_string())
        .env("SNCL_WORLD_SIZE", world.to_string())
        .env("SNCL_ROOT", root)
        .env("SNCL_SECRET", secret)
        .env("SNCL_TRANSPORT", "shm")
        .env("SNCL_TIMEOUT_MS", "30000")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
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
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let root = format!("127.0.0.1:{port}");
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).unwrap();
    let secret: String = b.iter().map(|x| format!("{x:02x}")).collect();
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
