//! With feature `emu`, compiles sncl's CUDA C++ kernels (kernels/cuda/) for
//! the host as C++17 with the `SNCL_HOST_EMU` shim, and links them in: the
//! emulated device runs the very sources NVRTC compiles for a GPU. Without
//! `emu` this does nothing (the CUDA backend compiles the sources at run time
//! from `kernels::cuda`).

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_EMU").is_none() {
        return;
    }
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let cuda = manifest.join("..").join("kernels").join("cuda");
    for file in [
        "sncl_host_launch.cpp",
        "sncl_reduce.cu",
        "sncl_direct.cu",
        "sncl_host_codec.cpp",
        "sncl_codec.cu",
        "sncl_codec_topk.cuh",
        "sncl_device.cuh",
        "sncl_host_emu.h",
    ] {
        println!("cargo:rerun-if-changed={}", cuda.join(file).display());
    }
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .define("SNCL_HOST_EMU", None)
        .include(&cuda)
        .file(cuda.join("sncl_host_launch.cpp"))
        .file(cuda.join("sncl_host_codec.cpp"))
        // Results must be bit-identical to the CPU kernels: no contraction
        // into FMAs, no fast-math; the shim type-puns through unions.
        .flag_if_supported("-ffp-contract=off")
        .flag_if_supported("-fno-fast-math")
        .flag_if_supported("-fno-strict-aliasing")
        .opt_level(2)
        .warnings(true)
        .extra_warnings(true)
        .compile("sncl_host_kernels");
}
