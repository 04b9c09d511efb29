//! Connection setup: [`TcpEndpoint`] listens, [`TcpEndpoint::establish`]
//! connects every pair of ranks with `nsocks` authenticated sockets.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use comm_core::Error;
use socket2::{Domain, Protocol, Socket, Type};

use crate::conn::TcpConnection;
use crate::frame::{self, Hello, ACK_BYTES, HELLO_BYTES, PROTOCOL_VERSION};
use crate::sys::{self, PollFd};

/// Requested size of every socket's kernel send and receive buffer. Applied
/// only where the system allows it (`net.core.{w,r}mem_max`); otherwise the
/// kernel's auto-tuning is left on, which beats a clamped fixed size.
pub const SOCKET_BUFFER_BYTES: usize = 4 << 20;
/// The largest number of sockets per peer accepted by [`TcpEndpoint::establish`].
pub const MAX_NSOCKS: usize = 64;
/// The largest piece size accepted by [`TcpEndpoint::establish`].
pub const MAX_PIECE_LIMIT: usize = 1 << 30;

/// Listen backlog of an endpoint.
const BACKLOG: i32 = 1024;
/// Connections that may wait for their hello at the same time.
const MAX_PENDING: usize = 4096;
/// First and last pause between connection attempts to a peer not yet listening.
const RETRY_MIN: Duration = Duration::from_millis(5);
const RETRY_MAX: Duration = Duration::from_millis(100);

/// What [`TcpEndpoint::establish`] needs to know about this rank and its
/// communicator. Every rank must use the same `comm_id`, `secret`, `nsocks`
/// and `max_piece`.
#[derive(Clone, Debug)]
pub struct TcpSetup {
    /// This rank.
    pub rank: usize,
    /// The communicator's id (carried in every hello and piece header).
    pub comm_id: u64,
    /// Shared secret; a connection must prove it knows it (the secret itself
    /// never travels).
    pub secret: [u8; 16],
    /// Sockets per peer (`SNCL_NSOCKS`, default [`DEFAULT_NSOCKS`](crate::DEFAULT_NSOCKS)).
    pub nsocks: usize,
    /// The largest payload of one piece (default [`DEFAULT_MAX_PIECE`](crate::DEFAULT_MAX_PIECE)).
    pub max_piece: usize,
    /// Every wait of the setup ends here with an error.
    pub deadline: Instant,
}

/// A listening TCP socket on an ephemeral port; peers of higher rank connect
/// to it. One endpoint serves one communicator's setup.
#[derive(Debug)]
pub struct TcpEndpoint {
    listener: Socket,
    addr: SocketAddr,
}

