//! sncl's device path on the model, every rule on: `commbench all_reduce
//! --device cuda` as 2 processes and as 2 threads of one process, and the
//! root crate's device suite (`tests/device_collectives.rs`) on the `cuda`
//! backend, complete with correct results; no `cuda-model: deadlock` or
//! `stall`; and the model's counters show that sncl's progress threads
//! (`sncl-progress-N`, where operations run) never allocate, free, load a
//! module or open an IPC mapping (the callers' threads do, at bind and
//! before the first collective), and that no synchronising call was made
//! while a stream was parked. Until stop 28 these runs deadlocked in their
//! first operation (docs/CUDA-MODEL.md, findings 1 and 2).
//!
//! Skips, printing why, when commbench or the suite has not been built (the
//! README's test command builds the whole workspace first) or NVRTC is
//! unavailable.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "common/driver_env.rs"]
mod driver_env;

/// commbench of the same build as this test binary, if built.
fn commbench() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.parent()?.join("commbench");
    p.is_file().then_some(p)
}

/// The runs of this file one at a time: without MPS the model gives the
/// device to one process's kernels at a time and does not preempt, so a
/// run whose kernels keep the device would starve another test's run into
/// a reported stall (a GPU time-slices contexts instead).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The newest build of the root crate's test binary `name` next to this
/// one (in `deps/`), if built; `None`, saying why the test skips, if not.
fn suite(name: &str) -> Option<PathBuf> {
    let found = newest_suite(name);
    if found.is_none() {
        eprintln!(
            "skipped: tests/{name}.rs is not built next to this test (run the workspace build \
             first)"
        );
    }
    found
}

fn newest_suite(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let prefix = format!("{name}-");
    std::fs::read_dir(exe.parent()?)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with(&prefix) && !n.contains('.')
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max()
        .map(|(_, p)| p)
}

