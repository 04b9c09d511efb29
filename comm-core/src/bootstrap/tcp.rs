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

use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::store::{quote_keys, AddError, Shared, WaitOutcome};
use super::{MemoryStore, Store};
use crate::auth::{ct_eq, hmac_sha256};
use crate::{Error, Result};

const MAGIC: &[u8; 8] = b"SNCLSTR1";
const NONCE: usize = 16;
const MAC: usize = 32;
/// Largest request or reply frame (a guard against garbage lengths).
const MAX_FRAME: usize = 1 << 30;

const OP_SET: u8 = 1;
const OP_GET: u8 = 2;
const OP_TRY_GET: u8 = 3;
const OP_WAIT: u8 = 4;
const OP_ADD: u8 = 5;

const ST_OK: u8 = 0;
const ST_MISSING: u8 = 1;
const ST_TIMEOUT: u8 = 2;
const ST_ERROR: u8 = 3;

const AUTH_OK: u8 = 0;
const AUTH_REFUSED: u8 = 1;

/// How long the server waits for a new connection to complete the handshake.
const SERVER_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the server waits for a client to take a reply.
const SERVER_WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default client grace period for a reply beyond the operation's timeout.
pub const DEFAULT_IO_TIMEOUT: Duration = Duration::from_secs(60);

fn client_mac(secret: &[u8; 16], snonce: &[u8], cnonce: &[u8], rank: u64) -> [u8; MAC] {
    hmac_sha256(
        secret,
        &[b"sncl-client", snonce, cnonce, &rank.to_le_bytes()],
    )
}

fn server_mac(secret: &[u8; 16], snonce: &[u8], cnonce: &[u8], rank: u64) -> [u8; MAC] {
    hmac_sha256(
        secret,
        &[b"sncl-server", cnonce, snonce, &rank.to_le_bytes()],
    )
}

fn nonce() -> io::Result<[u8; NONCE]> {
    let mut n = [0u8; NONCE];
    getrandom::fill(&mut n).map_err(|e| io::Error::other(format!("getrandom failed: {e}")))?;
    Ok(n)
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u32).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

fn write_frame(w: &mut impl Write, body: &[u8]) -> io::Result<()> {
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&(body.len() as u32).to_le_bytes());
    buf.extend_from_slice(body);
    w.write_all(&buf)?;
    w.flush()
}

/// Reads a frame; `Ok(None)` on a clean EOF before its first byte.
fn read_frame(r: &mut impl Read) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds the {MAX_FRAME}-byte limit"),
        ));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok(Some(body))
}

/// A cursor over a received frame.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn bytes(&mut self, n: usize) -> io::Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "truncated message",
            ));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn u8(&mut self) -> io::Result<u8> {
        Ok(self.bytes(1)?[0])
    }
    fn u32(&mut self) -> io::Result<u32> {
        let b = self.bytes(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> io::Result<u64> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.bytes(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn str(&mut self) -> io::Result<&'a str> {
        let n = self.u32()? as usize;
        std::str::from_utf8(self.bytes(n)?)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "key is not UTF-8"))
    }
    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }
}

// ---------------------------------------------------------------- server --

struct ServerInner {
    shared: Arc<Shared>,
    secret: [u8; 16],
    shutdown: AtomicBool,
    conns: Mutex<Vec<(TcpStream, JoinHandle<()>)>>,
}