/// Reads `/proc/sys/net/core/<name>` (None where it is unavailable).
fn sysctl_usize(name: &str) -> Option<usize> {
    std::fs::read_to_string(format!("/proc/sys/net/core/{name}"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Whether SO_SNDBUF / SO_RCVBUF may be set to [`SOCKET_BUFFER_BYTES`].
fn buffer_sizes_allowed() -> (bool, bool) {
    static ALLOWED: OnceLock<(bool, bool)> = OnceLock::new();
    *ALLOWED.get_or_init(|| {
        let ok = |name| !matches!(sysctl_usize(name), Some(max) if max < SOCKET_BUFFER_BYTES);
        let allowed = (ok("wmem_max"), ok("rmem_max"));
        tracing::debug!(
            send = allowed.0,
            recv = allowed.1,
            bytes = SOCKET_BUFFER_BYTES,
            "tcp socket buffer sizes (false: left to kernel auto-tuning)"
        );
        allowed
    })
}

/// Sets the socket buffer sizes (before connect/listen, so that the TCP
/// window scale covers them).
fn tune_buffers(sock: &Socket) {
    let (send, recv) = buffer_sizes_allowed();
    if send {
        if let Err(e) = sock.set_send_buffer_size(SOCKET_BUFFER_BYTES) {
            tracing::debug!("SO_SNDBUF {SOCKET_BUFFER_BYTES}: {e}");
        }
    }
    if recv {
        if let Err(e) = sock.set_recv_buffer_size(SOCKET_BUFFER_BYTES) {
            tracing::debug!("SO_RCVBUF {SOCKET_BUFFER_BYTES}: {e}");
        }
    }
}

fn new_socket(addr: &SocketAddr) -> io::Result<Socket> {
    let sock = Socket::new(
        Domain::for_address(*addr),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    tune_buffers(&sock);
    Ok(sock)
}

/// Waits until `sock` is readable (or writable) or the deadline passes.
fn wait(sock: &Socket, read: bool, deadline: Instant) -> io::Result<()> {
    let now = Instant::now();
    if now >= deadline {
        return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"));
    }
    let mut fds = [PollFd::new(sock.as_raw_fd(), read)];
    sys::poll(&mut fds, deadline - now)?;
    Ok(())
}

/// Writes all of `buf` to the non-blocking `sock` by the deadline.
fn write_all_deadline(sock: &Socket, buf: &[u8], deadline: Instant) -> io::Result<()> {
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
fn read_exact_deadline(sock: &Socket, buf: &mut [u8], deadline: Instant) -> io::Result<()> {
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

/// Connects to `addr`, retrying while nobody listens there yet, until the
/// deadline. Returns a non-blocking socket.
fn connect_retry(addr: SocketAddr, deadline: Instant) -> io::Result<Socket> {
    let mut pause = RETRY_MIN;
    loop {
        let sock = new_socket(&addr)?;
        let timeout = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        let err = match sock.connect_timeout(&addr.into(), timeout) {
            Ok(()) => {
                sock.set_nonblocking(true)?;
                sock.set_nodelay(true)?;
                return Ok(sock);
            }
            Err(e) => e,
        };
        if matches!(
            err.kind(),
            io::ErrorKind::InvalidInput
                | io::ErrorKind::PermissionDenied
                | io::ErrorKind::Unsupported
        ) {
            return Err(err);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(err);
        }
        tracing::trace!(%addr, "connect failed, retrying: {err}");
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(RETRY_MAX);
    }
}

/// An accepted socket whose hello passed every check.
struct Accepted {
    sock: Socket,
    hello: [u8; HELLO_BYTES],
}

/// An accepted socket still sending its hello.
struct Pending {
    sock: Socket,
    remote: SocketAddr,
    buf: [u8; HELLO_BYTES],
    got: usize,
}

/// What to do with a complete hello.
enum Verdict {
    Accept { from: usize, idx: usize },
    Refuse(String),
    Fatal(String),
}

fn judge(
    setup: &TcpSetup,
    bytes: &[u8; HELLO_BYTES],
    slots: &BTreeMap<usize, Vec<Option<Accepted>>>,
) -> Verdict {
    let hello = match Hello::decode(bytes) {
        Ok(h) => h,
        Err(e) => return Verdict::Refuse(e.into()),
    };
    if hello.version != PROTOCOL_VERSION {
        return Verdict::Refuse(format!(
            "protocol version {}, this rank speaks version {PROTOCOL_VERSION}",
            hello.version
        ));
    }
    if !Hello::authentic(bytes, &setup.secret) {
        return Verdict::Refuse(format!(
            "wrong secret: the hello (claiming rank {}) failed authentication",
            hello.from_rank
        ));
    }
    if hello.comm_id != setup.comm_id {
        return Verdict::Refuse(format!(
            "wrong communicator: id {:#018x}, this communicator is {:#018x}",
            hello.comm_id, setup.comm_id
        ));
    }
    if hello.to_rank as usize != setup.rank {
        return Verdict::Refuse(format!(
            "addressed to rank {}, this is rank {}",
            hello.to_rank, setup.rank
        ));
    }
    let from = hello.from_rank as usize;
    let Some(peer_slots) = slots.get(&from) else {
        let expected: Vec<usize> = slots.keys().copied().collect();
        return Verdict::Refuse(format!(
            "unexpected rank {from} (this rank expects connections from ranks {expected:?})"
        ));
    };
    if hello.nsocks as usize != setup.nsocks {
        return Verdict::Fatal(format!(
            "peer rank {from} opens {} sockets per peer, this rank {}: set the same SNCL_NSOCKS on every rank",
            hello.nsocks, setup.nsocks
        ));
    }
    if hello.max_piece as usize != setup.max_piece {
        return Verdict::Fatal(format!(
            "peer rank {from} uses pieces of up to {} bytes, this rank {}: every rank must use the same piece size",
            hello.max_piece, setup.max_piece
        ));
    }
    let idx = hello.sock_idx as usize;
    match peer_slots.get(idx) {
        None => Verdict::Refuse(format!(
            "socket index {idx} out of range (nsocks {})",
            setup.nsocks
        )),
        Some(Some(_)) => {
            Verdict::Refuse(format!("duplicate connection for rank {from} socket {idx}"))
        }
        Some(None) => Verdict::Accept { from, idx },
    }
}

/// Describes the slots still empty, for a timeout error.
fn describe_missing(slots: &BTreeMap<usize, Vec<Option<Accepted>>>, nsocks: usize) -> String {
    let mut parts = Vec::new();
    for (peer, s) in slots {
        let missing: Vec<usize> = (0..s.len()).filter(|&i| s[i].is_none()).collect();
        if missing.len() == nsocks {
            parts.push(format!("rank {peer} (none of its {nsocks} sockets)"));
        } else if !missing.is_empty() {
            parts.push(format!("rank {peer} (sockets {missing:?} of {nsocks})"));
        }
    }
    parts.join(", ")
}

impl TcpEndpoint {
    /// Listens on `ip` at an ephemeral port. Bind a concrete address (what
    /// peers will connect to), not `0.0.0.0`.
    pub fn bind(ip: IpAddr) -> io::Result<TcpEndpoint> {
        let want = SocketAddr::new(ip, 0);
        let listener = new_socket(&want)?;
        listener.bind(&want.into())?;
        listener.listen(BACKLOG)?;
        listener.set_nonblocking(true)?;
        let addr = listener
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("listening socket has no IP address"))?;
        tracing::debug!(%addr, "tcp endpoint listening");
        Ok(TcpEndpoint { listener, addr })
    }

    /// The address peers connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connects this rank to every peer in `peers` (rank, endpoint address)
    /// and returns the connections in the same order.
    ///
    /// For each pair the higher rank connects (`nsocks` sockets, each with
    /// an authenticated hello) and the lower rank accepts. Every rank first
    /// makes all its outgoing connections, then accepts until all its
    /// higher-ranked peers are in (refusing, with a warning naming the remote
    /// address, anything with a wrong secret, communicator id or rank, or a
    /// duplicate), then acknowledges them, then waits for its own
    /// acknowledgements; so no order of arrival deadlocks. Every wait ends at
    /// `setup.deadline` with a [`Error::Bootstrap`] naming the peer and what
    /// was expected.
    pub fn establish(
        &self,
        setup: &TcpSetup,
        peers: &[(usize, SocketAddr)],
    ) -> Result<Vec<TcpConnection>, Error> {
        let me = setup.rank;
        let nsocks = setup.nsocks;
        let err = |detail: String| Error::Bootstrap { rank: me, detail };
        if nsocks == 0 || nsocks > MAX_NSOCKS {
            return Err(err(format!(
                "SNCL_NSOCKS must be between 1 and {MAX_NSOCKS}, got {nsocks}"
            )));
        }
        if setup.max_piece == 0 || setup.max_piece > MAX_PIECE_LIMIT {
            return Err(err(format!(
                "the TCP piece size must be between 1 and {MAX_PIECE_LIMIT} bytes, got {}",
                setup.max_piece
            )));
        }
        let mut seen = std::collections::BTreeSet::new();
        for &(peer, _) in peers {
            if peer == me || !seen.insert(peer) || u32::try_from(peer).is_err() {
                return Err(err(format!(
                    "invalid peer list for TCP setup: rank {peer} is this rank, listed twice or too large"
                )));
            }
        }
        let deadline = setup.deadline;
        let hello_for = |to: usize, idx: usize| {
            Hello {
                version: PROTOCOL_VERSION,
                comm_id: setup.comm_id,
                from_rank: me as u32,
                to_rank: to as u32,
                sock_idx: idx as u32,
                nsocks: nsocks as u32,
                max_piece: setup.max_piece as u32,
            }
            .encode(&setup.secret)
        };

        // 1. Connect to every lower rank and say hello (the peer's kernel
        //    completes the handshake without waiting for its accept loop).
        let mut outgoing: BTreeMap<usize, Vec<(Socket, [u8; HELLO_BYTES])>> = BTreeMap::new();
        for &(peer, addr) in peers.iter().filter(|(p, _)| *p < me) {
            let mut socks = Vec::with_capacity(nsocks);
            for idx in 0..nsocks {
                let sock = connect_retry(addr, deadline).map_err(|e| {
                    err(format!(
                        "could not connect to peer rank {peer} at {addr} (socket {idx} of {nsocks}) \
                         by the deadline: {e}; is rank {peer} running and listening there?"
                    ))
                })?;
                let hello = hello_for(peer, idx);
                write_all_deadline(&sock, &hello, deadline).map_err(|e| {
                    err(format!(
                        "sending the hello to peer rank {peer} at {addr} (socket {idx} of {nsocks}) failed: {e}"
                    ))
                })?;
                socks.push((sock, hello));
            }
            tracing::trace!(rank = me, peer, %addr, "tcp hellos sent");
            outgoing.insert(peer, socks);
        }

        // 2. Accept every higher rank's sockets.
        let mut slots: BTreeMap<usize, Vec<Option<Accepted>>> = peers
            .iter()
            .filter(|(p, _)| *p > me)
            .map(|&(p, _)| (p, (0..nsocks).map(|_| None).collect()))
            .collect();
        self.accept_all(setup, &mut slots)?;

        // 3. Acknowledge them.
        for (peer, socks) in &slots {
            for (idx, a) in socks.iter().enumerate() {
                let a = a.as_ref().expect("every slot is filled");
                let ack = frame::ack_for(&a.hello, &setup.secret);
                write_all_deadline(&a.sock, &ack, deadline).map_err(|e| {
                    err(format!(
                        "sending the acknowledgement to peer rank {peer} (socket {idx} of {nsocks}) failed: {e}"
                    ))
                })?;
            }
        }

        // 4. Wait for the lower ranks' acknowledgements.
        for &(peer, addr) in peers.iter().filter(|(p, _)| *p < me) {
            for (idx, (sock, hello)) in outgoing[&peer].iter().enumerate() {
                let mut ack = [0u8; ACK_BYTES];
                match read_exact_deadline(sock, &mut ack, deadline) {
                    Ok(()) if frame::ack_valid(&ack, hello, &setup.secret) => {}
                    Ok(()) => {
                        return Err(err(format!(
                            "peer rank {peer} at {addr} answered socket {idx} of {nsocks} with a wrong \
                             acknowledgement: it does not hold this communicator's secret"
                        )))
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
                        ) =>
                    {
                        return Err(err(format!(
                            "peer rank {peer} at {addr} closed socket {idx} of {nsocks} instead of \
                             acknowledging this rank's hello: it refused it (different secret or \
                             communicator id, different SNCL_NSOCKS or piece size, or not expecting \
                             rank {me}); see that rank's log"
                        )))
                    }
                    Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                        return Err(err(format!(
                            "timed out waiting for peer rank {peer} at {addr} to acknowledge socket \
                             {idx} of {nsocks} (is it still waiting for other ranks to connect?)"
                        )))
                    }
                    Err(e) => {
                        return Err(err(format!(
                            "waiting for peer rank {peer} at {addr} to acknowledge socket {idx} of \
                             {nsocks} failed: {e}"
                        )))
                    }
                }
            }
        }

        // 5. Wrap them up, in the caller's order.
        let max_piece = setup.max_piece;
        peers
            .iter()
            .map(|&(peer, addr)| {
                let socks: Vec<Socket> = if peer < me {
                    outgoing
                        .remove(&peer)
                        .expect("connected")
                        .into_iter()
                        .map(|(s, _)| s)
                        .collect()
                } else {
                    slots
                        .remove(&peer)
                        .expect("accepted")
                        .into_iter()
                        .map(|a| a.expect("filled").sock)
                        .collect()
                };
                TcpConnection::new(me, peer, max_piece, addr, socks).map_err(|e| Error::Io {
                    rank: me,
                    context: format!("configuring the TCP sockets to peer rank {peer} at {addr}"),
                    source: e,
                })
            })
            .collect()
    }

    /// Accepts until every slot holds a socket whose hello passed.
    fn accept_all(
        &self,
        setup: &TcpSetup,
        slots: &mut BTreeMap<usize, Vec<Option<Accepted>>>,
    ) -> Result<(), Error> {
        let me = setup.rank;
        let err = |detail: String| Error::Bootstrap { rank: me, detail };
        let total = slots.len() * setup.nsocks;
        let mut filled = 0;
        let mut refused = 0usize;
        let mut pending: Vec<Pending> = Vec::new();
        let unknown = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);
        let mut refuse = |remote: &SocketAddr, reason: &str| {
            refused += 1;
            tracing::warn!(rank = me, %remote, "refused TCP connection: {reason}");
        };
        while filled < total {
            // Take every connection waiting in the backlog.
            loop {
                match self.listener.accept() {
                    Ok((sock, addr)) => {
                        let remote = addr.as_socket().unwrap_or(unknown);
                        if pending.len() >= MAX_PENDING {
                            refuse(&remote, "too many connections waiting to say hello");
                        } else if let Err(e) = sock.set_nonblocking(true) {
                            refuse(&remote, &format!("cannot configure the socket: {e}"));
                        } else {
                            pending.push(Pending {
                                sock,
                                remote,
                                buf: [0; HELLO_BYTES],
                                got: 0,
                            });
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                        ) => {}
                    Err(e) => {
                        // Out of descriptors or memory: wait and retry below.
                        tracing::warn!(rank = me, addr = %self.addr, "accept failed: {e}");
                        break;
                    }
                }
            }
            // Read hellos.
            let mut k = 0;
            while k < pending.len() {
                let p = &mut pending[k];
                let outcome: Option<Result<(), String>> = match (&p.sock).read(&mut p.buf[p.got..])
                {
                    Ok(0) => Some(Err(format!(
                        "closed before sending a complete hello ({} of {HELLO_BYTES} bytes)",
                        p.got
                    ))),
                    Ok(n) => {
                        p.got += n;
                        if !Hello::plausible_prefix(&p.buf[..p.got]) {
                            Some(Err("not an sncl TCP hello (bad magic)".into()))
                        } else if p.got == HELLO_BYTES {
                            Some(Ok(()))
                        } else {
                            None
                        }
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                        ) =>
                    {
                        None
                    }
                    Err(e) => Some(Err(format!("error reading its hello: {e}"))),
                };
                match outcome {
                    None => k += 1,
                    Some(Err(reason)) => {
                        let p = pending.swap_remove(k);
                        refuse(&p.remote, &reason);
                    }
                    Some(Ok(())) => {
                        let p = pending.swap_remove(k);
                        match judge(setup, &p.buf, slots) {
                            Verdict::Accept { from, idx } => {
                                tracing::trace!(rank = me, from, idx, remote = %p.remote, "tcp socket accepted");
                                slots.get_mut(&from).expect("expected peer")[idx] =
                                    Some(Accepted {
                                        sock: p.sock,
                                        hello: p.buf,
                                    });
                                filled += 1;
                            }
                            Verdict::Refuse(reason) => refuse(&p.remote, &reason),
                            Verdict::Fatal(reason) => {
                                return Err(err(format!(
                                    "connection from {} refused: {reason}",
                                    p.remote
                                )))
                            }
                        }
                    }
                }
            }
            if filled == total {
                break;
            }
            let now = Instant::now();
            if now >= setup.deadline {
                return Err(err(format!(
                    "timed out waiting for peers to connect to {}: still missing {}; accepted {filled} \
                     of {total} sockets, refused {refused} connection(s) (see warnings); are those \
                     ranks running, and did they get this rank's address?",
                    self.addr,
                    describe_missing(slots, setup.nsocks)
                )));
            }
            let mut fds: Vec<PollFd> = std::iter::once(self.listener.as_raw_fd())
                .chain(pending.iter().map(|p| p.sock.as_raw_fd()))
                .map(|fd| PollFd::new(fd, true))
                .collect();
            // Bounded so that an accept error (e.g. out of descriptors) is retried.
            sys::poll(
                &mut fds,
                (setup.deadline - now).min(Duration::from_millis(200)),
            )
            .map_err(|e| err(format!("waiting for connections on {}: {e}", self.addr)))?;
        }
        Ok(())
    }
}

/// The address of network interface `ifname` (as in `SNCL_SOCKET_IFNAME`):
/// its IPv4 address, else its first IPv6 address that is not link-local.
/// The error names the interface and lists the available ones.
pub fn interface_addr(ifname: &str) -> io::Result<IpAddr> {
    let all = sys::interface_addrs()?;
    let mine: Vec<IpAddr> = all
        .iter()
        .filter(|a| a.name == ifname)
        .filter_map(|a| a.addr)
        .collect();
    if let Some(v4) = mine.iter().find(|a| a.is_ipv4()) {
        return Ok(*v4);
    }
    let usable_v6 = |a: &&IpAddr| match a {
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) != 0xfe80 && !v6.is_unspecified(),
        IpAddr::V4(_) => false,
    };
    if let Some(v6) = mine.iter().find(usable_v6) {
        return Ok(*v6);
    }
    let mut listing: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for a in &all {
        let e = listing.entry(a.name.as_str()).or_default();
        if let Some(ip) = a.addr {
            e.push(ip.to_string());
        }
    }
    let available = listing
        .iter()
        .map(|(n, addrs)| {
            if addrs.is_empty() {
                format!("{n} (no address)")
            } else {
                format!("{n} ({})", addrs.join(", "))
            }
        })
        .collect::<Vec<_>>()
        .join("; ");
    let what = if listing.contains_key(ifname) {
        format!("network interface {ifname:?} has no usable IP address")
    } else {
        format!("no network interface named {ifname:?}")
    };
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!("{what}; available interfaces: {available}"),
    ))
}
