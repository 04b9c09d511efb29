//! `--np N`: runs N local ranks of this same command. The launcher is rank
//! 0 itself: it starts the rendezvous store on a free port first (so no
//! other program can take the port before the ranks use it), then starts
//! ranks 1..N as processes that die with it, then runs the benchmark.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sncl::{Communicator, ConfigFromEnv, UniqueId};

fn strip_np(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut skip = false;
    for a in args {
        if skip {
            skip = false;
            continue;
        }
        if a == "--np" {
            skip = true;
            continue;
        }
        if a.starts_with("--np=") {
            continue;
        }
        out.push(a.clone());
    }
    out
}

/// Makes the child started by `cmd` get SIGKILL when the launcher dies, so
/// killing the launcher never leaves ranks behind spinning on their peers.
///
/// Linux sends the signal when the thread that forked the child ends, so
/// children must be spawned by a thread that outlives them (the main
/// thread here).
fn die_with_launcher(cmd: &mut Command) {
    let launcher = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the child between fork and exec and only
    // makes async-signal-safe calls (prctl, getppid, _exit); it allocates
    // nothing and touches no lock.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // The launcher may have died before prctl: then the child was
            // re-parented and no signal will come.
            if libc::getppid() != launcher {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

/// How a rank's process ended, as an exit code (128 + signal if killed).
fn code_of(st: ExitStatus) -> i32 {
    st.code()
        .unwrap_or_else(|| 128 + st.signal().unwrap_or(libc::SIGKILL))
}

/// The ranks 1..N, watched from a thread while rank 0 runs here.
struct Watch {
    children: Mutex<Vec<(usize, Option<Child>)>>,
    /// When the first rank (any, rank 0 included) failed or rank 0 ended.
    clock: Mutex<Option<Instant>>,
    rank0_done: AtomicBool,
    grace: Duration,
}

impl Watch {
    fn start_clock(&self) {
        self.clock
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(Instant::now);
    }

    /// Waits for every child; the worst exit code. Once a rank has failed,
    /// or rank 0 has ended, the others get the sncl deadline plus a margin
    /// to finish or report their own errors, then they are stopped (and,
    /// if rank 0 is still running, the whole launcher).
    fn wait(&self) -> i32 {
        let mut worst = 0;
        loop {
            let mut alive = 0;
            let mut children = self.children.lock().unwrap_or_else(|e| e.into_inner());
            for (r, slot) in children.iter_mut() {
                let Some(c) = slot else { continue };
                match c.try_wait() {
                    Ok(Some(st)) => {
                        let code = code_of(st);
                        if code != 0 {
                            self.start_clock();
                            if st.code().is_none() {
                                eprintln!("commbench: rank {r} was killed by a signal");
                            }
                        }
                        worst = worst.max(code);
                        *slot = None;
                    }
                    Ok(None) => alive += 1,
                    Err(e) => {
                        eprintln!("commbench: cannot wait for rank {r}: {e}");
                        worst = worst.max(1);
                        *slot = None;
                    }
                }
            }
            let rank0_done = self.rank0_done.load(Ordering::SeqCst);
            if alive == 0 && rank0_done {
                return worst;
            }
            let expired = self
                .clock
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_some_and(|t| t.elapsed() > self.grace);
            if expired {
                for (r, slot) in children.iter_mut() {
                    if let Some(c) = slot {
                        eprintln!(
                            "commbench: stopping rank {r}, still running after another rank failed or finished"
                        );
                        let _ = c.kill();
                        let _ = c.wait();
                        worst = worst.max(1);
                        *slot = None;
                    }
                }
                if !rank0_done {
                    eprintln!(
                        "commbench: stopping rank 0, still running after another rank failed"
                    );
                    std::process::exit(worst.clamp(1, 255));
                }
                return worst;
            }
            drop(children);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Runs `threads` ranks as threads of this process (each with its own
/// communicator, `Communicator::init_threads`); the exit code is the worst
/// of theirs. A rank that fails makes its peers fail at their deadline.
pub fn launch_threads(
    threads: usize,
    rank: impl Fn(&Communicator) -> sncl::Result<bool> + Sync,
) -> ExitCode {
    if threads == 0 || threads > comm_core::MAX_RANKS {
        eprintln!(
            "commbench: --threads must be 1 to {} ranks",
            comm_core::MAX_RANKS
        );
        return ExitCode::from(2);
    }
    let comms = match sncl::Config::from_env()
        .and_then(|config| Communicator::init_threads(threads, config))
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("commbench: {e}");
            return ExitCode::from(1);
        }
    };
    let rank = &rank;
    let worst = std::thread::scope(|scope| {
        let runs: Vec<_> = comms
            .iter()
            .map(|comm| scope.spawn(move || crate::outcome(rank(comm))))
            .collect();
        runs.into_iter()
            .map(|r| r.join().unwrap_or(1))
            .max()
            .unwrap_or(0)
    });
    ExitCode::from(worst)
}

/// Runs `np` ranks: 1..np as processes, 0 here; the exit code is the worst
/// of theirs.
pub fn launch_local(
    np: usize,
    rank0: impl FnOnce(&Communicator) -> sncl::Result<bool>,
) -> ExitCode {
    if np == 0 {
        eprintln!("commbench: --np must be at least 1");
        return ExitCode::from(2);
    }
    if np > comm_core::MAX_RANKS {
        eprintln!(
            "commbench: --np {np} exceeds the limit of {} ranks",
            comm_core::MAX_RANKS
        );
        return ExitCode::from(2);
    }
    // Port 0: the store listens from now on, on a port the id carries.
    let id: UniqueId = match Communicator::unique_id(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))) {
        Ok(id) => id,
        Err(e) => {
            eprintln!("commbench: cannot start the rendezvous store on 127.0.0.1: {e}");
            return ExitCode::from(1);
        }
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("commbench: cannot find my own executable: {e}");
            return ExitCode::from(1);
        }
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let argv = strip_np(&argv);
    let secret: String = id.secret.iter().map(|x| format!("{x:02x}")).collect();
    // The ranks' own operation timeout (SNCL_TIMEOUT_MS, environment or
    // settings file); a bad value fails rank 0's init with the reason.
    let timeout = sncl::Config::from_env()
        .map(|c| c.timeout)
        .unwrap_or_else(|_| sncl::Config::default().timeout);
    let watch = Arc::new(Watch {
        children: Mutex::new(Vec::new()),
        clock: Mutex::new(None),
        rank0_done: AtomicBool::new(false),
        grace: timeout + Duration::from_secs(5),
    });
    for r in 1..np {
        let mut cmd = Command::new(&exe);
        cmd.args(&argv)
            .env("SNCL_RANK", r.to_string())
            .env("SNCL_WORLD_SIZE", np.to_string())
            .env("SNCL_ROOT", id.root.to_string())
            .env("SNCL_SECRET", &secret)
            .env("SNCL_LOCAL_RANK", r.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        die_with_launcher(&mut cmd);
        match cmd.spawn() {
            Ok(c) => watch
                .children
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((r, Some(c))),
            Err(e) => {
                eprintln!("commbench: cannot start rank {r}: {e}");
                let mut children = watch.children.lock().unwrap_or_else(|e| e.into_inner());
                for (_, c) in children.iter_mut() {
                    if let Some(c) = c {
                        let _ = c.kill();
                        let _ = c.wait();
                    }
                }
                return ExitCode::from(1);
            }
        }
    }
    let watcher = {
        let watch = watch.clone();
        std::thread::spawn(move || watch.wait())
    };
    let own = crate::outcome(Communicator::init_rank(&id, 0, np).and_then(|comm| rank0(&comm)));
    watch.rank0_done.store(true, Ordering::SeqCst);
    watch.start_clock();
    let theirs = watcher.join().unwrap_or(1);
    ExitCode::from(i32::from(own).max(theirs).clamp(0, 255) as u8)
}
