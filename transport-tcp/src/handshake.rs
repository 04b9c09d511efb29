//! The per-socket challenge–response of [`TcpEndpoint::establish`](crate::TcpEndpoint::establish)
//! (wire format in [`crate::frame`]), driven for every socket of a rank at
//! once by one `poll(2)` loop, without a thread per connection:
//!
//! * on the accepting side, every connection is greeted with a fresh server
//!   nonce as soon as it is accepted, then its hello is read and judged
//!   (tag, communicator, ranks, socket slot);
//! * on the connecting side, each socket waits for its greeting, then sends
//!   the hello signed over both nonces.
//!
//! Both sides run in the same loop, so a rank greets its higher-ranked peers
//! while it waits for its lower-ranked peers' greetings, and no order of
//! arrival deadlocks.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Read};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use comm_core::throttle::LogThrottle;
use comm_core::Error;
use sncl_bootstrap::auth;
use socket2::Socket;

use crate::deadline_io::write_all_deadline;
use crate::frame::{Greeting, Hello, Nonce, GREETING_BYTES, HELLO_BYTES, PROTOCOL_VERSION};
use crate::params::TcpSetup;
use crate::sys::{self, PollFd};

/// Connections that may wait for their hello at the same time; a new one
/// beyond this drops the one that has waited longest (a stranger's idle
/// connections must not keep a late rank out).
pub(crate) const MAX_PENDING: usize = 4096;
/// How long an accepted connection has to send its whole hello.
const HELLO_DEADLINE: Duration = Duration::from_secs(10);

/// An accepted socket whose hello passed every check.
#[derive(Debug)]
pub(crate) struct Accepted {
    pub sock: Socket,
    /// The hello as received.
    pub hello: [u8; HELLO_BYTES],
    /// The nonce this rank greeted the socket with.
    pub server_nonce: Nonce,
}

/// Accepted sockets per higher-ranked peer, by socket index.
pub(crate) type Slots = BTreeMap<usize, Vec<Option<Accepted>>>;

/// A socket this rank connected to a lower-ranked peer.
pub(crate) struct Outgoing {
    pub peer: usize,
    pub addr: SocketAddr,
    pub idx: usize,
    pub sock: Socket,
    greeting: [u8; GREETING_BYTES],
    got: usize,
    /// The hello sent and the server nonce it answered, once greeted.
    pub sent: Option<([u8; HELLO_BYTES], Nonce)>,
}

impl Outgoing {
    pub(crate) fn new(peer: usize, addr: SocketAddr, idx: usize, sock: Socket) -> Outgoing {
        Outgoing {
            peer,
            addr,
            idx,
            sock,
            greeting: [0; GREETING_BYTES],
            got: 0,
            sent: None,
        }
    }
}

/// An accepted socket, greeted, still sending its hello.
pub(crate) struct Pending {
    sock: Socket,
    pub(crate) remote: SocketAddr,
    /// When it was accepted.
    since: Instant,
    server_nonce: Nonce,
    buf: [u8; HELLO_BYTES],
    got: usize,
}

/// Greets a new connection with a fresh server nonce; the reason when it
/// cannot be greeted.
pub(crate) fn greet(sock: Socket, remote: SocketAddr) -> Result<Pending, String> {
    sock.set_nonblocking(true)
        .map_err(|e| format!("cannot configure the socket: {e}"))?;
    let server_nonce =
        auth::nonce().map_err(|e| format!("cannot draw a nonce to greet it: {e}"))?;
    let greeting = Greeting {
        version: PROTOCOL_VERSION,
        nonce: server_nonce,
    }
    .encode();
    // A fresh socket's send buffer always takes 32 bytes; anything else
    // means the connection is already broken.
    match sock.send_with_flags(&greeting, libc::MSG_NOSIGNAL) {
        Ok(GREETING_BYTES) => Ok(Pending {
            sock,
            remote,
            since: Instant::now(),
            server_nonce,
            buf: [0; HELLO_BYTES],
            got: 0,
        }),
        Ok(n) => Err(format!(
            "took only {n} of the {GREETING_BYTES} greeting bytes"
        )),
        Err(e) => Err(format!("cannot send the greeting: {e}")),
    }
}

/// Whether a whole, plausible hello (magic and protocol version) is
/// waiting in `p`'s socket or was read: what a rank that connected early
/// has sent, and a stranger's junk is not.
fn hello_arrived(p: &Pending) -> bool {
    if p.got == HELLO_BYTES {
        return true;
    }
    // What was read, then what waits in the socket.
    let mut whole = p.buf;
    let want = HELLO_BYTES - p.got;
    if !sys::peek(p.sock.as_raw_fd(), &mut whole[p.got..]).is_ok_and(|n| n == want) {
        return false;
    }
    Hello::plausible_prefix(&whole) && Hello::version_of_prefix(&whole) == Some(PROTOCOL_VERSION)
}

