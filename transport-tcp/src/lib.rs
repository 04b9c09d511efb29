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
//! * setup: a 64-byte hello per socket from the higher rank (magic, version,
//!   communicator id, ranks, socket index, `nsocks`, piece size, and a
//!   SipHash-2-4 tag keyed with the shared secret), answered by a 16-byte
//!   tag from the lower rank;
//! * data: 40-byte [`PieceHeader`](comm_core::wire::PieceHeader) + payload,
//!   or a 40-byte abort frame (first word `"ABRT"`, blamed rank).
//!
//! Driving a connection: poll `try_send` / `try_recv` / `flush` in a loop;
//! `try_send` answers `Ok(false)` when the socket for the next piece is full
//! and keeps at most the unsent remainder of one piece per socket in user
//! space, which only `flush` (or the next call) pushes out, so keep calling
//! `flush` until it returns `Ok(true)` before treating sends as done.

#![warn(missing_docs)]

mod conn;
mod frame;
mod mac;
mod setup;
mod sys;

pub use conn::TcpConnection;
pub use setup::{
    interface_addr, TcpEndpoint, TcpSetup, MAX_NSOCKS, MAX_PIECE_LIMIT, SOCKET_BUFFER_BYTES,
};

/// Default number of sockets per peer (`SNCL_NSOCKS`).
pub const DEFAULT_NSOCKS: usize = 2;
/// Default largest payload of one piece.
pub const DEFAULT_MAX_PIECE: usize = 512 * 1024;
