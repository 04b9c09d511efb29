//! NVRTC checks without a GPU: installs NVRTC 13, the CUDA headers and
//! ptxas from NVIDIA's wheels (scripts/cuda-wheels.sh), then compiles with
//! `device::nvrtc` and assembles the PTX with ptxas.
//!
//! Each test re-runs itself in a child process with `LD_LIBRARY_PATH`
//! pointing at the wheel's lib directory (the dynamic loader reads it only
//! at start-up) and a fresh `XDG_CACHE_HOME` (so the kernel cache starts
//! empty and compile times are real).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use device::nvrtc::{self, CompiledModule};
use device::{Arch, DeviceError};
use kernels::DataType;

const CHILD_ENV: &str = "SNCL_NVRTC_TEST_CHILD";
const PTXAS_ENV: &str = "SNCL_NVRTC_TEST_PTXAS";

const ARCHES: [Arch; 2] = [Arch { major: 8, minor: 0 }, Arch { major: 9, minor: 0 }];

/// What scripts/cuda-wheels.sh reports.
struct Wheels {
    lib: PathBuf,
    ptxas: PathBuf,
}

/// Installs the wheels once per process; `None` (with the reason printed)
/// where pip is absent.
fn wheels() -> Option<&'static Wheels> {
    static WHEELS: std::sync::OnceLock<Option<Wheels>> = std::sync::OnceLock::new();
    WHEELS.get_or_init(install).as_ref()
}

