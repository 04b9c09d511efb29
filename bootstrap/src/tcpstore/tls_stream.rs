//! TLS under the store's protocol (see [`crate::tls`] for the policy):
//! the client's blocking handshake and its [`Wire`] over a TLS stream, and
//! the server's reading of a failed handshake.
//!
//! With TLS the store's own handshake (the job secret's challenge and
//! response) and every request run inside the TLS channel, unchanged.

use std::io;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use comm_core::Error;
use rustls::{ClientConnection, StreamOwned};

use super::wire::{Attempt, Wire};
use crate::tls::{self, TlsIdentity};

/// A client's TLS stream to the store root.
pub(super) type ClientTls = StreamOwned<ClientConnection, TcpStream>;

/// How long closing a TLS stream may spend sending its close_notify.
const CLOSE_NOTIFY_TIMEOUT: Duration = Duration::from_millis(100);

/// The rustls error an I/O error from a TLS stream carries, if any
/// (rustls and tokio-rustls report TLS failures as `InvalidData` I/O
/// errors wrapping it).
pub(super) fn rustls_error(e: &io::Error) -> Option<&rustls::Error> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
}

/// The client's error for a TLS failure with the root at `addr`.
pub(super) fn client_failure(addr: SocketAddr, rank: usize, e: &rustls::Error) -> Error {
    let detail = if tls::peer_speaks_no_tls(e) {
        format!(
            "TLS handshake with the sncl store at {addr} failed: the store at {addr} does not \
             speak TLS ({e}): does rank 0 run without SNCL_TLS_* settings? Set SNCL_TLS_CERT, \
             SNCL_TLS_KEY and SNCL_TLS_CA on every rank or on none"
        )
    } else {
        format!(
            "TLS handshake with the sncl store at {addr} failed: {}",
            tls::describe(e)
        )
    };
    Error::Bootstrap { rank, detail }
}

/// Runs the TLS handshake as the connecting side over `sock` (connected to
/// the root at `addr`), each read and write bounded by what is left until
/// `deadline`.
///
/// A TLS failure or a root that does not answer within the deadline is
/// fatal; a connection reset or closed mid-handshake is retried (the root
/// may be starting or shedding load).
pub(super) fn client_handshake(
    sock: TcpStream,
    tls: &TlsIdentity,
    addr: SocketAddr,
    rank: usize,
    deadline: Instant,
) -> Result<ClientTls, Attempt> {
    let conn =
        ClientConnection::new(tls.client_config(), TlsIdentity::server_name()).map_err(|e| {
            Attempt::Fatal(Error::Bootstrap {
                rank,
                detail: format!(
                    "cannot start a TLS connection to the sncl store at {addr}: {}",
                    tls::describe(&e)
                ),
            })
        })?;
    let mut stream = StreamOwned::new(conn, sock);
    let started = Instant::now();
    let timed_out = || {
        Attempt::Fatal(Error::Bootstrap {
            rank,
            detail: format!(
                "TLS handshake with the sncl store at {addr} failed: no answer within {} ms; \
                 rank 0 may be stopped, hung or overloaded (check its process), or {addr} is \
                 another service (such as torchrun's store on MASTER_PORT)",
                deadline.saturating_duration_since(started).as_millis()
            ),
        })
    };
    let io_failed = |e: io::Error| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => timed_out(),
        _ => Attempt::Retry(e),
    };
    // One read or write at a time, so that the deadline bounds the whole
    // handshake, not each of its reads.
    while stream.conn.is_handshaking() || stream.conn.wants_write() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out());
        }
        stream
            .sock
            .set_timeouts(left, left)
            .map_err(|e| io_failed_fatal(addr, rank, "setting timeouts", e))?;
        if stream.conn.wants_write() {
            match stream.conn.write_tls(&mut stream.sock) {
                Ok(0) => return Err(Attempt::Retry(io::ErrorKind::WriteZero.into())),
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_failed(e)),
            }
        }
        match stream.conn.read_tls(&mut stream.sock) {
            Ok(0) => return Err(Attempt::Retry(io::ErrorKind::UnexpectedEof.into())),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_failed(e)),
        }
        if let Err(e) = stream.conn.process_new_packets() {
            // The alert describing the failure, best effort.
            let _ = stream.conn.write_tls(&mut stream.sock);
            return Err(Attempt::Fatal(client_failure(addr, rank, &e)));
        }
    }
    Ok(stream)
}

fn io_failed_fatal(addr: SocketAddr, rank: usize, what: &str, e: io::Error) -> Attempt {
    Attempt::Fatal(Error::Io {
        rank,
        context: format!("{what} on the TLS connection to the sncl root at {addr}"),
        source: e,
    })
}

impl Wire for ClientTls {
    fn set_timeouts(&mut self, read: Duration, write: Duration) -> io::Result<()> {
        self.sock.set_timeouts(read, write)
    }

    /// Sends close_notify (best effort, briefly) and shuts the socket down.
    fn close(&mut self) {
        self.conn.send_close_notify();
        let _ = self.sock.set_write_timeout(Some(CLOSE_NOTIFY_TIMEOUT));
        while self.conn.wants_write() {
            match self.conn.write_tls(&mut self.sock) {
                Ok(n) if n > 0 => {}
                _ => break,
            }
        }
        let _ = self.sock.shutdown(Shutdown::Both);
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    fn is_tls(&self) -> bool {
        true
    }
}

/// The server's reading of a failed TLS accept: `Some(reason)` when TLS
/// itself failed (worth a warning), `None` for a plain I/O failure (the
/// peer closed or reset the connection).
pub(super) fn server_failure(e: &io::Error) -> Option<String> {
    rustls_error(e).map(tls::describe)
}