/// The rendezvous store server rank 0 runs (like c10d's `TCPStore` master).
///
/// An accept loop runs on a background thread, with one thread per client
/// connection. Every connection must first prove it knows the job secret
/// (see the module docs); a connection that does not is refused, logged with
/// `tracing::warn!` naming its address, and the server keeps serving the
/// others. Dropping the server stops it: waiters are woken, connections are
/// shut down and all threads are joined.
pub struct TcpStoreServer {
    local_addr: SocketAddr,
    inner: Arc<ServerInner>,
    accept: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for TcpStoreServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpStoreServer")
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

impl TcpStoreServer {
    /// Binds `bind` (port 0 picks a free port; see [`Self::local_addr`]) and
    /// starts serving clients that know `secret`.
    pub fn start(bind: SocketAddr, secret: [u8; 16]) -> io::Result<TcpStoreServer> {
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(bind),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )?;
        socket.set_reuse_address(true)?;
        socket.bind(&bind.into())?;
        // Thousands of ranks may connect at once; the kernel caps this at
        // net.core.somaxconn.
        socket.listen(4096)?;
        // Blocking accept: an idle server never wakes up (a polling loop
        // would steal the core from spinning ranks); Drop wakes it with a
        // connection of its own.
        let listener: TcpListener = socket.into();
        let local_addr = listener.local_addr()?;
        let inner = Arc::new(ServerInner {
            shared: Arc::new(Shared::default()),
            secret,
            shutdown: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
        });
        let accept_inner = Arc::clone(&inner);
        let accept = thread::Builder::new()
            .name("sncl-store-accept".into())
            .spawn(move || accept_loop(listener, accept_inner))?;
        tracing::debug!(%local_addr, "sncl store server listening");
        Ok(TcpStoreServer {
            local_addr,
            inner,
            accept: Some(accept),
        })
    }

    /// The address the server listens on (with the real port when bound to
    /// port 0; the IP is the bound one, possibly unspecified).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// An in-process handle to the server's map (errors name rank 0). It
    /// is closed when the server is dropped.
    pub fn local_store(&self) -> MemoryStore {
        MemoryStore::from_shared(Arc::clone(&self.inner.shared), 0)
    }
}

