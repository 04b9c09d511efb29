//! TLS on a connection's sockets (`SNCL_TLS_*`): after the secret's
//! challenge–response, every socket runs a TLS 1.3 handshake (the
//! accepting, lower rank as the server, both sides presenting
//! certificates: [`sncl_bootstrap::tls`]), all sockets of a rank at once in
//! one `poll(2)` loop; then every frame travels encrypted.
//!
//! The handshake runs on rustls's unbuffered connections; once both sides
//! have confirmed it (one byte each way, see [`ACCEPTED`]), the session is
//! handed to this crate's record layer ([`record`]) the way rustls hands
//! one to kernel TLS. A [`TlsChannel`] is a transform beside the socket,
//! not a stream over it: a frame is sealed into the stream's outgoing byte
//! buffer (which the plain path's partial-write machinery then writes),
//! and a receive reads ciphertext in large reads into the channel's
//! buffer, opens each record in place and copies its plaintext out once.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::net::SocketAddr;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use rustls::client::UnbufferedClientConnection;
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{ConnectionState, EncodeError, UnbufferedStatus};
use sncl_bootstrap::tls::{describe, TlsIdentity};
use socket2::Socket;

use crate::sys::{self, PollFd};

mod record;
#[doc(hidden)]
pub use record::{key_updates_sent, set_records_per_key};
use record::{KeySchedule, Records};

/// One socket's TLS session after its handshake: the record layer and the
/// receive-side ciphertext buffer, in which records are opened in place.
pub(crate) struct TlsChannel {
    records: Records,
    /// Ciphertext read from the socket; `cipher[start..end]` is not yet
    /// opened.
    cipher: Box<[u8]>,
    start: usize,
    end: usize,
    /// Plaintext of an opened record not yet handed out (in `cipher`).
    plain: Range<usize>,
    /// The socket reported end of file, or the peer sent `close_notify`.
    eof: bool,
}

impl TlsChannel {
    /// A channel with a receive buffer of `buffer_bytes` holding
    /// `leftover`, ciphertext that arrived with the end of the handshake.
    fn new(records: Records, buffer_bytes: usize, leftover: &[u8]) -> TlsChannel {
        let mut cipher = vec![0u8; buffer_bytes.max(leftover.len())].into_boxed_slice();
        cipher[..leftover.len()].copy_from_slice(leftover);
        TlsChannel {
            records,
            cipher,
            start: 0,
            end: leftover.len(),
            plain: 0..0,
            eof: false,
        }
    }

    /// Encrypts `parts` (one frame) and appends the records to `out`.
    pub(crate) fn seal(&mut self, parts: &[&[u8]], out: &mut Vec<u8>) -> io::Result<()> {
        self.records.seal(parts, out)
    }

    /// Whether plaintext or a whole record waits in the channel (a peer
    /// whose socket is at end of file may still have frames here; a
    /// partial record alone does not count, so a peer that died mid-record
    /// is still found dead).
    pub(crate) fn holds_bytes(&self) -> bool {
        !self.plain.is_empty()
            || matches!(
                Records::complete_record(&self.cipher[self.start..self.end]),
                Ok(Some(_))
            )
    }

