//! The store's wire format: handshake messages, frames, and the limits that
//! bound what a peer can make the other side hold.

use std::io::{self, Read, Write};

use crate::auth::{hmac_sha256, verify_hmac_sha256};

pub(super) const MAGIC: &[u8; 8] = b"SNCLSTR1";
pub(super) const NONCE: usize = crate::auth::NONCE_BYTES;
pub(super) const MAC: usize = crate::auth::DIGEST_BYTES;
/// Bytes of the server's greeting: magic ‖ server nonce.
pub(super) const GREETING_BYTES: usize = 8 + NONCE;
/// Bytes of the client's proof: magic ‖ rank ‖ client nonce ‖ MAC.
pub(super) const PROOF_BYTES: usize = 8 + 8 + NONCE + MAC;

/// Largest request or reply frame. Store values are small (endpoints,
/// node identities, configuration digests: a few KiB per rank), so 4 MiB
/// leaves ample room while a client announcing a huge frame cannot make
/// the other side allocate more than this; and the body is read as it
/// arrives, never allocated from the announced length up front.
pub const MAX_FRAME_BYTES: usize = 4 << 20;

pub(super) const OP_SET: u8 = 1;
pub(super) const OP_GET: u8 = 2;
pub(super) const OP_TRY_GET: u8 = 3;
pub(super) const OP_WAIT: u8 = 4;
pub(super) const OP_ADD: u8 = 5;

pub(super) const ST_OK: u8 = 0;
pub(super) const ST_MISSING: u8 = 1;
pub(super) const ST_TIMEOUT: u8 = 2;
pub(super) const ST_ERROR: u8 = 3;

pub(super) const AUTH_OK: u8 = 0;
pub(super) const AUTH_REFUSED: u8 = 1;

/// The client's proof of the secret for this server nonce.
pub(super) fn client_mac(secret: &[u8; 16], snonce: &[u8], cnonce: &[u8], rank: u64) -> [u8; MAC] {
    hmac_sha256(secret, &client_parts(snonce, cnonce, &rank.to_le_bytes()))
}

fn client_parts<'a>(snonce: &'a [u8], cnonce: &'a [u8], rank: &'a [u8; 8]) -> [&'a [u8]; 4] {
    [b"sncl-client", snonce, cnonce, rank]
}

fn server_parts<'a>(snonce: &'a [u8], cnonce: &'a [u8], rank: &'a [u8; 8]) -> [&'a [u8]; 4] {
    [b"sncl-server", cnonce, snonce, rank]
}

/// The server's proof of the secret for this client nonce.
pub(super) fn server_mac(secret: &[u8; 16], snonce: &[u8], cnonce: &[u8], rank: u64) -> [u8; MAC] {
    hmac_sha256(secret, &server_parts(snonce, cnonce, &rank.to_le_bytes()))
}

/// Whether `mac` proves the client knows the secret (constant time).
pub(super) fn client_mac_valid(
    secret: &[u8; 16],
    snonce: &[u8],
    cnonce: &[u8],
    rank: u64,
    mac: &[u8],
) -> bool {
    verify_hmac_sha256(
        secret,
        &client_parts(snonce, cnonce, &rank.to_le_bytes()),
        mac,
    )
}

/// Whether `mac` proves the server knows the secret (constant time).
pub(super) fn server_mac_valid(
    secret: &[u8; 16],
    snonce: &[u8],
    cnonce: &[u8],
    rank: u64,
    mac: &[u8],
) -> bool {
    verify_hmac_sha256(
        secret,
        &server_parts(snonce, cnonce, &rank.to_le_bytes()),
        mac,
    )
}

pub(super) use crate::auth::nonce;

pub(super) fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u32).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

/// A frame on the wire: length ‖ body; a body over [`MAX_FRAME_BYTES`]
/// is refused before anything is sent.
pub(super) fn frame_bytes(body: &[u8]) -> io::Result<Vec<u8>> {
    if body.len() > MAX_FRAME_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a store message of {} bytes exceeds the {MAX_FRAME_BYTES}-byte limit \
                 (store values are meant to be small)",
                body.len()
            ),
        ));
    }
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&(body.len() as u32).to_le_bytes());
    buf.extend_from_slice(body);
    Ok(buf)
}

/// Writes one frame (see [`frame_bytes`]).
pub(super) fn write_frame(w: &mut impl Write, body: &[u8]) -> io::Result<()> {
    w.write_all(&frame_bytes(body)?)?;
    w.flush()
}

/// The body length a frame's header announces, refused past the limit.
pub(super) fn frame_len(header: [u8; 4]) -> io::Result<usize> {
    let len = u32::from_le_bytes(header) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds the {MAX_FRAME_BYTES}-byte limit"),
        ));
    }
    Ok(len)
}

/// Checks that a body read up to its announced `len` is whole.
pub(super) fn check_body(body: &[u8], len: usize) -> io::Result<()> {
    if body.len() != len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "the peer closed the connection after {} of {len} frame bytes",
                body.len()
            ),
        ));
    }
    Ok(())
}

/// Reads a frame; `Ok(None)` on a clean EOF before its first byte. The
/// body buffer grows with the bytes that actually arrive.
pub(super) fn read_frame(r: &mut impl Read) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let len = frame_len(len)?;
    let mut body = Vec::with_capacity(len.min(64 << 10));
    r.take(len as u64).read_to_end(&mut body)?;
    check_body(&body, len)?;
    Ok(Some(body))
}

/// A cursor over a received frame.
pub(super) struct Cursor<'a>(pub(super) &'a [u8]);

impl<'a> Cursor<'a> {
    pub(super) fn bytes(&mut self, n: usize) -> io::Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "truncated message",
            ));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    pub(super) fn u8(&mut self) -> io::Result<u8> {
        Ok(self.bytes(1)?[0])
    }
    pub(super) fn u32(&mut self) -> io::Result<u32> {
        let b = self.bytes(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub(super) fn u64(&mut self) -> io::Result<u64> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.bytes(8)?);
        Ok(u64::from_le_bytes(a))
    }
    pub(super) fn str(&mut self) -> io::Result<&'a str> {
        let n = self.u32()? as usize;
        std::str::from_utf8(self.bytes(n)?)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "key is not UTF-8"))
    }
    pub(super) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_announced_frame_is_refused_without_allocating() {
        let mut wire = Vec::new();
        wire.extend_from_slice(&(1u32 << 30).to_le_bytes());
        wire.extend_from_slice(&[0u8; 16]);
        let err = read_frame(&mut &wire[..]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("limit"), "{err}");
    }

    #[test]
    fn short_frame_is_an_eof_error() {
        let mut wire = Vec::new();
        wire.extend_from_slice(&100u32.to_le_bytes());
        wire.extend_from_slice(&[7u8; 10]);
        let err = read_frame(&mut &wire[..]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert!(err.to_string().contains("10 of 100"), "{err}");
    }

    #[test]
    fn frames_round_trip_and_oversized_writes_are_refused() {
        let mut wire = Vec::new();
        write_frame(&mut wire, b"hello").unwrap();
        assert_eq!(read_frame(&mut &wire[..]).unwrap().unwrap(), b"hello");
        assert!(read_frame(&mut &[][..]).unwrap().is_none());
        let big = vec![0u8; MAX_FRAME_BYTES + 1];
        let err = write_frame(&mut Vec::new(), &big).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }
}
