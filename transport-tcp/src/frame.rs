//! What this transport puts on the wire besides pieces.
//!
//! * Setup, per socket, a challenge–response in three messages (all little
//!   endian):
//!   1. the accepting (lower) rank sends a [`Greeting`] (32 bytes: magic
//!      `"STCG"`, protocol version, a fresh 16-byte server nonce) as soon as
//!      it accepts the connection;
//!   2. the connecting rank answers with a [`Hello`] (96 bytes: 48 bytes of
//!      fields — magic `"STCP"`, version, communicator id, ranks, socket
//!      index, `nsocks`, piece size, flags (bit 0: TLS) — then its own fresh 16-byte client
//!      nonce, then `HMAC-SHA-256(secret, "sncl-tcp-hello" ‖ fields ‖
//!      server nonce ‖ client nonce)`);
//!   3. the accepting rank checks that tag (in constant time) and answers
//!      with a 32-byte ack, `HMAC-SHA-256(secret, "sncl-tcp-ack" ‖ fields ‖
//!      client nonce ‖ server nonce)`, which the connecting rank checks.
//!
//!   The secret never travels; each side proves it holds it over a nonce
//!   the other side just drew, so a recorded hello (or greeting and ack)
//!   replayed on a new connection fails authentication.
//! * Data: every frame starts with at least 32 bytes. A piece frame is the
//!   [`PieceHeader`](comm_core::wire::PieceHeader) (first word `"SNCL"`;
//!   48 bytes on the first piece of a message, which carries the
//!   operation's fingerprint, 32 on the pieces after it) followed by `len`
//!   payload bytes; when the header's checksum flag is
//!   set (`SNCL_CHECKSUM=1`), its CRC32C field is zero and the CRC32C of the
//!   payload follows it in a 4-byte little-endian trailer (the sender
//!   computes it after handing the payload to the kernel, while the bytes
//!   are in cache, so only the pieces the kernel takes are checksummed).
//!   An abort frame (48 bytes) has first word `"ABRT"`, then a flag and
//!   the blamed rank, and no payload.

use comm_core::wire::{PieceHeader, HEADER_BYTES, SHORT_HEADER_BYTES};
use sncl_bootstrap::auth::{self, DIGEST_BYTES, NONCE_BYTES};

/// First word of a hello ("STCP" read as little-endian bytes).
const HELLO_MAGIC: u32 = u32::from_le_bytes(*b"STCP");
/// First word of a greeting.
const GREETING_MAGIC: u32 = u32::from_le_bytes(*b"STCG");
/// Version of this setup and framing protocol (2: nonces from both sides,
/// HMAC-SHA-256 tags).
pub(crate) const PROTOCOL_VERSION: u16 = 2;
/// A handshake nonce.
pub(crate) type Nonce = [u8; NONCE_BYTES];
/// Encoded size of a greeting.
pub(crate) const GREETING_BYTES: usize = 32;
/// Bytes of a hello holding its fields.
const HELLO_FIELDS: usize = 48;
/// Encoded size of a hello: fields, client nonce, tag.
pub(crate) const HELLO_BYTES: usize = HELLO_FIELDS + NONCE_BYTES + DIGEST_BYTES;
/// Encoded size of an ack.
pub(crate) const ACK_BYTES: usize = DIGEST_BYTES;
/// Bytes of a checksummed piece frame's CRC32C trailer.
pub(crate) const TRAILER_BYTES: usize = 4;
/// First word of an abort frame.
pub(crate) const ABORT_MAGIC: u32 = u32::from_le_bytes(*b"ABRT");

const DOMAIN_HELLO: &[u8] = b"sncl-tcp-hello";
const DOMAIN_ACK: &[u8] = b"sncl-tcp-ack";

/// Whether the first bytes received so far can start a message whose first
/// word is `magic`.
fn magic_prefix(b: &[u8], magic: u32) -> bool {
    let magic = magic.to_le_bytes();
    let n = b.len().min(4);
    b[..n] == magic[..n]
}

/// The accepting rank's first message: its protocol version and a fresh
/// nonce the connecting rank must sign over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Greeting {
    pub version: u16,
    pub nonce: Nonce,
}

impl Greeting {
    /// Encodes the greeting.
    pub(crate) fn encode(&self) -> [u8; GREETING_BYTES] {
        let mut b = [0u8; GREETING_BYTES];
        b[0..4].copy_from_slice(&GREETING_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&self.version.to_le_bytes());
        b[16..32].copy_from_slice(&self.nonce);
        b
    }

