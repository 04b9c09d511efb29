//! Shared by the tests that start `commbench` ranks as separate processes
//! the way a launcher would (`SNCL_RANK`, `SNCL_WORLD_SIZE`, `SNCL_ROOT`,
//! `SNCL_SECRET`): a free root port, a fresh secret, the rank command, and
//! a wait with a deadline.

#![allow(dead_code)] // each test binary uses its own part

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const COMMBENCH: &str = env!("CARGO_BIN_EXE_commbench");

/// A port below the ephemeral range, spread by pid, free right now.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(7919);
    for _ in 0..2000 {
        let k = start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed).wrapping_mul(104_729));
        let port = 20_000 + (k % 12_000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port below the ephemeral range");
}

/// A fresh random job secret (32 hex digits).
pub fn job_secret() -> String {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).unwrap();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `commbench ARGS` as `rank` of `world`, rooted at `root`, with `extra`
/// variables; output piped.
pub fn rank_cmd(
    args: &[&str],
    (rank, world): (usize, usize),
    root: &str,
    secret: &str,
    extra: &[(&str, &str)],
) -> Command {
    let mut c = Command::new(COMMBENCH);
    c.args(args)
        .env_remove("SNCL_SECRET_FILE")
        .env("SNCL_RANK", rank.to_string())
        .env("SNCL_WORLD_SIZE", world.to_string())
        .env("SNCL_ROOT", root)
        .env("SNCL_SECRET", secret)
        .env("SNCL_TIMEOUT_MS", "60000")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in extra {
        c.env(k, v);
    }
    c
}

/// Waits for `child` with a deadline; kills it when the deadline passes.
pub fn finish(mut child: Child, within: Duration) -> Output {
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > within {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}
