//! Connection setup: [`TcpEndpoint`] listens, [`TcpEndpoint::establish`]
//! connects every pair of ranks with `nsocks` authenticated sockets.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use comm_core::config::TcpPacing;
use comm_core::topofile::TierSpec;
use comm_core::Error;
use socket2::{Domain, Protocol, Socket, Type};

use crate::conn::TcpConnection;
use crate::deadline_io::{read_exact_deadline, write_all_deadline};
use crate::early::EarlyAccept;
use crate::frame::{self, ACK_BYTES};
use crate::handshake::{self, Accepted, Outgoing, Slots};
use crate::params::TcpSetup;
use crate::sys;

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
/// First and last pause between connection attempts to a peer not yet listening.
const RETRY_MIN: Duration = Duration::from_millis(5);
const RETRY_MAX: Duration = Duration::from_millis(100);

/// Share of the link's rate that a node's paced sockets use together: the
/// rest is headroom for the Ethernet, IP and TCP headers a link's rate
/// counts and a socket's pacing rate does not (about 3 % at a 1500-byte
/// MTU) and for the flows that are not paced (setup, stores).
pub const PACING_HEADROOM: f64 = 0.95;

/// The share of a *measured goodput* (the topology's `inter.bandwidth`, as
/// `commbench calibrate` writes it: TCP payload bytes per second, already
/// net of the headers) that a node's paced sockets use together under
/// `auto`: all of it. The pacing rate counts IP and TCP headers (≈ 3.5 %
/// at a 1500-byte MTU), so the wire still runs about that much below the
/// link's rate. Measured (docs/perf-notes/NOTEBOOK.md §13, compressed exchange at
/// 100 Mbit/s): 0.95 of the goodput left fp16 at 1.75× where all of it
/// gave 1.84×, without retransmits.
pub const GOODPUT_HEADROOM: f64 = 1.0;

/// The pacing rate (bytes per second) of each cross-node socket under
/// `SNCL_TCP_PACING = pacing`, or `None` for no pacing.
///
/// The link rate is `pacing`'s own ([`TcpPacing::Rate`], a link's rate,
/// used at [`PACING_HEADROOM`]) or, for [`TcpPacing::Auto`], the
/// topology's inter-node bandwidth (`tiers.inter`, a measured goodput, used
/// at [`GOODPUT_HEADROOM`]; none configured: no pacing). A node's link is shared by
/// its ranks (`local_ranks` of this communicator on the node, or the
/// topology's `ranks_per_node` if larger), each with `nsocks` sockets per
/// peer and `flows_per_rank` peers across at once (1 in ring-like
/// exchanges; the compressed all-reduce's exchange sends to every other
/// node), unless the topology says each rank has its own NIC
/// (`inter.nic = rank`); so each socket gets `rate × headroom /
/// (sharing ranks × flows_per_rank × nsocks)`, at least 1 KB/s. The
/// kernel's small-queue limit follows the pacing rate, so each socket
/// keeps only a few packets queued below it.
pub fn socket_pacing_rate(
    pacing: TcpPacing,
    tiers: &TierSpec,
    local_ranks: usize,
    nsocks: usize,
    flows_per_rank: usize,
) -> Option<u64> {
    let (link, headroom) = match pacing {
        TcpPacing::Off => return None,
        TcpPacing::Rate(b) => (b, PACING_HEADROOM),
        TcpPacing::Auto => (tiers.inter?.bytes_per_us * 1e6, GOODPUT_HEADROOM),
    };
    if !(link.is_finite() && link > 0.0) {
        return None;
    }
    let sharing = if tiers.cluster.nic.as_deref() == Some("rank") {
        1
    } else {
        // A communicator split from a larger one sees only its own members;
        // the topology's `ranks_per_node` counts all of the node's ranks.
        tiers
            .cluster
            .ranks_per_node
            .unwrap_or(0)
            .max(local_ranks)
            .max(1)
    };
    let flows = sharing * flows_per_rank.max(1) * nsocks.max(1);
    let per_socket = link * headroom / flows as f64;
    Some((per_socket as u64).max(1000))
}