    /// Whether the first bytes received so far can start a greeting.
    pub(crate) fn plausible_prefix(b: &[u8]) -> bool {
        magic_prefix(b, GREETING_MAGIC)
    }

    /// Decodes a greeting (any version: the caller compares it).
    pub(crate) fn decode(b: &[u8; GREETING_BYTES]) -> Result<Greeting, &'static str> {
        if !Greeting::plausible_prefix(b) {
            return Err("not an sncl TCP endpoint (bad magic in its greeting)");
        }
        Ok(Greeting {
            version: u16::from_le_bytes([b[4], b[5]]),
            nonce: b[16..32].try_into().expect("16 bytes"),
        })
    }
}

/// What a connecting rank says about one socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    pub version: u16,
    pub comm_id: u64,
    pub from_rank: u32,
    pub to_rank: u32,
    pub sock_idx: u32,
    pub nsocks: u32,
    pub max_piece: u32,
    /// The connecting rank runs TLS on its sockets (`SNCL_TLS_*`).
    pub tls: bool,
}

/// Hello flag: the connecting rank runs TLS (bytes 36..40 were zero before
/// TLS, so a rank without it reads as "no TLS").
const HELLO_FLAG_TLS: u32 = 1;

/// The tag of an encoded hello's fields and client nonce under `secret`,
/// for the greeting that carried `server_nonce`.
fn hello_tag(b: &[u8; HELLO_BYTES], secret: &[u8; 16], server_nonce: &Nonce) -> [u8; 32] {
    auth::hmac_sha256(
        secret,
        &[
            DOMAIN_HELLO,
            &b[..HELLO_FIELDS],
            server_nonce,
            client_nonce(b),
        ],
    )
}

/// The client nonce inside an encoded hello.
fn client_nonce(b: &[u8; HELLO_BYTES]) -> &[u8] {
    &b[HELLO_FIELDS..HELLO_FIELDS + NONCE_BYTES]
}

impl Hello {
    /// Encodes the hello with the connecting rank's fresh `client_nonce` and
    /// signs it with `secret` for the greeting that carried `server_nonce`.
    pub(crate) fn encode(
        &self,
        secret: &[u8; 16],
        server_nonce: &Nonce,
        client_nonce: &Nonce,
    ) -> [u8; HELLO_BYTES] {
        let mut b = [0u8; HELLO_BYTES];
        b[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&self.version.to_le_bytes());
        b[8..16].copy_from_slice(&self.comm_id.to_le_bytes());
        b[16..20].copy_from_slice(&self.from_rank.to_le_bytes());
        b[20..24].copy_from_slice(&self.to_rank.to_le_bytes());
        b[24..28].copy_from_slice(&self.sock_idx.to_le_bytes());
        b[28..32].copy_from_slice(&self.nsocks.to_le_bytes());
        b[32..36].copy_from_slice(&self.max_piece.to_le_bytes());
        let flags = if self.tls { HELLO_FLAG_TLS } else { 0 };
        b[36..40].copy_from_slice(&flags.to_le_bytes());
        b[HELLO_FIELDS..HELLO_FIELDS + NONCE_BYTES].copy_from_slice(client_nonce);
        let tag = hello_tag(&b, secret, server_nonce);
        b[HELLO_FIELDS + NONCE_BYTES..].copy_from_slice(&tag);
        b
    }

    /// Whether the first bytes received so far can start a hello.
    pub(crate) fn plausible_prefix(b: &[u8]) -> bool {
        magic_prefix(b, HELLO_MAGIC)
    }

    /// The protocol version of a hello, once its first 6 bytes are in (so a
    /// peer speaking another version is told so without waiting for a
    /// complete hello whose size may differ).
    pub(crate) fn version_of_prefix(b: &[u8]) -> Option<u16> {
        (b.len() >= 6).then(|| u16::from_le_bytes([b[4], b[5]]))
    }

