//! The C ABI: `libsncl` (cdylib and staticlib) with `include/sncl.h`,
//! generated from this module by cbindgen.
//!
//! It mirrors NCCL's API with the prefix `sncl` in place of `nccl`: same
//! function names, parameter lists, semantics and enum values, so a port is
//! mechanical. The last argument of an operation is a host stream
//! ([`snclStream_t`]) or NULL, which runs it to completion before the call
//! returns. Buffers are host memory. Errors are [`snclResult_t`] codes
//! with the full text from `snclGetLastError`; a panic never crosses the
//! boundary (it becomes `snclInternalError`).
//!
//! Every call on a communicator takes its place in that communicator's
//! issue order when it is issued (at `snclGroupEnd` inside a group) and
//! runs when the operations issued before it have completed, whichever
//! stream (or none) they were issued on; so ranks that issue the same
//! sequence run the same sequence.
//!
//! Where it differs from NCCL, and why:
//!
//! * Streams are host streams (`snclStreamCreate`, `snclStreamSynchronize`,
//!   `snclStreamQuery`, `snclStreamDestroy`: a thread each), and a NULL
//!   stream runs the operation before the call returns, since there is no
//!   device stream to queue it on.
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
//!   macros (a C enum cannot repeat values in cbindgen's output); the 8-bit
//!   float types are rejected.
//! * Both scalar residences are host pointers; `snclCommInitAll` ignores
//!   `devlist`.
//! * Extensions: `snclSendTagged` / `snclRecvTagged` (tags, and
//!   `SNCL_ANY_SOURCE`; NULL stream, outside groups), `snclAllGatherV`,
//!   `snclAlltoAllV`, `snclBarrier`, `snclGetSetting`,
//!   `snclConfig_t::timeoutMs`, and the unique id rules of
//!   `snclGetUniqueId` (`SNCL_ROOT` + `SNCL_SECRET` give every rank the same
//!   id).
//! * Not provided (device memory or newer NCCL features): memory
//!   allocation and registration, windows and one-sided operations,
//!   `CommCuDevice`, grow / revoke / suspend, scalable init, group
//!   simulation, memory statistics and the parameter API.
//!
//! Regenerate the header after changing anything here:
//! `cargo test --test c_abi -- --ignored regenerate_header` (the test
//! suite fails while `include/sncl.h` is stale).

#![allow(non_camel_case_types, non_snake_case)]

// The `extern "C"` functions, by concern. sncl.h lists them in the order
// of these declarations (cbindgen reads the modules in that order), so the
// comments between them keep rustfmt from sorting them.
// Version, unique ids and errors:
mod api;
// Communicators (creation, split, finalize, destroy, queries, operators):
mod init;
// Shrinking after a failure:
mod shrink;
// Collectives:
mod coll;
// Point-to-point and groups:
mod p2p;
// Host streams:
mod streams;
// Device memory, the current device and device streams (extensions):
mod memory;

mod args;
mod comm;
mod devcoll;
mod devmem;
mod error;
mod exec;
mod premul;
mod settings;
mod stream;
mod tagged;
mod types;
mod uid;

pub use api::*;
pub use coll::*;
pub use init::*;
pub use memory::*;
pub use p2p::*;
pub use settings::snclGetSetting;
pub use shrink::*;
pub use streams::*;
pub use tagged::*;
pub use types::*;

#[cfg(test)]
mod tests {
    #[test]
    fn handles_cross_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<super::comm::CommShared>();
        send_sync::<super::stream::StreamShared>();
    }
}
