//! [`TcpStoreServer`]: the store rank 0 serves (and every rank's standby
//! store, see the root crate's shrink).
//!
//! Every server of a process runs on one event loop: a tokio current-thread
//! runtime on one thread (`sncl-store-loop`), started by the first server.
//! A connection is a task, not a thread, so neither strangers nor
//! thousands of authenticated ranks cost a thread each:
//!
//! * a new connection's handshake runs with one deadline for the whole
//!   handshake ([`HANDSHAKE_TIMEOUT`]); at most [`MAX_PENDING_HANDSHAKES`]
//!   are in their handshake at once, and a new one beyond that drops the
//!   oldest;
//! * an authenticated connection's task reads a request, answers it (a
//!   blocking GET or WAIT waits on the store without holding the thread)
//!   and reads the next.
//!
//! Dropping a server stops accepting, wakes every waiter, lets each
//! connection finish the reply it is writing (so a rank that was answered
//! gets its answer even when rank 0 leaves right after), and waits up to
//! [`DRAIN_TIMEOUT`] for that before cutting what is left.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use comm_core::throttle::LogThrottle;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio_rustls::TlsAcceptor;

use super::protocol::*;
use super::tls_stream;
use crate::store::{AddError, Shared, WaitOutcome};
use crate::tls::TlsIdentity;
use crate::MemoryStore;

