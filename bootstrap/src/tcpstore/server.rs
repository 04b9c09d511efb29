//! [`TcpStoreServer`]: the store rank 0 serves.
//!
//! One thread accepts connections and runs every handshake: new sockets are
//! non-blocking and polled together, at most [`MAX_PENDING_HANDSHAKES`] at a
//! time (the oldest is dropped to make room), each with one deadline for the
//! whole handshake ([`HANDSHAKE_TIMEOUT`]). Only a connection that proved it
//! knows the secret gets a thread of its own to serve its requests, so idle
//! or trickling strangers cost a socket each and nothing more.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use comm_core::throttle::LogThrottle;
use rustix::event::{poll, PollFd, PollFlags, Timespec};

use super::protocol::*;
use crate::store::{AddError, Shared, WaitOutcome};
use crate::MemoryStore;

/// Connections that may be in their handshake at the same time; a new one
/// beyond this drops the oldest.
pub const MAX_PENDING_HANDSHAKES: usize = 256;
/// How long a new connection has to complete the whole handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the server waits for a client to take a reply.
const SERVER_WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// Connections accepted per wake-up before pending handshakes get a turn.
const ACCEPT_BURST: usize = 64;

struct ServerInner {
    shared: Arc<Shared>,
    secret: [u8; 16],
    shutdown: AtomicBool,
    /// Set once the accept thread has ended (shut down or expired).
    stopped: AtomicBool,
    /// When an unclaimed server stops by itself (see [`TcpStoreServer::start_unclaimed`]).
    expires: Mutex<Option<Instant>>,
    /// Clones of the authenticated connections' streams (to shut them down
    /// on drop), by connection number; a connection removes its own when it
    /// ends, so its socket closes at once.
    streams: Mutex<HashMap<u64, TcpStream>>,
    /// The connections' threads, joined on drop.
    threads: Mutex<Vec<JoinHandle<()>>>,
    next_conn: AtomicU64,
}

/// The rendezvous store server rank 0 runs (like c10d's `TCPStore` master).
///
/// Every connection must first prove it knows the job secret (see the
/// module docs of [`crate`]'s store protocol); a connection that
/// does not is refused, logged with `tracing::warn!` naming its address,
/// and the server keeps serving the others. Dropping the server stops it:
/// waiters are woken, connections are shut down and all threads are joined.
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
    /// starts serving clients that know `secret`. Bind the address the
    /// ranks connect to, not the unspecified address: the store should be
    /// reachable only where the job expects it.
    pub fn start(bind: SocketAddr, secret: [u8; 16]) -> io::Result<TcpStoreServer> {
        Self::start_inner(bind, secret, None)
    }

    /// Like [`Self::start`], for a store started ahead of its communicator
    /// (a unique id made with port 0): unless [`Self::claim`] is called
    /// within `expire_after`, the server stops by itself and frees its port
    /// and thread.
    pub fn start_unclaimed(
        bind: SocketAddr,
        secret: [u8; 16],
        expire_after: Duration,
    ) -> io::Result<TcpStoreServer> {
        Self::start_inner(bind, secret, Some(Instant::now() + expire_after))
    }

    fn start_inner(
        bind: SocketAddr,
        secret: [u8; 16],
        expires: Option<Instant>,
    ) -> io::Result<TcpStoreServer> {
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(bind),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )?;
        socket.set_reuse_address(true)?;
        if bind.is_ipv6() {
            // An IPv6 root serves IPv6 only, exactly the address it names.
            socket.set_only_v6(true)?;
        }
        socket.bind(&bind.into())?;
        // Thousands of ranks may connect at once; the kernel caps this at
        // net.core.somaxconn.
        socket.listen(4096)?;
        Self::serve(socket.into(), secret, expires)
    }

    /// Serves a store on a socket that already listens (for instance one
    /// opened ahead of time so that its address could be published before
    /// the store was needed). Connections waiting in its backlog are
    /// served.
    pub fn from_listener(listener: TcpListener, secret: [u8; 16]) -> io::Result<TcpStoreServer> {
        Self::serve(listener, secret, None)
    }

    fn serve(
        listener: TcpListener,
        secret: [u8; 16],
        expires: Option<Instant>,
    ) -> io::Result<TcpStoreServer> {
        listener.set_nonblocking(true)?;
        let local_addr = listener.local_addr()?;
        let inner = Arc::new(ServerInner {
            shared: Arc::new(Shared::default()),
            secret,
            shutdown: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            expires: Mutex::new(expires),
            streams: Mutex::new(HashMap::new()),
            threads: Mutex::new(Vec::new()),
            next_conn: AtomicU64::new(0),
        });
        let accept_inner = Arc::clone(&inner);
        let accept = thread::Builder::new()
            .name("sncl-store-accept".into())
            .spawn(move || {
                accept_loop(&listener, &accept_inner);
                accept_inner.stopped.store(true, Ordering::SeqCst);
            })?;
        tracing::debug!(%local_addr, "sncl store server listening");
        Ok(TcpStoreServer {
            local_addr,
            inner,
            accept: Some(accept),
        })
    }

    /// Keeps a server made by [`Self::start_unclaimed`] running for good.
    /// Returns false when it already stopped (its time ran out).
    pub fn claim(&self) -> bool {
        *self
            .inner
            .expires
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
        !self.inner.stopped.load(Ordering::SeqCst)
    }

    /// Whether the server still accepts connections.
    pub fn is_serving(&self) -> bool {
        !self.inner.stopped.load(Ordering::SeqCst)
    }

    /// The address the server listens on (with the real port when bound to
    /// port 0).
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
        if !self.inner.stopped.load(Ordering::SeqCst) {
            // Wake the accept thread out of poll with a connection of our own.
            let mut wake = self.local_addr;
            if wake.ip().is_unspecified() {
                wake.set_ip(match wake {
                    SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                    SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
                });
            }
            let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
        }
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        for stream in lock(&self.inner.streams).values() {
            let _ = stream.shutdown(Shutdown::Both);
        }
        let threads = std::mem::take(&mut *lock(&self.inner.threads));
        for h in threads {
            let _ = h.join();
        }
        lock(&self.inner.streams).clear();
        tracing::debug!(local_addr = %self.local_addr, "sncl store server stopped");
    }
}

