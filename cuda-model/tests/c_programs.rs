//! C programs written against the CUDA driver API (`tests/c/*.c`), built
//! with the system C compiler against NVIDIA's `cuda.h` and run with the
//! model's cdylib as `libcuda.so`: the model must behave as the driver
//! does where a program is correct, and report (not hang) where a real GPU
//! would deadlock.
//!
//! Each test skips, printing why, when `cc` is missing or the CUDA headers
//! cannot be installed (`scripts/cuda-wheels.sh`); a missing cdylib is a
//! failure.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

#[path = "common/driver_env.rs"]
mod driver_env;

use driver_env::{cuda_include, manifest_dir, model_library};

/// The wall-clock limit of one program run.
const GUARD: Duration = Duration::from_secs(60);

/// The exit status of a process the model stops for a hang.
const HANG_EXIT_STATUS: i32 = 86;

/// The outcome of one program run.
struct Outcome {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

/// Whether `cc` runs; the reason when not.
fn find_cc() -> Result<(), String> {
    match Command::new("cc").arg("--version").output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!("`cc --version` failed: {}", o.status)),
        Err(e) => Err(format!("no C compiler `cc`: {e}")),
    }
}

/// Builds `tests/c/<name>.c` into a fresh directory for `test` (tests run
/// in parallel) holding `libcuda.so` and `libcuda.so.1` (links to the
/// model); the binary and that directory. `None` (after printing why) when
/// the test must be skipped.
fn build(name: &str, test: &str) -> Option<(PathBuf, PathBuf)> {
    if let Err(why) = find_cc() {
        driver_env::say_skipped(&format!("{name}: {why}"));
        return None;
    }
    let include = match cuda_include() {
        Ok(dir) => dir,
        Err(why) => {
            driver_env::say_skipped(&format!("{name}: {why}"));
            return None;
        }
    };
    let lib = model_library();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("c-{test}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the build directory");
    for link in ["libcuda.so", "libcuda.so.1"] {
        std::os::unix::fs::symlink(&lib, dir.join(link)).expect("link libcuda.so to the model");
    }
    let src = manifest_dir().join(format!("tests/c/{name}.c"));
    let bin = dir.join(name);
    let o = Command::new("cc")
        .arg("-O1")
        .arg(format!("-I{}", include.display()))
        .arg(&src)
        .arg(format!("-L{}", dir.display()))
        .args(["-lcuda", "-lpthread", "-o"])
        .arg(&bin)
        .output()
        .expect("run cc");
    assert!(
        o.status.success(),
        "compiling {} failed ({}):\n{}",
        src.display(),
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    Some((bin, dir))
}

/// Runs `bin args` against the model in `libdir`, killing it (and
/// failing) after [`GUARD`].
fn run(bin: &Path, libdir: &Path, args: &[&str]) -> Outcome {
    let start = Instant::now();
    let mut child = Command::new(bin)
        .args(args)
        .env("LD_LIBRARY_PATH", libdir)
        .env("CUDA_MODEL_DEADLOCK_S", "3")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the program");
    // Drain the pipes on threads so a chatty program cannot block.
    fn drain(mut p: impl std::io::Read + Send + 'static) -> std::thread::JoinHandle<String> {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = p.read_to_string(&mut s);
            s
        })
    }
    let out_t = drain(child.stdout.take().expect("stdout pipe"));
    let err_t = drain(child.stderr.take().expect("stderr pipe"));
    let status = loop {
        if let Some(st) = child.try_wait().expect("poll the program") {
            break st;
        }
        if start.elapsed() >= GUARD {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{} {args:?} still ran after {} s: killed",
                bin.display(),
                GUARD.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let elapsed = start.elapsed();
    let o = Outcome {
        status,
        stdout: out_t.join().expect("stdout reader"),
        stderr: err_t.join().expect("stderr reader"),
        elapsed,
    };
    eprintln!(
        "{} {args:?}: {} in {:.1} s\n--- stdout\n{}--- stderr\n{}---",
        bin.display(),
        o.status,
        o.elapsed.as_secs_f64(),
        o.stdout,
        o.stderr
    );
    o
}

/// `park_then_free free-first`: a free on another thread while a stream is
/// parked on a host word nobody has written yet hangs on a GPU; the model
/// reports the deadlock, naming `cuMemFree`, and exits 86.
#[test]
fn park_then_free_deadlocks() {
    let Some((bin, dir)) = build("park_then_free", "park_then_free_deadlocks") else {
        return;
    };
    let o = run(&bin, &dir, &["free-first"]);
    assert_eq!(o.status.code(), Some(HANG_EXIT_STATUS), "{}", o.stderr);
    assert!(o.stderr.contains("cuda-model: deadlock"), "{}", o.stderr);
    assert!(o.stderr.contains("cuMemFree"), "{}", o.stderr);
    assert!(o.elapsed < Duration::from_secs(30), "took {:?}", o.elapsed);
}

/// `park_then_free release-first`: the word is written before the free,
/// so everything completes.
#[test]
fn release_first_completes() {
    let Some((bin, dir)) = build("park_then_free", "release_first_completes") else {
        return;
    };
    let o = run(&bin, &dir, &["release-first"]);
    assert_eq!(o.status.code(), Some(0), "{}", o.stderr);
    assert!(o.stdout.contains("ok"), "{}", o.stdout);
}

/// `capture_replay`: captured work runs only when the graph is launched,
/// and a query during a capture invalidates it.
#[test]
fn capture_replays() {
    let Some((bin, dir)) = build("capture_replay", "capture_replays") else {
        return;
    };
    let o = run(&bin, &dir, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", o.stderr);
    assert!(o.stdout.contains("ok"), "{}", o.stdout);
}