impl Pending {
    /// Whether it waited past [`HELLO_DEADLINE`] without a whole hello.
    pub(crate) fn overdue(&self) -> bool {
        self.since.elapsed() > HELLO_DEADLINE && !hello_arrived(self)
    }
}

/// Connections accepted per [`accept_waiting`] call, so that a flood of
/// connections cannot keep a caller from its other work (its deadline, a
/// request to stop).
const ACCEPT_BURST: usize = 256;

/// How many connections may wait for their hello: [`MAX_PENDING`], or a
/// quarter of this process's descriptor limit where that is lower (the
/// rank needs descriptors of its own).
fn max_pending() -> usize {
    crate::sys::open_file_limit().map_or(MAX_PENDING, |l| MAX_PENDING.min(l / 4).max(16))
}

/// Removes the connection that has waited longest for its hello, sparing
/// those whose whole hello already arrived (a rank that connected early,
/// before this rank reached its handshake) while any other is left.
pub(crate) fn evict_one(pending: &mut Vec<Pending>) -> Pending {
    let oldest = |pending: &[Pending], spare: bool| {
        (0..pending.len())
            .filter(|&i| !spare || !hello_arrived(&pending[i]))
            .min_by_key(|&i| pending[i].since)
    };
    // The oldest is almost always an idle stranger: one peek decides.
    let first = oldest(pending, false).expect("evicting from a non-empty set");
    let victim = if hello_arrived(&pending[first]) {
        oldest(pending, true).unwrap_or(first)
    } else {
        first
    };
    pending.swap_remove(victim)
}