/// A connection in its handshake: the greeting went out, the proof is
/// being read.
struct Pending {
    stream: TcpStream,
    peer: SocketAddr,
    deadline: Instant,
    snonce: [u8; NONCE],
    proof: [u8; PROOF_BYTES],
    got: usize,
}

/// Why the server refused a connection.
enum Refusal {
    NotSncl,
    WrongSecret(u64),
    Closed(usize),
    Io(io::Error),
}

enum Progress {
    Wait,
    Authenticated(u64),
    Refused(Refusal),
}

impl Pending {
    fn start(stream: TcpStream, peer: SocketAddr) -> io::Result<Pending> {
        stream.set_nonblocking(true)?;
        stream.set_nodelay(true)?;
        let snonce = nonce()?;
        let mut greeting = [0u8; GREETING_BYTES];
        greeting[..8].copy_from_slice(MAGIC);
        greeting[8..].copy_from_slice(&snonce);
        // A new socket's send buffer is empty: the greeting goes at once.
        if (&stream).write(&greeting)? != GREETING_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "the greeting did not fit the socket buffer",
            ));
        }
        Ok(Pending {
            stream,
            peer,
            deadline: Instant::now() + HANDSHAKE_TIMEOUT,
            snonce,
            proof: [0u8; PROOF_BYTES],
            got: 0,
        })
    }

    fn progress(&mut self, secret: &[u8; 16]) -> Progress {
        while self.got < PROOF_BYTES {
            match (&self.stream).read(&mut self.proof[self.got..]) {
                Ok(0) => return Progress::Refused(Refusal::Closed(self.got)),
                Ok(n) => self.got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Progress::Refused(Refusal::Io(e)),
            }
            let magic = self.got.min(8);
            if self.proof[..magic] != MAGIC[..magic] {
                return Progress::Refused(Refusal::NotSncl);
            }
        }
        if self.got < PROOF_BYTES {
            return Progress::Wait;
        }
        let rank = u64::from_le_bytes(self.proof[8..16].try_into().expect("8 bytes"));
        let cnonce = &self.proof[16..16 + NONCE];
        let mac = &self.proof[16 + NONCE..];
        if !client_mac_valid(secret, &self.snonce, cnonce, rank, mac) {
            let _ = (&self.stream).write(&[AUTH_REFUSED]);
            return Progress::Refused(Refusal::WrongSecret(rank));
        }
        let mut ok = [0u8; 1 + MAC];
        ok[0] = AUTH_OK;
        ok[1..].copy_from_slice(&server_mac(secret, &self.snonce, cnonce, rank));
        match (&self.stream).write(&ok) {
            Ok(n) if n == ok.len() => Progress::Authenticated(rank),
            Ok(_) => Progress::Refused(Refusal::Io(io::Error::new(
                io::ErrorKind::WouldBlock,
                "the verdict did not fit the socket buffer",
            ))),
            Err(e) => Progress::Refused(Refusal::Io(e)),
        }
    }
}

