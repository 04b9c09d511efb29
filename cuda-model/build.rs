//! Compiles sncl's CUDA C++ kernels (kernels/cuda/) for the host with the
//! `SNCL_HOST_EMU` shim, as device/build.rs does for the emulated device:
//! the model runs the very sources NVRTC compiles for a GPU when the real
//! backend launches them by name. Hidden visibility: the cdylib exports
//! only the driver's symbols.

use std::path::PathBuf;

include!("../kernels/cuda/host_build.rs");

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    compile_host_kernels(
        &manifest.join("..").join("kernels").join("cuda"),
        "cuda_model_kernels",
        true,
    );
}
