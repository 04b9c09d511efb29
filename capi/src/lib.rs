//! The C ABI: `libsncl` (cdylib and staticlib) with `include/sncl.h`,
//! generated from this crate by cbindgen. It is built on the Rust API (the
//! `sncl` crate, here `sncl_rs`): its raw operations and its
//! [`sncl_rs::binding`] module.
//!
//! It mirrors NCCL's API with the prefix `sncl` in place of `nccl`: same
//! function names, parameter lists, semantics and enum values, so a port is
//! mechanical. Buffers are host memory or device memory; the last argument
//! of an operation is a [`snclStream_t`], NCCL's `cudaStream_t` (both are
//! `struct CUstream_st *`, so a `cudaStream_t` or a driver `CUstream`
//! passes without a cast). Errors are [`snclResult_t`] codes with the full
//! text from `snclGetLastError`; a panic never crosses the boundary (it
//! becomes `snclInternalError`).
//!
//! # Host and device buffers
//!
//! Every buffer's memory kind is asked of the device backend
//! (`cuPointerGetAttribute` on CUDA; the address registry on the emulated
//! device); where no backend is available, buffers are host memory.
//!
//! * Device buffers (all on one device) run as device collectives of the
//!   communicator, which binds to their device on first use (as NCCL binds
//!   to the current device); later device buffers of another device are an
//!   error. The stream is a CUDA stream, or NULL for the legacy default
//!   stream (on the emulated device: its default stream, or a stream from
//!   `snclDeviceStreamCreate`); the call returns once the operation is
//!   queued there, as NCCL's does. A host stream of `snclStreamCreate` with
//!   device buffers is `snclInvalidUsage`: host streams order host work,
//!   and a device operation would have to block the host stream's thread.
//!   On device memory: all-reduce, reduce-scatter, all-gather, broadcast,
//!   reduce (and all-to-all, gather and scatter where the device path
//!   takes them); not yet point-to-point, premultiplied sums, compression,
//!   or the V variants (clear `snclInvalidArgument` errors).
//! * Host buffers run as before: on a host stream, or before the call
//!   returns with NULL. A handle that is neither NULL nor a host stream is
//!   taken for a CUDA stream and refused with host buffers (unless the
//!   operation has no buffers at all; then it runs as with NULL).
//! * Host and device buffers mixed in one call, a device pointer that is
//!   not live (freed, or of an emulated device object sncl did not make)
//!   are `snclInvalidArgument` before anything is sent. On CUDA a freed
//!   device pointer cannot be told from host memory.
//! * A device operation takes its place in the communicator's issue order
//!   when it is queued: after the operations issued before it have run
//!   (a host operation still queued on a host stream makes the call wait
//!   for it). Its failure, found when it completes, becomes the
//!   communicator's asynchronous error (`snclCommGetAsyncError`);
//!   `snclCommFinalize` and `snclCommDestroy` wait for it. Inside a group
//!   a device operation is queued when it is issued, not at
//!   `snclGroupEnd` (queuing never waits for peers).
//!
//! Every call on a communicator takes its place in that communicator's
//! issue order when it is issued (at `snclGroupEnd` inside a group) and
//! runs when the operations issued before it have completed, whichever
//! stream (or none) they were issued on; so ranks that issue the same
//! sequence run the same sequence.
//!
//! Where it differs from NCCL, and why:
//!
//! * Besides CUDA streams, sncl has host streams (`snclStreamCreate`,
//!   `snclStreamSynchronize`, `snclStreamQuery`, `snclStreamDestroy`: a
//!   thread each) for host buffers, and a NULL stream with host buffers
//!   runs the operation before the call returns.
//! * Non-blocking communicators (`config.blocking = 0`) make creation and
//!   `snclCommSplit` asynchronous (`snclInProgress`, polled with
//!   `snclCommGetAsyncError`); their operations behave as on a blocking one.
//! * `snclCommFinalize` waits for the communicator's issued operations and is
//!   local; `snclCommDestroy` finalizes implicitly.
//! * Inside a group, a communicator's collectives run in issue order and
//!   then all its sends and receives together (NCCL also schedules
//!   point-to-point after collectives); a send to the rank itself is a copy
//!   matched with a receive from itself in the same group.
//! * `snclCommShrink` completes before it returns, also on a non-blocking
//!   communicator; `SNCL_SHRINK_DEFAULT` waits for the operations issued on
//!   the parent, `SNCL_SHRINK_ABORT` aborts them first.
//! * `snclChar`, `snclInt`, `snclHalf`, `snclFloat` and `snclDouble` are
//!   macros (a C enum cannot repeat values in cbindgen's output);
//!   `snclFloat8e4m3` and `snclFloat8e5m2` (NCCL's values 10 and 11) run on
//!   host memory.
//! * Both scalar residences are host pointers; `snclCommInitAll` ignores
//!   `devlist`.
//! * `snclMemAlloc` is `cuMemAlloc` memory (IPC-ready, not the VMM
//!   allocations NCCL uses for NVLS); `snclMemFree` waits for the device's
//!   default stream first.
//! * Extensions: `snclSendTagged` / `snclRecvTagged` (tags, and
//!   `SNCL_ANY_SOURCE`; host memory, NULL stream, outside groups),
//!   `snclAllGatherV`, `snclAlltoAllV`, `snclBarrier`, `snclGetSetting`,
//!   `snclConfig_t::timeoutMs`, the unique id rules of `snclGetUniqueId`
//!   (`SNCL_ROOT` + `SNCL_SECRET` give every rank the same id), and for
//!   programs without the CUDA runtime or on the emulated device:
//!   `snclSetDeviceBackend` (`"cuda"`, `"emu"`), `snclSetDevice` /
//!   `snclGetDevice`, `snclDeviceStreamCreate`, `snclMemcpy`, and
//!   `snclStreamSynchronize` / `snclStreamDestroy` on device streams.
//! * `snclCommRegister` / `snclCommDeregister` check and track the range
//!   (a registered `snclMemAlloc` allocation cannot be freed), but no sncl
//!   transport reads registered buffers in place yet: operations on them
//!   run as on any buffer (NCCL too ignores a registration a transport
//!   cannot use).
//! * The version (`SNCL_MAJOR`, `SNCL_MINOR`, `SNCL_PATCH`,
//!   `SNCL_VERSION_CODE`, `snclGetVersion`) is that of the NCCL API sncl
//!   mirrors, so that `#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 19, 0)`
//!   after the rename keeps choosing the path the code was written for;
//!   sncl's own release is `SNCL_RELEASE`.
//! * Not provided (newer NCCL features): one-sided operations (put /
//!   signal), grow / revoke / suspend, group simulation, memory statistics
//!   and the parameter API.
//!
//! Regenerate the header after changing anything here:
//! `cargo test -p sncl-capi --test c_abi -- --ignored regenerate_header`
//! (the test suite fails while `include/sncl.h` is stale).

