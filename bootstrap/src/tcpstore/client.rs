//! [`TcpStore`]: a rank's connection to the [`super::TcpStoreServer`].

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::{Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use super::protocol::*;
use super::tls_stream;
use super::wire::{Attempt, Wire};
use crate::store::quote_keys;
use crate::tls::TlsIdentity;
use crate::Store;
use comm_core::{Error, Result};

/// Default client grace period for a reply beyond the operation's timeout;
/// communicators use their `SNCL_TIMEOUT_MS` instead
/// ([`TcpStore::with_io_timeout`]).
pub const DEFAULT_IO_TIMEOUT: Duration = Duration::from_secs(60);

struct Conn {
    stream: Box<dyn Wire>,
    /// Why the connection is unusable (a failed exchange may leave a reply
    /// in flight, so the stream cannot be reused after one).
    broken: Option<String>,
}

/// A rank's connection to the [`TcpStoreServer`](crate::TcpStoreServer); implements [`Store`].
///
/// Requests from several threads are serialized over the one connection.
/// After an I/O failure (dead root, reply timeout) the connection is marked
/// broken and every later call fails at once with an error saying so.
pub struct TcpStore {
    root: SocketAddr,
    rank: usize,
    local: SocketAddr,
    io_timeout: Duration,
    conn: Mutex<Conn>,
}

impl std::fmt::Debug for TcpStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpStore")
            .field("root", &self.root)
            .field("rank", &self.rank)
            .field("local", &self.local)
            .finish_non_exhaustive()
    }
}

fn describe_io(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => "connection refused".into(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => "connection timed out".into(),
        io::ErrorKind::ConnectionReset => "connection reset by the peer".into(),
        io::ErrorKind::UnexpectedEof => "the peer closed the connection".into(),
        _ => e.to_string(),
    }
}

impl TcpStore {
    /// Connects rank `rank` to the store server at `addr` and authenticates
    /// with `secret`.
    ///
    /// Connection refused (the root is not up yet), resets and timeouts are
    /// retried with backoff until `deadline`; then the error says which rank
    /// could not reach which address within how long, and why. A wrong
    /// secret, or a server that is not an sncl store, fails at once.
    ///
    /// This is [`Self::connect_tls`] without TLS: a root that requires TLS
    /// does not answer, and the error at `deadline` says it may need it.
    pub fn connect(
        addr: SocketAddr,
        secret: [u8; 16],
        rank: usize,
        deadline: Instant,
    ) -> Result<TcpStore> {
        Self::connect_tls(addr, secret, rank, deadline, None)
    }

