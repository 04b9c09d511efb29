//! A TCP socket beside each RDMA connection that carries no data, only the
//! news a NIC takes long to give (issue 36, risk 6).
//!
//! A peer whose process dies stops answering; its NIC's retries of every
//! WRITE to it run out only after 4.096 µs × 2^`SNCL_IB_TIMEOUT` ×
//! (`SNCL_IB_RETRY_CNT` + 1), 34 s at the defaults (`emu/timing.rs` models
//! it), and a peer whose own QP broke (fatal error, port down) cannot tell
//! this side over RDMA at all. The kernel closes a dead process's sockets
//! at once, so the socket's end is seen by the next liveness check; a side
//! whose connection broke writes one byte on it; a node that vanishes
//! without closing anything is found by TCP keep-alive (a probe after 1 s
//! idle, one more a second later: about 2 s; the kernel counts in whole
//! seconds). NCCL's bootstrap sockets play the
//! same part for its proxy.
//!
//! Pairing: the lower rank of each pair listens (one listener per setup,
//! on the address the TCP transport uses); the higher connects and sends a
//! hello of the communicator id and its rank. The socket carries no data:
//! a stranger that connects is dropped at its hello, and one that forged a
//! hello could only report a failure.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use socket2::{SockRef, TcpKeepalive};

/// What a side whose connection broke writes.
const BROKEN: u8 = b'F';
const HELLO: usize = 16;
/// The longest a connection may take to say hello.
const HELLO_WAIT: Duration = Duration::from_secs(1);

/// One pair's liveness socket.
#[derive(Debug)]
pub(crate) struct Liveness {
    sock: TcpStream,
    told: bool,
}

fn configure(sock: &TcpStream) -> std::io::Result<()> {
    let s = SockRef::from(sock);
    s.set_tcp_keepalive(
        &TcpKeepalive::new()
            .with_time(Duration::from_secs(1))
            .with_interval(Duration::from_secs(1))
            .with_retries(1),
    )?;
    sock.set_nodelay(true)?;
    sock.set_nonblocking(true)
}

impl Liveness {
    /// `Err((gone, what happened))` when the peer's process is gone or its
    /// node unreachable (`gone`), or its side reported the connection
    /// broken.
    pub(crate) fn check(&mut self) -> Result<(), (bool, String)> {
        let mut b = [0u8; 1];
        match self.sock.peek(&mut b) {
            Ok(0) => Err((
                true,
                "its process exited (its liveness socket closed)".into(),
            )),
            Ok(_) if b[0] == BROKEN => Err((
                false,
                "it reported its side of the connection broken (a fatal QP or port error there)"
                    .into(),
            )),
            Ok(_) => Err((
                false,
                "it wrote an unknown byte on the liveness socket".into(),
            )),
            Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(()),
            Err(e) if e.kind() == ErrorKind::Interrupted => Ok(()),
            Err(e) => Err((
                true,
                format!("its liveness socket failed: {e} (the node or network is down)"),
            )),
        }
    }

    /// Tells the peer this side's connection broke (once; best effort).
    pub(crate) fn tell_broken(&mut self) {
        if !self.told {
            self.told = true;
            let _ = SockRef::from(&self.sock).send_with_flags(&[BROKEN], libc::MSG_NOSIGNAL);
        }
    }
}

/// The listener of a setup: the lower rank of each pair waits here.
pub(crate) struct Listener {
    inner: TcpListener,
    /// Where peers connect.
    pub(crate) addr: SocketAddr,
}

/// Listens on `ip` (an ephemeral port).
pub(crate) fn listen(ip: IpAddr) -> std::io::Result<Listener> {
    let inner = TcpListener::bind(SocketAddr::new(ip, 0))?;
    let addr = inner.local_addr()?;
    Ok(Listener { inner, addr })
}

fn hello(comm_id: u64, rank: usize) -> [u8; HELLO] {
    let mut h = [0u8; HELLO];
    h[..8].copy_from_slice(&comm_id.to_le_bytes());
    h[8..].copy_from_slice(&(rank as u64).to_le_bytes());
    h
}

