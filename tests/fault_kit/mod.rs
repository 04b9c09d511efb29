//! Shared by the fault-tolerance tests of the Rust API
//! (tests/fault_tolerance.rs) and of the C ABI (sncl-capi's unit tests):
//! the child-process protocol, a scheduler-stall probe, and the kill, agree
//! and shrink job whose ranks are a given child test.
// Each test binary uses a part of the kit.
#![allow(dead_code)]

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::rank_kit::*;

pub const MODE_ENV: &str = "SNCL_FT_MODE";
pub const VICTIM_ENV: &str = "SNCL_FT_VICTIM";
pub const TIMEOUT_MS: u64 = 3000;
/// `SNCL_INIT_TIMEOUT_MS` of the kit's jobs: 8 rank processes started on a
/// loaded 2-core machine arrive seconds apart, which is launch skew, not
/// the failure the short operation timeout is there to catch.
pub const INIT_TIMEOUT_MS: u64 = 30_000;
pub const ABORT_LIMIT: Duration = Duration::from_millis(100);

/// One test at a time: the process tests start many busy ranks, and a
/// latency measured beside them would measure them.
pub static SERIAL: Mutex<()> = Mutex::new(());

pub fn mode() -> Option<String> {
    is_child().then(|| std::env::var(MODE_ENV).ok()).flatten()
}

pub fn names_rank(line: &str, v: usize) -> bool {
    line.contains(&format!("rank {v}")) || line.contains(&format!("[{v}]"))
}

/// Runs `f` while a probe thread measures how late 1 ms sleeps wake up
/// (what the scheduler of a loaded machine steals from every thread);
/// returns `f`'s result and the worst lateness seen.
pub fn with_stall_probe<R>(f: impl FnOnce() -> R) -> (R, Duration) {
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let probe = s.spawn(|| {
            let mut worst = Duration::ZERO;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let t = Instant::now();
                std::thread::sleep(Duration::from_millis(1));
                worst = worst.max(t.elapsed().saturating_sub(Duration::from_millis(1)));
            }
            worst
        });
        let r = f();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (r, probe.join().expect("probe"))
    })
}

pub fn victim() -> usize {
    std::env::var(VICTIM_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .expect("victim")
}

pub fn check_shrunk(
    old: usize,
    new: usize,
    size: usize,
    all_reduce: impl FnOnce(&mut [f32]) -> Result<(), String>,
) {
    assert_eq!(size, 7, "rank {old}: shrunk size");
    let want_rank = old - usize::from(old > victim());
    assert_eq!(new, want_rank, "rank {old}: new rank");
    let mut buf: Vec<f32> = (0..1000).map(|k| (new * 1000 + k) as f32).collect();
    all_reduce(&mut buf).unwrap_or_else(|e| panic!("rank {old}: all_reduce after shrink: {e}"));
    for (k, x) in buf.iter().enumerate() {
        let want: usize = (0..7).map(|q| q * 1000 + k).sum();
        assert_eq!(*x, want as f32, "rank {old}: element {k}");
    }
    println!("SHRUNK rank {old} -> {new} of {size}");
}

pub fn kill_and_shrink(child: &str, mode: &str, trials: usize) {
    kill_and_shrink_under(child, mode, trials, Attack::None);
}

/// What else happens to a job while its survivors agree and shrink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attack {
    /// Nothing: one rank is killed.
    None,
    /// This many idle TCP connections are held on every rank's standby
    /// store from before the kill to the end (the child prints
    /// `STANDBY rank R ADDR`).
    Flood(usize),
    /// The lowest survivor (the coordinator) is stopped (SIGSTOP) for this
    /// many milliseconds right after the kill: slow, not dead.
    Stop(u64),
}

/// The standby store address rank `rp` printed (`STANDBY rank R ADDR`).
fn standby_addr(rp: &RankProc) -> std::net::SocketAddr {
    let text = rp.text_so_far();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("STANDBY rank {} ", rp.rank)))
        .and_then(|a| a.trim().parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "rank {} printed no standby address:\n{}",
                rp.rank,
                tail(&text, 10)
            )
        })
}

/// This process's soft limit on open files (`/proc/self/limits`).
fn open_file_limit() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Holds `n` idle connections to every rank's standby store (fewer where
/// this process's descriptor limit would not hold them, keeping 512 for
/// the test itself; the count held is printed).
fn flood(ranks: &[RankProc], n: usize) -> Vec<std::net::TcpStream> {
    let fit = open_file_limit().map_or(n, |l| l.saturating_sub(512) / ranks.len().max(1));
    let n = n.min(fit);
    let mut held = Vec::new();
    for rp in ranks.iter() {
        let addr = standby_addr(rp);
        for _ in 0..n {
            if let Ok(s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                held.push(s);
            }
        }
    }
    eprintln!(
        "flood: {} idle connections held on {} standby stores",
        held.len(),
        ranks.len()
    );
    held
}