    /// Like [`Self::connect`], over TLS when `tls` is given: after the TCP
    /// connection, a mutually authenticated TLS 1.3 handshake with
    /// `tls`'s certificate and authorities (see [`crate::tls`]), then the
    /// store's handshake and every request inside that channel.
    ///
    /// A TLS failure (the root refused this rank's certificate, this rank
    /// refused the root's, or the root does not speak TLS) fails at once
    /// with an error naming `addr` and the reason; a root that does not
    /// answer the handshake fails at `deadline`.
    pub fn connect_tls(
        addr: SocketAddr,
        secret: [u8; 16],
        rank: usize,
        deadline: Instant,
        tls: Option<&TlsIdentity>,
    ) -> Result<TcpStore> {
        let start = Instant::now();
        let mut backoff = Duration::from_millis(10);
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let last = match Self::connect_once(addr, &secret, rank, deadline, tls) {
                Ok(s) => {
                    tracing::debug!(rank, root = %addr, local = %s.local, attempts, "connected to the sncl store");
                    return Ok(s);
                }
                Err(Attempt::Fatal(e)) => return Err(e),
                Err(Attempt::Retry(e)) => e,
            };
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                // A root that accepts and then closes without a word may be
                // a TLS root dropping this plaintext client's silent
                // connection at the end of its handshake time.
                let hint = if tls.is_none() && last.kind() == io::ErrorKind::UnexpectedEof {
                    "; if rank 0 runs with SNCL_TLS_CERT/SNCL_TLS_KEY/SNCL_TLS_CA, its store \
                     requires TLS: set them on this rank too"
                } else {
                    ""
                };
                return Err(Error::Bootstrap {
                    rank,
                    detail: format!(
                        "cannot reach the sncl root at {addr} within {} ms: {} ({attempts} attempt(s)); \
                         is rank 0 running and is SNCL_ROOT right?{hint}",
                        // Rounded: the caller computed the deadline a moment
                        // before this call started.
                        (deadline.saturating_duration_since(start).as_micros() + 500) / 1000,
                        describe_io(&last)
                    ),
                });
            }
            tracing::trace!(rank, root = %addr, "sncl store not reachable yet: {last}");
            thread::sleep(backoff.min(remaining));
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    }

    fn connect_once(
        addr: SocketAddr,
        secret: &[u8; 16],
        rank: usize,
        deadline: Instant,
        tls: Option<&TlsIdentity>,
    ) -> Result<TcpStore, Attempt> {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let connect_timeout = remaining.clamp(Duration::from_millis(10), Duration::from_secs(5));
        let stream = match TcpStream::connect_timeout(&addr, connect_timeout) {
            Ok(s) => s,
            Err(e) => {
                return Err(match e.kind() {
                    io::ErrorKind::InvalidInput
                    | io::ErrorKind::PermissionDenied
                    | io::ErrorKind::Unsupported => Attempt::Fatal(Error::Io {
                        rank,
                        context: format!(
                        "connecting to the sncl root at {addr} (check SNCL_ROOT / the unique id)"
                    ),
                        source: e,
                    }),
                    _ => Attempt::Retry(e),
                })
            }
        };
        let io_fatal = |what: &str, e: io::Error| {
            Attempt::Fatal(Error::Io {
                rank,
                context: format!("{what} on the connection to the sncl root at {addr}"),
                source: e,
            })
        };
        stream
            .set_nodelay(true)
            .map_err(|e| io_fatal("setting TCP_NODELAY", e))?;
        let keepalive = socket2::TcpKeepalive::new().with_time(Duration::from_secs(30));
        // Best effort: keepalive only speeds up noticing a vanished host.
        let _ = socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive);
        let mut wire: Box<dyn Wire> = match tls {
            Some(tls) => Box::new(tls_stream::client_handshake(
                stream, tls, addr, rank, deadline,
            )?),
            None => Box::new(stream),
        };
        let hs_timeout = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_secs(1));
        wire.set_timeouts(hs_timeout, hs_timeout)
            .map_err(|e| io_fatal("setting timeouts", e))?;
        Self::over(wire, addr, secret, rank, hs_timeout)
    }

    /// Authenticates over `stream` (connected to the root at `addr`, with
    /// read and write timeouts of `hs_timeout`) and wraps it: greeting,
    /// proof, verdict and the root's proof, each checked.
    pub(super) fn over(
        mut stream: Box<dyn Wire>,
        addr: SocketAddr,
        secret: &[u8; 16],
        rank: usize,
        hs_timeout: Duration,
    ) -> Result<TcpStore, Attempt> {
        let io_fatal = |what: &str, e: io::Error| {
            Attempt::Fatal(Error::Io {
                rank,
                context: format!("{what} on the connection to the sncl root at {addr}"),
                source: e,
            })
        };
        // Over TLS, a root that refuses this rank's certificate says so
        // after this side already finished its handshake: its alert
        // arrives in place of the greeting.
        let failed = |e: io::Error| match tls_stream::rustls_error(&e) {
            Some(tls) => Attempt::Fatal(tls_stream::client_failure(addr, rank, tls)),
            None => Attempt::Retry(e),
        };
        let not_sncl = |why: String| {
            Attempt::Fatal(Error::Bootstrap {
                rank,
                detail: format!(
                    "the process listening at {addr} is not an sncl store ({why}); \
                     check SNCL_ROOT / the unique id: it must name rank 0's sncl root, \
                     not another service such as torchrun's store on MASTER_PORT"
                ),
            })
        };

        // 1. greeting
        let mut hello = [0u8; GREETING_BYTES];
        if let Err(e) = stream.read_exact(&mut hello) {
            return Err(match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                    // A TLS root waits for a ClientHello and never greets a
                    // plaintext client.
                    let tls_hint = if stream.is_tls() {
                        ""
                    } else {
                        "; or rank 0's store requires TLS (rank 0 runs with SNCL_TLS_CERT, \
                         SNCL_TLS_KEY and SNCL_TLS_CA set): set the same on this rank"
                    };
                    Attempt::Fatal(Error::Bootstrap {
                        rank,
                        detail: format!(
                            "the sncl root at {addr} is unresponsive: it accepted the connection \
                             but sent no greeting within {} ms; rank 0 may be stopped, hung or \
                             overloaded (check its process), or {addr} is another service that \
                             never greets (such as torchrun's store on MASTER_PORT){tls_hint}",
                            hs_timeout.as_millis()
                        ),
                    })
                }
                _ => failed(e),
            });
        }
        if &hello[..8] != MAGIC {
            return Err(not_sncl(format!(
                "it greeted with {:?}",
                String::from_utf8_lossy(&hello[..8])
            )));
        }
        let snonce = &hello[8..];
        // 2. proof
        let cnonce = nonce().map_err(|e| io_fatal("drawing a nonce", e))?;
        let mut proof = Vec::with_capacity(PROOF_BYTES);
        proof.extend_from_slice(MAGIC);
        proof.extend_from_slice(&(rank as u64).to_le_bytes());
        proof.extend_from_slice(&cnonce);
        proof.extend_from_slice(&client_mac(secret, snonce, &cnonce, rank as u64));
        stream.write_all(&proof).map_err(failed)?;
        stream.flush().map_err(failed)?;
        // 3. verdict
        let mut status = [0u8; 1];
        stream.read_exact(&mut status).map_err(failed)?;
        match status[0] {
            AUTH_OK => {}
            AUTH_REFUSED => {
                return Err(Attempt::Fatal(Error::Bootstrap {
                    rank,
                    detail: format!(
                        "the sncl root at {addr} refused this rank's secret: the ranks were not \
                         given the same unique id / SNCL_SECRET, or {addr} is another job's root; \
                         pass rank 0's unique id (or the same SNCL_SECRET) to every rank"
                    ),
                }))
            }
            other => return Err(not_sncl(format!("unknown handshake status {other}"))),
        }
        let mut mac = [0u8; MAC];
        stream.read_exact(&mut mac).map_err(failed)?;
        if !server_mac_valid(secret, snonce, &cnonce, rank as u64, &mac) {
            return Err(Attempt::Fatal(Error::Bootstrap {
                rank,
                detail: format!(
                    "the sncl root at {addr} could not prove it knows this job's secret; \
                     {addr} is not this job's root: check SNCL_ROOT / the unique id"
                ),
            }));
        }
        let local = stream
            .local_addr()
            .map_err(|e| io_fatal("reading the local address", e))?;
        Ok(TcpStore {
            root: addr,
            rank,
            local,
            io_timeout: DEFAULT_IO_TIMEOUT,
            conn: Mutex::new(Conn {
                stream,
                broken: None,
            }),
        })
    }

    /// Sets how long to wait for a reply beyond an operation's own timeout
    /// (default [`DEFAULT_IO_TIMEOUT`]). A root that does not answer within
    /// it is considered dead.
    pub fn with_io_timeout(mut self, io_timeout: Duration) -> Self {
        self.io_timeout = io_timeout.max(Duration::from_millis(1));
        self
    }

    /// The local IP of the connection to the root: the interface through
    /// which this host reaches the root, a good address to publish for data
    /// connections.
    pub fn local_ip(&self) -> IpAddr {
        self.local.ip()
    }

    /// The local address (IP and ephemeral port) of the connection.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The root's address.
    pub fn root(&self) -> SocketAddr {
        self.root
    }

    /// Whether the connection failed (a lost or timed-out reply): every
    /// later request fails at once, so a caller that wants to go on must
    /// connect again. A `get` that only waited past its own timeout does
    /// not break the connection.
    pub fn is_broken(&self) -> bool {
        self.conn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .broken
            .is_some()
    }

    /// The rank this store reports in errors.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Sends one request and returns the reply's status and payload.
    fn request(&self, what: &str, body: &[u8], wait: Option<Duration>) -> Result<(u8, Vec<u8>)> {
        let mut conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(why) = &conn.broken {
            return Err(Error::Bootstrap {
                rank: self.rank,
                detail: format!(
                    "{what}: the connection to the sncl root at {} was lost earlier ({why}); \
                     rank 0 has probably exited: check its log",
                    self.root
                ),
            });
        }
        let read_timeout = wait.map_or(self.io_timeout, |w| w.saturating_add(self.io_timeout));
        let res = (|| {
            conn.stream.set_timeouts(read_timeout, self.io_timeout)?;
            write_frame(&mut conn.stream, body)?;
            match read_frame(&mut conn.stream)? {
                Some(r) if !r.is_empty() => Ok(r),
                Some(_) => Err(io::Error::new(io::ErrorKind::InvalidData, "empty reply")),
                None => Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the root closed the connection",
                )),
            }
        })();
        match res {
            Ok(mut r) => {
                let status = r.remove(0);
                Ok((status, r))
            }
            Err(e) => {
                let why = match e.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                        format!("no reply within {} ms", read_timeout.as_millis())
                    }
                    _ => describe_io(&e),
                };
                conn.broken = Some(why.clone());
                conn.stream.close();
                Err(Error::Io {
                    rank: self.rank,
                    context: format!(
                        "{what} at the sncl root {} failed ({why}); rank 0 may have exited or \
                         hung: check its log",
                        self.root
                    ),
                    source: e,
                })
            }
        }
    }

    fn unexpected(&self, what: &str, status: u8, payload: &[u8]) -> Error {
        let detail = match status {
            ST_ERROR => format!(
                "{what} refused by the sncl root at {}: {}",
                self.root,
                String::from_utf8_lossy(payload)
            ),
            _ => format!(
                "{what}: unexpected reply (status {status}, {} bytes) from the sncl root at {}; \
                 are all ranks running the same sncl version?",
                payload.len(),
                self.root
            ),
        };
        Error::Bootstrap {
            rank: self.rank,
            detail,
        }
    }

    fn timed_out(&self, what: &str, payload: &[u8], timeout: Duration) -> Error {
        let mut c = Cursor(payload);
        let missing: Vec<String> = (|| -> io::Result<Vec<String>> {
            let n = c.u32()?;
            (0..n).map(|_| c.str().map(str::to_owned)).collect()
        })()
        .unwrap_or_default();
        Error::Bootstrap {
            rank: self.rank,
            detail: format!(
                "{what} timed out after {} ms waiting for key(s) {} in the sncl store at {}; \
                 the rank(s) that set them failed or have not reached this point yet",
                timeout.as_millis(),
                quote_keys(&missing),
                self.root
            ),
        }
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let what = format!("store set of key '{key}'");
        let mut body = Vec::with_capacity(1 + 4 + key.len() + value.len());
        body.push(OP_SET);
        put_str(&mut body, key);
        body.extend_from_slice(value);
        match self.request(&what, &body, None)? {
            (ST_OK, _) => Ok(()),
            (s, p) => Err(self.unexpected(&what, s, &p)),
        }
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let what = format!("store get of key '{key}'");
        let mut body = vec![OP_GET];
        body.extend_from_slice(&ms(timeout).to_le_bytes());
        put_str(&mut body, key);
        match self.request(&what, &body, Some(timeout))? {
            (ST_OK, v) => Ok(v),
            (ST_TIMEOUT, p) => Err(self.timed_out("store get", &p, timeout)),
            (s, p) => Err(self.unexpected(&what, s, &p)),
        }
    }

    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let what = format!("store try_get of key '{key}'");
        let mut body = vec![OP_TRY_GET];
        put_str(&mut body, key);
        match self.request(&what, &body, None)? {
            (ST_OK, v) => Ok(Some(v)),
            (ST_MISSING, _) => Ok(None),
            (s, p) => Err(self.unexpected(&what, s, &p)),
        }
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        let what = format!("store wait for {}", quote_keys(keys));
        let mut body = vec![OP_WAIT];
        body.extend_from_slice(&ms(timeout).to_le_bytes());
        body.extend_from_slice(&(keys.len() as u32).to_le_bytes());
        for k in keys {
            put_str(&mut body, k);
        }
        match self.request(&what, &body, Some(timeout))? {
            (ST_OK, _) => Ok(()),
            (ST_TIMEOUT, p) => Err(self.timed_out("store wait", &p, timeout)),
            (s, p) => Err(self.unexpected(&what, s, &p)),
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let what = format!("store add({delta}) to key '{key}'");
        let mut body = vec![OP_ADD];
        body.extend_from_slice(&delta.to_le_bytes());
        put_str(&mut body, key);
        match self.request(&what, &body, None)? {
            (ST_OK, v) if v.len() == 8 => {
                let mut a = [0u8; 8];
                a.copy_from_slice(&v);
                Ok(i64::from_le_bytes(a))
            }
            (s, p) => Err(self.unexpected(&what, s, &p)),
        }
    }
}