impl Drop for TcpStoreServer {
    fn drop(&mut self) {
        self.inner.shutdown.store(true, Ordering::SeqCst);
        self.inner.shared.close();
        let mut wake = self.local_addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        let conns = std::mem::take(
            &mut *self
                .inner
                .conns
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for (stream, _) in &conns {
            let _ = stream.shutdown(Shutdown::Both);
        }
        for (_, h) in conns {
            let _ = h.join();
        }
        tracing::debug!(local_addr = %self.local_addr, "sncl store server stopped");
    }
}

fn accept_loop(listener: TcpListener, inner: Arc<ServerInner>) {
    while !inner.shutdown.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok(_) if inner.shutdown.load(Ordering::SeqCst) => break,
            Ok((stream, peer)) => {
                if let Err(e) = spawn_conn(&inner, stream, peer) {
                    tracing::warn!(%peer, "sncl store: dropping connection from {peer}: cannot start its thread: {e}");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                // E.g. out of file descriptors: keep serving the others.
                tracing::warn!("sncl store: accept failed: {e}; retrying");
                thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

fn spawn_conn(inner: &Arc<ServerInner>, stream: TcpStream, peer: SocketAddr) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)?;
    let keep = stream.try_clone()?;
    let conn_inner = Arc::clone(inner);
    let handle = thread::Builder::new()
        .name(format!("sncl-store-{peer}"))
        .stack_size(256 * 1024)
        .spawn(move || serve_conn(&conn_inner, stream, peer))?;
    let mut conns = inner.conns.lock().unwrap_or_else(PoisonError::into_inner);
    // Forget connections that already ended.
    let mut i = 0;
    while i < conns.len() {
        if conns[i].1.is_finished() {
            let (_, h) = conns.swap_remove(i);
            let _ = h.join();
        } else {
            i += 1;
        }
    }
    conns.push((keep, handle));
    Ok(())
}

/// Why the server refused a connection.
enum Refusal {
    NotSncl,
    WrongSecret(u64),
    Io(io::Error),
}

fn server_handshake(inner: &ServerInner, stream: &mut TcpStream) -> Result<u64, Refusal> {
    stream
        .set_read_timeout(Some(SERVER_HANDSHAKE_TIMEOUT))
        .map_err(Refusal::Io)?;
    stream
        .set_write_timeout(Some(SERVER_HANDSHAKE_TIMEOUT))
        .map_err(Refusal::Io)?;
    let snonce = nonce().map_err(Refusal::Io)?;
    let mut hello = Vec::with_capacity(8 + NONCE);
    hello.extend_from_slice(MAGIC);
    hello.extend_from_slice(&snonce);
    stream.write_all(&hello).map_err(Refusal::Io)?;

    let mut reply = [0u8; 8 + 8 + NONCE + MAC];
    stream.read_exact(&mut reply).map_err(Refusal::Io)?;
    if &reply[..8] != MAGIC {
        return Err(Refusal::NotSncl);
    }
    let mut rank = [0u8; 8];
    rank.copy_from_slice(&reply[8..16]);
    let rank = u64::from_le_bytes(rank);
    let cnonce = &reply[16..16 + NONCE];
    let mac = &reply[16 + NONCE..];
    if !ct_eq(mac, &client_mac(&inner.secret, &snonce, cnonce, rank)) {
        let _ = stream.write_all(&[AUTH_REFUSED]);
        return Err(Refusal::WrongSecret(rank));
    }
    let mut ok = Vec::with_capacity(1 + MAC);
    ok.push(AUTH_OK);
    ok.extend_from_slice(&server_mac(&inner.secret, &snonce, cnonce, rank));
    stream.write_all(&ok).map_err(Refusal::Io)?;
    stream.set_read_timeout(None).map_err(Refusal::Io)?;
    stream
        .set_write_timeout(Some(SERVER_WRITE_TIMEOUT))
        .map_err(Refusal::Io)?;
    Ok(rank)
}

fn serve_conn(inner: &ServerInner, mut stream: TcpStream, peer: SocketAddr) {
    serve_conn_inner(inner, &mut stream, peer);
    // The server keeps a clone of the stream (to shut it down on drop), so
    // dropping ours would not close the connection: shut it down explicitly.
    let _ = stream.shutdown(Shutdown::Both);
}

fn serve_conn_inner(inner: &ServerInner, stream: &mut TcpStream, peer: SocketAddr) {
    let rank = match server_handshake(inner, stream) {
        Ok(rank) => rank,
        Err(refusal) => {
            if !inner.shutdown.load(Ordering::SeqCst) {
                let why = match refusal {
                    Refusal::NotSncl => "it did not speak the sncl store protocol".to_string(),
                    Refusal::WrongSecret(r) => format!(
                        "it (claiming rank {r}) does not know this job's secret; \
                         it belongs to another job or was given a different unique id / SNCL_SECRET"
                    ),
                    Refusal::Io(e) => format!("handshake failed: {e}"),
                };
                tracing::warn!(%peer, "sncl store: refused connection from {peer}: {why}");
            }
            return;
        }
    };
    tracing::debug!(%peer, rank, "sncl store: rank connected");
    loop {
        let frame = match read_frame(stream) {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                if !inner.shutdown.load(Ordering::SeqCst) {
                    tracing::debug!(%peer, rank, "sncl store: connection of rank {rank} ended: {e}");
                }
                break;
            }
        };
        let reply = match handle_request(inner, &frame) {
            Ok(Some(r)) => r,
            // The store was closed: the server is shutting down.
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(%peer, rank, "sncl store: malformed request from rank {rank} at {peer}: {e}; closing its connection");
                break;
            }
        };
        if let Err(e) = write_frame(stream, &reply) {
            tracing::debug!(%peer, rank, "sncl store: cannot reply to rank {rank}: {e}");
            break;
        }
    }
}

fn timeout_reply(missing: &[String]) -> Vec<u8> {
    let mut r = vec![ST_TIMEOUT];
    r.extend_from_slice(&(missing.len() as u32).to_le_bytes());
    for k in missing {
        put_str(&mut r, k);
    }
    r
}

