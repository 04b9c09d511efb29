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
//! Skips, printing why, when commbench has not been built (the README's
//! test command builds the whole workspace first) or NVRTC is unavailable.

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

#[test]
fn current_device_path_deadlocks_in_its_first_operation() {
    let Some(bench) = commbench() else {
        eprintln!(
            "skipped: commbench is not built next to this test (run the workspace build first)"
        );
        return;
    };
    let nvrtc = match driver_env::wheel_dir("NVRTC_LIB_DIR", "libnvrtc.so.13") {
        Ok(d) => d,
        Err(why) => {
            eprintln!("skipped: NVRTC is unavailable: {why}");
            return;
        }
    };
    let include = driver_env::cuda_include().ok();
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("device-path-lib");
    let lib = driver_env::model_lib_dir(&tmp);
    let report = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("device-path-%p.json");
    let mut cmd = Command::new(&bench);
    cmd.args([
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
    ])
    .env(
        "LD_LIBRARY_PATH",
        format!("{}:{}", lib.display(), nvrtc.display()),
    )
    .env("CUDA_MODEL_DEADLOCK_S", "2")
    .env("CUDA_MODEL_REPORT", &report)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    if let Some(dir) = include {
        cmd.env("SNCL_CUDA_INCLUDE", dir);
    }
    let start = Instant::now();
    let mut child = cmd.spawn().expect("spawn commbench");
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            panic!("commbench on the model neither finished nor was stopped by the model in 90 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!("{err}");
    assert!(
        err.contains("cuda-model: deadlock") && err.contains("cuMemAlloc"),
        "the known deadlock (scratch growth inside the operation) did not reproduce; \
         if the device path was fixed, turn this test into a correctness check. \
         status {:?}, stderr:\n{err}",
        out.status
    );
    assert!(!out.status.success(), "a deadlocked job must fail");
}
