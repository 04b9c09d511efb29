//! With feature `host`, compiles sncl's CUDA C++ kernels (cuda/) for the
//! host as C++17 with the `SNCL_HOST_EMU` shim, into static library
//! `sncl_host_kernels`, linked into whatever depends on this crate with the
//! feature: the emulated device (`device`'s `emu`) and the strict driver
//! model (`cuda-model`) run the very sources NVRTC compiles for a GPU.
//! Without `host` this does nothing (the CUDA backend compiles the sources
//! at run time from `kernels::cuda`).
//!
//! One build for both users: the kernels instantiate every type and
//! operator, and this translation unit is the workspace's slowest compile.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "host")]
    compile_host_kernels();
}

/// The flags keep results bit-identical to the CPU kernels; hidden
/// visibility keeps the C entry points out of a cdylib's exports (the
/// driver model's libcuda.so exports only the driver's symbols).
#[cfg(feature = "host")]
fn compile_host_kernels() {
    let manifest =
        std::path::PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let cuda = manifest.join("cuda");
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
        .flag_if_supported("-fvisibility=hidden")
        .opt_level(2)
        // No debug information whatever the profile: with it (the test
        // profile's line tables turn on cc's -g) this one file took over
        // 7 CPU-minutes to compile, without it 6 (measured with g++ 12).
        .debug(false)
        .warnings(true)
        .extra_warnings(true)
        .compile("sncl_host_kernels");
}