    /// Decodes a hello without checking its tag (see [`Hello::authentic`]).
    pub(crate) fn decode(b: &[u8; HELLO_BYTES]) -> Result<Hello, &'static str> {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        if u32_at(0) != HELLO_MAGIC {
            return Err("not an sncl TCP hello (bad magic)");
        }
        Ok(Hello {
            version: u16::from_le_bytes([b[4], b[5]]),
            comm_id: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            from_rank: u32_at(16),
            to_rank: u32_at(20),
            sock_idx: u32_at(24),
            nsocks: u32_at(28),
            max_piece: u32_at(32),
            tls: u32_at(36) & HELLO_FLAG_TLS != 0,
        })
    }

    /// Whether the encoded hello `b` was signed with `secret` for the
    /// greeting that carried `server_nonce` (compared in constant time).
    pub(crate) fn authentic(
        b: &[u8; HELLO_BYTES],
        secret: &[u8; 16],
        server_nonce: &Nonce,
    ) -> bool {
        auth::verify_hmac_sha256(
            secret,
            &[
                DOMAIN_HELLO,
                &b[..HELLO_FIELDS],
                server_nonce,
                client_nonce(b),
            ],
            &b[HELLO_FIELDS + NONCE_BYTES..],
        )
    }
}

fn ack_parts<'a>(hello: &'a [u8; HELLO_BYTES], server_nonce: &'a Nonce) -> [&'a [u8]; 4] {
    [
        DOMAIN_ACK,
        &hello[..HELLO_FIELDS],
        client_nonce(hello),
        server_nonce,
    ]
}

/// The acceptor's answer to the encoded hello `hello` it received after
/// greeting with `server_nonce`: proves it knows the secret too.
pub(crate) fn ack_for(
    hello: &[u8; HELLO_BYTES],
    secret: &[u8; 16],
    server_nonce: &Nonce,
) -> [u8; ACK_BYTES] {
    auth::hmac_sha256(secret, &ack_parts(hello, server_nonce))
}

/// Whether `ack` answers `hello` (sent after a greeting carrying
/// `server_nonce`) under `secret`; compared in constant time.
pub(crate) fn ack_valid(
    ack: &[u8; ACK_BYTES],
    hello: &[u8; HELLO_BYTES],
    secret: &[u8; 16],
    server_nonce: &Nonce,
) -> bool {
    auth::verify_hmac_sha256(secret, &ack_parts(hello, server_nonce), ack)
}

/// Encodes an abort frame blaming `cause`.
pub(crate) fn encode_abort(cause: Option<usize>) -> [u8; HEADER_BYTES] {
    let mut b = [0u8; HEADER_BYTES];
    b[0..4].copy_from_slice(&ABORT_MAGIC.to_le_bytes());
    if let Some(c) = cause {
        b[4..8].copy_from_slice(&1u32.to_le_bytes());
        b[8..16].copy_from_slice(&(c as u64).to_le_bytes());
    }
    b
}

/// Decodes the blamed rank of an abort frame (its first word already checked).
pub(crate) fn decode_abort(b: &[u8; HEADER_BYTES]) -> Option<usize> {
    let flag = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes"));
    let cause = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
    (flag == 1).then_some(cause as usize)
}