/// Sends signal `sig` (`STOP`, `CONT`) to rank `rp`'s process.
pub fn signal(rp: &RankProc, sig: &str) {
    let st = std::process::Command::new("kill")
        .args([format!("-{sig}"), rp.child.id().to_string()])
        .status()
        .expect("kill(1)");
    assert!(st.success(), "SIG{sig} to rank {}", rp.rank);
}

/// `default`, or `SNCL_TEST_TRIALS` where set (scripts/reliability.sh's
/// short and long forms).
pub fn trials(default: usize) -> usize {
    std::env::var("SNCL_TEST_TRIALS").map_or(default, |v| v.parse().expect("SNCL_TEST_TRIALS"))
}

/// [`kill_and_shrink`] while `attack` happens, [`trials`]`(trials)` times.
pub fn kill_and_shrink_under(child: &str, mode: &str, trials: usize, attack: Attack) {
    let trials = self::trials(trials);
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let n = 8;
    let limit = Duration::from_millis(TIMEOUT_MS) + Duration::from_secs(2);
    let mut worst = Duration::ZERO;
    for trial in 0..trials {
        // Rank 0 (the store's host) in 5 of the 20 trials.
        let v = if trial % 4 == 0 {
            0
        } else {
            1 + trial % (n - 1)
        };
        let env = [
            (MODE_ENV, mode.to_string()),
            (VICTIM_ENV, v.to_string()),
            ("SNCL_TIMEOUT_MS", TIMEOUT_MS.to_string()),
            ("SNCL_INIT_TIMEOUT_MS", INIT_TIMEOUT_MS.to_string()),
            ("SNCL_ALGO", "all_reduce:ring".to_string()),
            (
                "SNCL_TRANSPORT",
                if trial % 2 == 0 { "auto" } else { "tcp" }.to_string(),
            ),
        ];
        let what = format!("{mode} trial {trial}: rank {v} of {n} killed");
        let mut ranks = spawn_job(child, n, &env);
        let ready = Instant::now() + Duration::from_secs(20);
        for k in 0..n {
            if !ranks[k].wait_line("READY", ready) {
                let text = ranks[k].text();
                wait_all(&mut ranks, Instant::now());
                panic!("{what}: rank {k} never got going:\n{}", tail(&text, 20));
            }
        }
        let held = match attack {
            Attack::Flood(n) => flood(&ranks, n),
            _ => Vec::new(),
        };
        std::thread::sleep(Duration::from_millis(50));
        ranks[v].child.kill().expect("SIGKILL");
        let died = Instant::now();
        // Reap it: a zombie still looks alive to a liveness check by pid.
        let _ = ranks[v].child.wait();
        if let Attack::Stop(ms) = attack {
            let coordinator = usize::from(v == 0);
            signal(&ranks[coordinator], "STOP");
            std::thread::sleep(Duration::from_millis(ms));
            signal(&ranks[coordinator], "CONT");
        }
        let mut problems = Vec::new();
        let mut slowest = Duration::ZERO;
        for rp in ranks.iter_mut().filter(|rp| rp.rank != v) {
            if rp.wait_line("SNCL-ERROR", died + limit) {
                slowest = slowest.max(died.elapsed());
            } else {
                problems.push(format!(
                    "rank {}: no failure report within {limit:?}",
                    rp.rank
                ));
            }
        }
        worst = worst.max(slowest);
        let all = wait_all(&mut ranks, Instant::now() + Duration::from_secs(20));
        drop(held);
        eprintln!(
            "{what}: every survivor reported within {slowest:?}; shrunk in {:?}",
            died.elapsed()
        );
        for rp in ranks.iter_mut().filter(|rp| rp.rank != v) {
            let text = rp.text();
            match rp.exit {
                Some((st, _)) if st.success() && text.contains("SHRUNK") => {}
                other => problems.push(format!(
                    "rank {}: {:?}\n{}",
                    rp.rank,
                    other.map(|o| o.0),
                    tail(&text, 12)
                )),
            }
        }
        assert!(all || !problems.is_empty(), "{what}: a rank hung");
        assert!(problems.is_empty(), "{what}:\n{}", problems.join("\n"));
    }
    eprintln!("{mode} ({attack:?}): {trials} of {trials} trials shrank to 7 ranks; slowest failure report {worst:?} after the kill");
}
