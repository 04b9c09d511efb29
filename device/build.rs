//! With feature `emu`, compiles sncl's CUDA C++ kernels (kernels/cuda/) for
//! the host as C++17 with the `SNCL_HOST_EMU` shim, and links them in: the
//! emulated device runs the very sources NVRTC compiles for a GPU. Without
//! `emu` this does nothing (the CUDA backend compiles the sources at run time
//! from `kernels::cuda`).

use std::path::PathBuf;

include!("../kernels/cuda/host_build.rs");

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_EMU").is_none() {
        return;
    }
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    compile_host_kernels(
        &manifest.join("..").join("kernels").join("cuda"),
        "sncl_host_kernels",
        false,
    );
}
