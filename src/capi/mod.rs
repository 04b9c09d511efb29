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
//! Regenerate the header after changing anything here:
//! `cargo test --test c_abi -- --ignored regenerate_header` (the test
//! suite fails while `include/sncl.h` is stale).

#![allow(non_camel_case_types, non_snake_case)]

mod api;
mod comm;
mod error;
mod exec;
mod premul;
mod stream;
mod types;
mod uid;

pub use api::*;
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
