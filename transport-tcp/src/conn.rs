//! [`TcpConnection`]: one peer, `nsocks` non-blocking sockets, pieces striped
//! round-robin over them.

use std::io::{self, IoSlice, Read};
use std::mem::MaybeUninit;
use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use comm_core::transport::registry::MemoryKind;
use comm_core::transport::{
    unsupported_memory, Connection, ConsumeResult, Outgoing, Payload, Space, TransportError,
};
use comm_core::wire::{PieceHeader, HEADER_BYTES};
use socket2::Socket;

/// The largest retransmission timeout of a data connection: after a link
/// flap a connection resumes within about this long of the link coming
/// back (Linux's default backoff reaches many seconds, which a 2 s flap
/// on a rate-limited link turned into a 10 s stall of one rank).
const RTO_MAX: Duration = Duration::from_secs(1);

use crate::frame::{self, front_of, Front, TRAILER_BYTES};
use crate::page_aligned::PageAlignedBytes;
use crate::sys;
use crate::tls::TlsChannel;

/// Bytes a receive may read beyond the frame it completes (collects the next
/// small frames in one system call) and below which a frame's remainder is
/// read together with what follows.
const READAHEAD: usize = 64 * 1024;
/// `send` flags: never raise SIGPIPE (the host process may not ignore it).
const SEND_FLAGS: libc::c_int = libc::MSG_NOSIGNAL;
/// How many bytes the search for an abort frame may skip on a dying connection.
const ABORT_SCAN_LIMIT: usize = 64 << 20;
/// How long dropping a connection may wait for its buffered bytes to leave.
const DROP_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);
/// The largest piece this rank sends (and so the largest part of a receive
/// buffer a piece fills): the bounce buffer a receive reads into and a
/// reduction reads back. At 256 KiB the buffers of both sockets stay in a
/// core's L2 cache between the kernel's copy into them and the reduction
/// out of them, instead of spilling to the shared L3 as the 512 KiB default
/// piece did. Larger `SNCL_TCP_PIECE_BYTES` values are capped to it for
/// sending; receiving still accepts pieces up to the configured size.
pub const BOUNCE_BYTES: usize = 256 * 1024;

/// Why a connection can no longer be used (kept so that every later call
/// reports the same failure).
#[derive(Debug)]
enum Dead {
    Gone(String),
    Aborted(Option<usize>),
    Corrupt(String),
    Io(io::ErrorKind, String),
    Local(Option<usize>),
}

/// Outcome of one `recv` call.
enum Fill {
    Read { n: usize, short: bool },
    Eof,
    WouldBlock,
}

/// One socket with its outgoing remainder and its receive buffer.
struct Stream {
    sock: Socket,
    /// With TLS, the session: frames are sealed into `out` and received
    /// through it.
    tls: Option<TlsChannel>,
    /// Bytes accepted by `try_post_send` that the kernel has not taken yet
    /// (ciphertext with TLS).
    out: Vec<u8>,
    /// How much of `out` is already written.
    out_pos: usize,
    /// Receive buffer: one largest frame plus read-ahead, page-aligned (see
    /// [`PageAlignedBytes`]).
    inb: PageAlignedBytes,
    in_start: usize,
    in_end: usize,
}

impl Stream {
    fn new(sock: Socket, tls: Option<TlsChannel>, max_piece: usize) -> Stream {
        Stream {
            sock,
            tls,
            out: Vec::new(),
            out_pos: 0,
            inb: PageAlignedBytes::zeroed(HEADER_BYTES + max_piece + TRAILER_BYTES + READAHEAD),
            in_start: 0,
            in_end: 0,
        }
    }

    fn pending(&self) -> usize {
        self.out.len() - self.out_pos
    }

    /// Appends bytes behind the pending ones (sealed, with TLS: `parts`
    /// must then be one whole frame).
    fn append(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        if self.out_pos > 0 {
            self.out.drain(..self.out_pos);
            self.out_pos = 0;
        }
        if let Some(tls) = &mut self.tls {
            return tls.seal(parts, &mut self.out);
        }
        for p in parts {
            self.out.extend_from_slice(p);
        }
        Ok(())
    }

