//! What a rank brings to the TCP transport's setup ([`TcpSetup`]), read by
//! the endpoint and by the handshake below it.

use std::collections::BTreeMap;
use std::time::Instant;

use sncl_bootstrap::tls::TlsIdentity;

/// What [`TcpEndpoint::establish`](crate::TcpEndpoint::establish) needs to know about this rank and its
/// communicator. Every rank must use the same `comm_id`, `secret`, `nsocks`
/// and `max_piece`.
#[derive(Clone, Debug)]
pub struct TcpSetup {
    /// This rank.
    pub rank: usize,
    /// The communicator's id (carried in every hello and piece header).
    pub comm_id: u64,
    /// Shared secret; a connection must prove it knows it (the secret itself
    /// never travels).
    pub secret: [u8; 16],
    /// Sockets per peer (`SNCL_NSOCKS`, default [`DEFAULT_NSOCKS`](crate::DEFAULT_NSOCKS)).
    pub nsocks: usize,
    /// The largest payload of one piece (default [`DEFAULT_MAX_PIECE`](crate::DEFAULT_MAX_PIECE)).
    pub max_piece: usize,
    /// Every wait of the setup ends here with an error.
    pub deadline: Instant,
    /// Peers whose sockets are paced, each with the pacing rate of one of
    /// its sockets in bytes per second (see [`socket_pacing_rate`](crate::socket_pacing_rate)); peers
    /// not listed are not paced.
    pub pacing: BTreeMap<usize, u64>,
    /// TLS on every socket (`SNCL_TLS_*`); every rank must agree, which the
    /// handshake checks.
    pub tls: Option<TlsIdentity>,
}
