//! The TCP store: a [`TcpStoreServer`] that rank 0 runs and a [`TcpStore`]
//! client every rank (rank 0 included) connects with.
//!
//! # Protocol
//!
//! Handshake (challenge-response with HMAC-SHA-256 keyed by the 16-byte job
//! secret, so the secret never crosses the wire and both sides prove they
//! know it):
//!
//! 1. server → client: `"SNCLSTR1"` ‖ server nonce (16 bytes)
//! 2. client → server: `"SNCLSTR1"` ‖ rank (u64 LE) ‖ client nonce (16) ‖
//!    HMAC(secret, `"sncl-client"` ‖ server nonce ‖ client nonce ‖ rank)
//! 3. server → client: `0` ‖ HMAC(secret, `"sncl-server"` ‖ client nonce ‖
//!    server nonce ‖ rank) when the MAC checks out, otherwise `1` and the
//!    server closes the connection (and logs a warning naming the peer).
//!
//! Then requests and replies, each a frame `len: u32 LE` ‖ `len` bytes.
//! Strings are `len: u32 LE` ‖ UTF-8 bytes.
//!
//! | request   | body after the op byte                     | OK reply payload |
//! |-----------|--------------------------------------------|------------------|
//! | 1 set     | key ‖ value (rest of frame)                | –                |
//! | 2 get     | timeout ms (u64) ‖ key                     | value            |
//! | 3 try_get | key                                        | value            |
//! | 4 wait    | timeout ms (u64) ‖ n (u32) ‖ n keys        | –                |
//! | 5 add     | delta (i64) ‖ key                          | new value (i64)  |
//!
//! A reply starts with a status byte: 0 ok, 1 missing (`try_get`),
//! 2 timed out (then n (u32) ‖ n missing keys), 3 error (then a UTF-8
//! message). `get` and `wait` block on the server, which honours the
//! timeout; the client reads with that timeout plus an I/O grace period, so
//! a dead or stuck server ends in an error, never a hang.
//!
//! # TLS
//!
//! With TLS ([`TcpStoreServer::start_tls`], [`TcpStore::connect_tls`];
//! the `SNCL_TLS_CERT` / `SNCL_TLS_KEY` / `SNCL_TLS_CA` settings), the
//! whole exchange above, handshake included, runs inside a mutually
//! authenticated TLS 1.3 channel: each side presents its certificate and
//! must chain to the other's authorities (see [`crate::tls`] for the
//! policy). The secret's challenge and response still run inside it, so a
//! certificate alone does not admit a rank to another job's store. A TLS
//! server waits for the client's TLS hello and never greets a plaintext
//! client, which then fails at its deadline with an error saying the store
//! may require TLS; a TLS client reaching a plaintext server reads its
//! `"SNCLSTR1"` greeting as not TLS and fails at once. The TLS handshake
//! counts against the same [`HANDSHAKE_TIMEOUT`] and pending bound.
//!
//! # Limits
//!
//! Frames are at most [`MAX_FRAME_BYTES`]; a frame body is read as it
//! arrives, so announcing a large frame costs the receiver nothing. Every
//! server of the process runs on one event loop thread; a connection is a
//! task. At most [`MAX_PENDING_HANDSHAKES`] handshakes are pending at once,
//! each within [`HANDSHAKE_TIMEOUT`] in all.

mod client;
#[doc(hidden)]
pub mod fuzzing;
mod protocol;
mod server;
#[cfg(test)]
mod tests;
mod tls_stream;
mod wire;

pub use client::{TcpStore, DEFAULT_IO_TIMEOUT};
pub use protocol::MAX_FRAME_BYTES;
pub use server::{TcpStoreServer, HANDSHAKE_TIMEOUT, MAX_PENDING_HANDSHAKES};