/// Executes one request; `Ok(None)` when the store is closed.
fn handle_request(inner: &ServerInner, frame: &[u8]) -> io::Result<Option<Vec<u8>>> {
    let store = &inner.shared;
    let mut c = Cursor(frame);
    let op = c.u8()?;
    let reply = match op {
        OP_SET => {
            let key = c.str()?;
            if !store.set(key, c.rest()) {
                return Ok(None);
            }
            vec![ST_OK]
        }
        OP_GET => {
            let timeout = Duration::from_millis(c.u64()?);
            let key = c.str()?;
            match store.wait(&[key], timeout, true) {
                (WaitOutcome::Ready, Some(v)) => {
                    let mut r = Vec::with_capacity(1 + v.len());
                    r.push(ST_OK);
                    r.extend_from_slice(&v);
                    r
                }
                (WaitOutcome::TimedOut { missing }, _) => timeout_reply(&missing),
                _ => return Ok(None),
            }
        }
        OP_TRY_GET => {
            let key = c.str()?;
            match store.try_get(key) {
                Ok(Some(v)) => {
                    let mut r = Vec::with_capacity(1 + v.len());
                    r.push(ST_OK);
                    r.extend_from_slice(&v);
                    r
                }
                Ok(None) => vec![ST_MISSING],
                Err(()) => return Ok(None),
            }
        }
        OP_WAIT => {
            let timeout = Duration::from_millis(c.u64()?);
            let n = c.u32()? as usize;
            let mut keys = Vec::with_capacity(n.min(4096));
            for _ in 0..n {
                keys.push(c.str()?);
            }
            match store.wait(&keys, timeout, false).0 {
                WaitOutcome::Ready => vec![ST_OK],
                WaitOutcome::TimedOut { missing } => timeout_reply(&missing),
                WaitOutcome::Closed => return Ok(None),
            }
        }
        OP_ADD => {
            let delta = c.u64()? as i64;
            let key = c.str()?;
            match store.add(key, delta) {
                Ok(v) => {
                    let mut r = vec![ST_OK];
                    r.extend_from_slice(&v.to_le_bytes());
                    r
                }
                Err(AddError::Closed) => return Ok(None),
                Err(e) => {
                    let mut r = vec![ST_ERROR];
                    r.extend_from_slice(e.to_string().as_bytes());
                    r
                }
            }
        }
        other => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unknown op {other}"),
            ))
        }
    };
    Ok(Some(reply))
}

// ---------------------------------------------------------------- client --

struct Conn {
    stream: TcpStream,
    /// Why the connection is unusable (a failed exchange may leave a reply
    /// in flight, so the stream cannot be reused after one).
    broken: Option<String>,
}

/// A rank's connection to the [`TcpStoreServer`]; implements [`Store`].
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

