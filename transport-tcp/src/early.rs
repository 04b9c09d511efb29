//! Accepting before the handshake. A rank's listener is published with its
//! setup record, and strangers can reach it from then on, while the rank
//! itself still waits for the other records: were nothing accepting, the
//! kernel's backlog (about 1,024) would fill and the SYN of a late rank be
//! dropped, costing it the kernel's one-second SYN retransmission (a 4-rank
//! job under 5,000 idle connections per port took 7.9× its quiet time).
//!
//! So from [`TcpEndpoint::bind`](crate::TcpEndpoint::bind) until its
//! handshake starts, one thread per endpoint accepts every connection and
//! greets it at once (the greeting needs nothing but a fresh nonce); a rank
//! that connected early gets its greeting and sends its hello, which waits
//! in its socket until the handshake reads and judges it. At most
//! [`MAX_PENDING`](crate::handshake::MAX_PENDING) connections are held (a
//! quarter of the descriptor limit where that is lower); beyond that the
//! one that has waited longest without a whole hello is dropped, and so is
//! one without a hello after the handshake's deadline for it (10 s).

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use socket2::Socket;

use crate::handshake::{accept_waiting, Pending};
use crate::sys::{self, PollFd};

/// The early acceptor of one endpoint; [`EarlyAccept::finish`] stops it
/// and hands over what it greeted.
#[derive(Debug)]
pub(crate) struct EarlyAccept {
    /// Written once to stop the thread.
    wake: UnixStream,
    thread: Option<JoinHandle<Vec<Pending>>>,
}

impl EarlyAccept {
    /// Starts accepting on (a duplicate of) `listener`, which must be
    /// non-blocking.
    pub(crate) fn start(listener: &Socket, local: SocketAddr) -> io::Result<EarlyAccept> {
        let listener = listener.try_clone()?;
        let (wake, woken) = UnixStream::pair()?;
        let thread = thread::Builder::new()
            .name("sncl-tcp-early".into())
            .stack_size(256 * 1024)
            .spawn(move || accept_until_woken(&listener, woken, local))?;
        Ok(EarlyAccept {
            wake,
            thread: Some(thread),
        })
    }

    /// Stops accepting; the connections greeted so far.
    pub(crate) fn finish(mut self) -> Vec<Pending> {
        self.stop()
    }

    fn stop(&mut self) -> Vec<Pending> {
        let Some(thread) = self.thread.take() else {
            return Vec::new();
        };
        // A failed write means the thread is gone already.
        let _ = self.wake.write_all(&[1]);
        thread.join().unwrap_or_default()
    }
}

impl Drop for EarlyAccept {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_until_woken(listener: &Socket, mut woken: UnixStream, local: SocketAddr) -> Vec<Pending> {
    let mut pending: Vec<Pending> = Vec::new();
    loop {
        let mut fds = [
            PollFd::new(listener.as_raw_fd(), true),
            PollFd::new(woken.as_raw_fd(), true),
        ];
        // Bounded so that an accept error (e.g. out of descriptors) is retried.
        if let Err(e) = sys::poll(&mut fds, Duration::from_millis(200)) {
            tracing::warn!(addr = %local, "early accept: poll failed: {e}");
            thread::sleep(Duration::from_millis(50));
        }
        if fds[1].ready {
            let _ = woken.read(&mut [0u8; 1]);
            return pending;
        }
        let mut dropped = |remote: &SocketAddr, why: &str| {
            tracing::debug!(addr = %local, %remote, "early accept: {why}");
        };
        if let Err(e) = accept_waiting(listener, &mut pending, &mut dropped) {
            // Out of descriptors or memory: pause rather than spin.
            tracing::warn!(addr = %local, "early accept failed: {e}");
            thread::sleep(Duration::from_millis(50));
        }
        // Strangers that never said hello go, as in the handshake.
        pending.retain(|p| {
            let overdue = p.overdue();
            if overdue {
                dropped(&p.remote, "no complete hello in time");
            }
            !overdue
        });
    }
}
