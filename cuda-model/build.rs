//! Compiles sncl's CUDA C++ kernels (kernels/cuda/) for the host with the
//! `SNCL_HOST_EMU` shim, as device/build.rs does for the emulated device:
//! the model runs the very sources NVRTC compiles for a GPU when the real
//! backend launches them by name.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
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
        .flag_if_supported("-ffp-contract=off")
        .flag_if_supported("-fno-fast-math")
        .flag_if_supported("-fno-strict-aliasing")
        // Hidden: the cdylib exports only the driver's symbols.
        .flag_if_supported("-fvisibility=hidden")
        .opt_level(2)
        .warnings(true)
        .extra_warnings(true)
        .compile("cuda_model_kernels");
}
