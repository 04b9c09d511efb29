//! Entry points of this transport's decoders for the fuzz targets and
//! property tests in `fuzz/` (not API: hidden from the docs, may change at
//! any time). Each takes bytes as a peer would send them and must return,
//! never panic, hang or allocate beyond the protocol's limits.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use comm_core::wire::PieceHeader;

use crate::frame::{self, Greeting, Hello, ACK_BYTES, GREETING_BYTES, HELLO_BYTES};
use crate::handshake::{judge, Slots, Verdict};
use crate::params::TcpSetup;

/// The secret the fuzzed handshake checks against.
pub const SECRET: [u8; 16] = *b"sncl-fuzz-secret";
/// The server nonce the fuzzed handshake greeted with.
pub const SERVER_NONCE: [u8; 16] = [5; 16];

/// What the connecting rank does with the first bytes of the acceptor's
/// greeting: the magic check on every prefix, then the decode.
pub fn greeting(b: &[u8]) -> Result<(u16, [u8; 16]), &'static str> {
    let plausible = Greeting::plausible_prefix(&b[..b.len().min(GREETING_BYTES)]);
    let Some(g) = b.first_chunk::<GREETING_BYTES>() else {
        return Err("short greeting");
    };
    let g = Greeting::decode(g)?;
    assert!(plausible, "decoded a greeting whose prefix was refused");
    Ok((g.version, g.nonce))
}

/// What the accepting rank does with a hello: prefix checks, version, then
/// the full verdict (tag, communicator, ranks, socket index) of a setup for
/// rank 0 of `nsocks` sockets expecting ranks 1 to 3. Returns the accepted
/// (peer, socket) or the refusal.
pub fn hello(b: &[u8], nsocks: usize, max_piece: usize) -> Result<(usize, usize), String> {
    let _ = Hello::plausible_prefix(&b[..b.len().min(HELLO_BYTES)]);
    let _ = Hello::version_of_prefix(&b[..b.len().min(HELLO_BYTES)]);
    let Some(bytes) = b.first_chunk::<HELLO_BYTES>() else {
        return Err("short hello".into());
    };
    let setup = TcpSetup {
        rank: 0,
        comm_id: 0x5eed,
        secret: SECRET,
        nsocks,
        max_piece,
        deadline: Instant::now() + Duration::from_secs(1),
        pacing: Default::default(),
        tls: None,
    };
    let mut slots: Slots = BTreeMap::new();
    for peer in 1..4 {
        slots.insert(peer, (0..nsocks).map(|_| None).collect());
    }
    match judge(&setup, bytes, &SERVER_NONCE, &slots) {
        Verdict::Accept { from, idx } => Ok((from, idx)),
        Verdict::Refuse(e) | Verdict::Fatal(e) => Err(e),
    }
}

/// A valid hello from rank `from` for [`hello`]'s setup (a seed for the
/// mutating fuzzer).
pub fn valid_hello(
    from: u32,
    sock_idx: u32,
    nsocks: u32,
    max_piece: u32,
    client_nonce: [u8; 16],
) -> [u8; HELLO_BYTES] {
    Hello {
        version: frame::PROTOCOL_VERSION,
        comm_id: 0x5eed,
        from_rank: from,
        to_rank: 0,
        sock_idx,
        nsocks,
        max_piece,
        tls: false,
    }
    .encode(&SECRET, &SERVER_NONCE, &client_nonce)
}

/// A hello with any fields, signed with [`SECRET`] over [`SERVER_NONCE`]:
/// a mutated hello that still passes the tag check, so the fuzzer reaches
/// the checks after it (communicator, ranks, socket index, sizes).
/// `fields` are the version, communicator id, from and to ranks, socket
/// index, sockets and piece size, in that order.
pub fn signed_hello(
    (version, comm_id, from_rank, to_rank): (u16, u64, u32, u32),
    (sock_idx, nsocks, max_piece): (u32, u32, u32),
    client_nonce: [u8; 16],
) -> [u8; HELLO_BYTES] {
    Hello {
        version,
        comm_id,
        from_rank,
        to_rank,
        sock_idx,
        nsocks,
        max_piece,
        tls: false,
    }
    .encode(&SECRET, &SERVER_NONCE, &client_nonce)
}

/// The communicator id [`hello`]'s setup expects.
pub const COMM_ID: u64 = 0x5eed;
/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u16 = frame::PROTOCOL_VERSION;

/// What the connecting rank does with the acceptor's ack of `hello`.
pub fn ack(ack: &[u8], hello: &[u8; HELLO_BYTES]) -> bool {
    match ack.first_chunk::<ACK_BYTES>() {
        Some(a) => frame::ack_valid(a, hello, &SECRET, &SERVER_NONCE),
        None => false,
    }
}

/// The acceptor's ack of `hello` (a seed).
pub fn valid_ack(hello: &[u8; HELLO_BYTES]) -> [u8; ACK_BYTES] {
    frame::ack_for(hello, &SECRET, &SERVER_NONCE)
}

/// What the receive path makes of received data bytes: a whole piece
/// (header and frame length), `None` when more bytes are needed, or an
/// error for an abort frame or corrupt bytes.
pub fn data(avail: &[u8], max_piece: usize) -> Result<Option<(PieceHeader, usize)>, String> {
    crate::frame::classify(avail, max_piece)
}