fn install() -> Option<Wheels> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/cuda-wheels.sh");
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(2) {
        eprintln!("SKIPPED: pip is not available, so NVRTC cannot be installed: {stderr}");
        return None;
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
fn in_child(name: &str) -> bool {
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

fn sm(arch: Arch) -> String {
    format!("sm_{}{}", arch.major, arch.minor)
}

/// Runs `ptxas -v -arch=sm_XY` on the PTX; fails on an error or any spill.
fn ptxas_check(ptx: &str, arch: Arch, what: &str) {
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
fn spill_counts(log: &str) -> Vec<u64> {
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

fn compile_timed(source: &str, headers: &[(&str, &str)], arch: Arch) -> (CompiledModule, f64) {
    let t = Instant::now();
    let m = nvrtc::compile(source, headers, arch).unwrap_or_else(|e| panic!("{e}"));
    (m, t.elapsed().as_secs_f64() * 1e3)
}

const TINY: &str = r#"
#include "tiny.h"
#include <cuda_fp16.h>
extern "C" __global__ void k(float* x) { x[0] = TINY_VALUE; }
extern "C" __global__ void h(__half* x) { x[0] = __float2half(2.0f); }
"#;

#[test]
fn nvrtc_compiles_a_tiny_kernel_to_cubin_and_ptxas_accepts_it() {
    if !in_child("nvrtc_compiles_a_tiny_kernel_to_cubin_and_ptxas_accepts_it") {
        return;
    }
    let version = nvrtc::version().expect("NVRTC loads from LD_LIBRARY_PATH");
    let include = nvrtc::cuda_include_dir().expect("the headers beside the wheel's NVRTC");
    eprintln!("NVRTC {version:?}, headers in {}", include.display());
    assert!(include.join("cuda_fp16.h").exists());
    let headers = [("tiny.h", "#define TINY_VALUE 1.0f\n")];
    for arch in ARCHES {
        let (m, ms) = compile_timed(TINY, &headers, arch);
        eprintln!("tiny kernel, {}: {ms:.0} ms, target {}", sm(arch), m.target);
        assert_eq!(m.target, sm(arch));
        let cubin = m.cubin.as_deref().expect("a CUBIN for a real architecture");
        assert_eq!(&cubin[..4], b"\x7fELF", "a CUBIN is an ELF file");
        for name in ["k", "h"] {
            assert!(
                m.ptx.contains(&format!(".entry {name}(")),
                "no {name} in:\n{}",
                m.ptx
            );
        }
        ptxas_check(&m.ptx, arch, "tiny");

        // The same inputs again come from the in-process cache.
        let (again, ms) = compile_timed(TINY, &headers, arch);
        assert_eq!(again, m);
        assert!(ms < 50.0, "a cached compile took {ms} ms");
    }

    // The disk cache holds one private entry per compilation.
    let dir = PathBuf::from(std::env::var_os("XDG_CACHE_HOME").unwrap()).join("sncl/kernels");
    let entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap())
        .collect();
    assert_eq!(entries.len(), ARCHES.len(), "{entries:?}");
    use std::os::unix::fs::PermissionsExt;
    for e in &entries {
        assert_eq!(e.metadata().unwrap().permissions().mode() & 0o777, 0o600);
    }
    assert_eq!(
        std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );

    // A compile error carries NVRTC's log.
    let err = nvrtc::compile(
        "extern \"C\" __global__ void bad() { nope(); }",
        &[],
        ARCHES[0],
    )
    .expect_err("undefined identifier");
    match &err {
        DeviceError::Compile { log, arch, .. } => {
            assert!(log.contains("nope"), "{log}");
            assert_eq!(arch, "sm_80");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn sncl_kernels_compile_for_sm80_and_sm90_without_spills() {
    if !in_child("sncl_kernels_compile_for_sm80_and_sm90_without_spills") {
        return;
    }
    let mut names: Vec<String> = kernels::cuda::reduce_copy_kernels()
        .map(|(_, _, n)| n)
        .collect();
    names.extend(DataType::ALL.into_iter().map(kernels::cuda::divide_kernel));
    names.sort();
    names.dedup();
    for arch in ARCHES {
        let (m, ms) = compile_timed(kernels::cuda::REDUCE_SOURCE, kernels::cuda::HEADERS, arch);
        eprintln!(
            "sncl kernels, {}: {ms:.0} ms, target {}, cubin {} bytes, ptx {} bytes",
            sm(arch),
            m.target,
            m.cubin.as_ref().map_or(0, Vec::len),
            m.ptx.len()
        );
        assert!(m.cubin.is_some(), "no CUBIN for {}", sm(arch));
        let missing: Vec<&str> = names
            .iter()
            .filter(|n| !m.ptx.contains(&format!(".entry {n}(")))
            .map(String::as_str)
            .collect();
        assert!(
            missing.is_empty(),
            "{} of {} kernels missing from the PTX for {}: {missing:?}",
            missing.len(),
            names.len(),
            sm(arch)
        );
        ptxas_check(&m.ptx, arch, "sncl_reduce");
    }
}

/// Every `.entry <name>(` in `ptx`.
fn entries(ptx: &str) -> std::collections::BTreeSet<String> {
    ptx.split(".entry ")
        .skip(1)
        .filter_map(|rest| {
            rest.split_once('(')
                .map(|(name, _)| name.trim().to_string())
        })
        .collect()
}

/// The kernels `dtype`'s module must hold: its reduce-copy kernels and its
/// divide.
fn kernels_of(dtype: DataType) -> std::collections::BTreeSet<String> {
    kernels::ReduceOp::ALL
        .into_iter()
        .filter_map(|op| kernels::cuda::reduce_copy_kernel(dtype, op))
        .chain([kernels::cuda::divide_kernel(dtype)])
        .collect()
}

#[test]
fn one_dtype_compiles_alone_and_faster_than_the_whole_source() {
    if !in_child("one_dtype_compiles_alone_and_faster_than_the_whole_source") {
        return;
    }
    let arch = ARCHES[1];
    let src = kernels::cuda::REDUCE_SOURCE;
    let headers = kernels::cuda::HEADERS;
    let float = kernels::cuda::dtype_options(DataType::Float32);
    let t = Instant::now();
    let m = nvrtc::compile_with(src, headers, arch, &float).unwrap_or_else(|e| panic!("{e}"));
    let float_ms = t.elapsed().as_secs_f64() * 1e3;
    assert!(m.cubin.is_some(), "no CUBIN for {}", sm(arch));
    assert_eq!(entries(&m.ptx), kernels_of(DataType::Float32));
    ptxas_check(&m.ptx, arch, "sncl_reduce_float");

    let (whole, whole_ms) = compile_timed(src, headers, arch);
    assert_eq!(entries(&whole.ptx).len(), 66 + 12);
    eprintln!(
        "{}: float only {float_ms:.0} ms ({} kernels, cubin {} bytes), whole source {whole_ms:.0} ms \
         ({} kernels, cubin {} bytes): {:.1}x",
        sm(arch),
        entries(&m.ptx).len(),
        m.cubin.as_ref().map_or(0, Vec::len),
        entries(&whole.ptx).len(),
        whole.cubin.as_ref().map_or(0, Vec::len),
        whole_ms / float_ms
    );
    assert!(
        float_ms < whole_ms,
        "one dtype ({float_ms:.0} ms) is no faster than all ({whole_ms:.0} ms)"
    );

    // The options are part of the cache key: float again is a cache hit and
    // differs from the whole source.
    let t = Instant::now();
    let again = nvrtc::compile_with(src, headers, arch, &float).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        t.elapsed().as_millis() < 50,
        "a cached compile took {:?}",
        t.elapsed()
    );
    assert_eq!(again, m);
    assert_ne!(again.ptx, whole.ptx);

    // Every other dtype's module holds exactly its kernels.
    for dtype in DataType::ALL
        .into_iter()
        .filter(|&d| d != DataType::Float32)
    {
        let t = Instant::now();
        let opts = kernels::cuda::dtype_options(dtype);
        let m = nvrtc::compile_with(src, headers, arch, &opts).unwrap_or_else(|e| panic!("{e}"));
        eprintln!(
            "{} {}: {:.0} ms",
            sm(arch),
            dtype.name(),
            t.elapsed().as_secs_f64() * 1e3
        );
        assert_eq!(entries(&m.ptx), kernels_of(dtype), "{}", dtype.name());
    }

    // A number that names no dtype is a compile error, not an empty module.
    let bad = ["-DSNCL_ONLY_DTYPE=12".to_string()];
    match nvrtc::compile_with(src, headers, arch, &bad) {
        Err(DeviceError::Compile { log, what, .. }) => {
            assert!(log.contains("names no dtype"), "{log}");
            assert!(what.contains("SNCL_ONLY_DTYPE=12"), "{what}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn spill_counts_are_parsed() {
    let log = "ptxas info    : Used 30 registers, used 1 barriers, 16 bytes spill stores, 0 bytes spill loads\n\
               ptxas info    : 0 bytes gmem\n     0 bytes stack frame, 0 bytes spill stores, 8 bytes spill loads";
    assert_eq!(spill_counts(log), vec![16, 0, 0, 8]);
    assert!(spill_counts("ptxas info : 0 bytes gmem").is_empty());
}