/// A listening TCP socket on an ephemeral port; peers of higher rank connect
/// to it. One endpoint serves one communicator's setup.
#[derive(Debug)]
pub struct TcpEndpoint {
    listener: Socket,
    addr: SocketAddr,
    /// Accepts and greets connections until the handshake starts.
    early: std::sync::Mutex<Option<EarlyAccept>>,
    /// Sockets of higher-ranked peers accepted during an earlier
    /// [`TcpEndpoint::establish_some`] whose batch did not name them, kept
    /// (unacknowledged) for the call that does.
    kept: std::sync::Mutex<Slots>,
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
        let early = EarlyAccept::start(&listener, addr)?;
        Ok(TcpEndpoint {
            listener,
            addr,
            early: std::sync::Mutex::new(Some(early)),
            kept: std::sync::Mutex::new(Slots::new()),
        })
    }

    /// The address peers connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connects this rank to every peer in `peers` (rank, endpoint address)
    /// and returns the connections in the same order.
    ///
    /// For each pair the higher rank connects `nsocks` sockets and the lower
    /// rank accepts them; each socket is authenticated by a challenge–response
    /// with fresh nonces from both sides (greeting, hello, ack: see the crate
    /// docs), so a recorded hello cannot be replayed. Every rank first opens
    /// all its outgoing connections, then in one loop greets and judges the
    /// connections of its higher-ranked peers (refusing, with a warning
    /// naming the remote address, anything with a wrong secret or a replayed
    /// hello, a wrong communicator id or rank, or a duplicate) while it
    /// answers its lower-ranked peers' greetings with hellos; then it
    /// acknowledges the accepted hellos and waits for its own
    /// acknowledgements; so no order of arrival deadlocks. Every wait ends at
    /// `setup.deadline` with a [`Error::Bootstrap`] naming the peer and what
    /// was expected.
    pub fn establish(
        &self,
        setup: &TcpSetup,
        peers: &[(usize, SocketAddr)],
    ) -> Result<Vec<TcpConnection>, Error> {
        self.establish_some(setup, peers, &BTreeSet::new())
    }

    /// [`TcpEndpoint::establish`] for one batch of a communicator whose
    /// pairs connect at their first use: `later` are higher-ranked peers
    /// this endpoint may be asked for in a later call. Their sockets that
    /// arrive during this one (a peer already in the operation that
    /// connects the pair, this rank still in an earlier one) are accepted,
    /// judged and kept, unacknowledged, for that call, instead of refused.
    pub fn establish_some(
        &self,
        setup: &TcpSetup,
        peers: &[(usize, SocketAddr)],
        later: &BTreeSet<usize>,
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

        // 1. Connect every socket to every lower rank (the peer's kernel
        //    completes the TCP handshake without waiting for its accept loop).
        let mut outgoing: Vec<Outgoing> = Vec::new();
        for &(peer, addr) in peers.iter().filter(|(p, _)| *p < me) {
            for idx in 0..nsocks {
                let sock = connect_retry(addr, deadline).map_err(|e| {
                    err(format!(
                        "could not connect to peer rank {peer} at {addr} (socket {idx} of {nsocks}) \
                         by the deadline: {e}; is rank {peer} running and listening there?"
                    ))
                })?;
                outgoing.push(Outgoing::new(peer, addr, idx, sock));
            }
            tracing::trace!(rank = me, peer, %addr, "tcp sockets connected");
        }

        // 2. Greet and judge every higher rank's sockets, answer the lower
        //    ranks' greetings with hellos, all in one loop (sockets kept
        //    from an earlier batch count as judged).
        let batch: BTreeSet<usize> = peers.iter().map(|&(p, _)| p).filter(|&p| p > me).collect();
        let mut kept = self
            .kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut slots: Slots = batch
            .iter()
            .chain(later.iter().filter(|&&p| p > me && !batch.contains(&p)))
            .map(|&p| {
                let fresh = || (0..nsocks).map(|_| None).collect::<Vec<Option<Accepted>>>();
                (p, kept.remove(&p).unwrap_or_else(fresh))
            })
            .collect();
        let early = self
            .early
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
            .map(EarlyAccept::finish)
            .unwrap_or_default();
        let shaken = handshake::run(
            &self.listener,
            self.addr,
            early,
            setup,
            &mut slots,
            &batch,
            &mut outgoing,
        );
        // The later peers' sockets wait for their own batch (dropped on an
        // error: this communicator is failing).
        let later_slots: Vec<usize> = slots
            .keys()
            .copied()
            .filter(|p| !batch.contains(p))
            .collect();
        for p in later_slots {
            let socks = slots.remove(&p).expect("listed");
            if shaken.is_ok() && socks.iter().any(Option::is_some) {
                kept.insert(p, socks);
            }
        }
        drop(kept);
        shaken?;

        // 3. Acknowledge the accepted hellos.
        for (peer, socks) in &slots {
            for (idx, a) in socks.iter().enumerate() {
                let a = a.as_ref().expect("every slot is filled");
                let ack = frame::ack_for(&a.hello, &setup.secret, &a.server_nonce);
                write_all_deadline(&a.sock, &ack, deadline).map_err(|e| {
                    err(format!(
                        "sending the acknowledgement to peer rank {peer} (socket {idx} of {nsocks}) failed: {e}"
                    ))
                })?;
            }
        }

        // 4. Wait for the lower ranks' acknowledgements.
        for o in &outgoing {
            let (peer, addr, idx) = (o.peer, o.addr, o.idx);
            let (hello, server_nonce) = o.sent.as_ref().expect("every hello is sent");
            let mut ack = [0u8; ACK_BYTES];
            match read_exact_deadline(&o.sock, &mut ack, deadline) {
                Ok(()) if frame::ack_valid(&ack, hello, &setup.secret, server_nonce) => {}
                Ok(()) => {
                    return Err(err(format!(
                        "peer rank {peer} at {addr} answered socket {idx} of {nsocks} with a wrong \
                         acknowledgement: it does not hold this communicator's secret (or replayed \
                         an old answer)"
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
                         communicator id, different SNCL_NSOCKS, piece size or TLS settings, or \
                         not expecting rank {me}); see that rank's log"
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

        // 5. Wrap them up, in the caller's order (with TLS, after every
        //    socket's TLS handshake).
        let mut connected: BTreeMap<usize, Vec<Socket>> = BTreeMap::new();
        for o in outgoing {
            // In socket index order: pushed so in step 1.
            connected.entry(o.peer).or_default().push(o.sock);
        }
        let mut accepted: BTreeMap<usize, Vec<Socket>> = slots
            .into_iter()
            .map(|(peer, socks)| {
                (
                    peer,
                    socks.into_iter().map(|a| a.expect("filled").sock).collect(),
                )
            })
            .collect();
        let addr_of: BTreeMap<usize, SocketAddr> = peers.iter().copied().collect();
        let mut channels = match &setup.tls {
            Some(identity) => {
                crate::tls::establish_channels(setup, identity, &connected, &accepted, &addr_of)?
            }
            None => BTreeMap::new(),
        };
        let max_piece = setup.max_piece;
        peers
            .iter()
            .map(|&(peer, addr)| {
                let socks = if peer < me {
                    connected.remove(&peer).expect("connected")
                } else {
                    accepted.remove(&peer).expect("accepted")
                };
                if let Some(&rate) = setup.pacing.get(&peer) {
                    for (idx, s) in socks.iter().enumerate() {
                        sys::set_max_pacing_rate(s.as_raw_fd(), rate).map_err(|e| Error::Io {
                            rank: me,
                            context: format!(
                                "pacing socket {idx} to peer rank {peer} at {addr} to {rate} B/s \
                                 (SO_MAX_PACING_RATE, SNCL_TCP_PACING)"
                            ),
                            source: e,
                        })?;
                    }
                    tracing::debug!(rank = me, peer, rate, "tcp sockets paced (bytes/s each)");
                }
                let mut tls = channels.remove(&peer).unwrap_or_default().into_iter();
                let socks = socks.into_iter().map(|s| (s, tls.next())).collect();
                TcpConnection::new(me, peer, max_piece, addr, socks).map_err(|e| Error::Io {
                    rank: me,
                    context: format!("configuring the TCP sockets to peer rank {peer} at {addr}"),
                    source: e,
                })
            })
            .collect()
    }
}

/// This host's address for a new rendezvous root when no interface is
/// named: the first IPv4 address of an up interface that is not loopback
/// or a docker / virtual bridge; `None` when there is none.
pub fn default_host_ipv4() -> Option<Ipv4Addr> {
    sys::interface_addrs()
        .ok()?
        .into_iter()
        .filter(|a| a.up)
        .filter(|a| {
            !["docker", "virbr", "lo"]
                .iter()
                .any(|p| a.name.starts_with(p))
        })
        .find_map(|a| match a.addr {
            Some(IpAddr::V4(ip)) if !ip.is_loopback() && !ip.is_unspecified() => Some(ip),
            _ => None,
        })
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

#[cfg(test)]
mod tests {
    use comm_core::tune::LinkCost;

    use super::*;

    fn tiers(inter_bytes_per_s: Option<f64>, nic: Option<&str>) -> TierSpec {
        let mut t = TierSpec {
            inter: inter_bytes_per_s.map(|b| LinkCost {
                alpha_us: 50.0,
                bytes_per_us: b / 1e6,
            }),
            ..TierSpec::default()
        };
        t.cluster.nic = nic.map(str::to_owned);
        t
    }

    #[test]
    fn pacing_rate_is_the_link_share_of_one_socket() {
        let none = tiers(None, None);
        // 100 Mbit/s = 12.5 MB/s shared by 4 ranks x 2 sockets.
        let r = socket_pacing_rate(TcpPacing::Rate(12.5e6), &none, 4, 2, 1).expect("paced");
        assert_eq!(r, (12.5e6 * PACING_HEADROOM / 8.0) as u64);
        assert_eq!(r, 1_484_375);
        // Off paces nothing, whatever the topology says.
        assert_eq!(
            socket_pacing_rate(TcpPacing::Off, &tiers(Some(1e9), None), 4, 2, 1),
            None
        );
        // Auto: the topology's inter bandwidth (a measured goodput, used
        // whole), or nothing without one.
        assert_eq!(GOODPUT_HEADROOM, 1.0);
        assert_eq!(socket_pacing_rate(TcpPacing::Auto, &none, 4, 2, 1), None);
        assert_eq!(
            socket_pacing_rate(TcpPacing::Auto, &tiers(Some(12.5e6), None), 4, 2, 1),
            Some(1_562_500)
        );
        // A NIC per rank: the link is not shared by the node's ranks.
        assert_eq!(
            socket_pacing_rate(TcpPacing::Auto, &tiers(Some(12.5e6), Some("rank")), 4, 2, 1),
            Some(6_250_000)
        );
        assert_eq!(
            socket_pacing_rate(TcpPacing::Auto, &tiers(Some(12.5e6), Some("node")), 4, 1, 1),
            Some(3_125_000)
        );
        // A split communicator (one rank per node) still shares the link
        // with the node's other ranks when the topology counts them.
        let mut split = tiers(Some(12.5e6), Some("node"));
        split.cluster.ranks_per_node = Some(4);
        assert_eq!(
            socket_pacing_rate(TcpPacing::Auto, &split, 1, 2, 1),
            Some(1_562_500)
        );
        // An exchange with 3 other nodes at once (the compressed
        // all-reduce): each socket gets a third of the single-flow share.
        assert_eq!(
            socket_pacing_rate(TcpPacing::Rate(12.5e6), &none, 4, 2, 3),
            Some(1_484_375 / 3)
        );
        // Degenerate inputs: no division by zero, a floor of 1 KB/s.
        assert_eq!(
            socket_pacing_rate(TcpPacing::Rate(1e6), &none, 0, 0, 1),
            Some(950_000)
        );
        assert_eq!(
            socket_pacing_rate(TcpPacing::Rate(10.0), &none, 64, 64, 1),
            Some(1000)
        );
        assert_eq!(
            socket_pacing_rate(TcpPacing::Rate(f64::NAN), &none, 1, 1, 1),
            None
        );
    }
}
