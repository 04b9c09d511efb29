//! commbench's command line and its local launcher (`--np`): argument
//! errors exit 2 before anything runs, sweeps skip reductions that do not
//! apply to a type, send/recv runs on one rank, and killing the launcher
//! takes its rank processes with it.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_commbench");

fn commbench(args: &[&str]) -> (Option<i32>, String, String) {
    let o = Command::new(BIN)
        .args(args)
        .env("SNCL_TIMEOUT_MS", "30000")
        .stdin(Stdio::null())
        .output()
        .expect("running commbench");
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The table's rows of commbench's output (neither comments nor blank).
fn table_rows(out: &str) -> Vec<&str> {
    out.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .collect()
}

#[test]
fn min_size_above_max_is_an_error() {
    let (code, out, err) = commbench(&["all_reduce", "--np", "2", "-b", "2K", "-e", "1K"]);
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(err.contains("2048") && err.contains("1024"), "{err}");
    assert!(out.is_empty(), "nothing may run: {out}");
}

#[test]
fn inapplicable_reduction_is_an_error() {
    let (code, out, err) = commbench(&["all_reduce", "--np", "2", "-o", "bxor", "-d", "float"]);
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(err.contains("bxor") && err.contains("float"), "{err}");
    assert!(out.is_empty(), "nothing may run: {out}");
}

#[test]
fn sweep_skips_inapplicable_pairs_with_a_comment() {
    let (code, out, err) = commbench(&[
        "all_reduce",
        "--np",
        "1",
        "-o",
        "bxor",
        "-d",
        "all",
        "-b",
        "64",
        "-e",
        "64",
        "-n",
        "2",
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    let skip: Vec<&str> = out.lines().filter(|l| l.contains("skipping")).collect();
    assert_eq!(skip.len(), 1, "{out}");
    assert!(
        skip[0].starts_with('#') && skip[0].contains("float"),
        "{out}"
    );
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains("bxor"))
        .collect();
    assert_eq!(rows.len(), 6, "one row per integer type:\n{out}");
    assert!(rows.iter().all(|r| !r.contains("float")), "{out}");
}

#[test]
fn ranks_as_threads_of_one_process() {
    let (code, out, err) = commbench(&[
        "all_reduce",
        "--threads",
        "3",
        "-b",
        "8",
        "-e",
        "4K",
        "-f",
        "8",
        "-n",
        "2",
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("3 ranks"), "{out}");
    let rows = table_rows(&out).len();
    assert_eq!(rows, 4, "rows of 8 B, 64 B, 512 B and 4 KiB: {out}");
    // nccl-tests' -t under a launcher: 2 processes × 2 threads = 4 ranks,
    // ranks 0-1 in the launcher's process and 2-3 in the child's.
    let (code, out, err) = commbench(&[
        "broadcast",
        "-t",
        "2",
        "--np",
        "2",
        "-b",
        "8",
        "-e",
        "64",
        "-f",
        "8",
        "-n",
        "2",
        "-r",
        "3",
    ]);
    assert_eq!(code, Some(0), "-t with --np: {out}{err}");
    assert!(
        out.contains("4 ranks") && out.contains("# nThread 2"),
        "{out}"
    );
    let pid_of = |rank: usize| {
        out.lines()
            .find(|l| l.starts_with(&format!("#  Rank {rank:2} Group  0 Pid")))
            .and_then(|l| l.split_whitespace().nth(6))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("rank {rank}'s line: {out}"))
    };
    assert_eq!(pid_of(0), pid_of(1), "{out}");
    assert_eq!(pid_of(2), pid_of(3), "{out}");
    assert_ne!(pid_of(0), pid_of(2), "{out}");
    let (code, _, err) = commbench(&["broadcast", "-t", "2", "--np", "2", "-r", "4"]);
    assert_eq!(code, Some(2), "root 4 of 2 × 2 ranks: {err}");
    assert!(err.contains("0 to 3"), "{err}");
}

/// nccl-tests' -O 0 (in place only), -u (unaligned buffers), -z 2 and the
/// refusals of what does not apply.
#[test]
fn in_place_only_unaligned_and_refusals() {
    let (code, out, err) = commbench(&[
        "reduce_scatter",
        "--np",
        "2",
        "-b",
        "64",
        "-e",
        "4K",
        "-f",
        "8",
        "-n",
        "2",
        "-O",
        "0",
        "-u",
        "3",
        "-z",
        "2",
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    let rows = table_rows(&out);
    assert_eq!(rows.len(), 3, "{out}");
    for row in rows {
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(&cols[5..9], ["N/A"; 4], "out of place not run: {row}");
        assert_eq!(
            cols[12], "0",
            "in place right with unaligned buffers: {row}"
        );
    }
    for (args, says) in [
        (
            &["alltoall", "-O", "0"][..],
            "alltoall has no in-place form",
        ),
        (&["all_reduce", "-z", "3"][..], "-z 3: expected 0, 1"),
        (
            &["all_reduce", "-o", "mulsum"][..],
            "snclRedOpCreatePreMulSum",
        ),
        (&["all_reduce", "-u", "100000"][..], "-u 100000"),
    ] {
        let (code, out, err) = commbench(&[&["--np", "2"][..], args].concat());
        assert_eq!(code, Some(2), "{args:?}: {out}{err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(
            !out.contains("# sncl commbench"),
            "refused after launch: {out}"
        );
    }
}

#[test]
fn sendrecv_on_one_rank() {
    let (code, out, err) = commbench(&[
        "sendrecv", "--np", "1", "-b", "8", "-e", "1M", "-f", "4", "-n", "3",
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("# Out of bounds values : 0 OK"), "{out}");
    let rows = out.lines().filter(|l| !l.starts_with('#')).count();
    assert_eq!(rows, 9, "8 B to 512 KiB by 4:\n{out}");
}

/// Process ids of `pid`'s children (every thread's).
fn children_of(pid: u32) -> Vec<u32> {
    let mut v = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return v;
    };
    for t in tasks.flatten() {
        let s = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        v.extend(s.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
    }
    v.sort_unstable();
    v.dedup();
    v
}

/// Whether `pid` exists and is not a zombie (killed, not yet reaped).
fn running(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name in parentheses.
    let state = stat
        .rsplit(')')
        .next()
        .and_then(|r| r.split_whitespace().next());
    !matches!(state, Some("Z" | "X") | None)
}

/// The launcher `pid`'s rank processes once `want` of them run (or what
/// runs after 30 s).
fn wait_for_ranks(pid: u32, want: usize) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut ranks = children_of(pid);
    while ranks.len() < want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        ranks = children_of(pid);
    }
    ranks
}

#[test]
fn ranks_die_with_their_launcher() {
    if !std::path::Path::new("/proc/self/task").exists() {
        eprintln!("skipped: no /proc to find the rank processes");
        return;
    }
    let mut launcher = Command::new(BIN)
        .args([
            "all_reduce",
            "--np",
            "3",
            "-b",
            "64K",
            "-e",
            "64K",
            "-n",
            "1000000000",
            "-c",
            "0",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting commbench");
    let pid = launcher.id();
    let ranks = wait_for_ranks(pid, 2);
    // Rank 0 runs in the launcher itself (it holds the rendezvous port).
    assert_eq!(ranks.len(), 2, "--np 3 starts ranks 1 and 2: {ranks:?}");
    // Let them get into the timed loop.
    std::thread::sleep(Duration::from_millis(500));
    assert!(ranks.iter().all(|&p| running(p)), "ranks ended early");
    // A running rank would also notice rank 0's death at its next wait on
    // it; a stopped one (as one busy or stuck elsewhere) never does, so
    // only the death signal set at launch ends it.
    for &p in &ranks {
        // SAFETY: kill(2) on a pid this test started (through the launcher).
        unsafe { libc::kill(p as libc::pid_t, libc::SIGSTOP) };
    }
    launcher.kill().expect("killing the launcher");
    launcher.wait().expect("reaping the launcher");
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut left: Vec<u32> = ranks.clone();
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        left.retain(|&p| running(p));
    }
    for &p in &left {
        // Do not leave them spinning after a failed test.
        // SAFETY: kill(2) on a pid this test started (through the launcher).
        unsafe { libc::kill(p as libc::pid_t, libc::SIGKILL) };
    }
    assert!(
        left.is_empty(),
        "rank processes {left:?} outlived their launcher by 5 s"
    );
}

/// A rank that fails at startup ends the whole job at once, as torchrun and
/// mpirun do: with a network interface that does not exist, every rank
/// fails; the launcher exits non-zero within a few seconds (not at the
/// ranks' 30 s deadline), names a failed rank and leaves no process.
#[test]
fn a_failed_rank_ends_the_job_within_seconds() {
    let start = Instant::now();
    let o = Command::new(BIN)
        .args(["all_reduce", "--np", "4", "-b", "8", "-e", "8"])
        .env("SNCL_TIMEOUT_MS", "30000")
        .env("SNCL_SOCKET_IFNAME", "eth99")
        .stdin(Stdio::null())
        .output()
        .expect("running commbench");
    let took = start.elapsed();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(
        took < Duration::from_secs(5),
        "the job took {took:?}:\n{err}"
    );
    assert!(
        err.contains("rank 0 failed") || err.contains("its last error line"),
        "names the failed rank: {err}"
    );
    assert!(
        err.contains("eth99"),
        "the ranks' error reached the log: {err}"
    );
}

/// A rank killed mid-run: the launcher names it and its signal and ends
/// the job within a few seconds, leaving no rank behind.
#[test]
fn a_killed_rank_ends_the_job_naming_it() {
    if !std::path::Path::new("/proc/self/task").exists() {
        eprintln!("skipped: no /proc to find the rank processes");
        return;
    }
    let launcher = Command::new(BIN)
        .args([
            "all_reduce",
            "--np",
            "3",
            "-b",
            "64K",
            "-e",
            "64K",
            "-n",
            "1000000000",
            "-c",
            "0",
        ])
        .env("SNCL_TIMEOUT_MS", "30000")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting commbench");
    let pid = launcher.id();
    let ranks = wait_for_ranks(pid, 2);
    assert_eq!(ranks.len(), 2, "--np 3 starts ranks 1 and 2: {ranks:?}");
    std::thread::sleep(Duration::from_millis(500));
    let killed_at = Instant::now();
    // SAFETY: kill(2) on a pid this test started (through the launcher).
    unsafe { libc::kill(ranks[1] as libc::pid_t, libc::SIGKILL) };
    let o = launcher.wait_with_output().expect("the launcher's end");
    let took = killed_at.elapsed();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(
        took < Duration::from_secs(5),
        "ended {took:?} after the kill:\n{err}"
    );
    assert!(
        err.contains("was killed by signal 9"),
        "names the signal: {err}"
    );
    let left: Vec<u32> = ranks.into_iter().filter(|&p| running(p)).collect();
    for &p in &left {
        // SAFETY: kill(2) on a pid this test started (through the launcher).
        unsafe { libc::kill(p as libc::pid_t, libc::SIGKILL) };
    }
    assert!(left.is_empty(), "rank processes {left:?} outlived the job");
}

/// `--np` above 8 ranks per core is refused before anything starts unless
/// `--oversubscribe` (as mpirun's).
#[test]
fn oversubscription_needs_its_flag() {
    let (code, out, err) = commbench(&["all_reduce", "--np", "100000", "-b", "8", "-e", "8"]);
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(
        err.contains("--oversubscribe") && err.contains("per core"),
        "{err}"
    );
    assert!(out.is_empty(), "nothing may run: {out}");
}

/// A command line copied from nccl-tests' README runs as it is, and the
/// log carries nccl-tests' header lines: the parameters (so it can be
/// reproduced from itself) and one line per rank with its pid, host and
/// device. Nonsense values are refused before any rank starts (exit 2, one
/// line naming the flag), and an unchecked run says N/A, not OK.
#[test]
fn nccl_tests_readme_line_runs_with_its_header() {
    let (code, out, err) = commbench(&[
        "all_reduce",
        "--np",
        "2",
        "-b",
        "8",
        "-e",
        "128M",
        "-f",
        "2",
        "-g",
        "1",
        "-n",
        "2",
    ]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(
        out.contains(
            "# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 \
             iters: 2 agg iters: 1 validation: 1 graph: 0"
        ),
        "{out}"
    );
    for rank in 0..2 {
        assert!(
            out.lines()
                .any(|l| l.starts_with(&format!("#  Rank {rank:2} Group  0 Pid"))
                    && l.contains("device host")),
            "rank {rank}'s line: {out}"
        );
    }
    // 8 B to 128 MiB by 2: 25 sizes.
    assert_eq!(table_rows(&out).len(), 25, "{out}");
    assert!(out.contains("# Out of bounds values : 0 OK"), "{out}");
    let started = Instant::now();
    let (code, out, err) =
        commbench(&["all_reduce", "--np", "2", "-b", "8", "-e", "64", "-f", "1"]);
    assert_eq!(code, Some(2), "{out}\n{err}");
    assert!(
        err.starts_with("commbench: -f 1: the size factor must be above 1"),
        "{err}"
    );
    assert!(
        !out.contains("# sncl commbench"),
        "refused after launch: {out}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    let (code, out, _) = commbench(&["all_reduce", "--np", "2", "-b", "8", "-e", "8", "-c", "0"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("# Out of bounds values : N/A"), "{out}");
    // -N cycles, -m aggregation, -a minimum, -T timeout, -J JSON.
    let json = std::env::temp_dir().join(format!("commbench-J-{}.json", std::process::id()));
    let (code, out, err) = commbench(&[
        "all_reduce",
        "--np",
        "2",
        "-b",
        "8",
        "-e",
        "8",
        "-N",
        "2",
        "-m",
        "3",
        "-a",
        "2",
        "-T",
        "20",
        "-J",
        json.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("agg iters: 3"), "{out}");
    assert!(out.contains("# cycle 2 of 2"), "{out}");
    assert_eq!(table_rows(&out).len(), 2, "one row per cycle: {out}");
    let text = std::fs::read_to_string(&json).expect("-J wrote the rows");
    assert!(text.trim_start().starts_with('['), "{text}");
    let _ = std::fs::remove_file(&json);
}

/// `commbench --help` names every subcommand, each of which answers its own
/// `--help` naming itself as `commbench <sub>`.
#[test]
fn help_lists_the_subcommands() {
    let (code, out, _) = commbench(&["--help"]);
    assert_eq!(code, Some(0));
    for sub in ["sim", "plan", "calibrate", "trace", "soak"] {
        assert!(out.contains(&format!("commbench {sub}")), "{sub}: {out}");
        let (_, o, e) = commbench(&[sub, "--help"]);
        assert!(
            format!("{o}{e}").contains(&format!("commbench {sub}")),
            "{sub} --help: {o}{e}"
        );
    }
}

/// nccl-tests' `-r all` (every root in turn), its loop order (type, then
/// reduction, then root, sizes innermost), an `algo` column when `--algo`
/// runs several, and `N/A` in `#wrong` when not checked.
#[test]
fn root_all_loop_order_and_algo_column() {
    let (code, out, err) = commbench(&[
        "reduce",
        "--np",
        "2",
        "-b",
        "8",
        "-e",
        "64",
        "-f",
        "8",
        "-n",
        "2",
        "-w",
        "1",
        "-r",
        "all",
        "--algo",
        "ring,tree",
        "-d",
        "int8,float",
        "-o",
        "sum,max",
        "-c",
        "0",
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.lines()
            .any(|l| l.starts_with('#') && l.contains(" root       algo ")),
        "algo column header: {out}"
    );
    let rows: Vec<Vec<&str>> = table_rows(&out)
        .into_iter()
        .map(|l| l.split_whitespace().collect())
        .collect();
    // 2 algorithms × 2 types × 2 reductions × 2 roots × 2 sizes.
    assert_eq!(rows.len(), 32, "{out}");
    let key = |r: &Vec<&str>| {
        (
            r[5].to_string(),
            r[2].to_string(),
            r[3].to_string(),
            r[4].to_string(),
        )
    };
    // Sizes innermost: each (algo, type, op, root) holds 8 then 64 bytes.
    for pair in rows.chunks(2) {
        assert_eq!(key(&pair[0]), key(&pair[1]), "{out}");
        assert_eq!((pair[0][0], pair[1][0]), ("8", "64"), "{out}");
    }
    assert_eq!(
        (rows[0][2], rows[0][3], rows[0][4], rows[0][5]),
        ("int8", "sum", "0", "ring")
    );
    assert_eq!(
        (rows[2][4], rows[4][3], rows[8][2], rows[16][5]),
        ("1", "max", "float", "tree")
    );
    assert!(
        rows.iter().all(|r| r[9] == "N/A" && r[13] == "N/A"),
        "{out}"
    );
}

/// Both charts go through the one plotting path (plotters): `plan --svg`
/// draws a bar per mapping labelled with its name, total and utilisation;
/// `--plot` a line per algorithm, labelled.
#[test]
fn charts_name_what_they_show() {
    let dir = std::env::temp_dir().join(format!("commbench-charts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plan = dir.join("plan.svg");
    let (code, out, err) = commbench(&[
        "plan",
        "--params",
        "7e9",
        "--layers",
        "32",
        "--hidden",
        "4096",
        "--seq",
        "4096",
        "--micro-batch",
        "1",
        "--global-batch",
        "256",
        "--dtype",
        "bf16",
        "--dp",
        "16",
        "--tp",
        "8",
        "--pp",
        "1",
        "--map",
        "tp:intra,dp:inter",
        "--compare",
        "dp:intra,tp:inter",
        "--nodes",
        "16",
        "--ranks-per-node",
        "8",
        "--intra",
        "900GB/s,1us",
        "--inter",
        "50GB/s,5us",
        "--step-compute-ms",
        "1000",
        "--svg",
        plan.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    let svg = std::fs::read_to_string(&plan).unwrap();
    for want in [
        "<svg",
        "tp:intra,dp:inter",
        "dp:intra,tp:inter",
        "utilisation",
        "compute",
    ] {
        assert!(svg.contains(want), "plan chart lacks {want}: {svg}");
    }
    let plot = dir.join("plot.svg");
    let (code, out, err) = commbench(&[
        "all_reduce",
        "-b",
        "1K",
        "-e",
        "4K",
        "-f",
        "2",
        "-n",
        "1",
        "-w",
        "0",
        "-t",
        "2",
        "--algo",
        "ring,rd",
        "--plot",
        plot.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    let svg = std::fs::read_to_string(&plot).unwrap();
    for want in ["<svg", "ring", "rd", "bus bandwidth"] {
        assert!(svg.contains(want), "busbw chart lacks {want}: {svg}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--launches N` runs the benchmark N times, each a fresh launch, and
/// prints one row per size with the spread over the launches; it refuses
/// `--json` (it writes its own per launch).
#[test]
fn launches_report_the_spread_over_fresh_runs() {
    let (code, out, err) = commbench(&[
        "all_reduce",
        "--threads",
        "2",
        "-b",
        "8",
        "-e",
        "64",
        "-f",
        "8",
        "-n",
        "5",
        "-w",
        "1",
        "--launches",
        "3",
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("# 3 launches"), "{out}");
    let rows = table_rows(&out);
    assert_eq!(rows.len(), 2, "one row per size: {out}");
    for row in rows {
        let cols: Vec<f64> = row
            .split_whitespace()
            .map(|c| c.parse().expect("numbers"))
            .collect();
        // size, min / median / max time, min / median / max busbw, max/min.
        assert_eq!(cols.len(), 8, "{row}");
        assert!(cols[1] <= cols[2] && cols[2] <= cols[3], "{row}");
        assert!(cols[7] >= 1.0, "{row}");
    }
    let (code, _, err) = commbench(&[
        "all_reduce",
        "--threads",
        "2",
        "--launches",
        "2",
        "--json",
        "x.json",
    ]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--json"), "{err}");
}

/// The `cpus` field of each rank line, in rank order.
fn rank_cpus(out: &str) -> Vec<String> {
    out.lines()
        .filter(|l| l.starts_with("#  Rank"))
        .map(|l| l.rsplit("cpus ").next().unwrap_or("").trim().to_string())
        .collect()
}

#[test]
fn np_binds_each_rank_to_its_own_core_unless_told_not_to() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores < 2 {
        eprintln!("skipped: binding 2 ranks needs 2 CPUs, this machine has {cores}");
        return;
    }
    let args = [
        "all_reduce",
        "--np",
        "2",
        "-b",
        "8",
        "-e",
        "8",
        "-n",
        "1",
        "-w",
        "0",
    ];
    let (code, out, err) = commbench(&args);
    assert_eq!(code, Some(0), "{err}");
    let bound = rank_cpus(&out);
    assert_eq!(bound.len(), 2, "{out}");
    assert!(
        bound.iter().all(|c| !c.contains(',')),
        "one CPU each: {bound:?}"
    );
    assert_ne!(bound[0], bound[1], "two ranks on one CPU: {bound:?}");
    let (code, out, err) = commbench(&[&args[..], &["--bind-to", "none"]].concat());
    assert_eq!(code, Some(0), "{err}");
    let free = rank_cpus(&out);
    assert!(
        free.iter().all(|c| c.contains(',')),
        "unbound ranks keep every CPU: {free:?}"
    );
}

/// `commbench sim init`: the creation of a communicator at 65 664 ranks,
/// phase by phase, names the all-read-all rendezvous as the bottleneck;
/// the tree rendezvous (sncl's, the default) brings it to seconds; bad
/// flags are errors.
#[test]
fn sim_init_names_the_rendezvous_as_the_bottleneck_at_scale() {
    let scale = ["sim", "init", "--nodes", "171", "--ranks-per-node", "384"];
    let (code, out, err) = commbench(&[&scale[..], &["--rendezvous", "all"]].concat());
    assert_eq!(code, Some(0), "{err}");
    let rows = table_rows(&out);
    let phases: Vec<&str> = rows
        .iter()
        .map(|r| r.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(phases, ["prepare", "rendezvous", "connect", "barrier"]);
    assert!(
        out.contains("bottleneck: rendezvous (4.312e9 requests at one store server)"),
        "{out}"
    );
    let (code, out, err) = commbench(&scale);
    assert_eq!(code, Some(0), "{err}");
    let total: f64 = out
        .lines()
        .find_map(|l| l.strip_prefix("# total "))
        .and_then(|l| l.split(' ').next())
        .and_then(|s| s.parse().ok())
        .expect("a total");
    assert!(total < 60.0, "{out}");
    for bad in [
        &["--rendezvous", "bogus"][..],
        &["--store-rate", "0"],
        &["--store-rtt", "soon"],
    ] {
        let (code, _, err) = commbench(&[&scale[..], bad].concat());
        assert_eq!(code, Some(2), "{bad:?}: {err}");
        assert!(err.contains(bad[0]), "{bad:?}: {err}");
    }
}

/// `commbench sim --straggler / --slow-link`: the per-rank frame runs, the
/// critical path line names the slow node and the degraded link, and the
/// JSON row carries it; malformed flags are errors that name the flag.
#[test]
fn sim_names_a_straggler_and_a_degraded_link_on_the_critical_path() {
    let base = [
        "sim",
        "all_reduce",
        "-b",
        "64M",
        "-e",
        "64M",
        "--algo",
        "hier",
        "--nodes",
        "8",
        "--ranks-per-node",
        "16",
        "--intra",
        "400GB/s,2us",
        "--inter",
        "50GB/s,5us",
    ];
    let chrome = std::env::temp_dir().join(format!("sncl-sim-slow-{}.trace", std::process::id()));
    let (code, out, err) = commbench(
        &[
            &base[..],
            &["--straggler", "5:3", "--chrome", chrome.to_str().unwrap()],
        ]
        .concat(),
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("per-rank"), "{out}");
    assert!(
        out.contains("critical path") && out.contains(": node 5 (slowed: intra x3"),
        "{out}"
    );
    // The trace draws the path on its own track, ending with the operation.
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&chrome).unwrap()).unwrap();
    let _ = std::fs::remove_file(&chrome);
    let events = trace["traceEvents"].as_array().unwrap();
    let op = events.iter().find(|e| e["cat"] == "simulated").unwrap();
    let path: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["cat"] == "critical path")
        .collect();
    assert!(!path.is_empty(), "{trace}");
    let f = |v: &serde_json::Value| v.as_f64().unwrap();
    let last = path.last().unwrap();
    let end = f(&op["ts"]) + f(&op["dur"]);
    assert!((f(&last["ts"]) + f(&last["dur"]) - end).abs() < 1e-6 * end);
    assert!(path
        .iter()
        .any(|e| e["args"]["from_node"] == 5 || e["args"]["node"] == 5));
    let json = std::env::temp_dir().join(format!("sncl-sim-slow-{}.json", std::process::id()));
    let (code, out, err) = commbench(
        &[
            &base[..],
            &["--slow-link", "3:4", "--json", json.to_str().unwrap()],
        ]
        .concat(),
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("(inter)") && out.contains(": node 3 (slowed"),
        "{out}"
    );
    let rows: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    let critical = &rows[0]["critical_path"];
    assert_eq!(critical["link"]["tier"], "inter", "{rows}");
    assert_eq!(critical["node"], 3, "{rows}");
    for bad in [
        &["--straggler", "x"][..],
        &["--slow-link", "3"],
        &["--straggler", "8:2"],
        &["--straggler", "1:0.5"],
    ] {
        let (code, _, err) = commbench(&[&base[..], bad].concat());
        assert_eq!(code, Some(2), "{bad:?}: {err}");
        assert!(
            err.contains(bad[0]) || err.contains("slowdown of node"),
            "{bad:?}: {err}"
        );
    }
}
