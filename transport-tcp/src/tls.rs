//! TLS on a connection's sockets (`SNCL_TLS_*`): after the secret's
//! challenge–response, every socket runs a TLS 1.3 handshake (the
//! accepting, lower rank as the server, both sides presenting
//! certificates: [`sncl_bootstrap::tls`]), all sockets of a rank at once in
//! one `poll(2)` loop; then every frame travels encrypted.
//!
//! A [`TlsChannel`] is a transform beside the socket, not a stream over
//! it: a frame is sealed into the stream's outgoing byte buffer (which the
//! plain path's partial-write machinery then writes), and a receive reads
//! ciphertext from the socket in large reads into the channel's own
//! buffer, feeds rustls from there (rustls reads a socket 4 KiB at a time)
//! and hands back plaintext.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use rustls::{ClientConnection, Connection, ServerConnection};
use sncl_bootstrap::tls::{describe, TlsIdentity};
use socket2::Socket;

use crate::sys::{self, PollFd};

/// Largest plaintext sealed through a scratch copy in one record: a frame
/// up to this size (header, payload and trailer) is one TLS record, not
/// one per part.
const COALESCE_BYTES: usize = 16 * 1024;

/// One socket's TLS session and its receive-side ciphertext buffer.
pub(crate) struct TlsChannel {
    conn: Connection,
    /// Ciphertext read from the socket, not yet given to rustls.
    cipher: Box<[u8]>,
    cipher_start: usize,
    cipher_end: usize,
    /// The socket reported end of file.
    eof: bool,
    /// A frame's parts gathered for one record.
    scratch: Vec<u8>,
}

fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {}", describe(&e)))
}

impl TlsChannel {
    /// A channel after its handshake, with a receive buffer of `buffer_bytes`.
    fn new(conn: Connection, buffer_bytes: usize) -> TlsChannel {
        TlsChannel {
            conn,
            cipher: vec![0u8; buffer_bytes].into_boxed_slice(),
            cipher_start: 0,
            cipher_end: 0,
            eof: false,
            scratch: Vec::with_capacity(COALESCE_BYTES),
        }
    }