/// How often a stranger's refused connections are logged: one line per
/// source address per window, with the count held back.
pub const REFUSAL_LOG_WINDOW: Duration = Duration::from_secs(10);

fn log_refusal(
    peer: SocketAddr,
    refusal: Refusal,
    throttle: &mut LogThrottle<(IpAddr, &'static str)>,
) {
    let mut warn = |kind: &'static str, what: String| {
        if let Some(more) = throttle.admit_note((peer.ip(), kind), peer.ip(), Instant::now()) {
            tracing::warn!(%peer, "sncl store: refused connection from {peer}: {what}{more}");
        }
    };
    match refusal {
        Refusal::NotSncl => warn(
            "protocol",
            "it did not speak the sncl store protocol".into(),
        ),
        Refusal::WrongSecret(r) => warn(
            "secret",
            format!(
                "it (claiming rank {r}) does not know this job's secret; it belongs to another \
                 job or was given a different unique id / SNCL_SECRET"
            ),
        ),
        Refusal::Closed(got) => tracing::debug!(
            %peer,
            "sncl store: {peer} closed its connection after {got} of {PROOF_BYTES} handshake bytes"
        ),
        Refusal::Io(e) => {
            tracing::debug!(%peer, "sncl store: handshake with {peer} failed: {e}")
        }
    }
}

fn timespec(d: Duration) -> Timespec {
    Timespec::try_from(d).unwrap_or(Timespec {
        tv_sec: i64::MAX,
        tv_nsec: 0,
    })
}

fn accept_loop(listener: &TcpListener, inner: &Arc<ServerInner>) {
    let mut pending: VecDeque<Pending> = VecDeque::new();
    let mut refusals = LogThrottle::new(REFUSAL_LOG_WINDOW);
    while !inner.shutdown.load(Ordering::SeqCst) {
        let now = Instant::now();
        pending.retain(|p| {
            let alive = now < p.deadline;
            if !alive {
                tracing::debug!(
                    peer = %p.peer,
                    "sncl store: {} did not complete its handshake within {} ms; dropped",
                    p.peer,
                    HANDSHAKE_TIMEOUT.as_millis()
                );
            }
            alive
        });
        let expires = *inner.expires.lock().unwrap_or_else(PoisonError::into_inner);
        if expires.is_some_and(|e| now >= e) {
            tracing::info!(
                "sncl store: no rank 0 took this unique id's store in time; stopped it (port {} is free again)",
                listener.local_addr().map(|a| a.port()).unwrap_or(0)
            );
            return;
        }
        let wake_at = pending.iter().map(|p| p.deadline).chain(expires).min();
        let timeout = wake_at.map(|t| timespec(t.saturating_duration_since(now)));
        let mut fds = Vec::with_capacity(1 + pending.len());
        fds.push(PollFd::new(listener, PollFlags::IN));
        fds.extend(
            pending
                .iter()
                .map(|p| PollFd::new(&p.stream, PollFlags::IN)),
        );
        if let Err(e) = poll(&mut fds, timeout.as_ref()) {
            if e != rustix::io::Errno::INTR {
                tracing::warn!("sncl store: poll failed: {e}; retrying");
                thread::sleep(Duration::from_millis(50));
            }
            continue;
        }
        let listener_ready = !fds[0].revents().is_empty();
        let ready: Vec<bool> = fds[1..].iter().map(|f| !f.revents().is_empty()).collect();
        drop(fds);
        if inner.shutdown.load(Ordering::SeqCst) {
            break;
        }
        for i in (0..ready.len()).rev() {
            if !ready[i] {
                continue;
            }
            match pending[i].progress(&inner.secret) {
                Progress::Wait => {}
                Progress::Authenticated(rank) => {
                    let p = pending.remove(i).expect("index in range");
                    if let Err(e) = spawn_conn(inner, p.stream, p.peer, rank) {
                        tracing::warn!(peer = %p.peer, "sncl store: dropping the connection of rank {rank} from {}: cannot start its thread: {e}", p.peer);
                    }
                }
                Progress::Refused(why) => {
                    let p = pending.remove(i).expect("index in range");
                    log_refusal(p.peer, why, &mut refusals);
                }
            }
        }
        if listener_ready {
            accept_burst(listener, inner, &mut pending);
        }
    }
}

