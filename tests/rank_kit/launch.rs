//! Ranks as child processes: the test binary re-executes itself once per
//! rank with the launcher variables set, and the parent collects output and
//! exit status with deadlines.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sncl::{Config, ConfigFromEnv};

// ---------------------------------------------------------------------------
// Ranks as processes: the test binary re-executes itself.

/// Set in a child's environment: the child test body runs only then.
pub const CHILD_ENV: &str = "SNCL_TEST_CHILD";

pub fn is_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some()
}

/// A free TCP port on loopback (bound, read and released).
pub fn free_port() -> u16 {
    // Below the kernel's ephemeral range (so outgoing connections of other
    // tests cannot take it), spread by pid and a counter (so concurrent jobs
    // do not pick the same one), and free right now.
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
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("binding 127.0.0.1:0")
        .port()
}

/// A fresh random job secret (so a rank can never join another job's store).
pub fn job_secret() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut out = String::new();
    for i in 0..2u64 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(i);
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos(),
        );
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}

/// Variables of the parent's environment that must not leak into a child.
const SCRUB: [&str; 21] = [
    "SNCL_ALGO",
    "SNCL_CHUNK_BYTES",
    "SNCL_NSOCKS",
    "SNCL_TRANSPORT",
    "SNCL_SOCKET_IFNAME",
    "SNCL_SHM_SLOT_BYTES",
    "SNCL_SHM_SLOTS",
    "SNCL_TCP_PIECE_BYTES",
    "SNCL_NODE_ID",
    "SNCL_TIMEOUT_MS",
    "SNCL_INIT_TIMEOUT_MS",
    "SNCL_SECRET",
    "SNCL_LOCAL_RANK",
    "RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
];

/// One rank running as a child process.
pub struct RankProc {
    pub rank: usize,
    pub child: Child,
    /// stdout and stderr as read so far.
    pub output: Arc<Mutex<String>>,
    /// Every output line as it arrives.
    pub lines: mpsc::Receiver<String>,
    readers: Vec<JoinHandle<()>>,
    pub exit: Option<(ExitStatus, Instant)>,
}

fn reader(
    src: impl Read + Send + 'static,
    out: Arc<Mutex<String>>,
    tx: mpsc::Sender<String>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(src).lines() {
            let Ok(line) = line else { break };
            {
                let mut o = out.lock().unwrap();
                o.push_str(&line);
                o.push('\n');
            }
            let _ = tx.send(line);
        }
    })
}

/// Starts ranks `0..n` of a job as children running test `test` of this
/// binary, with `SNCL_RANK` / `SNCL_WORLD_SIZE` / `SNCL_ROOT` and `env`.
pub fn spawn_job(test: &str, n: usize, env: &[(&str, String)]) -> Vec<RankProc> {
    spawn_job_per_rank(test, n, env, &|_| Vec::new())
}

/// [`spawn_job`] with variables that differ per rank (`per_rank(rank)`).
pub fn spawn_job_per_rank(
    test: &str,
    n: usize,
    env: &[(&str, String)],
    per_rank: &dyn Fn(usize) -> Vec<(&'static str, String)>,
) -> Vec<RankProc> {
    let exe = std::env::current_exe().expect("current_exe");
    let root = format!("127.0.0.1:{}", free_port());
    let secret = job_secret();
    (0..n)
        .map(|rank| {
            let mut cmd = Command::new(&exe);
            // Child entry points are #[ignore]d (not reported as passing
            // tests of their own); the child runs its one anyway.
            cmd.args([
                "--exact",
                test,
                "--nocapture",
                "--test-threads",
                "1",
                "--include-ignored",
            ]);
            for v in SCRUB {
                cmd.env_remove(v);
            }
            cmd.env(CHILD_ENV, "1")
                .env("SNCL_RANK", rank.to_string())
                .env("SNCL_WORLD_SIZE", n.to_string())
                .env("SNCL_ROOT", &root)
                .env("SNCL_SECRET", &secret)
                .env("RUST_BACKTRACE", "0");
            for (k, v) in env.iter().cloned().chain(per_rank(rank)) {
                cmd.env(k, v);
            }
            cmd.stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let mut child = cmd.spawn().expect("spawning a rank");
            let output = Arc::new(Mutex::new(String::new()));
            let (tx, lines) = mpsc::channel();
            let readers = vec![
                reader(child.stdout.take().unwrap(), output.clone(), tx.clone()),
                reader(child.stderr.take().unwrap(), output.clone(), tx),
            ];
            RankProc {
                rank,
                child,
                output,
                lines,
                readers,
                exit: None,
            }
        })
        .collect()
}

impl RankProc {
    /// Polls for exit.
    pub fn poll(&mut self) -> bool {
        if self.exit.is_none() {
            if let Ok(Some(st)) = self.child.try_wait() {
                self.exit = Some((st, Instant::now()));
            }
        }
        self.exit.is_some()
    }

    /// Waits for a line containing `pat` until `deadline`.
    pub fn wait_line(&mut self, pat: &str, deadline: Instant) -> bool {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            match self.lines.recv_timeout(left.min(Duration::from_millis(50))) {
                Ok(l) if l.contains(pat) => return true,
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if self.poll() {
                        return false;
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return false,
            }
        }
    }

    /// The output so far (the process may still run).
    pub fn text_so_far(&self) -> String {
        self.output.lock().unwrap().clone()
    }

    /// The whole output, once the process has exited and its pipes closed.
    pub fn text(&mut self) -> String {
        for h in self.readers.drain(..) {
            let _ = h.join();
        }
        self.output.lock().unwrap().clone()
    }
}

/// Waits for every rank until `deadline`; kills those still running.
/// Returns whether every rank exited on its own.
pub fn wait_all(ranks: &mut [RankProc], deadline: Instant) -> bool {
    loop {
        let mut all = true;
        for r in ranks.iter_mut() {
            all &= r.poll();
        }
        if all {
            return true;
        }
        if Instant::now() >= deadline {
            for r in ranks.iter_mut() {
                if !r.poll() {
                    let _ = r.child.kill();
                    let _ = r.child.wait();
                }
            }
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The last `n` lines of a text.
pub fn tail(s: &str, n: usize) -> String {
    let v: Vec<&str> = s.lines().collect();
    v[v.len().saturating_sub(n)..].join("\n")
}

/// The configuration of a child from its environment (for the checks).
pub fn child_config() -> Config {
    Config::from_env().expect("child configuration")
}
