//! A strict model of the CUDA driver API: a `libcuda.so` stand-in that runs
//! sncl's real `cuda` backend (cudarc with dynamic loading, unchanged), C
//! programs written against the driver API, and `commbench --device cuda`
//! on the CPU, with the driver's rules enforced where the real driver
//! enforces them. Test infrastructure, not a product feature.
//!
//! `scripts/cuda-model.sh CMD ARGS...` builds the cdylib and runs CMD with
//! it as `libcuda.so` / `libcuda.so.1`. The rules, each cited to the CUDA
//! documentation in the module that models it, are listed in
//! docs/CUDA-MODEL.md:
//!
//! * contexts: a current context per host thread ([`context`]);
//! * streams and events: in-order streams, the legacy default stream's
//!   implicit synchronisation, non-blocking and per-thread streams
//!   ([`stream`], [`event`]);
//! * implicit device-wide synchronisation in allocation, free, host
//!   allocation, registration, module and function loading (lazy by
//!   default) and `cuCtxSynchronize` ([`sync`]);
//! * stream memory operations with the driver's cyclic comparison
//!   ([`memops`]);
//! * a deadlock and stall detector: a hang is reported (`cuda-model:
//!   deadlock` / `cuda-model: stall`, exit status 86), never silent
//!   ([`watch`]);
//! * IPC of memory and events ([`ipc`]); pointer attributes ([`memory`]);
//! * stream capture and graphs ([`graph`]);
//! * kernels: sncl's sources compiled for the host, launched by name with
//!   the launch's grid, co-resident blocks limited by the SM count, and
//!   time slices between processes without MPS ([`module`], [`launch`]);
//! * counters per host thread and API (`CUDA_MODEL_REPORT`, [`report`]).
//!
//! Settings (environment, read once): `CUDA_MODEL_DEVICES` (1),
//! `CUDA_MODEL_SMS` (132), `CUDA_MODEL_MPS` (0), `CUDA_MODULE_LOADING`
//! (LAZY), `CUDA_MODEL_STALL_S` (20), `CUDA_MODEL_DEADLOCK_S` (5),
//! `CUDA_MODEL_REPORT` (unset), `CUDA_MODEL_LOG` (unset: errors only).

// sncl's kernels compiled for the host (`kernels/build.rs`, feature
// `host`) are a static library of the `kernels` crate, which no Rust code
// here names: the line links it in for `host_kernels`' entry points.
extern crate kernels as _;

pub mod activity;
pub mod api;
pub mod config;
pub mod context;
pub mod event;
pub mod graph;
pub mod handles;
pub mod host_kernels;
pub mod ipc;
pub mod launch;
pub mod memops;
pub mod memory;
pub mod module;
pub mod report;
pub mod stream;
pub mod sync;
pub mod watch;

pub use cudarc::driver::sys::CUresult;

/// The exit status of a process the model stops for a deadlock or a stall.
pub const HANG_EXIT_STATUS: i32 = 86;

/// A driver call's outcome inside the model: `Err` carries the CUresult
/// the entry point returns.
pub type Res<T> = std::result::Result<T, CUresult>;

/// Writes one line on stderr in one write (ranks of one job share it).
pub fn log_line(line: &str) {
    use std::io::Write;
    let text = format!("cuda-model[{}]: {line}\n", std::process::id());
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// Logs `line` when `CUDA_MODEL_LOG` is set (any value).
pub fn trace_line(line: impl FnOnce() -> String) {
    if config::get().log {
        log_line(&line());
    }
}
