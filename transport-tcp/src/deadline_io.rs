//! Blocking reads and writes on non-blocking sockets, each bounded by a
//! deadline: the setup's and the handshake's small messages.

use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::time::Instant;

use socket2::Socket;

use crate::sys::{self, PollFd};

/// Waits until `sock` is readable (or writable) or the deadline passes.
pub(crate) fn wait(sock: &Socket, read: bool, deadline: Instant) -> io::Result<()> {
    let now = Instant::now();
    if now >= deadline {
        return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"));
    }
    let mut fds = [PollFd::new(sock.as_raw_fd(), read)];
    sys::poll(&mut fds, deadline - now)?;
    Ok(())
}

/// Writes all of `buf` to the non-blocking `sock` by the deadline.
pub(crate) fn write_all_deadline(sock: &Socket, buf: &[u8], deadline: Instant) -> io::Result<()> {
    let mut off = 0;
    while off < buf.len() {
        match sock.send_with_flags(&buf[off..], libc::MSG_NOSIGNAL) {
            Ok(n) => off += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait(sock, false, deadline)?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads exactly `buf.len()` bytes from the non-blocking `sock` by the deadline.
pub(crate) fn read_exact_deadline(
    sock: &Socket,
    buf: &mut [u8],
    deadline: Instant,
) -> io::Result<()> {
    let mut off = 0;
    while off < buf.len() {
        match (&*sock).read(&mut buf[off..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => off += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait(sock, true, deadline)?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