/// Runs `program args` on the model (every rule on, deadlocks reported
/// after 2 s); its exit status and stderr. `None` (printed) when NVRTC is
/// unavailable.
fn on_the_model(program: &PathBuf, args: &[&str], env: &[(&str, &str)], name: &str) -> Option<Run> {
    let nvrtc = match driver_env::wheel_dir("NVRTC_LIB_DIR", "libnvrtc.so.13") {
        Ok(d) => d,
        Err(why) => {
            driver_env::say_skipped(&format!("{name}: NVRTC is unavailable: {why}"));
            return None;
        }
    };
    let include = driver_env::cuda_include().ok();
    // One directory per test: tests run in parallel, and each makes its own afresh.
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("device-path-lib-{name}"));
    let lib = driver_env::model_lib_dir(&tmp);
    let reports = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("device-path-{name}"));
    let _ = std::fs::remove_dir_all(&reports);
    std::fs::create_dir_all(&reports).expect("the report directory");
    let report = reports.join("%p.json");
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env(
            "LD_LIBRARY_PATH",
            format!("{}:{}", lib.display(), nvrtc.display()),
        )
        .env("CUDA_MODEL_DEADLOCK_S", "2")
        .env("CUDA_MODEL_REPORT", &report)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    if let Some(dir) = include {
        cmd.env("SNCL_CUDA_INCLUDE", dir);
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let start = Instant::now();
    let mut child = cmd.spawn().expect("spawn the program");
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > Duration::from_secs(240) {
            let _ = child.kill();
            panic!(
                "{} on the model neither finished nor was stopped by the model in 240 s",
                program.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{stdout}\n{err}");
    let reports = std::fs::read_dir(&reports)
        .expect("the report directory")
        .filter_map(|e| e.ok())
        .map(|e| {
            let text = std::fs::read_to_string(e.path()).expect("a report");
            serde_json::from_str(&text).expect("a JSON report")
        })
        .collect();
    Some(Run {
        status: out.status,
        stdout,
        stderr: err,
        reports,
    })
}

/// What a run on the model left: exit status, output, the model's reports
/// (one per process).
struct Run {
    status: std::process::ExitStatus,
    stdout: String,
    stderr: String,
    reports: Vec<serde_json::Value>,
}

impl Run {
    /// The run succeeded, the model reported no hang, and every report
    /// (at least `processes`) says: kernels ran (the kernel path launches
    /// them from the callers' threads, the host-driven path from the
    /// progress threads); sncl's progress threads never allocated, freed, loaded modules or opened IPC mappings;
    /// nothing synchronising ran while a stream was parked.
    fn assert_clean(&self, what: &str, processes: usize) {
        let (launches, _) = self.check_clean(what, processes);
        assert!(launches > 0, "{what}: no kernel ran");
    }

    /// The checks of [`Run::assert_clean`] but the kernels'; the launches
    /// and the callers' stream waits it counted.
    fn check_clean(&self, what: &str, processes: usize) -> (u64, u64) {
        assert!(
            !self.stderr.contains("cuda-model: deadlock")
                && !self.stderr.contains("cuda-model: stall"),
            "{what}: the model reported a hang:\n{}",
            self.stderr
        );
        assert!(
            self.status.success(),
            "{what}: status {:?}\n{}",
            self.status,
            self.stderr
        );
        assert!(
            self.reports.len() >= processes,
            "{what}: {} reports for {processes} processes",
            self.reports.len()
        );
        let (mut launches, mut waits) = (0, 0);
        for r in &self.reports {
            let pid = r["pid"].as_u64().expect("pid");
            for t in r["threads"].as_array().expect("threads") {
                let (tid, name) = (&t["tid"], t["name"].as_str().unwrap_or(""));
                let events = &t["events"];
                let count = |k: &str| events[k].as_u64().unwrap_or(0);
                assert!(
                    t["synchronising_calls_while_parked"]
                        .as_object()
                        .is_none_or(|m| m.is_empty()),
                    "{what}: process {pid} thread {tid} ({name}) made synchronising calls while \
                     a stream was parked: {t}"
                );
                launches += count("launches");
                waits += count("stream_waits");
                if !name.starts_with("sncl-progress") {
                    continue;
                }
                for k in [
                    "allocations",
                    "frees",
                    "host_allocations",
                    "host_frees",
                    "module_loads",
                    "function_loads",
                    "ipc_opens",
                ] {
                    assert_eq!(
                        count(k),
                        0,
                        "{what}: process {pid} progress thread {tid} ({name}) has {k}: {events}"
                    );
                }
            }
        }
        (launches, waits)
    }

    /// As [`Run::assert_clean`] for a run that launches no kernel (copies
    /// only, the host-driven point-to-point path): callers' streams waited
    /// on its operations instead.
    fn assert_clean_copies(&self, what: &str, processes: usize) {
        let (_, waits) = self.check_clean(what, processes);
        assert!(
            waits > 0,
            "{what}: no caller's stream waited on an operation"
        );
    }

    /// Per process, what the model counted between its first operation
    /// (kernel launch or stream wait) and its last, summed over threads.
    fn between_operations(&self) -> Vec<std::collections::BTreeMap<String, u64>> {
        self.reports
            .iter()
            .map(|r| {
                let mut sum = std::collections::BTreeMap::new();
                for t in r["threads"].as_array().expect("threads") {
                    if let Some(m) = t["events_between_operations"].as_object() {
                        for (k, v) in m {
                            *sum.entry(k.clone()).or_default() += v.as_u64().unwrap_or(0);
                        }
                    }
                }
                sum
            })
            .collect()
    }

    /// Nothing allocated, freed, loaded or mapped between the first and
    /// the last operation of any process, on any thread (commbench
    /// allocates its buffers once, for the largest case, and sets the
    /// device links up with `connect_device` before any operation).
    fn assert_nothing_between_operations(&self, what: &str) {
        for (i, between) in self.between_operations().iter().enumerate() {
            assert!(
                between.is_empty(),
                "{what}: process {i} allocated, freed, loaded or mapped between its \
                 operations: {between:?}"
            );
        }
    }
}

fn commbench_on_the_model(extra: &[&str], max: &str, processes: usize, name: &str) {
    commbench_collective_on_the_model("all_reduce", extra, max, processes, name);
}

fn commbench_collective_on_the_model(
    collective: &str,
    extra: &[&str],
    max: &str,
    processes: usize,
    name: &str,
) {
    let Some(bench) = commbench() else {
        eprintln!(
            "skipped: commbench is not built next to this test (run the workspace build first)"
        );
        return;
    };
    let mut args = vec![
        collective, "--device", "cuda", "-b", "8", "-e", max, "-f", "8", "-n", "3", "-w", "1",
        "-c", "1",
    ];
    args.extend_from_slice(extra);
    if let Some(run) = on_the_model(&bench, &args, &[], name) {
        run.assert_clean(&format!("commbench {}", extra.join(" ")), processes);
        run.assert_nothing_between_operations(&format!("commbench {}", extra.join(" ")));
        assert!(
            run.stdout.contains("Out of bounds values : 0 OK"),
            "commbench {extra:?}: wrong results:\n{}",
            run.stdout
        );
    }
}

#[test]
fn commbench_all_reduce_on_device_as_two_processes() {
    commbench_on_the_model(&["--np", "2"], "1M", 2, "np2");
}

#[test]
fn commbench_all_reduce_on_device_as_two_threads_of_one_process() {
    commbench_on_the_model(&["--threads", "2"], "1M", 1, "threads2");
}

/// The kernel path captured into CUDA graphs: 5 all-reduces per graph,
/// each graph launched 10 times per size, results checked, under the
/// model's capture rules (global capture mode, no unsafe call anywhere).
#[test]
fn commbench_all_reduce_in_cuda_graphs_as_two_threads() {
    commbench_on_the_model(&["--threads", "2", "-G", "10"], "64K", 1, "graphs");
}

/// The kernel path's other collectives captured likewise (3 launches of
/// each graph per size, 8 B to 256 KiB).
#[test]
fn commbench_other_collectives_in_cuda_graphs_as_two_threads() {
    for coll in [
        "all_gather",
        "reduce_scatter",
        "broadcast",
        "reduce",
        "alltoall",
        "gather",
        "scatter",
    ] {
        commbench_collective_on_the_model(
            coll,
            &["--threads", "2", "-G", "3"],
            "256K",
            1,
            &format!("graphs-{coll}"),
        );
    }
}

/// Ranks of different processes sharing a device without MPS (the model's
/// default): a kernel spinning on another process's kernel would wait for
/// a kernel that cannot start, so the lane's collectives are ordered
/// between the processes by IPC events (`src/device/window/ipc_events.rs`):
/// results right from 48 B (a piece of each rank at least one element)
/// over several rounds each (a 4 KiB lane), no hang report,
/// nothing allocated or mapped between operations, and no caller's stream
/// parked on a host-released wait (the host-driven path parks one per
/// operation).
#[test]
fn collectives_of_processes_sharing_a_device_without_mps_are_ordered_by_ipc_events() {
    let Some(bench) = commbench() else {
        eprintln!(
            "skipped: commbench is not built next to this test (run the workspace build first)"
        );
        return;
    };
    for (coll, np, dtype) in [
        ("all_reduce", "3", "half"),
        ("all_reduce", "2", "float"),
        ("reduce_scatter", "3", "bfloat16"),
        ("reduce", "2", "float"),
        ("all_gather", "3", "half"),
        ("broadcast", "2", "int8"),
        ("alltoall", "3", "float"),
        ("gather", "2", "half"),
        ("scatter", "3", "half"),
    ] {
        let args = [
            coll, "--device", "cuda", "--np", np, "-d", dtype, "-b", "48", "-e", "64K", "-f", "8",
            "-n", "2", "-w", "1", "-c", "1",
        ];
        let name = format!("ipc-events-{coll}-{np}");
        let env = [("SNCL_DEVICE_LANE_BYTES", "4096")];
        let Some(run) = on_the_model(&bench, &args, &env, &name) else {
            return;
        };
        let what = format!("commbench {coll} --np {np} -d {dtype}");
        let processes = np.parse().expect("a count");
        let (_, parked) = run.check_clean(&what, processes);
        run.assert_nothing_between_operations(&what);
        assert!(
            run.stdout.contains("Out of bounds values : 0 OK"),
            "{what}: wrong results:\n{}",
            run.stdout
        );
        assert_eq!(
            parked, 0,
            "{what}: callers' streams waited on host-released flags {parked} times (the \
             host-driven path), not on the peers' IPC events"
        );
    }
    // A graph cannot hold another process's events: capture is refused
    // with an error that says why, on every rank, and the run ends.
    let capture = "all_reduce --device cuda --np 2 -b 8 -e 64 -f 8 -n 2 -w 1 -G 2";
    let args: Vec<&str> = capture.split(' ').collect();
    if let Some(run) = on_the_model(&bench, &args, &[], "ipc-events-capture") {
        assert!(!run.status.success(), "a capture over IPC events succeeded");
        assert!(
            !run.stderr.contains("cuda-model: deadlock")
                && !run.stderr.contains("cuda-model: stall"),
            "the refused capture hung:\n{}",
            run.stderr
        );
        assert!(
            run.stderr
                .contains("cannot capture this collective into a CUDA graph")
                && run.stderr.contains("without MPS"),
            "the refusal does not say why:\n{}",
            run.stderr
        );
    }
}

/// The lane between processes sharing the device without MPS
/// (tests/device_ipc_events.rs: every collective on 2 and 3 processes, and
/// ranks calling different operations) on the model.
#[test]
fn ipc_events_suite_on_the_cuda_backend() {
    let Some(bin) = suite("device_ipc_events") else {
        return;
    };
    let env = [("SNCL_TEST_DEVICE", "cuda")];
    if let Some(run) = on_the_model(&bin, &["--nocapture"], &env, "ipc-events-suite") {
        assert!(
            !run.stderr.contains("skipped") && !run.stdout.contains("skipped"),
            "the suite skipped on the model:\n{}",
            run.stderr
        );
        let (_, parked) = run.check_clean("device_ipc_events on the cuda backend", 1);
        assert_eq!(parked, 0, "callers' streams waited on host-released flags");
    }
}

/// The compressed device all-reduce takes every temporary before it
/// enqueues anything, from those the binding kept from earlier calls:
/// at one size, nothing is allocated, freed or mapped between operations
/// and no allocation meets a stream its sub-collectives parked. (It
/// allocated and freed about 6 buffers in the middle of every call: 42
/// allocations and 33 frees between operations for 2 iterations, and the
/// model caught one made while a stream was parked, a hang on a GPU.)
#[test]
fn compressed_device_all_reduce_allocates_before_it_enqueues() {
    let Some(bench) = commbench() else {
        eprintln!(
            "skipped: commbench is not built next to this test (run the workspace build first)"
        );
        return;
    };
    for codec in ["int8", "topk:0.01", "fp16", "mxfp8"] {
        let args = [
            "all_reduce",
            "--device",
            "cuda",
            "--np",
            "2",
            "-b",
            "1M",
            "-e",
            "1M",
            "-n",
            "8",
            "-w",
            "1",
            "-c",
            "1",
            "--compress",
            codec,
        ];
        let what = format!("commbench --compress {codec}");
        let Some(run) = on_the_model(&bench, &args, &[], &codec.replace(':', "-")) else {
            return;
        };
        run.assert_clean(&what, 2);
        run.assert_nothing_between_operations(&what);
        assert!(
            run.stdout.contains("Out of bounds values : 0 OK"),
            "{what}: wrong results:\n{}",
            run.stdout
        );
    }
}

#[test]
fn device_suite_on_the_cuda_backend() {
    let Some(bin) = suite("device_collectives") else {
        return;
    };
    let args = ["--test-threads=1"];
    if let Some(run) = on_the_model(&bin, &args, &[("SNCL_TEST_DEVICE", "cuda")], "suite") {
        run.assert_clean("device_collectives on the cuda backend", 1);
    }
}

/// The kernel path's rounds (tests/device_lane.rs) on the model: its
/// blocks run at once on threads of their own, as co-resident blocks do on
/// a GPU, where the emulated device runs them one after the other (a block
/// overwriting lane positions another block's peer still reads shows here
/// only).
#[test]
fn lane_suite_on_the_cuda_backend() {
    let Some(bin) = suite("device_lane") else {
        return;
    };
    if let Some(run) = on_the_model(&bin, &[], &[("SNCL_TEST_DEVICE", "cuda")], "lane") {
        run.assert_clean("device_lane on the cuda backend", 1);
    }
}

/// Point-to-point groups on device memory (tests/device_p2p.rs) on the
/// model: the copies to self and the segments through the staging with
/// every rule on (no allocation, free, load or IPC open inside a group).
#[test]
fn p2p_suite_on_the_cuda_backend() {
    let Some(bin) = suite("device_p2p") else {
        return;
    };
    // One test at a time: a test that ends frees its buffers, which
    // synchronises the device while another test's streams wait on a group.
    let args = ["--test-threads=1"];
    if let Some(run) = on_the_model(&bin, &args, &[("SNCL_TEST_DEVICE", "cuda")], "p2p") {
        run.assert_clean_copies("device_p2p on the cuda backend", 1);
    }
}

/// The CUDA backend's GPUDirect answers on the model (tests/gpudirect_flush.rs):
/// the write ordering and flush options it reads, and
/// `cuFlushGPUDirectRDMAWrites` (unmodelled before: the flush failed, and a
/// GPUDirect pair on such a device would have staged).
#[test]
fn gpudirect_flush_on_the_cuda_backend() {
    let Some(bin) = suite("gpudirect_flush") else {
        return;
    };
    let args = ["--nocapture"];
    if let Some(run) = on_the_model(&bin, &args, &[("SNCL_TEST_DEVICE", "cuda")], "gdr-flush") {
        run.check_clean("gpudirect_flush on the cuda backend", 1);
        assert!(
            run.stderr
                .contains("cuda: GPUDirect flush needed and taken"),
            "{}",
            run.stderr
        );
    }
}

/// GPUDirect RDMA from the `cuda` backend (tests/rdma_gdr.rs over the
/// emulated NIC, 2, 3 and 4 processes, and the nvidia-peermem route): the
/// device exports its allocations through `cuMemGetHandleForAddressRange`
/// (device/src/cuda/dmabuf.rs, which had never run: the model answered
/// "not modelled" and every pair staged), the NIC writes into them, and
/// every rank flushes before it consumes a piece.
#[test]
fn gpudirect_rdma_on_the_cuda_backend() {
    let Some(bin) = suite("rdma_gdr") else {
        return;
    };
    let args = [
        "gdr_collectives",
        "gdr_through_nvidia_peermem",
        "--test-threads=1",
        "--nocapture",
    ];
    let Some(run) = on_the_model(&bin, &args, &[("SNCL_TEST_DEVICE", "cuda")], "gdr") else {
        return;
    };
    // The ranks: 2 + 3 + 4 of the matrix, 2 through peermem.
    let ranks = 11;
    run.check_clean("rdma_gdr on the cuda backend", ranks);
    assert_eq!(
        run.stderr.matches("ok, device to device").count(),
        ranks,
        "{}",
        run.stderr
    );
    let api = |r: &serde_json::Value, name: &str, field: &str| -> u64 {
        r["threads"]
            .as_array()
            .expect("threads")
            .iter()
            .map(|t| t["apis"][name][field].as_u64().unwrap_or(0))
            .sum()
    };
    let exporting: Vec<_> = run
        .reports
        .iter()
        .filter(|r| api(r, "cuMemGetHandleForAddressRange", "calls") > 0)
        .collect();
    assert_eq!(
        exporting.len(),
        ranks,
        "processes that exported device memory"
    );
    for r in exporting {
        let pid = &r["pid"];
        assert_eq!(
            api(r, "cuMemGetHandleForAddressRange", "errors"),
            0,
            "process {pid}: an export failed"
        );
        assert!(
            api(r, "cuFlushGPUDirectRDMAWrites", "calls") > 0,
            "process {pid}: received GPUDirect pieces were never flushed"
        );
    }
}

/// Two ranks on a device that holds 32 blocks of the direct kernels'
/// shape (`CUDA_MODEL_SMS=8`: 4 of 512 threads an SM): each rank's kernel
/// launches at most 16, so both are resident together. (With the fixed cap
/// of 32 blocks each, rank 0's blocks spun on rank 1's, which could not
/// start: the model reported a stall, a hang on a small GPU or with more
/// ranks on one.)
#[test]
fn direct_kernels_of_ranks_sharing_a_small_device_are_resident_together() {
    let Some(bench) = commbench() else {
        eprintln!(
            "skipped: commbench is not built next to this test (run the workspace build first)"
        );
        return;
    };
    let args = [
        "all_reduce",
        "--device",
        "cuda",
        "--threads",
        "2",
        "-b",
        "4M",
        "-e",
        "4M",
        "-n",
        "2",
        "-w",
        "1",
        "-c",
        "1",
    ];
    if let Some(run) = on_the_model(&bench, &args, &[("CUDA_MODEL_SMS", "8")], "small-device") {
        run.assert_clean("commbench on a device of 8 SMs", 1);
        assert!(
            run.stdout.contains("Out of bounds values : 0 OK"),
            "wrong results:\n{}",
            run.stdout
        );
    }
}