    /// Reads plaintext into `dst` from what the channel holds and then
    /// from the socket until `dst` is full or the socket has nothing more:
    /// `Ok(0)` at the end of the stream, `WouldBlock` when nothing came.
    /// Records the channel must answer (a key update) are appended to `out`.
    pub(crate) fn read(
        &mut self,
        sock: &Socket,
        dst: &mut [u8],
        out: &mut Vec<u8>,
    ) -> io::Result<usize> {
        let mut got = 0;
        loop {
            if !self.plain.is_empty() {
                let n = self.plain.len().min(dst.len() - got);
                let from = self.plain.start;
                dst[got..got + n].copy_from_slice(&self.cipher[from..from + n]);
                got += n;
                self.plain.start += n;
                if got == dst.len() {
                    return Ok(got);
                }
            }
            if let Some(len) = Records::complete_record(&self.cipher[self.start..self.end])? {
                let at = self.start;
                self.start += len;
                match self.records.open(&mut self.cipher[at..at + len], out)? {
                    Some(r) => self.plain = at + r.start..at + r.end,
                    None => self.eof = true,
                }
                continue;
            }
            if self.eof {
                return Ok(got);
            }
            // Keep the partial record at the front and read behind it.
            self.cipher.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            match (&*sock).read(&mut self.cipher[self.end..]) {
                Ok(0) => self.eof = true,
                Ok(n) => self.end += n,
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
/// The connecting side's answer to [`ACCEPTED`]: after it nothing of the
/// handshake is in flight, so both sides hand the session to the record
/// layer with nothing buffered inside rustls.
const READY: u8 = 0x5d;

/// Where a socket's handshake stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// The TLS handshake itself.
    Tls,
    /// Accepting side: [`ACCEPTED`] sent, waiting for [`READY`].
    AwaitReady,
    /// Connecting side: [`ACCEPTED`] received, [`READY`] to send.
    SendReady,
    /// Done: hand over once everything is sent.
    Finished,
}

/// What a handshake step needs next.
enum Next {
    Continue,
    Read,
}

enum Session {
    Client(UnbufferedClientConnection),
    Server(UnbufferedServerConnection),
}

/// One socket's handshake in progress.
pub(crate) struct Handshake {
    /// Who is at the other end, for errors ("peer rank 3 at ADDR (socket 0 of 2)").
    pub who: String,
    session: Session,
    /// Received bytes rustls has not consumed.
    incoming: Vec<u8>,
    /// Encoded bytes to send, and how much of them is sent.
    outgoing: Vec<u8>,
    sent: usize,
    phase: Phase,
    /// Confirmed and sent (the driver stops stepping it).
    done: bool,
}

/// Largest handshake message accepted (rustls's own bound).
const MAX_HANDSHAKE_BYTES: usize = 64 * 1024 + 1024;

fn handle<Data>(
    status: UnbufferedStatus<'_, '_, Data>,
    phase: &mut Phase,
    server: bool,
    out: &mut Vec<u8>,
) -> Result<(usize, Next), String> {
    let discard = status.discard;
    let next = match status.state.map_err(|e| describe(&e))? {
        ConnectionState::EncodeTlsData(mut e) => {
            let at = out.len();
            out.resize(at + 4096, 0);
            let n = match e.encode(&mut out[at..]) {
                Ok(n) => n,
                Err(EncodeError::InsufficientSize(s)) => {
                    out.resize(at + s.required_size, 0);
                    e.encode(&mut out[at..]).map_err(|e| e.to_string())?
                }
                Err(e) => return Err(e.to_string()),
            };
            out.truncate(at + n);
            Next::Continue
        }
        // Sent by the caller's loop before the next call.
        ConnectionState::TransmitTlsData(t) => {
            t.done();
            Next::Continue
        }
        ConnectionState::BlockedHandshake => Next::Read,
        ConnectionState::WriteTraffic(mut w) => {
            let byte = match (*phase, server) {
                (Phase::Tls, true) => ACCEPTED,
                (Phase::SendReady, false) => READY,
                _ => return Ok((discard, Next::Read)),
            };
            let mut record = [0u8; 64];
            let n = w
                .encrypt(&[byte], &mut record)
                .map_err(|e| format!("confirming the TLS handshake failed: {e}"))?;
            out.extend_from_slice(&record[..n]);
            *phase = if server {
                Phase::AwaitReady
            } else {
                Phase::Finished
            };
            Next::Continue
        }
        ConnectionState::ReadTraffic(mut r) => {
            while let Some(record) = r.next_record() {
                let record = record.map_err(|e| describe(&e))?;
                *phase = match (*phase, server, record.payload) {
                    (Phase::Tls, false, [ACCEPTED]) => Phase::SendReady,
                    (Phase::AwaitReady, true, [READY]) => Phase::Finished,
                    _ => {
                        return Err(format!(
                            "unexpected data during the TLS handshake ({} bytes)",
                            record.payload.len()
                        ))
                    }
                };
            }
            Next::Continue
        }
        ConnectionState::PeerClosed | ConnectionState::Closed => {
            return Err("the peer closed the TLS session during the handshake".into())
        }
        other => return Err(format!("unexpected TLS state {other:?}")),
    };
    Ok((discard, next))
}

impl Handshake {
    /// The accepting side of a socket (the lower rank).
    pub(crate) fn server(identity: &TlsIdentity, who: String) -> io::Result<Handshake> {
        let conn = UnbufferedServerConnection::new(identity.server_config())
            .map_err(|e| io::Error::other(describe(&e)))?;
        Ok(Handshake::with(Session::Server(conn), who))
    }

    /// The connecting side of a socket (the higher rank).
    pub(crate) fn client(identity: &TlsIdentity, who: String) -> io::Result<Handshake> {
        let conn =
            UnbufferedClientConnection::new(identity.client_config(), TlsIdentity::server_name())
                .map_err(|e| io::Error::other(describe(&e)))?;
        Ok(Handshake::with(Session::Client(conn), who))
    }

    fn with(session: Session, who: String) -> Handshake {
        Handshake {
            who,
            session,
            incoming: Vec::with_capacity(16 * 1024),
            outgoing: Vec::with_capacity(4096),
            sent: 0,
            phase: Phase::Tls,
            done: false,
        }
    }

    /// Whether the step is waiting to send rather than to receive.
    fn wants_write(&self) -> bool {
        self.sent < self.outgoing.len()
    }

    /// Advances the handshake without blocking; `Ok(true)` once it is
    /// confirmed on both sides and everything it sent has left. Errors say
    /// what failed.
    fn step(&mut self, sock: &Socket) -> Result<bool, String> {
        loop {
            while self.sent < self.outgoing.len() {
                match sock.send_with_flags(&self.outgoing[self.sent..], libc::MSG_NOSIGNAL) {
                    Ok(n) => self.sent += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(format!("sending the TLS handshake failed: {e}")),
                }
            }
            self.outgoing.clear();
            self.sent = 0;
            if self.phase == Phase::Finished {
                return Ok(true);
            }
            let (incoming, phase, out) = (&mut self.incoming, &mut self.phase, &mut self.outgoing);
            let (discard, next) = match &mut self.session {
                Session::Client(c) => handle(c.process_tls_records(incoming), phase, false, out),
                Session::Server(s) => handle(s.process_tls_records(incoming), phase, true, out),
            }?;
            self.incoming.drain(..discard);
            if let Next::Continue = next {
                continue;
            }
            if self.incoming.len() >= MAX_HANDSHAKE_BYTES {
                return Err("the peer's handshake messages are too large".into());
            }
            let at = self.incoming.len();
            self.incoming.resize(at + 16 * 1024, 0);
            let read = (&*sock).read(&mut self.incoming[at..]);
            self.incoming.truncate(at + *read.as_ref().unwrap_or(&0));
            match read {
                Ok(0) => {
                    return Err(
                        "the peer closed the connection during the TLS handshake: it refused \
                         this rank's certificate or runs without TLS (see that rank's log)"
                            .into(),
                    )
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("reading the TLS handshake failed: {e}")),
            }
        }
    }

    /// The established channel, with a receive buffer of `buffer_bytes`:
    /// the session's secrets go to this crate's record layer.
    fn into_channel(self, buffer_bytes: usize) -> Result<TlsChannel, String> {
        let fail = |e: rustls::Error| format!("handing the TLS session over failed: {e}");
        let (secrets, schedule) = match self.session {
            Session::Client(c) => c
                .dangerous_into_kernel_connection()
                .map(|(s, k)| (s, KeySchedule::Client(k)))
                .map_err(fail)?,
            Session::Server(s) => s
                .dangerous_into_kernel_connection()
                .map(|(s, k)| (s, KeySchedule::Server(k)))
                .map_err(fail)?,
        };
        let records = Records::new(schedule, secrets.tx, secrets.rx).map_err(|e| e.to_string())?;
        Ok(TlsChannel::new(records, buffer_bytes, &self.incoming))
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
                    let read = !hs.wants_write();
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
    // Each socket's handshake and, in the same order, its peer.
    let mut pairs: Vec<(Handshake, &Socket)> = Vec::new();
    let mut peers = Vec::new();
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
                pairs.push((hs, sock));
                peers.push(peer);
            }
        }
    }
    let started = Instant::now();
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
        let who = hs.who.clone();
        let channel = hs
            .into_channel(CIPHER_BUFFER_BYTES)
            .map_err(|why| err(format!("TLS with {who}: {why}")))?;
        channels.entry(peer).or_default().push(channel);
    }
    Ok(channels)
}