/// Connections that may be in their handshake at the same time; a new one
/// beyond this drops the oldest.
pub const MAX_PENDING_HANDSHAKES: usize = 256;
/// How long a new connection has to complete the whole handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a dropped server lets its connections finish the replies they
/// are writing before it cuts them.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the server waits for a client to take a reply.
const SERVER_WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long closing a connection may spend on its last bytes (TLS's
/// close_notify).
const CLOSE_TIMEOUT: Duration = Duration::from_millis(200);
/// How often a stranger's refused connections are logged: one line per
/// source address per window, with the count held back.
pub const REFUSAL_LOG_WINDOW: Duration = Duration::from_secs(10);

/// The event loop every store server of this process runs on, started by
/// the first server (again in a forked child, whose copy of the loop has
/// no thread).
fn event_loop() -> io::Result<Handle> {
    static LOOP: Mutex<Option<(u32, Handle)>> = Mutex::new(None);
    let mut slot = lock(&LOOP);
    let pid = std::process::id();
    if let Some((owner, handle)) = slot.as_ref() {
        if *owner == pid {
            return Ok(handle.clone());
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()?;
    let handle = runtime.handle().clone();
    thread::Builder::new()
        .name(LOOP_THREAD.into())
        .spawn(move || runtime.block_on(std::future::pending::<()>()))?;
    *slot = Some((pid, handle.clone()));
    Ok(handle)
}

const LOOP_THREAD: &str = "sncl-store-loop";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every map here is left whole between statements.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The tasks of one server that are still running (its accept loop, its
/// handshakes, its connections): dropping the server waits for none left.
#[derive(Default)]
struct TaskCount {
    live: Mutex<usize>,
    ended: Condvar,
}

/// One running task; it counts as ended when this is dropped (also when
/// the task is aborted).
struct TaskGuard(Arc<ServerInner>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        *lock(&self.0.tasks.live) -= 1;
        self.0.tasks.ended.notify_all();
    }
}

impl TaskCount {
    /// Waits until no task is left, at most `limit`; whether none is.
    fn wait_idle(&self, limit: Duration) -> bool {
        let live = lock(&self.live);
        let (live, _) = self
            .ended
            .wait_timeout_while(live, limit, |n| *n > 0)
            .unwrap_or_else(PoisonError::into_inner);
        *live == 0
    }
}

struct ServerInner {
    shared: Arc<Shared>,
    secret: [u8; 16],
    /// Set when every connection must first complete a TLS handshake.
    tls: Option<TlsAcceptor>,
    local_addr: SocketAddr,
    /// Set to true when the server is dropped.
    shutdown: watch::Sender<bool>,
    /// Set once the accept loop has ended (shut down or expired).
    stopped: AtomicBool,
    /// When an unclaimed server stops by itself (see [`TcpStoreServer::start_unclaimed`]).
    expires: Mutex<Option<Instant>>,
    tasks: TaskCount,
    /// Connections in their handshake, oldest first.
    pending: Mutex<VecDeque<(u64, AbortHandle)>>,
    /// Authenticated connections.
    conns: Mutex<HashMap<u64, AbortHandle>>,
    refusals: Mutex<LogThrottle<(IpAddr, &'static str)>>,
    next_conn: AtomicU64,
    /// The process that started the server (its loop's owner).
    pid: u32,
}

impl ServerInner {
    fn task(self: &Arc<Self>) -> TaskGuard {
        *lock(&self.tasks.live) += 1;
        TaskGuard(Arc::clone(self))
    }

    fn shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }
}

/// The rendezvous store server rank 0 runs (like c10d's `TCPStore` master).
///
/// Every connection must first prove it knows the job secret (see the
/// module docs of [`crate`]'s store protocol), inside a mutually
/// authenticated TLS channel when the server was started with a
/// [`TlsIdentity`] ([`Self::start_tls`]); a connection that
/// does not is refused, logged with `tracing::warn!` naming its address,
/// and the server keeps serving the others. Dropping the server stops it:
/// waiters are woken, replies being written are finished, connections are
/// closed.
pub struct TcpStoreServer {
    inner: Arc<ServerInner>,
}

impl std::fmt::Debug for TcpStoreServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpStoreServer")
            .field("local_addr", &self.inner.local_addr)
            .finish_non_exhaustive()
    }
}

impl TcpStoreServer {
    /// Binds `bind` (port 0 picks a free port; see [`Self::local_addr`]) and
    /// starts serving clients that know `secret`. Bind the address the
    /// ranks connect to, not the unspecified address: the store should be
    /// reachable only where the job expects it.
    pub fn start(bind: SocketAddr, secret: [u8; 16]) -> io::Result<TcpStoreServer> {
        Self::start_tls(bind, secret, None)
    }

    /// Like [`Self::start`], over TLS when `tls` is given: every connection
    /// first completes a mutually authenticated TLS 1.3 handshake (a client
    /// certificate from one of `tls`'s authorities is required, see
    /// [`crate::tls`]) within [`HANDSHAKE_TIMEOUT`], then the store's
    /// handshake and requests run inside it. A failed TLS handshake is
    /// logged as a warning naming the peer and the reason, and dropped.
    pub fn start_tls(
        bind: SocketAddr,
        secret: [u8; 16],
        tls: Option<TlsIdentity>,
    ) -> io::Result<TcpStoreServer> {
        Self::start_inner(bind, secret, None, tls)
    }

    /// Like [`Self::start`], for a store started ahead of its communicator
    /// (a unique id made with port 0): unless [`Self::claim`] is called
    /// within `expire_after`, the server stops by itself and frees its port.
    pub fn start_unclaimed(
        bind: SocketAddr,
        secret: [u8; 16],
        expire_after: Duration,
    ) -> io::Result<TcpStoreServer> {
        Self::start_unclaimed_tls(bind, secret, expire_after, None)
    }

    /// [`Self::start_unclaimed`], over TLS when `tls` is given (see
    /// [`Self::start_tls`]).
    pub fn start_unclaimed_tls(
        bind: SocketAddr,
        secret: [u8; 16],
        expire_after: Duration,
        tls: Option<TlsIdentity>,
    ) -> io::Result<TcpStoreServer> {
        Self::start_inner(bind, secret, Some(Instant::now() + expire_after), tls)
    }

    fn start_inner(
        bind: SocketAddr,
        secret: [u8; 16],
        expires: Option<Instant>,
        tls: Option<TlsIdentity>,
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
        Self::serve(socket.into(), secret, expires, tls)
    }

    /// Serves a store on a socket that already listens (for instance one
    /// opened ahead of time so that its address could be published before
    /// the store was needed). Connections waiting in its backlog are
    /// served.
    pub fn from_listener(listener: TcpListener, secret: [u8; 16]) -> io::Result<TcpStoreServer> {
        Self::from_listener_tls(listener, secret, None)
    }

    /// [`Self::from_listener`], over TLS when `tls` is given (see
    /// [`Self::start_tls`]).
    pub fn from_listener_tls(
        listener: TcpListener,
        secret: [u8; 16],
        tls: Option<TlsIdentity>,
    ) -> io::Result<TcpStoreServer> {
        Self::serve(listener, secret, None, tls)
    }

    fn serve(
        listener: TcpListener,
        secret: [u8; 16],
        expires: Option<Instant>,
        tls: Option<TlsIdentity>,
    ) -> io::Result<TcpStoreServer> {
        listener.set_nonblocking(true)?;
        let local_addr = listener.local_addr()?;
        let handle = event_loop()?;
        let listener = {
            let _in_loop = handle.enter();
            tokio::net::TcpListener::from_std(listener)?
        };
        let inner = Arc::new(ServerInner {
            shared: Arc::new(Shared::default()),
            secret,
            tls: tls.map(|t| TlsAcceptor::from(t.server_config())),
            local_addr,
            shutdown: watch::channel(false).0,
            stopped: AtomicBool::new(false),
            expires: Mutex::new(expires),
            tasks: TaskCount::default(),
            pending: Mutex::new(VecDeque::new()),
            conns: Mutex::new(HashMap::new()),
            refusals: Mutex::new(LogThrottle::new(REFUSAL_LOG_WINDOW)),
            next_conn: AtomicU64::new(0),
            pid: std::process::id(),
        });
        let guard = inner.task();
        handle.spawn(accept_loop(listener, Arc::clone(&inner), guard));
        tracing::debug!(%local_addr, tls = inner.tls.is_some(), "sncl store server listening");
        Ok(TcpStoreServer { inner })
    }

    /// Keeps a server made by [`Self::start_unclaimed`] running for good.
    /// Returns false when it already stopped (its time ran out).
    pub fn claim(&self) -> bool {
        *lock(&self.inner.expires) = None;
        !self.inner.stopped.load(Ordering::SeqCst)
    }

    /// Whether the server still accepts connections.
    pub fn is_serving(&self) -> bool {
        !self.inner.stopped.load(Ordering::SeqCst)
    }

    /// The address the server listens on (with the real port when bound to
    /// port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr
    }

    /// An in-process handle to the server's map (errors name rank 0). It
    /// is closed when the server is dropped.
    pub fn local_store(&self) -> MemoryStore {
        MemoryStore::from_shared(Arc::clone(&self.inner.shared), 0)
    }
}

