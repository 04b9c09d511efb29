//! `--np N`: runs N local processes of this same command (each of `-t`
//! ranks as threads; one by default). The launcher is process 0 itself: it
//! starts the rendezvous store on a free port first (so no other program
//! can take the port before the ranks use it), then starts processes 1..N
//! that die with it, then runs its own ranks.

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

/// How long the other ranks get, once a rank failed, to report their own
/// errors before the job is ended (torchrun and mpirun end a job at its
/// first failed rank).
const FAIL_GRACE: Duration = Duration::from_secs(2);

/// A rank's process and the last line it wrote to stderr (forwarded to
/// this process's stderr as it comes).
struct RankProcess {
    /// How messages name it: "rank 3", or "process 1 (ranks 2-3)" with -t.
    label: String,
    child: Option<Child>,
    last_line: Arc<Mutex<String>>,
    /// The thread forwarding its stderr (done once the pipe is drained).
    forwarder: Option<std::thread::JoinHandle<()>>,
}

/// The ranks 1..N, watched from a thread while rank 0 runs here.
struct Watch {
    children: Mutex<Vec<RankProcess>>,
    /// When the first rank (any, rank 0 included) failed, or rank 0 ended,
    /// and how long the others get from then.
    clock: Mutex<Option<(Instant, Duration)>>,
    rank0_done: AtomicBool,
    /// The ranks' own deadline plus a margin: what the others get after
    /// rank 0 ended well (they may still be finishing normally).
    done_grace: Duration,
    /// How messages name this process's own ranks ("rank 0", or "process
    /// 0 (ranks 0-1)" with -t).
    own_label: String,
}

impl Watch {
    fn start_clock(&self, grace: Duration) {
        let mut clock = self.clock.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        match *clock {
            // A failure shortens a clock that a good end started.
            Some((t, g)) if t + g <= now + grace => {}
            _ => *clock = Some((now, grace)),
        }
    }

    /// Rank 0 (this process) ended with `code`.
    fn rank0_ended(&self, code: u8) {
        if code == 0 {
            self.start_clock(self.done_grace);
        } else {
            eprintln!(
                "commbench: {} failed (exit status {code}); ending the job",
                self.own_label
            );
            self.start_clock(FAIL_GRACE);
        }
        self.rank0_done.store(true, Ordering::SeqCst);
    }