/// The outcome of one connection attempt.
enum Attempt {
    /// Worth retrying until the deadline (refused, reset, ...).
    Retry(io::Error),
    /// Retrying cannot help (wrong secret, not an sncl store, ...).
    Fatal(Error),
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
    pub fn connect(
        addr: SocketAddr,
        secret: [u8; 16],
        rank: usize,
        deadline: Instant,
    ) -> Result<TcpStore> {
        let start = Instant::now();
        let mut backoff = Duration::from_millis(10);
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let last = match Self::connect_once(addr, &secret, rank, deadline) {
                Ok(s) => {
                    tracing::debug!(rank, root = %addr, local = %s.local, attempts, "connected to the sncl store");
                    return Ok(s);
                }
                Err(Attempt::Fatal(e)) => return Err(e),
                Err(Attempt::Retry(e)) => e,
            };
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(Error::Bootstrap {
                    rank,
                    detail: format!(
                        "cannot reach the sncl root at {addr} within {} ms: {} ({attempts} attempt(s)); \
                         is rank 0 running and is SNCL_ROOT right?",
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
    ) -> Result<TcpStore, Attempt> {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let connect_timeout = remaining.clamp(Duration::from_millis(10), Duration::from_secs(5));
        let mut stream = match TcpStream::connect_timeout(&addr, connect_timeout) {
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
        let hs_timeout = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_secs(1));
        stream
            .set_read_timeout(Some(hs_timeout))
            .and_then(|()| stream.set_write_timeout(Some(hs_timeout)))
            .map_err(|e| io_fatal("setting timeouts", e))?;

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
        let mut hello = [0u8; 8 + NONCE];
        if let Err(e) = stream.read_exact(&mut hello) {
            return Err(match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => not_sncl(format!(
                    "no sncl greeting within {} ms",
                    hs_timeout.as_millis()
                )),
                _ => Attempt::Retry(e),
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
        let mut proof = Vec::with_capacity(8 + 8 + NONCE + MAC);
        proof.extend_from_slice(MAGIC);
        proof.extend_from_slice(&(rank as u64).to_le_bytes());
        proof.extend_from_slice(&cnonce);
        proof.extend_from_slice(&client_mac(secret, snonce, &cnonce, rank as u64));
        stream.write_all(&proof).map_err(Attempt::Retry)?;
        // 3. verdict
        let mut status = [0u8; 1];
        stream.read_exact(&mut status).map_err(Attempt::Retry)?;
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
        stream.read_exact(&mut mac).map_err(Attempt::Retry)?;
        if !ct_eq(&mac, &server_mac(secret, snonce, &cnonce, rank as u64)) {
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
            conn.stream.set_read_timeout(Some(read_timeout))?;
            conn.stream.set_write_timeout(Some(self.io_timeout))?;
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
                let _ = conn.stream.shutdown(Shutdown::Both);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::store_barrier;
    use std::net::{Ipv4Addr, SocketAddrV4};

    const T: Duration = Duration::from_secs(20);
    const SECRET: [u8; 16] = *b"0123456789abcdef";

    fn loopback0() -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
    }

    fn deadline() -> Instant {
        Instant::now() + T
    }

    #[test]
    fn four_clients_barrier() {
        let server = TcpStoreServer::start(loopback0(), SECRET).unwrap();
        let addr = server.local_addr();
        let world = 4;
        let handles: Vec<_> = (0..world)
            .map(|r| {
                thread::spawn(move || {
                    let s = TcpStore::connect(addr, SECRET, r, deadline()).unwrap();
                    assert_eq!(s.local_ip(), IpAddr::V4(Ipv4Addr::LOCALHOST));
                    s.set(&format!("addr/{r}"), format!("10.0.0.{r}:1234").as_bytes())
                        .unwrap();
                    // Barrier: count arrivals, the last one releases everyone.
                    let n = s.add("arrived", 1).unwrap();
                    if n == world as i64 {
                        s.set("go", b"").unwrap();
                    }
                    s.wait(&["go"], T).unwrap();
                    for p in 0..world {
                        let v = s.try_get(&format!("addr/{p}")).unwrap().unwrap();
                        assert_eq!(v, format!("10.0.0.{p}:1234").as_bytes());
                    }
                    assert_eq!(s.get("arrived", T).unwrap(), b"4");
                    store_barrier(&s, "b1", world, T).unwrap();
                    let ps = crate::bootstrap::PrefixStore::new("c", &s);
                    ps.set("x", &[0u8; 100_000]).unwrap();
                    assert_eq!(ps.get("x", T).unwrap().len(), 100_000);
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(
            server.local_store().try_get("arrived").unwrap().unwrap(),
            b"4"
        );
    }

    #[test]
    fn get_blocks_until_set_and_times_out_naming_key() {
        let server = TcpStoreServer::start(loopback0(), SECRET).unwrap();
        let addr = server.local_addr();
        let a = TcpStore::connect(addr, SECRET, 1, deadline()).unwrap();
        let setter = thread::spawn(move || {
            let b = TcpStore::connect(addr, SECRET, 2, deadline()).unwrap();
            thread::sleep(Duration::from_millis(50));
            b.set("late", b"v").unwrap();
        });
        assert_eq!(a.get("late", T).unwrap(), b"v");
        setter.join().unwrap();
        assert_eq!(a.try_get("nope").unwrap(), None);
        let err = a
            .get("missing/key", Duration::from_millis(100))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("rank 1") && err.contains("'missing/key'"),
            "{err}"
        );
        let err = a
            .wait(&["late", "other"], Duration::from_millis(50))
            .unwrap_err()
            .to_string();
        assert!(err.contains("'other'") && !err.contains("'late'"), "{err}");
        a.set("str", b"abc").unwrap();
        let err = a.add("str", 1).unwrap_err().to_string();
        assert!(err.contains("'str'"), "{err}");
        // The connection is still usable after refused requests.
        assert_eq!(a.add("n", 5).unwrap(), 5);
    }

    #[test]
    fn wrong_secret_refused_and_server_keeps_serving() {
        let server = TcpStoreServer::start(loopback0(), SECRET).unwrap();
        let addr = server.local_addr();
        let t0 = Instant::now();
        let err = TcpStore::connect(addr, *b"fedcba9876543210", 3, deadline())
            .unwrap_err()
            .to_string();
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "wrong secret must fail fast"
        );
        assert!(err.contains("rank 3") && err.contains("secret"), "{err}");
        assert!(err.contains(&addr.to_string()), "{err}");
        // Garbage from a non-sncl client is refused too.
        {
            let mut junk = TcpStream::connect(addr).unwrap();
            junk.write_all(&[b'x'; 64]).unwrap();
            let mut buf = Vec::new();
            let _ = junk.read_to_end(&mut buf);
        }
        let good = TcpStore::connect(addr, SECRET, 0, deadline()).unwrap();
        good.set("k", b"v").unwrap();
        assert_eq!(good.get("k", T).unwrap(), b"v");
    }

    #[test]
    fn unreachable_root_fails_within_deadline() {
        // Grab a free port and close it again, so nothing listens there.
        let port = TcpListener::bind(loopback0())
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
        let t0 = Instant::now();
        let err = TcpStore::connect(addr, SECRET, 3, Instant::now() + Duration::from_millis(300))
            .unwrap_err()
            .to_string();
        let took = t0.elapsed();
        assert!(took >= Duration::from_millis(290), "{took:?}");
        assert!(took < Duration::from_secs(3), "{took:?}");
        assert!(err.contains("rank 3"), "{err}");
        assert!(
            err.contains(&format!(
                "cannot reach the sncl root at {addr} within 300 ms"
            )),
            "{err}"
        );
        assert!(err.contains("connection refused"), "{err}");
        assert!(err.contains("SNCL_ROOT"), "{err}");
    }

    #[test]
    fn connect_retries_until_root_starts() {
        let port = TcpListener::bind(loopback0())
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
        let client = thread::spawn(move || TcpStore::connect(addr, SECRET, 1, deadline()));
        thread::sleep(Duration::from_millis(200));
        let _server = TcpStoreServer::start(addr, SECRET).unwrap();
        let s = client.join().unwrap().unwrap();
        assert_eq!(s.add("x", 2).unwrap(), 2);
    }

    #[test]
    fn dead_server_is_an_error_not_a_hang() {
        let server = TcpStoreServer::start(loopback0(), SECRET).unwrap();
        let addr = server.local_addr();
        let s = TcpStore::connect(addr, SECRET, 2, deadline()).unwrap();
        let waiter = {
            let s2 = TcpStore::connect(addr, SECRET, 5, deadline()).unwrap();
            thread::spawn(move || s2.get("never", Duration::from_secs(3600)))
        };
        thread::sleep(Duration::from_millis(50));
        let t0 = Instant::now();
        drop(server);
        assert!(t0.elapsed() < Duration::from_secs(2), "drop must not hang");
        let err = waiter.join().unwrap().unwrap_err().to_string();
        assert!(err.contains("rank 5") && err.contains("'never'"), "{err}");
        let err = s.set("k", b"v").unwrap_err().to_string();
        assert!(
            err.contains("rank 2") && err.contains(&addr.to_string()),
            "{err}"
        );
        let err = s.try_get("k").unwrap_err().to_string();
        assert!(err.contains("lost earlier"), "{err}");
    }

    #[test]
    fn not_an_sncl_server() {
        // A listener that accepts but never greets (like torchrun's store).
        let l = TcpListener::bind(loopback0()).unwrap();
        let addr = l.local_addr().unwrap();
        let h = thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            thread::sleep(Duration::from_millis(1500));
            drop(s);
        });
        let err = TcpStore::connect(addr, SECRET, 1, Instant::now() + Duration::from_millis(200))
            .unwrap_err()
            .to_string();
        assert!(err.contains("not an sncl store"), "{err}");
        h.join().unwrap();
    }
}
