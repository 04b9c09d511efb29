//! The TLS 1.3 record layer of an established channel, in this crate's own
//! buffers (RFC 8446 §5): rustls ran the handshake and keeps the key
//! schedule ([`rustls::kernel::KernelConnection`], the interface rustls
//! offers kernel TLS); record protection (nonce, additional data, inner
//! content type, padding) is rustls's own `MessageEncrypter` /
//! `MessageDecrypter` for the negotiated suite. What this module adds is
//! where the bytes live: records are opened in place in the receive
//! buffer and their plaintext copied once into the frame buffer, where
//! rustls's buffered connection copied every byte three times on the way
//! in (measured: 31 % of a 64 MiB all-reduce's samples in `memmove`).
//!
//! Key updates: a channel updates its sending keys after the suite's
//! confidentiality limit of records (AES-GCM: 2^24, RFC 8446 §5.5), sending
//! a `KeyUpdate` first, and follows the peer's `KeyUpdate`s (answering one
//! that asks for it).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use rustls::client::ClientConnectionData;
use rustls::crypto::cipher::{
    InboundOpaqueMessage, MessageDecrypter, MessageEncrypter, OutboundChunks, OutboundPlainMessage,
};
use rustls::kernel::KernelConnection;
use rustls::server::ServerConnectionData;
use rustls::{
    ConnectionTrafficSecrets, ContentType, ProtocolVersion, SupportedCipherSuite, Tls13CipherSuite,
};

/// Largest plaintext of one record (RFC 8446 §5.1).
const MAX_FRAGMENT: usize = 1 << 14;
/// Largest record payload on the wire: plaintext, inner type, padding and
/// tag (RFC 8446 §5.2: 2^14 + 256).
const MAX_CIPHERTEXT: usize = MAX_FRAGMENT + 256;
/// Bytes of a record header.
pub(crate) const HEADER: usize = 5;
/// A TLS 1.3 handshake message `KeyUpdate` (type 24, length 1).
const KEY_UPDATE: [u8; 4] = [24, 0, 0, 1];

/// Records per sending key before a key update, when below the suite's
/// limit (tests lower it; 0: the suite's limit).
static RECORDS_PER_KEY: AtomicU64 = AtomicU64::new(0);
/// Key updates sent by this process (tests read it).
static KEY_UPDATES_SENT: AtomicU64 = AtomicU64::new(0);

/// Lowers the records sent under one key (tests: key updates every few
/// records). 0 restores the suite's confidentiality limit.
#[doc(hidden)]
pub fn set_records_per_key(records: u64) {
    RECORDS_PER_KEY.store(records, Ordering::Relaxed);
}

/// Key updates this process's channels have sent.
#[doc(hidden)]
pub fn key_updates_sent() -> u64 {
    KEY_UPDATES_SENT.load(Ordering::Relaxed)
}

/// The key schedule of either side.
pub(crate) enum KeySchedule {
    Client(KernelConnection<ClientConnectionData>),
    Server(KernelConnection<ServerConnectionData>),
}

impl KeySchedule {
    fn suite(&self) -> SupportedCipherSuite {
        match self {
            KeySchedule::Client(k) => k.negotiated_cipher_suite(),
            KeySchedule::Server(k) => k.negotiated_cipher_suite(),
        }
    }

    fn next_tx(&mut self) -> Result<(u64, ConnectionTrafficSecrets), rustls::Error> {
        match self {
            KeySchedule::Client(k) => k.update_tx_secret(),
            KeySchedule::Server(k) => k.update_tx_secret(),
        }
    }

    fn next_rx(&mut self) -> Result<(u64, ConnectionTrafficSecrets), rustls::Error> {
        match self {
            KeySchedule::Client(k) => k.update_rx_secret(),
            KeySchedule::Server(k) => k.update_rx_secret(),
        }
    }
}

fn invalid(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {what}"))
}

/// One direction's protection: rustls's encrypter or decrypter and the
/// record sequence number.
struct Keys<T: ?Sized> {
    cipher: Box<T>,
    seq: u64,
}

/// An established channel's record layer.
pub(crate) struct Records {
    schedule: KeySchedule,
    suite: &'static Tls13CipherSuite,
    send: Keys<dyn MessageEncrypter>,
    recv: Keys<dyn MessageDecrypter>,
    /// Records sent under one key before updating it.
    limit: u64,
}

fn key_and_iv(
    secrets: ConnectionTrafficSecrets,
) -> io::Result<(rustls::crypto::cipher::AeadKey, rustls::crypto::cipher::Iv)> {
    match secrets {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv }
        | ConnectionTrafficSecrets::Aes256Gcm { key, iv }
        | ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => Ok((key, iv)),
        #[allow(unreachable_patterns)] // the enum is non-exhaustive
        _ => Err(invalid(
            "the negotiated cipher suite has no record layer here",
        )),
    }
}

impl Records {
    /// The record layer of a channel whose handshake ended with `secrets`
    /// (`(sequence, secrets)` per direction).
    pub(crate) fn new(
        schedule: KeySchedule,
        tx: (u64, ConnectionTrafficSecrets),
        rx: (u64, ConnectionTrafficSecrets),
    ) -> io::Result<Records> {
        // Irrefutable unless rustls's TLS 1.2 support is compiled in.
        #[allow(irrefutable_let_patterns)]
        let SupportedCipherSuite::Tls13(suite) = schedule.suite() else {
            return Err(invalid("not a TLS 1.3 session"));
        };
        let (tk, tiv) = key_and_iv(tx.1)?;
        let (rk, riv) = key_and_iv(rx.1)?;
        let suite_limit = suite.common.confidentiality_limit;
        let limit = match RECORDS_PER_KEY.load(Ordering::Relaxed) {
            0 => suite_limit,
            n => n.min(suite_limit),
        };
        Ok(Records {
            send: Keys {
                cipher: suite.aead_alg.encrypter(tk, tiv),
                seq: tx.0,
            },
            recv: Keys {
                cipher: suite.aead_alg.decrypter(rk, riv),
                seq: rx.0,
            },
            schedule,
            suite,
            limit,
        })
    }