    /// Encrypts `parts` (one frame) and appends the records to `out`.
    pub(crate) fn seal(&mut self, parts: &[&[u8]], out: &mut Vec<u8>) -> io::Result<()> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        if total <= COALESCE_BYTES && parts.len() > 1 {
            self.scratch.clear();
            for p in parts {
                self.scratch.extend_from_slice(p);
            }
            self.conn.writer().write_all(&self.scratch)?;
        } else {
            for p in parts.iter().filter(|p| !p.is_empty()) {
                self.conn.writer().write_all(p)?;
            }
        }
        self.drain_records(out)
    }

    /// Moves what rustls has to send (sealed records, a key update's
    /// answer) to `out`.
    fn drain_records(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        while self.conn.wants_write() {
            self.conn.write_tls(out)?;
        }
        Ok(())
    }

    /// Whether decrypted bytes or ciphertext wait in the channel (a peer
    /// whose socket is at end of file may still have frames here).
    pub(crate) fn holds_bytes(&self) -> bool {
        self.cipher_start < self.cipher_end
    }

    /// Reads plaintext into `dst` from what the channel holds and then
    /// from the socket until `dst` is full or the socket has nothing more:
    /// `Ok(0)` at the end of the stream, `WouldBlock` when nothing came.
    /// Records rustls must answer (a key update) are appended to `out`.
    pub(crate) fn read(
        &mut self,
        sock: &Socket,
        dst: &mut [u8],
        out: &mut Vec<u8>,
    ) -> io::Result<usize> {
        let mut got = 0;
        loop {
            match self.conn.reader().read(&mut dst[got..]) {
                Ok(n) => {
                    got += n;
                    if n == 0 || got == dst.len() {
                        return Ok(got); // full, or the peer's close_notify
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(got),
                Err(e) => return Err(e),
            }
            if self.cipher_start < self.cipher_end {
                let mut pending = &self.cipher[self.cipher_start..self.cipher_end];
                let before = pending.len();
                self.conn.read_tls(&mut pending)?;
                self.cipher_start += before - pending.len();
                self.conn.process_new_packets().map_err(tls_error)?;
                self.drain_records(out)?;
                continue;
            }
            if self.eof {
                return Ok(got);
            }
            self.cipher_start = 0;
            self.cipher_end = 0;
            match (&*sock).read(&mut self.cipher) {
                Ok(0) => self.eof = true,
                Ok(n) => self.cipher_end = n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && got > 0 => return Ok(got),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// The accepting side's first application byte: it accepted the
/// connecting side's certificate. In TLS 1.3 the connecting side finishes
/// its handshake before the other side has judged its certificate; waiting
/// for this byte makes a refusal fail the setup on both sides, naming the
/// peer, instead of the first collective on one.
const ACCEPTED: u8 = 0xac;

/// One socket's handshake in progress.
pub(crate) struct Handshake {
    /// Who is at the other end, for errors ("peer rank 3 at ADDR (socket 0 of 2)").
    pub who: String,
    conn: Connection,
    /// The accepting side: sends [`ACCEPTED`]; else waits for it.
    server: bool,
    /// [`ACCEPTED`] sent or received.
    confirmed: bool,
    done: bool,
}

impl Handshake {
    /// The accepting side of a socket (the lower rank).
    pub(crate) fn server(identity: &TlsIdentity, who: String) -> io::Result<Handshake> {
        let conn = ServerConnection::new(identity.server_config()).map_err(tls_error)?;
        Ok(Handshake {
            who,
            conn: conn.into(),
            server: true,
            confirmed: false,
            done: false,
        })
    }

    /// The connecting side of a socket (the higher rank).
    pub(crate) fn client(identity: &TlsIdentity, who: String) -> io::Result<Handshake> {
        let conn = ClientConnection::new(identity.client_config(), TlsIdentity::server_name())
            .map_err(tls_error)?;
        Ok(Handshake {
            who,
            conn: conn.into(),
            server: false,
            confirmed: false,
            done: false,
        })
    }

    /// After the TLS handshake: the accepting side queues [`ACCEPTED`],
    /// the connecting side reads it. `Ok(true)` once it is sent or read.
    fn confirm(&mut self) -> Result<bool, String> {
        if self.server {
            self.conn
                .writer()
                .write_all(&[ACCEPTED])
                .map_err(|e| format!("confirming the TLS handshake failed: {e}"))?;
            return Ok(true);
        }
        let mut byte = [0u8; 1];
        match self.conn.reader().read(&mut byte) {
            Ok(1) if byte[0] == ACCEPTED => Ok(true),
            Ok(_) => Err(
                "the peer closed the connection instead of confirming the TLS handshake \
                 (see that rank's log)"
                    .into(),
            ),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(format!("confirming the TLS handshake failed: {e}")),
        }
    }

    /// Advances the handshake without blocking; `Ok(true)` once it is
    /// complete and everything it sent has left. Errors say what failed.
    fn step(&mut self, sock: &Socket) -> Result<bool, String> {
        loop {
            while self.conn.wants_write() {
                match self.conn.write_tls(&mut SocketWriter(sock)) {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(format!("sending the TLS handshake failed: {e}")),
                }
            }
            if !self.conn.is_handshaking() {
                if self.confirmed {
                    return Ok(true);
                }
                if self.confirm()? {
                    self.confirmed = true;
                    continue;
                }
            }
            match self.conn.read_tls(&mut &*sock) {
                Ok(0) => {
                    return Err(
                        "the peer closed the connection during the TLS handshake: it refused \
                         this rank's certificate or runs without TLS (see that rank's log)"
                            .into(),
                    )
                }
                Ok(_) => {
                    if let Err(e) = self.conn.process_new_packets() {
                        // Tell the peer why (an alert), best effort.
                        let _ = self.conn.write_tls(&mut SocketWriter(sock));
                        return Err(describe(&e));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("reading the TLS handshake failed: {e}")),
            }
        }
    }

    /// The established channel, with a receive buffer of `buffer_bytes`.
    pub(crate) fn into_channel(mut self, buffer_bytes: usize) -> TlsChannel {
        // Sealed records move to the stream's own buffer at once, which
        // does the back-pressure; rustls's default limit (64 KiB) would
        // refuse a whole frame.
        self.conn.set_buffer_limit(None);
        TlsChannel::new(self.conn, buffer_bytes)
    }
}

/// `io::Write` on a non-blocking socket that never raises SIGPIPE.
struct SocketWriter<'a>(&'a Socket);

impl Write for SocketWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.send_with_flags(buf, libc::MSG_NOSIGNAL)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Runs every socket's handshake at once until all are complete or the
/// deadline passes; the error names the first socket that failed (or those
/// still handshaking at the deadline).
pub(crate) fn run_all(
    handshakes: &mut [(Handshake, &Socket)],
    deadline: Instant,
) -> Result<(), String> {
    loop {
        let mut waiting = Vec::new();
        for (hs, sock) in handshakes.iter_mut().filter(|(hs, _)| !hs.done) {
            match hs.step(sock) {
                Ok(true) => hs.done = true,
                Ok(false) => {
                    let read = !hs.conn.wants_write();
                    waiting.push(PollFd::new(sock.as_raw_fd(), read));
                }
                Err(why) => return Err(format!("TLS with {}: {why}", hs.who)),
            }
        }
        if waiting.is_empty() {
            return Ok(());
        }
        let now = Instant::now();
        if now >= deadline {
            let stuck: Vec<&str> = handshakes
                .iter()
                .filter(|(hs, _)| !hs.done)
                .map(|(hs, _)| hs.who.as_str())
                .collect();
            return Err(format!(
                "timed out in the TLS handshake with {}: does that rank run with the same \
                 SNCL_TLS_* settings?",
                stuck.join(", ")
            ));
        }
        sys::poll(
            &mut waiting,
            (deadline - now).min(Duration::from_millis(200)),
        )
        .map_err(|e| format!("waiting for TLS handshakes: {e}"))?;
    }
}

/// Bytes of ciphertext a receive reads from the socket at once.
const CIPHER_BUFFER_BYTES: usize = 256 * 1024;

/// The TLS handshakes of every socket of a setup: this rank is the server
/// on the sockets it `accepted` (from higher ranks) and the client on those
/// it `connected` (to lower ranks). Returns each peer's channels in socket
/// order.
pub(crate) fn establish_channels(
    setup: &crate::TcpSetup,
    identity: &TlsIdentity,
    connected: &BTreeMap<usize, Vec<Socket>>,
    accepted: &BTreeMap<usize, Vec<Socket>>,
    addr_of: &BTreeMap<usize, SocketAddr>,
) -> Result<BTreeMap<usize, Vec<TlsChannel>>, comm_core::Error> {
    let me = setup.rank;
    let err = |detail: String| comm_core::Error::Bootstrap { rank: me, detail };
    let nsocks = setup.nsocks;
    let mut handshakes = Vec::new();
    for (server, side) in [(false, connected), (true, accepted)] {
        for (&peer, socks) in side {
            for (idx, sock) in socks.iter().enumerate() {
                let who = format!(
                    "peer rank {peer} at {} (socket {idx} of {nsocks})",
                    addr_of[&peer]
                );
                let hs = if server {
                    Handshake::server(identity, who)
                } else {
                    Handshake::client(identity, who)
                }
                .map_err(|e| err(format!("starting TLS with peer rank {peer}: {e}")))?;
                handshakes.push(((peer, hs), sock));
            }
        }
    }
    let started = Instant::now();
    let mut pairs: Vec<(Handshake, &Socket)> = Vec::with_capacity(handshakes.len());
    let mut peers = Vec::with_capacity(handshakes.len());
    for ((peer, hs), sock) in handshakes {
        peers.push(peer);
        pairs.push((hs, sock));
    }
    run_all(&mut pairs, setup.deadline).map_err(err)?;
    tracing::debug!(
        rank = me,
        sockets = pairs.len(),
        micros = started.elapsed().as_micros() as u64,
        "tls handshakes complete"
    );
    let mut channels: BTreeMap<usize, Vec<TlsChannel>> = BTreeMap::new();
    // Pushed per peer in socket order above.
    for (peer, (hs, _)) in peers.into_iter().zip(pairs) {
        channels
            .entry(peer)
            .or_default()
            .push(hs.into_channel(CIPHER_BUFFER_BYTES));
    }
    Ok(channels)
}