/// The first word of a frame (of its first [`SHORT_HEADER_BYTES`], what
/// every frame has).
pub(crate) fn first_word(b: &[u8; SHORT_HEADER_BYTES]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// What the front of a socket's receive buffer holds.
pub(crate) enum Front {
    /// A whole piece: its header, the header's encoded length (the
    /// payload follows it) and the total frame length.
    Piece(PieceHeader, usize, usize),
    /// An abort frame blaming this rank.
    Abort(Option<usize>),
    /// An incomplete frame that needs this many bytes in total.
    Need(usize),
    /// Not a frame.
    Corrupt(String),
}

/// Classifies the first frame of the received bytes `avail`.
pub(crate) fn front_of(avail: &[u8], max_piece: usize) -> Front {
    // Every frame is at least a short header long (an abort frame, a
    // header with a fingerprint: HEADER_BYTES).
    let Some(h) = avail.first_chunk::<SHORT_HEADER_BYTES>() else {
        return Front::Need(SHORT_HEADER_BYTES);
    };
    if first_word(h) == ABORT_MAGIC {
        return match avail.first_chunk::<HEADER_BYTES>() {
            Some(a) => Front::Abort(decode_abort(a)),
            None => Front::Need(HEADER_BYTES),
        };
    }
    let hlen = match PieceHeader::encoded_len_at(h) {
        Ok(n) => n,
        Err(e) => return Front::Corrupt(e.to_string()),
    };
    if avail.len() < hlen {
        return Front::Need(hlen);
    }
    match PieceHeader::decode_prefix(avail).map(|(h, _)| h) {
        Err(e) => Front::Corrupt(e.to_string()),
        Ok(hdr) if hdr.len as usize > max_piece => Front::Corrupt(format!(
            "piece of {} bytes exceeds the maximum piece size {max_piece}",
            hdr.len
        )),
        Ok(hdr) if hdr.checksum.is_some_and(|c| c != 0) => Front::Corrupt(
            "a piece header carries a CRC32C; on tcp it travels in the frame's trailer".into(),
        ),
        Ok(mut hdr) => {
            let trailer = if hdr.checksum.is_some() {
                TRAILER_BYTES
            } else {
                0
            };
            let total = hlen + hdr.len as usize + trailer;
            if avail.len() < total {
                return Front::Need(total);
            }
            if trailer > 0 {
                let t = &avail[total - TRAILER_BYTES..total];
                hdr.checksum = Some(u32::from_le_bytes(t.try_into().expect("4 bytes")));
            }
            Front::Piece(hdr, hlen, total)
        }
    }
}

/// What the receive path makes of the received bytes `avail` (fuzzing
/// entry): `Ok(Some((header, frame bytes)))` for a whole piece,
/// `Ok(None)` when more bytes are needed (never more than one frame of
/// `max_piece`), `Err` for an abort frame or corrupt bytes.
pub(crate) fn classify(
    avail: &[u8],
    max_piece: usize,
) -> Result<Option<(PieceHeader, usize)>, String> {
    match front_of(avail, max_piece) {
        Front::Piece(h, _, total) => Ok(Some((h, total))),
        Front::Need(n) => {
            assert!(
                n <= HEADER_BYTES + max_piece + TRAILER_BYTES,
                "asks for {n} bytes"
            );
            Ok(None)
        }
        Front::Abort(cause) => Err(format!("abort frame blaming {cause:?}")),
        Front::Corrupt(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> Hello {
        Hello {
            version: PROTOCOL_VERSION,
            comm_id: 0x1234_5678_9abc,
            from_rank: 3,
            to_rank: 1,
            sock_idx: 2,
            nsocks: 4,
            max_piece: 1 << 19,
            tls: true,
        }
    }

    #[test]
    fn greeting_round_trip() {
        let g = Greeting {
            version: PROTOCOL_VERSION,
            nonce: [9; 16],
        };
        let b = g.encode();
        assert_eq!(Greeting::decode(&b), Ok(g));
        assert!(Greeting::plausible_prefix(&b[..2]));
        assert!(!Greeting::plausible_prefix(b"STCP"));
        let mut junk = b;
        junk[0] = b'X';
        assert!(Greeting::decode(&junk).is_err());
    }

    #[test]
    fn hello_round_trip_and_auth() {
        let secret = [7u8; 16];
        let (snonce, cnonce) = ([1u8; 16], [2u8; 16]);
        let b = hello().encode(&secret, &snonce, &cnonce);
        assert_eq!(Hello::decode(&b), Ok(hello()));
        assert_eq!(Hello::version_of_prefix(&b[..6]), Some(PROTOCOL_VERSION));
        assert_eq!(Hello::version_of_prefix(&b[..5]), None);
        assert!(Hello::authentic(&b, &secret, &snonce));
        assert!(!Hello::authentic(&b, &[8u8; 16], &snonce));
        // Replayed on a connection greeted with another nonce.
        assert!(!Hello::authentic(&b, &secret, &[3u8; 16]));
        let mut forged = b;
        forged[16] = 2; // claim another rank, keep the tag
        assert!(!Hello::authentic(&forged, &secret, &snonce));
        let mut renonced = b;
        renonced[HELLO_FIELDS] ^= 1; // another client nonce, same tag
        assert!(!Hello::authentic(&renonced, &secret, &snonce));
        assert!(Hello::plausible_prefix(&b[..3]));
        assert!(!Hello::plausible_prefix(b"GET "));

        let ack = ack_for(&b, &secret, &snonce);
        assert!(ack_valid(&ack, &b, &secret, &snonce));
        assert!(!ack_valid(&ack, &b, &[0u8; 16], &snonce));
        assert!(!ack_valid(&ack, &b, &secret, &[3u8; 16]));
        assert!(!ack_valid(&ack, &forged, &secret, &snonce));
        assert!(!ack_valid(&ack, &renonced, &secret, &snonce));
        // An ack is not a hello tag and vice versa (separate domains).
        assert_ne!(&ack[..], &b[HELLO_FIELDS + NONCE_BYTES..]);
    }

    #[test]
    fn abort_round_trip() {
        for cause in [None, Some(0), Some(17)] {
            let b = encode_abort(cause);
            assert_eq!(first_word(b.first_chunk().unwrap()), ABORT_MAGIC);
            assert_eq!(decode_abort(&b), cause);
        }
    }
}