/// The higher rank's side: connects to the lower rank's `addr`.
pub(crate) fn connect(
    addr: SocketAddr,
    comm_id: u64,
    rank: usize,
    deadline: Instant,
) -> std::io::Result<Liveness> {
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    let mut sock = TcpStream::connect_timeout(&addr, left)?;
    sock.set_write_timeout(Some(left))?;
    sock.write_all(&hello(comm_id, rank))?;
    configure(&sock)?;
    Ok(Liveness { sock, told: false })
}

/// The lower rank's side: accepts until every rank of `from` said hello
/// for `comm_id`; `Err` names those missing at the deadline.
pub(crate) fn accept(
    listener: &Listener,
    comm_id: u64,
    from: &[usize],
    deadline: Instant,
) -> Result<Vec<(usize, Liveness)>, String> {
    let mut got: Vec<(usize, Liveness)> = Vec::with_capacity(from.len());
    listener
        .inner
        .set_nonblocking(true)
        .map_err(|e| format!("liveness listener: {e}"))?;
    while got.len() < from.len() {
        let now = Instant::now();
        if now >= deadline {
            let missing: Vec<usize> = from
                .iter()
                .copied()
                .filter(|p| got.iter().all(|(g, _)| g != p))
                .collect();
            return Err(format!(
                "peer rank(s) {missing:?} did not open their RDMA liveness sockets by the deadline"
            ));
        }
        let mut sock = match listener.inner.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
            Err(e) => return Err(format!("liveness listener: {e}")),
        };
        // A peer says hello as soon as it connects; a stranger that says
        // nothing is dropped after HELLO_WAIT, not at the setup's deadline
        // (which would fail the setup for everyone waiting behind it).
        let mut h = [0u8; HELLO];
        let wait = (deadline - now).clamp(Duration::from_millis(1), HELLO_WAIT);
        let read = sock
            .set_nonblocking(false)
            .and_then(|()| sock.set_read_timeout(Some(wait)))
            .and_then(|()| sock.read_exact(&mut h));
        let id = u64::from_le_bytes(h[..8].try_into().expect("8 bytes"));
        let rank = u64::from_le_bytes(h[8..].try_into().expect("8 bytes")) as usize;
        let wanted = from.contains(&rank) && got.iter().all(|(g, _)| *g != rank);
        if read.is_err() || id != comm_id || !wanted {
            continue; // a stranger, or a hello that never came: dropped
        }
        configure(&sock).map_err(|e| format!("liveness socket of peer rank {rank}: {e}"))?;
        got.push((rank, Liveness { sock, told: false }));
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_peer_and_a_reported_failure_are_seen_at_once() {
        let l = listen("127.0.0.1".parse().unwrap()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        // Strangers first: one with another communicator's hello, one
        // silent (dropped after HELLO_WAIT, not at the deadline).
        let mut stranger = TcpStream::connect(l.addr).unwrap();
        stranger.write_all(&hello(99, 1)).unwrap();
        let _silent = TcpStream::connect(l.addr).unwrap();
        let mut hi = connect(l.addr, 7, 1, deadline).unwrap();
        let mut lo = accept(&l, 7, &[1], deadline).unwrap().pop().unwrap().1;
        assert!(lo.check().is_ok() && hi.check().is_ok());
        hi.tell_broken();
        let (gone, e) = lo.check().unwrap_err();
        assert!(!gone && e.contains("reported"), "{e}");
        drop(hi);
        drop(lo);

        let mut hi = connect(l.addr, 7, 2, deadline).unwrap();
        let (rank, lo) = accept(&l, 7, &[2], deadline).unwrap().pop().unwrap();
        assert_eq!(rank, 2);
        drop(lo.sock.try_clone().unwrap()); // a clone's drop closes nothing
        assert!(hi.check().is_ok());
        drop(lo);
        let start = Instant::now();
        let (gone, e) = loop {
            if let Err(e) = hi.check() {
                break e;
            }
            assert!(start.elapsed() < Duration::from_secs(2), "no end seen");
        };
        assert!(gone && e.contains("exited"), "{e}");
        // Nobody comes: the deadline names the missing rank.
        let e = accept(&l, 7, &[3], Instant::now() + Duration::from_millis(50)).unwrap_err();
        assert!(e.contains("[3]"), "{e}");
    }
}
