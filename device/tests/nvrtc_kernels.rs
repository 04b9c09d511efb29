//! NVRTC checks without a GPU: installs NVRTC 13, the CUDA headers and
//! ptxas from NVIDIA's wheels (scripts/cuda-wheels.sh), then compiles with
//! `device::nvrtc` and assembles the PTX with ptxas.
//!
//! Each test re-runs itself in a child process with `LD_LIBRARY_PATH`
//! pointing at the wheel's lib directory (the dynamic loader reads it only
//! at start-up) and a fresh `XDG_CACHE_HOME` (so the kernel cache starts
//! empty and compile times are real).

use std::path::PathBuf;
use std::time::Instant;

use device::nvrtc;
use device::DeviceError;
use kernels::DataType;

#[path = "common/nvrtc.rs"]
mod nvrtc_common;
use nvrtc_common::*;

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
    let m = nvrtc::compile_with(src, headers, arch, &float, None).unwrap_or_else(|e| panic!("{e}"));
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
    let again =
        nvrtc::compile_with(src, headers, arch, &float, None).unwrap_or_else(|e| panic!("{e}"));
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
        let m =
            nvrtc::compile_with(src, headers, arch, &opts, None).unwrap_or_else(|e| panic!("{e}"));
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
    match nvrtc::compile_with(src, headers, arch, &bad, None) {
        Err(DeviceError::Compile { log, what, .. }) => {
            assert!(log.contains("names no dtype"), "{log}");
            assert!(what.contains("SNCL_ONLY_DTYPE=12"), "{what}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}

/// The direct all-reduce source (nvlink version 2) compiles for sm_80 and
/// sm_90, one dtype at a time as the CUDA backend loads it, with exactly
/// that dtype's kernels and no spills; a bad dtype option is a compile
/// error whose log says why (what a kernel compile failure looks like).
#[test]
fn direct_kernels_compile_for_sm80_and_sm90_and_failures_are_clear() {
    if !in_child("direct_kernels_compile_for_sm80_and_sm90_and_failures_are_clear") {
        return;
    }
    let src = kernels::cuda::DIRECT_SOURCE;
    let headers = kernels::cuda::HEADERS;
    for arch in ARCHES {
        for dtype in [DataType::Float32, DataType::Bfloat16] {
            let opts = kernels::cuda::dtype_options(dtype);
            let t = Instant::now();
            let m = nvrtc::compile_with(src, headers, arch, &opts, None)
                .unwrap_or_else(|e| panic!("{e}"));
            eprintln!(
                "direct {} {}: {:.0} ms, cubin {} bytes",
                sm(arch),
                dtype.name(),
                t.elapsed().as_secs_f64() * 1e3,
                m.cubin.as_ref().map_or(0, Vec::len)
            );
            assert!(m.cubin.is_some(), "no CUBIN for {}", sm(arch));
            let want: std::collections::BTreeSet<String> = kernels::ReduceOp::ALL
                .into_iter()
                .filter(|&op| op != kernels::ReduceOp::Avg)
                .filter_map(|op| kernels::cuda::direct_kernel(dtype, op))
                .collect();
            assert_eq!(entries(&m.ptx), want, "{}", dtype.name());
            ptxas_check(&m.ptx, arch, "sncl_direct");
        }
    }
    let bad = ["-DSNCL_ONLY_DTYPE=12".to_string()];
    match nvrtc::compile_with(src, headers, ARCHES[1], &bad, None) {
        Err(e @ DeviceError::Compile { .. }) => {
            let text = e.to_string();
            assert!(text.contains("names no dtype"), "{text}");
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
