//! sncl's current device path on the model: `commbench all_reduce --device
//! cuda --np 2` with every rule on. Today it deadlocks at its first
//! operation (docs/CUDA-MODEL.md, finding 1): the work thread grows the
//! scratch buffer (`cuMemAlloc`, device-synchronising) while the caller's
//! stream is parked on the host-released `cuStreamWaitValue32` of the
//! prepare step. This test pins that finding — the model must report it as
//! a deadlock naming `cuMemAlloc` — and is to be turned into "completes
//! with correct results" by the device-path issue ("The device path,
//! NCCL-style"), which the model exists to accept.
//!
//! The root crate's device suite (`tests/device_collectives.rs`) is pinned
//! the same way: with `SNCL_TEST_DEVICE=cuda` its two- and three-rank TCP
//! matrix ends in the same deadlock.
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

/// The newest build of the root crate's test binary `name` next to this
/// one (in `deps/`), if built.
fn suite(name: &str) -> Option<PathBuf> {
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
fn on_the_model(
    program: &PathBuf,
    args: &[&str],
    env: &[(&str, &str)],
) -> Option<(std::process::ExitStatus, String)> {
    let nvrtc = match driver_env::wheel_dir("NVRTC_LIB_DIR", "libnvrtc.so.13") {
        Ok(d) => d,
        Err(why) => {
            eprintln!("skipped: NVRTC is unavailable: {why}");
            return None;
        }
    };
    let include = driver_env::cuda_include().ok();
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("device-path-lib");
    let lib = driver_env::model_lib_dir(&tmp);
    let report = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("device-path-%p.json");
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
    let start = Instant::now();
    let mut child = cmd.spawn().expect("spawn the program");
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            panic!(
                "{} on the model neither finished nor was stopped by the model in 90 s",
                program.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!("{err}");
    Some((out.status, err))
}

/// The known deadlock: scratch growth (`cuMemAlloc`) inside an operation.
fn assert_first_operation_deadlocks(what: &str, status: std::process::ExitStatus, err: &str) {
    assert!(
        err.contains("cuda-model: deadlock") && err.contains("cuMemAlloc"),
        "{what}: the known deadlock (scratch growth inside the operation) did not reproduce; \
         if the device path was fixed, turn this test into a correctness check. \
         status {status:?}, stderr:\n{err}"
    );
    assert!(!status.success(), "{what}: a deadlocked job must fail");
}

#[test]
fn current_device_path_deadlocks_in_its_first_operation() {
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
        "--np",
        "2",
        "-b",
        "8",
        "-e",
        "8",
        "-n",
        "2",
        "-w",
        "1",
    ];
    if let Some((status, err)) = on_the_model(&bench, &args, &[]) {
        assert_first_operation_deadlocks("commbench --device cuda --np 2", status, &err);
    }
}

#[test]
fn device_suite_on_the_cuda_backend_deadlocks_in_its_first_operation() {
    let Some(bin) = suite("device_collectives") else {
        eprintln!(
            "skipped: tests/device_collectives.rs is not built next to this test (run the \
             workspace build first)"
        );
        return;
    };
    let args = ["--exact", "matrix_tcp_2_and_3_ranks", "--test-threads=1"];
    if let Some((status, err)) = on_the_model(&bin, &args, &[("SNCL_TEST_DEVICE", "cuda")]) {
        assert_first_operation_deadlocks("device_collectives on the cuda backend", status, &err);
    }
}