impl Drop for TcpStoreServer {
    fn drop(&mut self) {
        let inner = &self.inner;
        {
            let mut pending = lock(&inner.pending);
            inner.shutdown.send_replace(true);
            for (_, handshake) in pending.drain(..) {
                handshake.abort();
            }
        }
        inner.shared.close();
        // The loop's own thread cannot wait for its tasks, and a forked
        // child has no loop thread to run them.
        let can_wait =
            thread::current().name() != Some(LOOP_THREAD) && std::process::id() == inner.pid;
        if can_wait && !inner.tasks.wait_idle(DRAIN_TIMEOUT) {
            tracing::debug!(
                local_addr = %inner.local_addr,
                "sncl store: connections still busy {} ms after the server was dropped; cutting them",
                DRAIN_TIMEOUT.as_millis()
            );
            for conn in lock(&inner.conns).values() {
                conn.abort();
            }
            inner.tasks.wait_idle(Duration::from_secs(1));
        }
        tracing::debug!(local_addr = %inner.local_addr, "sncl store server stopped");
    }
}

/// Resolves once the server is shutting down (at once if it already is).
async fn shut_down(mut shutdown: watch::Receiver<bool>) {
    // An error means the sender is gone: the server is gone too.
    let _ = shutdown.wait_for(|down| *down).await;
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    inner: Arc<ServerInner>,
    _running: TaskGuard,
) {
    let shutdown = shut_down(inner.shutdown.subscribe());
    tokio::pin!(shutdown);
    loop {
        let expires = *lock(&inner.expires);
        let expiry = async move {
            match expires {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut shutdown => break,
            _ = expiry => {
                // A claim may have come meanwhile.
                if lock(&inner.expires).is_some_and(|at| Instant::now() >= at) {
                    tracing::info!(
                        "sncl store: no rank 0 took this unique id's store in time; stopped it (port {} is free again)",
                        inner.local_addr.port()
                    );
                    break;
                }
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => start_handshake(&inner, stream, peer),
                Err(e) => {
                    // E.g. out of file descriptors: keep serving the others.
                    tracing::warn!("sncl store: accept failed: {e}; retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    inner.stopped.store(true, Ordering::SeqCst);
}

/// Starts the handshake of a new connection as a task of its own, making
/// room by dropping the oldest pending one when the bound is reached.
fn start_handshake(inner: &Arc<ServerInner>, stream: TcpStream, peer: SocketAddr) {
    // Under the lock Drop drains `pending` with, so a handshake either
    // sees the shutdown or is drained.
    let mut pending = lock(&inner.pending);
    if inner.shutting_down() {
        return;
    }
    let id = inner.next_conn.fetch_add(1, Ordering::Relaxed);
    let running = inner.task();
    let task = tokio::spawn(connection(Arc::clone(inner), stream, peer, id, running));
    if pending.len() >= MAX_PENDING_HANDSHAKES {
        if let Some((_, oldest)) = pending.pop_front() {
            oldest.abort();
            tracing::debug!(
                "sncl store: {MAX_PENDING_HANDSHAKES} handshakes pending; dropped the oldest"
            );
        }
    }
    // The task cannot have run yet (this is the loop's thread), so it will
    // find itself here when it ends its handshake.
    pending.push_back((id, task.abort_handle()));
}

/// Why the server refused a connection.
enum Refusal {
    /// The TLS handshake failed.
    Tls(io::Error),
    NotSncl,
    WrongSecret(u64),
    Closed(usize),
    Io(io::Error),
    TimedOut,
}

/// One connection: its TLS handshake (with TLS), its store handshake,
/// then (authenticated) its requests. Both handshakes together have
/// [`HANDSHAKE_TIMEOUT`].
async fn connection(
    inner: Arc<ServerInner>,
    stream: TcpStream,
    peer: SocketAddr,
    id: u64,
    _running: TaskGuard,
) {
    let deadline = tokio::time::Instant::now() + HANDSHAKE_TIMEOUT;
    if let Err(e) = stream.set_nodelay(true) {
        return refuse(&inner, peer, id, Refusal::Io(e));
    }
    let Some(acceptor) = inner.tls.clone() else {
        return authenticate(&inner, stream, peer, id, deadline).await;
    };
    match tokio::time::timeout_at(deadline, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => authenticate(&inner, tls, peer, id, deadline).await,
        Ok(Err(e)) => refuse(&inner, peer, id, Refusal::Tls(e)),
        Err(_) => refuse(&inner, peer, id, Refusal::TimedOut),
    }
}

/// The store handshake over `stream` (plain or TLS) by `deadline`, then
/// the requests of the authenticated connection.
async fn authenticate<S: AsyncRead + AsyncWrite + Unpin>(
    inner: &Arc<ServerInner>,
    mut stream: S,
    peer: SocketAddr,
    id: u64,
    deadline: tokio::time::Instant,
) {
    let verdict = tokio::time::timeout_at(deadline, handshake(&mut stream, &inner.secret))
        .await
        .unwrap_or(Err(Refusal::TimedOut));
    let Some(abort) = take_pending(inner, id) else {
        // Dropped to make room, or the server is shutting down.
        return;
    };
    match verdict {
        Ok(rank) => {
            lock(&inner.conns).insert(id, abort);
            serve_conn(inner, &mut stream, peer, rank).await;
            lock(&inner.conns).remove(&id);
            // TLS's close_notify (a plain stream's FIN), best effort.
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, stream.shutdown()).await;
        }
        Err(why) => log_refusal(inner, peer, why),
    }
}

/// Ends connection `id`'s handshake with a refusal (logged unless the
/// connection was dropped to make room or the server is shutting down).
fn refuse(inner: &ServerInner, peer: SocketAddr, id: u64, why: Refusal) {
    if take_pending(inner, id).is_some() {
        log_refusal(inner, peer, why);
    }
}

/// Removes connection `id` from the pending handshakes, if it is still
/// there.
fn take_pending(inner: &ServerInner, id: u64) -> Option<AbortHandle> {
    let mut pending = lock(&inner.pending);
    let at = pending.iter().position(|(p, _)| *p == id)?;
    pending.remove(at).map(|(_, abort)| abort)
}

/// The server's side of the handshake; the client's rank once it proved
/// it knows the secret.
async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    secret: &[u8; 16],
) -> Result<u64, Refusal> {
    let snonce = nonce().map_err(Refusal::Io)?;
    let mut greeting = [0u8; GREETING_BYTES];
    greeting[..8].copy_from_slice(MAGIC);
    greeting[8..].copy_from_slice(&snonce);
    stream.write_all(&greeting).await.map_err(Refusal::Io)?;
    stream.flush().await.map_err(Refusal::Io)?;
    let mut proof = [0u8; PROOF_BYTES];
    let mut got = 0;
    while got < PROOF_BYTES {
        match stream.read(&mut proof[got..]).await {
            Ok(0) => return Err(Refusal::Closed(got)),
            Ok(n) => got += n,
            Err(e) => return Err(Refusal::Io(e)),
        }
        // Refuse a stranger as soon as its first bytes show it is one.
        let magic = got.min(8);
        if proof[..magic] != MAGIC[..magic] {
            return Err(Refusal::NotSncl);
        }
    }
    let rank = u64::from_le_bytes(proof[8..16].try_into().expect("8 bytes"));
    let cnonce = &proof[16..16 + NONCE];
    let mac = &proof[16 + NONCE..];
    if !client_mac_valid(secret, &snonce, cnonce, rank, mac) {
        if stream.write_all(&[AUTH_REFUSED]).await.is_ok() {
            let _ = stream.flush().await;
        }
        return Err(Refusal::WrongSecret(rank));
    }
    let mut ok = [0u8; 1 + MAC];
    ok[0] = AUTH_OK;
    ok[1..].copy_from_slice(&server_mac(secret, &snonce, cnonce, rank));
    stream.write_all(&ok).await.map_err(Refusal::Io)?;
    stream.flush().await.map_err(Refusal::Io)?;
    Ok(rank)
}

fn log_refusal(inner: &ServerInner, peer: SocketAddr, refusal: Refusal) {
    let warn = |kind: &'static str, what: String| {
        let admitted =
            lock(&inner.refusals).admit_note((peer.ip(), kind), peer.ip(), Instant::now());
        if let Some(more) = admitted {
            tracing::warn!(%peer, "sncl store: refused connection from {peer}: {what}{more}");
        }
    };
    match refusal {
        Refusal::Tls(e) => match tls_stream::server_failure(&e) {
            Some(why) => warn("tls", format!("its TLS handshake failed: {why}")),
            None => tracing::debug!(
                %peer,
                "sncl store: TLS handshake with {peer} failed: {e} (a client without \
                 SNCL_TLS_* settings closes its connection when it gets no greeting)"
            ),
        },
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
        Refusal::TimedOut => tracing::debug!(
            %peer,
            "sncl store: {peer} did not complete its handshake within {} ms; dropped",
            HANDSHAKE_TIMEOUT.as_millis()
        ),
    }
}

async fn serve_conn<S: AsyncRead + AsyncWrite + Unpin>(
    inner: &ServerInner,
    stream: &mut S,
    peer: SocketAddr,
    rank: u64,
) {
    tracing::debug!(%peer, rank, "sncl store: rank connected");
    let shutdown = shut_down(inner.shutdown.subscribe());
    tokio::pin!(shutdown);
    loop {
        let frame = tokio::select! {
            // A request not yet read when the server stops is not served.
            _ = &mut shutdown => break,
            frame = read_frame_async(stream) => frame,
        };
        let frame = match frame {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(%peer, rank, "sncl store: connection of rank {rank} ended: {e}");
                break;
            }
        };
        let reply = match handle_request(&inner.shared, &frame).await {
            Ok(Some(r)) => r,
            // The store was closed: the server is shutting down.
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(%peer, rank, "sncl store: malformed request from rank {rank} at {peer}: {e}; closing its connection");
                break;
            }
        };
        match tokio::time::timeout(SERVER_WRITE_TIMEOUT, write_frame_async(stream, &reply)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::debug!(%peer, rank, "sncl store: cannot reply to rank {rank}: {e}");
                break;
            }
            Err(_) => {
                tracing::debug!(%peer, rank, "sncl store: rank {rank} did not take its reply within {} s", SERVER_WRITE_TIMEOUT.as_secs());
                break;
            }
        }
    }
}

