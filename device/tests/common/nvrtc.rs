//! NVRTC test helpers shared by the NVRTC test files (moved out of
//! nvrtc_kernels.rs): installs NVRTC 13, the CUDA headers and ptxas from
//! NVIDIA's wheels (scripts/cuda-wheels.sh), re-runs a test in a child
//! process set up for them, and checks ptxas output for spills.
//!
//! Each test re-runs itself in a child process with `LD_LIBRARY_PATH`
//! pointing at the wheel's lib directory (the dynamic loader reads it only
//! at start-up) and a fresh `XDG_CACHE_HOME` (so the kernel cache starts
//! empty and compile times are real).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use device::nvrtc::{self, CompiledModule};
use device::Arch;

pub const CHILD_ENV: &str = "SNCL_NVRTC_TEST_CHILD";
pub const PTXAS_ENV: &str = "SNCL_NVRTC_TEST_PTXAS";

pub const ARCHES: [Arch; 2] = [Arch { major: 8, minor: 0 }, Arch { major: 9, minor: 0 }];

/// What scripts/cuda-wheels.sh reports.
pub struct Wheels {
    lib: PathBuf,
    ptxas: PathBuf,
}

/// Installs the wheels once per process; `None` (with the reason printed)
/// where pip is absent or the package index cannot provide them.
pub fn wheels() -> Option<&'static Wheels> {
    static WHEELS: std::sync::OnceLock<Option<Wheels>> = std::sync::OnceLock::new();
    WHEELS.get_or_init(install).as_ref()
}

pub fn install() -> Option<Wheels> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/cuda-wheels.sh");
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    // On the process's stderr itself: the harness captures `eprintln!` of
    // a passing test, and a skip must be seen in the test command's output.
    let say = |why: &str| {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "SKIPPED: {why}: {}", stderr.trim_end());
    };
    match out.status.code() {
        Some(2) => {
            say("pip is not available, so NVRTC cannot be installed");
            return None;
        }
        Some(3) => {
            say(
                "the package index cannot provide NVRTC's wheels (unreachable, or without the \
                 pinned versions), so the kernels cannot be compiled here",
            );
            return None;
        }
        _ => {}
    }
    assert!(
        out.status.success(),
        "{} failed:\n{stderr}",
        script.display()
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let get = |key: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(PathBuf::from)
            .unwrap_or_else(|| panic!("{} printed no {key}:\n{stdout}", script.display()))
    };
    Some(Wheels {
        lib: get("NVRTC_LIB_DIR"),
        ptxas: get("PTXAS"),
    })
}

/// In the parent: runs test `name` again in a child process set up for
/// NVRTC and returns false. In the child: returns true.
pub fn in_child(name: &str) -> bool {
    if std::env::var_os(CHILD_ENV).is_some() {
        return true;
    }
    let Some(w) = wheels() else { return false };
    let cache =
        std::env::temp_dir().join(format!("sncl-nvrtc-test-{}-{}", std::process::id(), name));
    let _ = std::fs::remove_dir_all(&cache);
    let mut ld = std::ffi::OsString::from(&w.lib);
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        ld.push(":");
        ld.push(old);
    }
    let started = Instant::now();
    let status = Command::new(std::env::current_exe().expect("the test binary's path"))
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env(PTXAS_ENV, &w.ptxas)
        .env("LD_LIBRARY_PATH", ld)
        .env("XDG_CACHE_HOME", &cache)
        .env_remove("SNCL_CUDA_INCLUDE")
        .status()
        .expect("starting the child test process");
    let _ = std::fs::remove_dir_all(&cache);
    assert!(
        status.success(),
        "the child process of {name} failed: {status}"
    );
    eprintln!("{name}: child process done in {:?}", started.elapsed());
    false
}

pub fn sm(arch: Arch) -> String {
    format!("sm_{}{}", arch.major, arch.minor)
}

/// Runs `ptxas -v -arch=sm_XY` on the PTX; fails on an error or any spill.
pub fn ptxas_check(ptx: &str, arch: Arch, what: &str) {
    let ptxas = std::env::var_os(PTXAS_ENV).expect("the parent passes ptxas's path");
    let dir = std::env::temp_dir().join(format!("sncl-ptxas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join(format!("{what}-{}.ptx", sm(arch)));
    std::fs::write(&input, ptx).unwrap();
    let out = Command::new(&ptxas)
        .arg("-v")
        .arg(format!("-arch={}", sm(arch)))
        .arg(&input)
        .arg("-o")
        .arg(dir.join(format!("{what}-{}.cubin", sm(arch))))
        .output()
        .expect("running ptxas");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "ptxas {} on {what} failed:\n{log}",
        sm(arch)
    );
    assert!(
        !log.contains("error"),
        "ptxas {} on {what}:\n{log}",
        sm(arch)
    );
    let spills = spill_counts(&log);
    assert!(
        !spills.is_empty() || !log.contains("Compiling entry"),
        "no spill lines in:\n{log}"
    );
    assert!(
        spills.iter().all(|&n| n == 0),
        "{what} spills registers on {}:\n{log}",
        sm(arch)
    );
}

/// Every "N bytes spill stores/loads" count in ptxas -v output.
pub fn spill_counts(log: &str) -> Vec<u64> {
    let words: Vec<&str> = log
        .split([' ', ',', '\n'])
        .filter(|w| !w.is_empty())
        .collect();
    words
        .windows(3)
        .filter(|w| w[1] == "bytes" && w[2] == "spill")
        .filter_map(|w| w[0].parse().ok())
        .collect()
}

pub fn compile_timed(source: &str, headers: &[(&str, &str)], arch: Arch) -> (CompiledModule, f64) {
    let t = Instant::now();
    let m = nvrtc::compile(source, headers, arch).unwrap_or_else(|e| panic!("{e}"));
    (m, t.elapsed().as_secs_f64() * 1e3)
}
