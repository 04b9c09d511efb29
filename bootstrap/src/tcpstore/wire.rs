//! What a store client talks over ([`Wire`]: a TCP socket, a TLS channel
//! or a scripted root in memory) and how one connection attempt ends
//! ([`Attempt`]); below both the client and its TLS handshake.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

use comm_core::Error;

/// The byte stream a store client talks over: its TCP socket to the root,
/// or (fuzzing, [`super::fuzzing::memory_session`]) a scripted root in
/// memory. The request/response logic sees only this.
pub(super) trait Wire: Read + Write + Send {
    /// Sets how long a read and a write may block (`TcpStream`'s timeouts).
    fn set_timeouts(&mut self, read: Duration, write: Duration) -> io::Result<()>;
    /// Shuts the stream down in both directions (after a failed exchange).
    fn close(&mut self);
    /// The local address of the stream.
    fn local_addr(&self) -> io::Result<SocketAddr>;
    /// Whether the stream is a TLS channel (for error messages).
    fn is_tls(&self) -> bool {
        false
    }
}

impl Wire for TcpStream {
    fn set_timeouts(&mut self, read: Duration, write: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(read))?;
        self.set_write_timeout(Some(write))
    }

    fn close(&mut self) {
        let _ = self.shutdown(Shutdown::Both);
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        TcpStream::local_addr(self)
    }
}

/// The outcome of one connection attempt.
pub(super) enum Attempt {
    /// Worth retrying until the deadline (refused, reset, ...).
    Retry(io::Error),
    /// Retrying cannot help (wrong secret, not an sncl store, ...).
    Fatal(Error),
}