/// [`read_frame`] on the event loop: `Ok(None)` on a clean end of stream
/// before a frame (for TLS also one without close_notify: a rank's store
/// dropped without closing); the body grows with the bytes that actually
/// arrive.
async fn read_frame_async<S: AsyncRead + Unpin>(stream: &mut S) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match stream.read(&mut len[got..]).await {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if got == 0 && e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
    }
    let len = frame_len(len)?;
    let mut body = Vec::with_capacity(len.min(64 << 10));
    (&mut *stream)
        .take(len as u64)
        .read_to_end(&mut body)
        .await?;
    check_body(&body, len)?;
    Ok(Some(body))
}

/// [`write_frame`] on the event loop (flushed: a TLS stream holds what
/// it could not send at once).
async fn write_frame_async<S: AsyncWrite + Unpin>(stream: &mut S, body: &[u8]) -> io::Result<()> {
    stream.write_all(&frame_bytes(body)?).await?;
    stream.flush().await
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
/// see `fuzz/`), run to completion on this thread. The caller keeps the
/// GET / WAIT timeouts small: they are honoured, as for a real client.
pub(super) fn handle_request_fresh(frame: &[u8]) -> io::Result<Option<Vec<u8>>> {
    thread_local! {
        static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a current-thread runtime without I/O builds");
    }
    let shared = Shared::default();
    RUNTIME.with(|rt| rt.block_on(handle_request(&shared, frame)))
}

/// Executes one request; `Ok(None)` when the store is closed.
async fn handle_request(store: &Shared, frame: &[u8]) -> io::Result<Option<Vec<u8>>> {
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
            match store.wait_async(&[key], timeout, true).await {
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
            match store.wait_async(&keys, timeout, false).await.0 {
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