#![allow(non_camel_case_types, non_snake_case)]

// The `extern "C"` functions, by concern. sncl.h lists them in the order
// of these declarations (cbindgen reads the modules in that order), so the
// comments between them keep rustfmt from sorting them.
// Version, unique ids and errors:
mod api;
// Communicators (creation, split, finalize, destroy, queries, operators):
mod init;
// The memory a communicator holds:
mod mem_stats;
// Shrinking after a failure:
mod shrink;
// Growing with new ranks:
mod grow;
// Collectives:
mod coll;
// Collectives with per-call settings:
mod coll_config;
// Error feedback of the compressed all-reduce:
mod feedback;
// Point-to-point and groups:
mod p2p;
// Host streams:
mod streams;
// Device memory, the current device and device streams (extensions):
mod memory;
mod register;
mod window;

mod args;
mod comm;
mod devcoll;
mod devmem;
mod devp2p;
mod error;
mod exec;
mod premul;
mod ranges;
mod settings;
mod stream;
mod tagged;
mod types;
mod uid;

pub use api::*;
pub use coll::*;
pub use coll_config::*;
pub use comm::{snclComm, snclComm_t};
pub use feedback::*;
pub use grow::*;
pub use init::*;
pub use mem_stats::*;
pub use memory::*;
pub use p2p::*;
pub use register::*;
pub use settings::snclGetSetting;
pub use shrink::*;
pub use streams::*;
pub use tagged::*;
pub use types::*;
pub use window::*;

// In-process tests through the C functions (the crate has no rlib for
// tests/ to link; tests/ holds the C programs).
#[cfg(test)]
mod tests;
// The workspace's shared test kits (tests/rank_kit, tests/fault_kit) name
// the Rust API `sncl`, as the root crate's tests see it.
#[cfg(test)]
extern crate sncl_rs as sncl;