/// Accepts the connections waiting in `listener`'s backlog (at most
/// [`ACCEPT_BURST`]) and greets them, making room (the longest waiting
/// without a hello goes) when [`max_pending`] are pending; `refuse` hears
/// of each connection dropped and why. An error other than "nothing
/// waits" ends the burst.
pub(crate) fn accept_waiting(
    listener: &Socket,
    pending: &mut Vec<Pending>,
    refuse: &mut impl FnMut(&SocketAddr, &str),
) -> io::Result<()> {
    let unknown = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);
    let bound = max_pending();
    for _ in 0..ACCEPT_BURST {
        match listener.accept() {
            Ok((sock, addr)) => {
                let remote = addr.as_socket().unwrap_or(unknown);
                if pending.len() >= bound {
                    let old = evict_one(pending);
                    refuse(
                        &old.remote,
                        "dropped: the longest waiting of too many connections that have not \
                         said hello",
                    );
                }
                match greet(sock, remote) {
                    Ok(p) => pending.push(p),
                    Err(why) => refuse(&remote, &why),
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// What to do with a complete hello.
pub(crate) enum Verdict {
    Accept { from: usize, idx: usize },
    Refuse(String),
    Fatal(String),
}

fn version_mismatch(version: u16) -> String {
    format!(
        "protocol version {version}, this rank speaks version {PROTOCOL_VERSION} \
         (run the same sncl on every rank)"
    )
}

pub(crate) fn judge(
    setup: &TcpSetup,
    bytes: &[u8; HELLO_BYTES],
    server_nonce: &Nonce,
    slots: &Slots,
) -> Verdict {
    let hello = match Hello::decode(bytes) {
        Ok(h) => h,
        Err(e) => return Verdict::Refuse(e.into()),
    };
    if hello.version != PROTOCOL_VERSION {
        return Verdict::Refuse(version_mismatch(hello.version));
    }
    if !Hello::authentic(bytes, &setup.secret, server_nonce) {
        return Verdict::Refuse(format!(
            "wrong secret, or a replayed hello: the hello (claiming rank {}) failed \
             authentication against this connection's nonce",
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
    if hello.tls != setup.tls.is_some() {
        let side = |on: bool| if on { "with TLS" } else { "without TLS" };
        return Verdict::Fatal(format!(
            "peer rank {from} runs {}, this rank {}: set SNCL_TLS_CERT, SNCL_TLS_KEY and \
             SNCL_TLS_CA on every rank, or on none",
            side(hello.tls),
            side(setup.tls.is_some())
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

/// Describes the slots of `batch` still empty, for a timeout error.
fn describe_missing(slots: &Slots, batch: &BTreeSet<usize>, nsocks: usize) -> String {
    let mut parts = Vec::new();
    for (peer, s) in slots.iter().filter(|(p, _)| batch.contains(p)) {
        let missing: Vec<usize> = (0..s.len()).filter(|&i| s[i].is_none()).collect();
        if missing.len() == nsocks {
            parts.push(format!("rank {peer} (none of its {nsocks} sockets)"));
        } else if !missing.is_empty() {
            parts.push(format!("rank {peer} (sockets {missing:?} of {nsocks})"));
        }
    }
    parts.join(", ")
}

/// Describes the outgoing sockets still waiting for their greeting.
fn describe_ungreeted(outgoing: &[Outgoing], nsocks: usize) -> String {
    let mut by_peer: BTreeMap<(usize, SocketAddr), Vec<usize>> = BTreeMap::new();
    for o in outgoing.iter().filter(|o| o.sent.is_none()) {
        by_peer.entry((o.peer, o.addr)).or_default().push(o.idx);
    }
    by_peer
        .iter()
        .map(|((peer, addr), idx)| {
            if idx.len() == nsocks {
                format!("peer rank {peer} at {addr} (none of its {nsocks} sockets)")
            } else {
                format!("peer rank {peer} at {addr} (sockets {idx:?} of {nsocks})")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Reads what arrived of `o`'s greeting; once it is complete, answers it
/// with the hello. `Ok(true)` once the hello is sent; errors name the peer.
fn advance_outgoing(setup: &TcpSetup, o: &mut Outgoing) -> Result<bool, String> {
    let (peer, addr, idx, nsocks) = (o.peer, o.addr, o.idx, setup.nsocks);
    let on = format!("peer rank {peer} at {addr} (socket {idx} of {nsocks})");
    match (&o.sock).read(&mut o.greeting[o.got..]) {
        Ok(0) => {
            return Err(format!(
                "{on} closed the connection before greeting this rank: it refused the connection \
                 or gave up its setup (different SNCL_NSOCKS or piece size, too many connections \
                 waiting); see that rank's log"
            ))
        }
        Ok(n) => o.got += n,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            ) =>
        {
            return Ok(false)
        }
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
            return Err(format!(
                "{on} reset the connection before greeting this rank: it refused the connection \
                 or gave up its setup (different SNCL_NSOCKS or piece size); see that rank's log"
            ))
        }
        Err(e) => return Err(format!("reading the greeting of {on} failed: {e}")),
    }
    if !Greeting::plausible_prefix(&o.greeting[..o.got]) {
        return Err(format!(
            "{on} is not an sncl TCP endpoint (bad magic in its greeting): is that the address \
             rank {peer} published?"
        ));
    }
    if o.got < GREETING_BYTES {
        return Ok(false);
    }
    let greeting = Greeting::decode(&o.greeting).map_err(|e| format!("{on}: {e}"))?;
    if greeting.version != PROTOCOL_VERSION {
        return Err(format!(
            "{on} refused: it speaks TCP {}",
            version_mismatch(greeting.version)
        ));
    }
    let client_nonce = auth::nonce().map_err(|e| format!("answering the greeting of {on}: {e}"))?;
    let hello = Hello {
        version: PROTOCOL_VERSION,
        comm_id: setup.comm_id,
        from_rank: setup.rank as u32,
        to_rank: peer as u32,
        sock_idx: idx as u32,
        nsocks: nsocks as u32,
        max_piece: setup.max_piece as u32,
        tls: setup.tls.is_some(),
    }
    .encode(&setup.secret, &greeting.nonce, &client_nonce);
    write_all_deadline(&o.sock, &hello, setup.deadline)
        .map_err(|e| format!("sending the hello to {on} failed: {e}"))?;
    o.sent = Some((hello, greeting.nonce));
    Ok(true)
}

/// Runs the handshake until every slot holds an accepted socket whose hello
/// passed and every outgoing socket has sent its hello; refusals of
/// incoming connections are logged (naming the remote address) and
/// skipped, everything else ends in an error naming the peer.
///
/// Only the slots of `batch` must fill; the other peers in `slots` (ranks
/// that connect at a later first use, `TcpEndpoint::establish_some`) are
/// accepted when they come early, and kept.
pub(crate) fn run(
    listener: &Socket,
    local: SocketAddr,
    early: Vec<Pending>,
    setup: &TcpSetup,
    slots: &mut Slots,
    batch: &BTreeSet<usize>,
    outgoing: &mut [Outgoing],
) -> Result<(), Error> {
    let me = setup.rank;
    let err = |detail: String| Error::Bootstrap { rank: me, detail };
    let total = batch.len() * setup.nsocks;
    // Sockets of the batch accepted at an earlier call, kept for this one.
    let mut filled = slots
        .iter()
        .filter(|(p, _)| batch.contains(p))
        .map(|(_, s)| s.iter().flatten().count())
        .sum::<usize>();
    let mut greeted = 0;
    let mut refused = 0usize;
    // Connections accepted and greeted before this rank reached its
    // handshake (see `crate::early`) come first.
    let mut pending = early;
    let mut throttle = LogThrottle::new(Duration::from_secs(10));
    let mut refuse = |remote: &SocketAddr, reason: &str| {
        refused += 1;
        // One line per source and kind of refusal (the reason up to its
        // first ':') per 10 s: strangers must not flood the log.
        let kind = reason.split(':').next().unwrap_or(reason).to_owned();
        if let Some(more) = throttle.admit_note((remote.ip(), kind), remote.ip(), Instant::now()) {
            tracing::warn!(rank = me, %remote, "refused TCP connection: {reason}{more}");
        }
    };
    loop {
        // Take every connection waiting in the backlog and greet it.
        if let Err(e) = accept_waiting(listener, &mut pending, &mut refuse) {
            // Out of descriptors or memory: the listener stays readable,
            // so pause rather than spin.
            tracing::warn!(rank = me, addr = %local, "accept failed: {e}");
            std::thread::sleep(Duration::from_millis(50));
        }
        // Read hellos.
        let mut k = 0;
        while k < pending.len() {
            let p = &mut pending[k];
            let outcome: Option<Result<(), String>> = match (&p.sock).read(&mut p.buf[p.got..]) {
                Ok(0) => Some(Err(format!(
                    "closed before sending a complete hello ({} of {HELLO_BYTES} bytes)",
                    p.got
                ))),
                Ok(n) => {
                    p.got += n;
                    let got = &p.buf[..p.got];
                    if !Hello::plausible_prefix(got) {
                        Some(Err("not an sncl TCP hello (bad magic)".into()))
                    } else if let Some(v) =
                        Hello::version_of_prefix(got).filter(|&v| v != PROTOCOL_VERSION)
                    {
                        Some(Err(version_mismatch(v)))
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
            let outcome = match outcome {
                None if p.since.elapsed() > HELLO_DEADLINE => Some(Err(format!(
                    "no complete hello within {} s ({} of {HELLO_BYTES} bytes)",
                    HELLO_DEADLINE.as_secs(),
                    p.got
                ))),
                other => other,
            };
            match outcome {
                None => k += 1,
                Some(Err(reason)) => {
                    let p = pending.swap_remove(k);
                    refuse(&p.remote, &reason);
                }
                Some(Ok(())) => {
                    let p = pending.swap_remove(k);
                    match judge(setup, &p.buf, &p.server_nonce, slots) {
                        Verdict::Accept { from, idx } => {
                            tracing::trace!(rank = me, from, idx, remote = %p.remote, "tcp socket accepted");
                            slots.get_mut(&from).expect("expected peer")[idx] = Some(Accepted {
                                sock: p.sock,
                                hello: p.buf,
                                server_nonce: p.server_nonce,
                            });
                            filled += usize::from(batch.contains(&from));
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
        // Answer greetings.
        for o in outgoing.iter_mut().filter(|o| o.sent.is_none()) {
            if advance_outgoing(setup, o).map_err(err)? {
                tracing::trace!(rank = me, peer = o.peer, idx = o.idx, "tcp hello sent");
                greeted += 1;
            }
        }
        if filled == total && greeted == outgoing.len() {
            return Ok(());
        }
        let now = Instant::now();
        if now >= setup.deadline {
            let mut missing = Vec::new();
            if filled < total {
                missing.push(format!(
                    "peers to connect to {local}: still missing {}; accepted {filled} of {total} \
                     sockets, refused {refused} connection(s) (see warnings); are those ranks \
                     running, and did they get this rank's address?",
                    describe_missing(slots, batch, setup.nsocks)
                ));
            }
            if greeted < outgoing.len() {
                missing.push(format!(
                    "the greetings of {}: the connections are open but those ranks have not \
                     accepted them (still connecting to their own lower-ranked peers, stuck, or \
                     running an sncl of another protocol version?)",
                    describe_ungreeted(outgoing, setup.nsocks)
                ));
            }
            return Err(err(format!(
                "timed out waiting for {}",
                missing.join("; and for ")
            )));
        }
        let mut fds: Vec<PollFd> = std::iter::once(listener.as_raw_fd())
            .chain(pending.iter().map(|p| p.sock.as_raw_fd()))
            .chain(
                outgoing
                    .iter()
                    .filter(|o| o.sent.is_none())
                    .map(|o| o.sock.as_raw_fd()),
            )
            .map(|fd| PollFd::new(fd, true))
            .collect();
        // Bounded so that an accept error (e.g. out of descriptors) is retried.
        sys::poll(
            &mut fds,
            (setup.deadline - now).min(Duration::from_millis(200)),
        )
        .map_err(|e| err(format!("waiting for connections on {local}: {e}")))?;
    }
}
