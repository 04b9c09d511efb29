// Included (`include!`) by the build scripts of `device` (feature `emu`) and
// `cuda-model`: compiles sncl's CUDA C++ kernels in this directory for the
// host as C++17 with the `SNCL_HOST_EMU` shim, into static library `lib`.
// One place for the file list and the flags that keep results bit-identical
// to the CPU kernels.

/// Compiles the host kernels from `cuda` (this directory) into `lib`;
/// `hidden`: give the C entry points hidden visibility (a cdylib that must
/// export only its own symbols).
fn compile_host_kernels(cuda: &std::path::Path, lib: &str, hidden: bool) {
    for file in [
        "sncl_host_launch.cpp",
        "sncl_reduce.cu",
        "sncl_direct.cu",
        "sncl_host_codec.cpp",
        "sncl_codec.cu",
        "sncl_codec_topk.cuh",
        "sncl_device.cuh",
        "sncl_host_emu.h",
        "host_build.rs",
    ] {
        println!("cargo:rerun-if-changed={}", cuda.join(file).display());
    }
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++17")
        .define("SNCL_HOST_EMU", None)
        .include(cuda)
        .file(cuda.join("sncl_host_launch.cpp"))
        .file(cuda.join("sncl_host_codec.cpp"))
        // Results must be bit-identical to the CPU kernels: no contraction
        // into FMAs, no fast-math; the shim type-puns through unions.
        .flag_if_supported("-ffp-contract=off")
        .flag_if_supported("-fno-fast-math")
        .flag_if_supported("-fno-strict-aliasing")
        .opt_level(2)
        .warnings(true)
        .extra_warnings(true);
    if hidden {
        build.flag_if_supported("-fvisibility=hidden");
    }
    build.compile(lib);
}
