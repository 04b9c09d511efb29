//! sncl transport over TCP.
//!
//! A [`TcpConnection`] links two ranks with `nsocks` non-blocking sockets
//! (`SNCL_NSOCKS`, default [`DEFAULT_NSOCKS`]); piece `k` travels on socket
//! `k % nsocks`, so large messages are striped over the sockets and pieces
//! still arrive in order. Connections are set up by [`TcpEndpoint`]: each
//! rank binds one (see [`interface_addr`] for `SNCL_SOCKET_IFNAME`),
//! publishes [`TcpEndpoint::local_addr`] through the bootstrap, then calls
//! [`TcpEndpoint::establish`] with everyone's addresses.
//!
//! Wire format (little endian):
//! * setup, per socket, a challenge–response with fresh nonces from both
//!   sides: the lower (accepting) rank sends a 32-byte greeting with a
//!   16-byte server nonce; the higher rank answers with a 96-byte hello
//!   (magic, version, communicator id, ranks, socket index, `nsocks`, piece
//!   size, its own 16-byte client nonce, and an HMAC-SHA-256 tag under the
//!   shared secret over the fields and both nonces); the lower rank checks
//!   it and answers with a 32-byte HMAC-SHA-256 ack over the fields and both
//!   nonces. The secret never travels, and a recorded hello or ack replayed
//!   on a new connection fails (details in `frame.rs`);
//! * data: [`PieceHeader`](comm_core::wire::PieceHeader) (48 bytes with the
//!   fingerprint on a message's first piece, 32 after) + payload, or a
//!   48-byte abort frame (first word `"ABRT"`, blamed rank).
//!
//! Pacing (`SNCL_TCP_PACING`, off by default): [`TcpSetup::pacing`] caps
//! the kernel pacing rate (`SO_MAX_PACING_RATE`) of the sockets to the
//! listed peers, at [`socket_pacing_rate`]'s share of the node link.
//!
//! Driving a connection: poll `try_post_send` / `try_recv` / `flush` in a
//! loop (host pieces only); `try_post_send` answers `Ok(false)` when the socket for the next piece is full
//! and keeps at most the unsent remainder of one piece per socket in user
//! space, which only `flush` (or the next call) pushes out, so keep calling
//! `flush` until it returns `Ok(true)` before treating sends as done.

#![warn(missing_docs)]

mod conn;
mod deadline_io;
mod early;
mod frame;
#[doc(hidden)]
pub mod fuzzing;
mod handshake;
mod kind;
mod page_aligned;
mod params;
mod setup;
mod sys;
mod tls;

pub use conn::{TcpConnection, BOUNCE_BYTES};
pub use kind::TcpKind;
pub use params::TcpSetup;
pub use setup::{
    default_host_ipv4, interface_addr, socket_pacing_rate, TcpEndpoint, GOODPUT_HEADROOM,
    MAX_NSOCKS, MAX_PIECE_LIMIT, PACING_HEADROOM, SOCKET_BUFFER_BYTES,
};
/// Test hooks of the TLS record layer: fewer records per key, key updates sent.
#[doc(hidden)]
pub use tls::{key_updates_sent, set_records_per_key};

/// Default number of sockets per peer (`SNCL_NSOCKS`).
pub const DEFAULT_NSOCKS: usize = 1;
/// Default largest payload of one piece: the cache-sized bounce buffer
/// ([`BOUNCE_BYTES`]) a receive reads into and a reduction reads back.
pub const DEFAULT_MAX_PIECE: usize = BOUNCE_BYTES;