    /// Waits for every child; the worst exit code. Once a rank has failed
    /// the others get [`FAIL_GRACE`] to report their own errors, once rank
    /// 0 has ended well the sncl deadline plus a margin; then they are
    /// stopped (and, if rank 0 is still running, the whole launcher).
    fn wait(&self) -> i32 {
        let mut worst = 0;
        loop {
            let mut alive = 0;
            let mut children = self.children.lock().unwrap_or_else(|e| e.into_inner());
            for p in children.iter_mut() {
                let Some(c) = &mut p.child else { continue };
                match c.try_wait() {
                    Ok(Some(st)) => {
                        let code = code_of(st);
                        // Its last lines first (the pipe drains right
                        // after the exit; bounded).
                        if let Some(f) = p.forwarder.take() {
                            let until = Instant::now() + Duration::from_millis(500);
                            while !f.is_finished() && Instant::now() < until {
                                std::thread::sleep(Duration::from_millis(5));
                            }
                        }
                        if code != 0 {
                            let how = match st.code() {
                                Some(c) => format!("exited with status {c}"),
                                None => format!(
                                    "was killed by signal {}",
                                    st.signal().unwrap_or(libc::SIGKILL)
                                ),
                            };
                            let last = p.last_line.lock().unwrap_or_else(|e| e.into_inner());
                            eprintln!(
                                "commbench: {} {how}; its last error line: {}; ending the job",
                                p.label,
                                if last.is_empty() {
                                    "(none)"
                                } else {
                                    last.as_str()
                                }
                            );
                            self.start_clock(FAIL_GRACE);
                        }
                        worst = worst.max(code);
                        p.child = None;
                    }
                    Ok(None) => alive += 1,
                    Err(e) => {
                        eprintln!("commbench: cannot wait for {}: {e}", p.label);
                        worst = worst.max(1);
                        p.child = None;
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
                .is_some_and(|(t, grace)| t.elapsed() > grace);
            if expired {
                for p in children.iter_mut() {
                    if let Some(c) = &mut p.child {
                        eprintln!(
                            "commbench: stopping {}, still running after another rank failed or finished",
                            p.label
                        );
                        let _ = c.kill();
                        let _ = c.wait();
                        worst = worst.max(1);
                        p.child = None;
                    }
                }
                if !rank0_done {
                    eprintln!(
                        "commbench: stopping {}, still running after another rank failed",
                        self.own_label
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

/// Forwards `child`'s stderr to this process's stderr line by line and
/// keeps its last non-empty line; the forwarding thread, if one started.
fn forward_stderr(child: &mut Child) -> (Arc<Mutex<String>>, Option<std::thread::JoinHandle<()>>) {
    let last = Arc::new(Mutex::new(String::new()));
    let mut forwarder = None;
    if let Some(err) = child.stderr.take() {
        let keep = last.clone();
        forwarder = Some(std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                eprintln!("{line}");
                if !line.trim().is_empty() {
                    *keep.lock().unwrap_or_else(|e| e.into_inner()) = line;
                }
            }
        }));
    }
    (last, forwarder)
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

/// Runs `threads` ranks as threads of this process, which is process
/// `proc_index` of `procs` in the job `id`: ranks `proc_index × threads +
/// i` of `procs × threads` (nccl-tests' `-t` under mpirun, and `--np` with
/// `-t`). The exit code is the worst of theirs; one thread runs here.
pub fn run_thread_ranks(
    id: &UniqueId,
    (proc_index, procs): (usize, usize),
    threads: usize,
    cpus: Option<&[usize]>,
    rank: &(impl Fn(&Communicator) -> sncl::Result<bool> + Sync),
) -> u8 {
    let world = procs.saturating_mul(threads);
    if threads == 0 || world > comm_core::MAX_RANKS {
        eprintln!(
            "commbench: {procs} process(es) × -t {threads} threads must make 1 to {} ranks",
            comm_core::MAX_RANKS
        );
        return 2;
    }
    let one = |i: usize| {
        if let Some(&cpu) = cpus.and_then(|c| c.get(i)) {
            crate::binding::bind_current_thread(cpu);
        }
        crate::outcome(
            Communicator::init_rank(id, proc_index * threads + i, world).and_then(|c| rank(&c)),
        )
    };
    if threads == 1 {
        return one(0);
    }
    std::thread::scope(|scope| {
        let runs: Vec<_> = (0..threads).map(|i| scope.spawn(move || one(i))).collect();
        runs.into_iter()
            .map(|r| r.join().unwrap_or(1))
            .max()
            .unwrap_or(0)
    })
}

/// How messages name process `p` of `--np` with `threads` ranks each.
fn process_label(p: usize, threads: usize) -> String {
    match threads {
        1 => format!("rank {p}"),
        t => format!("process {p} (ranks {}-{})", p * t, p * t + t - 1),
    }
}

/// Ranks per core `--np` allows without `--oversubscribe` (the test
/// machines run 4 ranks on 2 cores; 8 per core is far past what helps).
pub const RANKS_PER_CORE: usize = 8;

/// Refuses `np` local processes above [`RANKS_PER_CORE`] per core of this
/// machine unless `oversubscribe`, as mpirun refuses more processes than
/// slots without its `--oversubscribe`.
pub fn check_subscription(np: usize, oversubscribe: bool) -> Result<(), String> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let most = cores * RANKS_PER_CORE;
    if np > most && !oversubscribe {
        return Err(format!(
            "--np {np} is more than {RANKS_PER_CORE} ranks per core on this machine's {cores} \
             core(s) ({most}); pass --oversubscribe to start them anyway"
        ));
    }
    Ok(())
}

/// Runs `np` processes of `threads` ranks each: processes 1..np as
/// children, process 0 here; the exit code is the worst of theirs.
pub fn launch_local(
    np: usize,
    threads: usize,
    bind: crate::binding::BindTo,
    rank: impl Fn(&Communicator) -> sncl::Result<bool> + Sync,
) -> ExitCode {
    if np == 0 {
        eprintln!("commbench: --np must be at least 1");
        return ExitCode::from(2);
    }
    if np.saturating_mul(threads) > comm_core::MAX_RANKS {
        eprintln!(
            "commbench: --np {np} × -t {threads} exceeds the limit of {} ranks",
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
        done_grace: timeout + Duration::from_secs(5),
        own_label: process_label(0, threads),
    });
    // Process p's ranks on CPUs p×threads .. p×threads+threads−1.
    let cpus = crate::binding::plan(bind, np.saturating_mul(threads));
    let cpus_of = |p: usize| cpus.as_ref().map(|c| &c[p * threads..(p + 1) * threads]);
    for r in 1..np {
        let mut cmd = Command::new(&exe);
        cmd.args(&argv);
        if let Some(list) = cpus_of(r) {
            let list: Vec<String> = list.iter().map(usize::to_string).collect();
            cmd.arg("--bind-cpus").arg(list.join(","));
        }
        cmd.env("SNCL_RANK", r.to_string())
            .env("SNCL_WORLD_SIZE", np.to_string())
            .env("SNCL_ROOT", id.root.to_string())
            .env("SNCL_SECRET", &secret)
            .env("SNCL_LOCAL_RANK", r.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        die_with_launcher(&mut cmd);
        match cmd.spawn() {
            Ok(mut c) => {
                let (last_line, forwarder) = forward_stderr(&mut c);
                watch
                    .children
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(RankProcess {
                        label: process_label(r, threads),
                        child: Some(c),
                        last_line,
                        forwarder,
                    })
            }
            Err(e) => {
                eprintln!("commbench: cannot start rank {r}: {e}");
                let mut children = watch.children.lock().unwrap_or_else(|e| e.into_inner());
                for p in children.iter_mut() {
                    if let Some(c) = &mut p.child {
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
    let own = run_thread_ranks(&id, (0, np), threads, cpus_of(0), &rank);
    watch.rank0_ended(own);
    let theirs = watcher.join().unwrap_or(1);
    ExitCode::from(i32::from(own).max(theirs).clamp(0, 255) as u8)
}