    /// Writes pending bytes until the kernel takes no more.
    fn write_pending(&mut self) -> io::Result<()> {
        while self.out_pos < self.out.len() {
            let want = self.out.len() - self.out_pos;
            match self
                .sock
                .send_with_flags(&self.out[self.out_pos..], SEND_FLAGS)
            {
                Ok(n) => {
                    self.out_pos += n;
                    if n < want {
                        break; // the socket buffer is full
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if self.out_pos == self.out.len() {
            self.out.clear();
            self.out_pos = 0;
        }
        Ok(())
    }

    fn front(&self, max_piece: usize) -> Front {
        front_of(&self.inb[self.in_start..self.in_end], max_piece)
    }

    fn release(&mut self, total: usize) {
        self.in_start += total;
        if self.in_start == self.in_end {
            self.in_start = 0;
            self.in_end = 0;
        }
    }

    /// One `recv` towards a frame of `need` bytes. A large remainder is read
    /// exactly (so the buffer empties and nothing needs moving); otherwise up
    /// to [`READAHEAD`] bytes are read, which may include following frames.
    fn fill(&mut self, need: usize) -> io::Result<Fill> {
        let avail = self.in_end - self.in_start;
        debug_assert!(need > avail);
        let remaining = need - avail;
        let want = if need > HEADER_BYTES && remaining >= READAHEAD {
            remaining
        } else {
            READAHEAD.max(remaining)
        };
        if self.inb.len() - self.in_end < want && self.in_start > 0 {
            self.inb.copy_within(self.in_start..self.in_end, 0);
            self.in_start = 0;
            self.in_end = avail;
        }
        // The buffer holds a largest frame plus READAHEAD, so this is >= remaining.
        let want = want.min(self.inb.len() - self.in_end);
        loop {
            let dst = &mut self.inb[self.in_end..self.in_end + want];
            let read = match &mut self.tls {
                Some(tls) => tls.read(&self.sock, dst, &mut self.out),
                None => (&self.sock).read(dst),
            };
            match read {
                Ok(0) => return Ok(Fill::Eof),
                Ok(n) => {
                    self.in_end += n;
                    return Ok(Fill::Read { n, short: n < want });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Fill::WouldBlock),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// Errors that mean the peer (or the path to it) is gone.
fn is_gone(e: &io::Error) -> bool {
    use io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionReset | ConnectionAborted | BrokenPipe | NotConnected | UnexpectedEof | TimedOut
    ) || matches!(
        e.raw_os_error(),
        Some(libc::EHOSTUNREACH | libc::ENETUNREACH | libc::ENETDOWN | libc::EHOSTDOWN)
    )
}

/// A connection to one peer over `nsocks` TCP sockets.
///
/// Piece `k` of the outgoing stream goes on socket `k % nsocks` and the peer
/// reads piece `k` from that socket, so pieces arrive in send order while
/// large messages are striped over all sockets. Every frame is a 48-byte
/// [`PieceHeader`] followed by `len` payload bytes; an abort frame
/// (see [`Connection::abort`]) has its own first word and no payload.
///
/// Back-pressure: a piece is written straight to the socket; only a
/// remainder the kernel did not take is copied into a per-socket buffer, and
/// [`Connection::try_post_send`] answers `Ok(false)` while that socket still has
/// a remainder (or the kernel takes nothing). Call [`Connection::flush`]
/// while waiting so remainders keep moving.
///
/// Created by [`TcpEndpoint::establish`](crate::TcpEndpoint::establish).
/// Dropping it waits up to 2 s for buffered bytes to leave.
pub struct TcpConnection {
    rank: usize,
    peer: usize,
    /// The largest piece accepted from the peer (the configured size).
    accept_piece: usize,
    /// The largest piece sent: `accept_piece` capped to [`BOUNCE_BYTES`].
    max_piece: usize,
    remote: SocketAddr,
    streams: Vec<Stream>,
    next_send: usize,
    next_recv: usize,
    /// Bytes `try_post_send` may buffer per socket beyond a partial write.
    send_cap: usize,
    dead: Option<Dead>,
    /// The CRC32C of a piece whose send the socket refused (address,
    /// length, sequence number, CRC): the executor retries that same piece
    /// next, so the retry does not checksum it again.
    refused_crc: Option<(usize, usize, u64, u32)>,
}

impl std::fmt::Debug for TcpConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpConnection")
            .field("rank", &self.rank)
            .field("peer", &self.peer)
            .field("remote", &self.remote)
            .field("nsocks", &self.streams.len())
            .field("accept_piece", &self.accept_piece)
            .field("max_piece", &self.max_piece)
            .field("dead", &self.dead)
            .finish()
    }
}

impl TcpConnection {
    /// Wraps established sockets (index = socket number).
    pub(crate) fn new(
        rank: usize,
        peer: usize,
        max_piece: usize,
        remote: SocketAddr,
        socks: Vec<(Socket, Option<TlsChannel>)>,
    ) -> io::Result<TcpConnection> {
        let streams = socks
            .into_iter()
            .map(|(s, tls)| {
                s.set_nonblocking(true)?;
                s.set_nodelay(true)?;
                if let Err(e) = sys::cap_retransmission_timeout(s.as_raw_fd(), RTO_MAX) {
                    tracing::debug!(
                        rank,
                        peer,
                        "TCP_RTO_MAX_MS not available ({e}); retransmissions back off as the system's default"
                    );
                }
                Ok(Stream::new(s, tls, max_piece))
            })
            .collect::<io::Result<Vec<_>>>()?;
        let send_piece = max_piece.min(BOUNCE_BYTES);
        if send_piece < max_piece {
            tracing::debug!(
                rank,
                peer,
                max_piece,
                send_piece,
                "tcp pieces capped to the cache-sized bounce buffer"
            );
        }
        Ok(TcpConnection {
            rank,
            peer,
            accept_piece: max_piece,
            max_piece: send_piece,
            remote,
            streams,
            next_send: 0,
            next_recv: 0,
            send_cap: 0,
            dead: None,
            refused_crc: None,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of sockets to the peer.
    pub fn nsocks(&self) -> usize {
        self.streams.len()
    }

    /// The peer's address (its listening endpoint, or the address it
    /// connected from).
    pub fn peer_addr(&self) -> SocketAddr {
        self.remote
    }

    /// Each socket's kernel pacing cap in bytes per second
    /// (`SO_MAX_PACING_RATE`; `u64::MAX`: not paced, 0: unreadable).
    pub fn max_pacing_rates(&self) -> Vec<u64> {
        self.streams
            .iter()
            .map(|s| sys::max_pacing_rate(s.sock.as_raw_fd()).unwrap_or(0))
            .collect()
    }

    /// Segments the kernel retransmitted on this connection's sockets so far
    /// (`TCP_INFO`'s `tcpi_total_retrans`, summed); sockets whose counter
    /// cannot be read count 0. Nonzero on a loss-free path means a queue
    /// overflowed (too many concurrent flows on a rate-limited link).
    pub fn retransmits(&self) -> u64 {
        self.streams
            .iter()
            .filter_map(|s| sys::total_retransmits(s.sock.as_raw_fd()).ok())
            .map(u64::from)
            .sum()
    }

    /// Lets `try_post_send` copy up to `bytes` per socket into user space when the
    /// kernel's socket buffer is full (default 0: only the remainder of a
    /// partial write is kept, the kernel buffer does the queueing).
    pub fn set_send_buffer_limit(&mut self, bytes: usize) {
        self.send_cap = bytes;
    }

    fn dead_error(&self) -> TransportError {
        let peer = self.peer;
        match self.dead.as_ref().expect("connection is dead") {
            Dead::Gone(detail) => TransportError::PeerGone {
                peer,
                detail: detail.clone(),
            },
            Dead::Aborted(cause) => TransportError::PeerAborted {
                peer,
                cause: *cause,
            },
            Dead::Corrupt(detail) => TransportError::Corrupt {
                peer,
                detail: detail.clone(),
            },
            Dead::Io(kind, msg) => TransportError::Io {
                peer,
                source: io::Error::new(*kind, msg.clone()),
            },
            Dead::Local(cause) => TransportError::PeerGone {
                peer,
                detail: format!(
                    "this rank aborted the connection (blaming {})",
                    cause.map_or_else(|| "no rank".to_string(), |c| format!("rank {c}"))
                ),
            },
        }
    }

    fn die(&mut self, dead: Dead) -> TransportError {
        tracing::debug!(rank = self.rank, peer = self.peer, remote = %self.remote, reason = ?dead, "tcp connection failed");
        self.dead = Some(dead);
        self.dead_error()
    }

    /// The peer closed or reset: report its abort frame if one is buffered.
    fn gone(&mut self, detail: String) -> TransportError {
        match self.find_abort() {
            Some(cause) => self.die(Dead::Aborted(cause)),
            None => self.die(Dead::Gone(detail)),
        }
    }

    fn io_failure(&mut self, sock: usize, e: io::Error, what: &str) -> TransportError {
        let n = self.streams.len();
        if is_gone(&e) {
            self.gone(format!("{what} failed on socket {sock} of {n}: {e}"))
        } else if let Some(cause) = self.find_abort() {
            self.die(Dead::Aborted(cause))
        } else {
            self.die(Dead::Io(
                e.kind(),
                format!("{what} failed on socket {sock} of {n}: {e}"),
            ))
        }
    }

    /// Looks for an abort frame on a connection that is failing, discarding
    /// the pieces in front of it (nobody will consume them).
    fn find_abort(&mut self) -> Option<Option<usize>> {
        let max_piece = self.accept_piece;
        let mut budget = ABORT_SCAN_LIMIT;
        for s in &mut self.streams {
            loop {
                match s.front(max_piece) {
                    Front::Abort(cause) => return Some(cause),
                    Front::Piece(_, _, total) => s.release(total),
                    Front::Need(need) => match s.fill(need) {
                        Ok(Fill::Read { n, .. }) if n < budget => budget -= n,
                        _ => break,
                    },
                    Front::Corrupt(_) => break,
                }
            }
        }
        None
    }

    /// Writes what is buffered; `Ok(true)` when nothing is left.
    fn progress(&mut self) -> Result<bool, TransportError> {
        let mut done = true;
        for i in 0..self.streams.len() {
            let s = &mut self.streams[i];
            if s.pending() == 0 {
                continue;
            }
            if let Err(e) = s.write_pending() {
                return Err(self.io_failure(i, e, "send"));
            }
            done &= self.streams[i].pending() == 0;
        }
        Ok(done)
    }

    fn check_usable(&self) -> Result<(), TransportError> {
        match self.dead {
            Some(_) => Err(self.dead_error()),
            None => Ok(()),
        }
    }

    /// Writes the piece straight to socket `k % nsocks`; a remainder the
    /// kernel does not take is buffered. `Ok(false)` while that socket still
    /// has buffered bytes or the kernel takes nothing. The header's `len` is
    /// set to `data.len()`. A `data` longer than `max_piece` is an error.
    fn send_host(&mut self, header: &PieceHeader, data: &[u8]) -> Result<bool, TransportError> {
        self.check_usable()?;
        if data.len() > self.max_piece {
            return Err(TransportError::Io {
                peer: self.peer,
                source: io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "piece of {} bytes exceeds the maximum piece size {}",
                        data.len(),
                        self.max_piece
                    ),
                ),
            });
        }
        self.progress()?;
        let i = self.next_send;
        let nsocks = self.streams.len();
        let checksum = header.checksum.is_some();
        let trailer_len = if checksum { TRAILER_BYTES } else { 0 };
        let mut hbuf = [0u8; HEADER_BYTES];
        let mut h = *header;
        h.len = data.len() as u32;
        h.checksum = checksum.then_some(0);
        // A piece without a fingerprint sends the short header.
        let hlen = h.encode(&mut hbuf);
        let hb = &hbuf[..hlen];
        let frame_len = hlen + data.len() + trailer_len;
        let cap = self.send_cap;
        if self.streams[i].pending() > 0 && self.streams[i].pending() + frame_len > cap {
            return Ok(false);
        }
        // The trailer's CRC32C, computed just before the kernel (or the
        // pending buffer) copies the payload: pieces are at most
        // BOUNCE_BYTES, so the copy reads them from cache, and the whole
        // frame goes in one call (a trailer sent after the payload would
        // hold back the frame's last segment or cost a second call).
        let key = (data.as_ptr() as usize, data.len(), header.seq);
        let crc = checksum.then(|| match self.refused_crc.take() {
            Some((p, l, q, c)) if (p, l, q) == key => c,
            _ => comm_core::wire::piece_checksum(data),
        });
        let tail = crc.unwrap_or(0).to_le_bytes();
        let tail = &tail[..trailer_len];
        let s = &mut self.streams[i];
        if s.pending() > 0 || s.tls.is_some() {
            // With TLS the frame is sealed into the pending bytes whole.
            let sent = s.append(&[hb, data, tail]).and_then(|()| s.write_pending());
            if let Err(e) = sent {
                return Err(self.io_failure(i, e, "send"));
            }
            self.next_send = (i + 1) % nsocks;
            return Ok(true);
        }
        let written = loop {
            let bufs = [IoSlice::new(hb), IoSlice::new(data), IoSlice::new(tail)];
            match s.sock.send_vectored_with_flags(&bufs, SEND_FLAGS) {
                Ok(n) => break Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Ok(0),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        let written = match written {
            Ok(n) => n,
            Err(e) => return Err(self.io_failure(i, e, "send")),
        };
        let s = &mut self.streams[i];
        if written == 0 && frame_len > cap {
            // Collectives only: their pieces carry a sequence number, so a
            // later operation on the same buffer cannot match the key
            // (point-to-point and tagged pieces all carry 0).
            self.refused_crc = crc.filter(|_| key.2 != 0).map(|c| (key.0, key.1, key.2, c));
            return Ok(false);
        }
        // Plain bytes (TLS frames took the branch above): appending cannot fail.
        let _ = if written < hlen {
            s.append(&[&hb[written..], data, tail])
        } else if written < hlen + data.len() {
            s.append(&[&data[written - hlen..], tail])
        } else if written < frame_len {
            s.append(&[&tail[written - hlen - data.len()..]])
        } else {
            Ok(())
        };
        self.next_send = (i + 1) % nsocks;
        Ok(true)
    }

    /// Device memory asked of this host-only connection (`what`: posted,
    /// received).
    fn host_only(&self, what: &str) -> comm_core::Error {
        unsupported_memory(self.rank, self, MemoryKind::Device, what)
    }

    /// What the peer did, as this rank reports it.
    fn error(&self, source: TransportError) -> comm_core::Error {
        comm_core::Error::Transport {
            rank: self.rank,
            source,
        }
    }

    fn recv_inner(
        &mut self,
        consume: &mut dyn FnMut(&PieceHeader, Payload<'_>) -> ConsumeResult,
    ) -> Result<Result<bool, comm_core::Error>, TransportError> {
        self.check_usable()?;
        self.progress()?;
        let i = self.next_recv;
        let n = self.streams.len();
        let max_piece = self.accept_piece;
        let mut drained = false;
        loop {
            match self.streams[i].front(max_piece) {
                Front::Piece(hdr, hlen, total) => {
                    let s = &self.streams[i];
                    let at = s.in_start + hlen;
                    let payload = &s.inb[at..at + hdr.len as usize];
                    if let Err(e) = consume(&hdr, Payload::Host(payload)) {
                        return Ok(Err(e));
                    }
                    self.streams[i].release(total);
                    self.next_recv = (i + 1) % n;
                    return Ok(Ok(true));
                }
                Front::Abort(cause) => return Err(self.die(Dead::Aborted(cause))),
                Front::Corrupt(detail) => {
                    return Err(self.die(Dead::Corrupt(format!("socket {i} of {n}: {detail}"))))
                }
                Front::Need(_) if drained => return Ok(Ok(false)),
                Front::Need(need) => match self.streams[i].fill(need) {
                    Ok(Fill::Read { short, .. }) => drained = short,
                    Ok(Fill::WouldBlock) => return Ok(Ok(false)),
                    Ok(Fill::Eof) => {
                        return Err(self.gone(format!(
                            "connection closed by the peer (EOF on socket {i} of {n})"
                        )))
                    }
                    Err(e) => return Err(self.io_failure(i, e, "receive")),
                },
            }
        }
    }
}

impl Connection for TcpConnection {
    fn retransmits(&self) -> Option<u64> {
        Some(TcpConnection::retransmits(self))
    }

    /// Each socket's receive buffer (a largest frame and read-ahead) and
    /// what it holds of unsent bytes; the kernel's socket buffers are not
    /// this process's memory.
    fn footprint(&self, report: &mut comm_core::transport::footprint::FootprintReport<'_>) {
        use comm_core::transport::footprint::{Purpose, Residence};
        let bytes: usize = self
            .streams
            .iter()
            .map(|s| s.inb.allocated_bytes() + s.out.capacity())
            .sum();
        report(Purpose::Fifo, Residence::Host, bytes as u64);
    }

    fn peer(&self) -> usize {
        self.peer
    }

    /// The configured piece size capped to [`BOUNCE_BYTES`]: both ends of a
    /// connection compute the same value, so the receiver's expected piece
    /// lengths match what the sender sends.
    fn max_piece(&self, _kind: MemoryKind) -> usize {
        self.max_piece
    }

    /// Host pieces only (tcp moves host memory): see
    /// `send_host`. A lent piece is copied like any other.
    fn try_post_send(
        &mut self,
        header: &PieceHeader,
        piece: Outgoing<'_>,
    ) -> Result<bool, comm_core::Error> {
        let Payload::Host(data) = piece.payload() else {
            return Err(self.host_only("posted"));
        };
        self.send_host(header, data).map_err(|e| self.error(e))
    }

    fn try_recv(
        &mut self,
        space: Space<'_>,
        consume: &mut dyn FnMut(&PieceHeader, Payload<'_>) -> ConsumeResult,
    ) -> Result<bool, comm_core::Error> {
        if let Space::Device(_) = space {
            return Err(self.host_only("received"));
        }
        self.recv_inner(consume)
            .unwrap_or_else(|e| Err(self.error(e)))
    }

    fn flush(&mut self) -> Result<bool, comm_core::Error> {
        let r = self.check_usable().and_then(|()| self.progress());
        r.map_err(|e| self.error(e))
    }

    /// Peeks the sockets for errors, and the socket carrying the next
    /// expected piece for EOF (no data is consumed). A complete piece still
    /// buffered counts as alive; EOF on another socket is not conclusive
    /// (the peer may have finished after sending its last pieces there).
    fn check_alive(&mut self) -> Result<(), TransportError> {
        self.check_usable()?;
        let n = self.streams.len();
        let next = self.next_recv;
        let s = &self.streams[next];
        if !matches!(s.front(self.accept_piece), Front::Need(_))
            || s.tls.as_ref().is_some_and(TlsChannel::holds_bytes)
        {
            return Ok(());
        }
        for i in 0..n {
            let mut b = [MaybeUninit::<u8>::uninit(); 1];
            let r = self.streams[i]
                .sock
                .recv_with_flags(&mut b, libc::MSG_PEEK | libc::MSG_DONTWAIT);
            match r {
                Ok(0) if i == next => {
                    return Err(self.gone(format!(
                        "connection closed by the peer (EOF on socket {i} of {n})"
                    )))
                }
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(self.io_failure(i, e, "liveness check")),
            }
        }
        Ok(())
    }

    /// Queues an abort frame behind whatever is buffered on every socket,
    /// writes what the kernel takes without waiting, then shuts down the
    /// sending side. Later calls report the connection as aborted locally.
    fn abort(&mut self, cause: Option<usize>) {
        self.refused_crc = None;
        if self.dead.is_some() {
            return;
        }
        let frame = frame::encode_abort(cause);
        for s in &mut self.streams {
            let _ = s.append(&[&frame]).and_then(|()| s.write_pending());
            let _ = s.sock.shutdown(Shutdown::Write);
        }
        tracing::debug!(
            rank = self.rank,
            peer = self.peer,
            ?cause,
            "tcp connection aborted"
        );
        self.dead = Some(Dead::Local(cause));
    }

    fn kind(&self) -> &'static str {
        "tcp"
    }
}

impl Drop for TcpConnection {
    fn drop(&mut self) {
        let retransmits = self.retransmits();
        if retransmits > 0 {
            tracing::debug!(
                rank = self.rank,
                peer = self.peer,
                remote = %self.remote,
                retransmits,
                "tcp connection closing; segments retransmitted over its lifetime"
            );
        }
        if self.dead.is_some() {
            return;
        }
        let deadline = Instant::now() + DROP_FLUSH_TIMEOUT;
        loop {
            match self.progress() {
                Ok(true) | Err(_) => return,
                Ok(false) => {}
            }
            let now = Instant::now();
            if now >= deadline {
                let left: usize = self.streams.iter().map(Stream::pending).sum();
                tracing::warn!(
                    rank = self.rank,
                    peer = self.peer,
                    remote = %self.remote,
                    bytes = left,
                    "dropping tcp connection with unsent bytes (peer not reading)"
                );
                return;
            }
            let mut fds: Vec<sys::PollFd> = self
                .streams
                .iter()
                .filter(|s| s.pending() > 0)
                .map(|s| sys::PollFd::new(s.sock.as_raw_fd(), false))
                .collect();
            let _ = sys::poll(&mut fds, (deadline - now).min(Duration::from_millis(10)));
        }
    }
}