fn accept_burst(listener: &TcpListener, inner: &ServerInner, pending: &mut VecDeque<Pending>) {
    for _ in 0..ACCEPT_BURST {
        match listener.accept() {
            Ok(_) if inner.shutdown.load(Ordering::SeqCst) => return,
            Ok((stream, peer)) => {
                if pending.len() >= MAX_PENDING_HANDSHAKES {
                    if let Some(old) = pending.pop_front() {
                        tracing::debug!(
                            peer = %old.peer,
                            "sncl store: {MAX_PENDING_HANDSHAKES} handshakes pending; dropped the oldest, from {}",
                            old.peer
                        );
                    }
                }
                match Pending::start(stream, peer) {
                    Ok(p) => pending.push_back(p),
                    Err(e) => tracing::debug!(%peer, "sncl store: cannot greet {peer}: {e}"),
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                // E.g. out of file descriptors: keep serving the others.
                tracing::warn!("sncl store: accept failed: {e}; retrying");
                thread::sleep(Duration::from_millis(50));
                return;
            }
        }
    }
}

fn spawn_conn(
    inner: &Arc<ServerInner>,
    stream: TcpStream,
    peer: SocketAddr,
    rank: u64,
) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(Some(SERVER_WRITE_TIMEOUT))?;
    let keep = stream.try_clone()?;
    let id = inner.next_conn.fetch_add(1, Ordering::Relaxed);
    lock(&inner.streams).insert(id, keep);
    let conn_inner = Arc::clone(inner);
    let spawned = thread::Builder::new()
        .name(format!("sncl-store-r{rank}"))
        .stack_size(256 * 1024)
        .spawn(move || {
            serve_conn(&conn_inner, stream, peer, rank);
            lock(&conn_inner.streams).remove(&id);
        });
    let handle = match spawned {
        Ok(h) => h,
        Err(e) => {
            lock(&inner.streams).remove(&id);
            return Err(e);
        }
    };
    let mut threads = lock(&inner.threads);
    // Forget connections that already ended.
    threads.retain(|h| !h.is_finished());
    threads.push(handle);
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn serve_conn(inner: &ServerInner, mut stream: TcpStream, peer: SocketAddr, rank: u64) {
    tracing::debug!(%peer, rank, "sncl store: rank connected");
    loop {
        let frame = match read_frame(&mut stream) {
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
        if let Err(e) = write_frame(&mut stream, &reply) {
            tracing::debug!(%peer, rank, "sncl store: cannot reply to rank {rank}: {e}");
            break;
        }
    }
    // The server keeps a clone of the stream (to shut it down on drop), so
    // dropping ours would not close the connection: shut it down explicitly.
    let _ = stream.shutdown(Shutdown::Both);
}

fn timeout_reply(missing: &[String]) -> Vec<u8> {
    let mut r = vec![ST_TIMEOUT];
    r.extend_from_slice(&(missing.len() as u32).to_le_bytes());
    for k in missing {
        put_str(&mut r, k);
    }
    r
}

fn value_reply(v: &[u8]) -> Vec<u8> {
    let mut r = Vec::with_capacity(1 + v.len());
    r.push(ST_OK);
    r.extend_from_slice(v);
    r
}

/// [`handle_request`] on a fresh, empty store (the fuzz targets' entry,
/// see `fuzz/`). The caller keeps the GET / WAIT timeouts small: they are
/// honoured, as for a real client.
pub(super) fn handle_request_fresh(frame: &[u8]) -> io::Result<Option<Vec<u8>>> {
    let inner = ServerInner {
        shared: Arc::new(Shared::default()),
        secret: [0; 16],
        shutdown: AtomicBool::new(false),
        stopped: AtomicBool::new(false),
        expires: Mutex::new(None),
        streams: Mutex::new(HashMap::new()),
        threads: Mutex::new(Vec::new()),
        next_conn: AtomicU64::new(0),
    };
    handle_request(&inner, frame)
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
                (WaitOutcome::Ready, Some(v)) => value_reply(&v),
                (WaitOutcome::TimedOut { missing }, _) => timeout_reply(&missing),
                _ => return Ok(None),
            }
        }
        OP_TRY_GET => {
            let key = c.str()?;
            match store.try_get(key) {
                Ok(Some(v)) => value_reply(&v),
                Ok(None) => vec![ST_MISSING],
                Err(()) => return Ok(None),
            }
        }
        OP_WAIT => {
            let timeout = Duration::from_millis(c.u64()?);
            let n = c.u32()? as usize;
            // Each key takes at least its 4-byte length: bound n by the frame.
            let mut keys = Vec::with_capacity(n.min(frame.len() / 4));
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
