//! What this transport puts on the wire besides pieces.
//!
//! * Setup: a connecting rank sends one [`Hello`] (64 bytes) per socket; the
//!   accepting rank answers with a 16-byte ack. Both carry a SipHash-2-4 tag
//!   keyed with the communicator's secret, so the secret itself never travels
//!   and each side knows the other holds it.
//! * Data: every frame starts with 40 bytes. A piece frame is the
//!   [`PieceHeader`](comm_core::wire::PieceHeader) (first word `"SNCL"`)
//!   followed by `len` payload bytes. An abort frame has first word `"ABRT"`,
//!   then a flag and the blamed rank, and no payload.

use comm_core::wire::HEADER_BYTES;

use crate::mac;

/// First word of a hello ("STCP" read as little-endian bytes).
const HELLO_MAGIC: u32 = u32::from_le_bytes(*b"STCP");
/// Version of this setup and framing protocol.
pub(crate) const PROTOCOL_VERSION: u16 = 1;
/// Encoded size of a hello.
pub(crate) const HELLO_BYTES: usize = 64;
/// Bytes of a hello covered by its tag.
const HELLO_SIGNED: usize = 48;
/// Encoded size of an ack.
pub(crate) const ACK_BYTES: usize = 16;
/// First word of an abort frame.
pub(crate) const ABORT_MAGIC: u32 = u32::from_le_bytes(*b"ABRT");

const DOMAIN_HELLO: u8 = b'H';
const DOMAIN_ACK: u8 = b'A';

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
}

impl Hello {
    /// Encodes and signs the hello with `secret`.
    pub(crate) fn encode(&self, secret: &[u8; 16]) -> [u8; HELLO_BYTES] {
        let mut b = [0u8; HELLO_BYTES];
        b[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&self.version.to_le_bytes());
        b[8..16].copy_from_slice(&self.comm_id.to_le_bytes());
        b[16..20].copy_from_slice(&self.from_rank.to_le_bytes());
        b[20..24].copy_from_slice(&self.to_rank.to_le_bytes());
        b[24..28].copy_from_slice(&self.sock_idx.to_le_bytes());
        b[28..32].copy_from_slice(&self.nsocks.to_le_bytes());
        b[32..36].copy_from_slice(&self.max_piece.to_le_bytes());
        let tag = mac::mac128(secret, DOMAIN_HELLO, &b[..HELLO_SIGNED]);
        b[HELLO_SIGNED..].copy_from_slice(&tag);
        b
    }

    /// Whether the first bytes received so far can start a hello.
    pub(crate) fn plausible_prefix(b: &[u8]) -> bool {
        let magic = HELLO_MAGIC.to_le_bytes();
        let n = b.len().min(4);
        b[..n] == magic[..n]
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
        })
    }

    /// Whether the encoded hello `b` was signed with `secret`.
    pub(crate) fn authentic(b: &[u8; HELLO_BYTES], secret: &[u8; 16]) -> bool {
        let tag = mac::mac128(secret, DOMAIN_HELLO, &b[..HELLO_SIGNED]);
        mac::tags_equal(&tag, b[HELLO_SIGNED..].try_into().expect("16 bytes"))
    }
}

/// The acceptor's answer to the encoded hello `hello`: proves it knows the secret too.
pub(crate) fn ack_for(hello: &[u8; HELLO_BYTES], secret: &[u8; 16]) -> [u8; ACK_BYTES] {
    mac::mac128(secret, DOMAIN_ACK, hello)
}

/// Whether `ack` answers `hello` under `secret`.
pub(crate) fn ack_valid(
    ack: &[u8; ACK_BYTES],
    hello: &[u8; HELLO_BYTES],
    secret: &[u8; 16],
) -> bool {
    mac::tags_equal(ack, &ack_for(hello, secret))
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

/// The first word of a frame.
pub(crate) fn first_word(b: &[u8; HEADER_BYTES]) -> u32 {
    u32::from_le_bytes(b[0..4].try_into().expect("4 bytes"))
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
        }
    }

    #[test]
    fn hello_round_trip_and_auth() {
        let secret = [7u8; 16];
        let b = hello().encode(&secret);
        assert_eq!(Hello::decode(&b), Ok(hello()));
        assert!(Hello::authentic(&b, &secret));
        assert!(!Hello::authentic(&b, &[8u8; 16]));
        let mut forged = b;
        forged[16] = 2; // claim another rank, keep the tag
        assert!(!Hello::authentic(&forged, &secret));
        assert!(Hello::plausible_prefix(&b[..3]));
        assert!(!Hello::plausible_prefix(b"GET "));
        let ack = ack_for(&b, &secret);
        assert!(ack_valid(&ack, &b, &secret));
        assert!(!ack_valid(&ack, &b, &[0u8; 16]));
        assert!(!ack_valid(&ack, &forged, &secret));
    }

    #[test]
    fn abort_round_trip() {
        for cause in [None, Some(0), Some(17)] {
            let b = encode_abort(cause);
            assert_eq!(first_word(&b), ABORT_MAGIC);
            assert_eq!(decode_abort(&b), cause);
        }
    }
}