    /// Protects one record of type `typ` holding `payload` and appends it to `out`.
    fn seal_record(
        &mut self,
        typ: ContentType,
        payload: OutboundChunks<'_>,
        out: &mut Vec<u8>,
    ) -> io::Result<()> {
        let msg = OutboundPlainMessage {
            typ,
            version: ProtocolVersion::TLSv1_2,
            payload,
        };
        let sealed = self
            .send
            .cipher
            .encrypt(msg, self.send.seq)
            .map_err(|e| invalid(format!("sealing a record failed: {e}")))?;
        self.send.seq += 1;
        out.extend_from_slice(&sealed.encode());
        Ok(())
    }

    /// Sends a `KeyUpdate` (asking the peer to update too when
    /// `request`), then switches to the next sending key.
    fn update_send_key(&mut self, request: bool, out: &mut Vec<u8>) -> io::Result<()> {
        let mut msg = [0u8; 5];
        msg[..4].copy_from_slice(&KEY_UPDATE);
        msg[4] = u8::from(request);
        self.seal_record(ContentType::Handshake, OutboundChunks::Single(&msg), out)?;
        let (seq, secrets) = self
            .schedule
            .next_tx()
            .map_err(|e| invalid(format!("updating the sending key failed: {e}")))?;
        let (key, iv) = key_and_iv(secrets)?;
        self.send = Keys {
            cipher: self.suite.aead_alg.encrypter(key, iv),
            seq,
        };
        KEY_UPDATES_SENT.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Seals `parts` (one frame) into records of at most 16 KiB of
    /// plaintext each, appended to `out`.
    pub(crate) fn seal(&mut self, parts: &[&[u8]], out: &mut Vec<u8>) -> io::Result<()> {
        let mut rest = OutboundChunks::new(parts);
        while !rest.is_empty() {
            if self.send.seq >= self.limit {
                self.update_send_key(false, out)?;
            }
            let (record, after) = rest.split_at(MAX_FRAGMENT);
            self.seal_record(ContentType::ApplicationData, record, out)?;
            rest = after;
        }
        Ok(())
    }

    /// The length of the whole record at the front of `bytes`, once it is
    /// all there; an error for what is not a TLS 1.3 application record.
    pub(crate) fn complete_record(bytes: &[u8]) -> io::Result<Option<usize>> {
        let Some(h) = bytes.first_chunk::<HEADER>() else {
            return Ok(None);
        };
        if h[0] != u8::from(ContentType::ApplicationData) || h[1] != 3 || h[2] != 3 {
            return Err(invalid(format!(
                "not a TLS 1.3 record (header {:02x?})",
                &h[..3]
            )));
        }
        let len = usize::from(u16::from_be_bytes([h[3], h[4]]));
        if len > MAX_CIPHERTEXT {
            return Err(invalid(format!(
                "a record of {len} bytes exceeds {MAX_CIPHERTEXT}"
            )));
        }
        Ok((bytes.len() >= HEADER + len).then_some(HEADER + len))
    }

    /// Opens the whole record `record` (header included) in place. Returns
    /// the range of its application data within `record` (empty for a key
    /// update, which is followed here), or `None` at the peer's
    /// `close_notify`. `out` receives the answer to a key update that asks
    /// for one.
    pub(crate) fn open(
        &mut self,
        record: &mut [u8],
        out: &mut Vec<u8>,
    ) -> io::Result<Option<std::ops::Range<usize>>> {
        let base = record.as_ptr() as usize;
        let msg = InboundOpaqueMessage::new(
            ContentType::ApplicationData,
            ProtocolVersion::TLSv1_2,
            &mut record[HEADER..],
        );
        let plain = self.recv.cipher.decrypt(msg, self.recv.seq).map_err(|e| {
            invalid(format!(
                "a record failed to open (altered or out of order): {e}"
            ))
        })?;
        self.recv.seq += 1;
        let at = plain.payload.as_ptr() as usize - base;
        let range = at..at + plain.payload.len();
        match plain.typ {
            ContentType::ApplicationData => Ok(Some(range)),
            ContentType::Handshake => {
                let m = plain.payload;
                if m.len() != 5 || m[..4] != KEY_UPDATE || m[4] > 1 {
                    return Err(invalid(format!(
                        "unexpected handshake message after the handshake ({} bytes, type {})",
                        m.len(),
                        m.first().copied().unwrap_or(0)
                    )));
                }
                let requested = m[4] == 1;
                let (seq, secrets) = self
                    .schedule
                    .next_rx()
                    .map_err(|e| invalid(format!("following the peer's key update failed: {e}")))?;
                let (key, iv) = key_and_iv(secrets)?;
                self.recv = Keys {
                    cipher: self.suite.aead_alg.decrypter(key, iv),
                    seq,
                };
                if requested {
                    self.update_send_key(false, out)?;
                }
                Ok(Some(at..at))
            }
            ContentType::Alert if plain.payload == [1, 0] => Ok(None), // close_notify
            ContentType::Alert => Err(invalid(format!("the peer sent alert {:?}", plain.payload))),
            other => Err(invalid(format!("unexpected record type {other:?}"))),
        }
    }
}
