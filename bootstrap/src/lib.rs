//! Bootstrap: how the ranks of a job find each other before any data moves.
//!
//! * [`Store`]: a small key-value store (set / blocking get / wait / atomic
//!   add) in the shape of Gloo's rendezvous store and PyTorch's c10d store,
//!   with [`PrefixStore`] for namespacing and [`MemoryStore`] for ranks that
//!   are threads of one process.
//! * [`TcpStoreServer`] / [`TcpStore`]: the store over TCP. Rank 0 runs the
//!   server; every rank connects, proving it knows the job secret.
//! * [`UniqueId`]: root address + secret, 128 bytes like `ncclUniqueId`.
//! * [`LaunchEnv`]: rank, world size, root and secret from torchrun, Open
//!   MPI, Slurm or `SNCL_*` environment variables.
//! * [`environment`]: the one reader of the process environment and the
//!   settings files ([`ReadEnvironment`], [`ConfigFromEnv`]); comm-core's
//!   settings table parses what it read.
//! * [`auth`]: HMAC-SHA-256 / SHA-256 and nonces from the OS's entropy, for
//!   the store's and the TCP transport's handshakes.
//! * [`tls`]: TLS for the store's and the TCP transport's connections
//!   (`SNCL_TLS_*`).

pub mod auth;
/// The one reader of the process environment and the settings files (the
/// `sncl-environment` crate).
pub use sncl_environment as environment;

mod env;
mod store;
mod tcpstore;
pub mod tls;
mod unique_id;

pub use env::{
    configured_secret, parse_host_port, slurm_first_host, LaunchEnv, SecretSource,
    LAUNCHER_OPENMPI, LAUNCHER_SLURM, LAUNCHER_SNCL, LAUNCHER_TORCHRUN, SLURM_PORT_BASE,
    SLURM_PORT_RANGE,
};
pub use environment::{ConfigFromEnv, ReadEnvironment};
pub use store::{store_barrier, MemoryStore, PrefixStore, Store};
/// Entry points of the store decoders for the fuzz targets (`fuzz/`); not API.
#[doc(hidden)]
pub use tcpstore::fuzzing as store_fuzzing;
pub use tcpstore::{
    TcpStore, TcpStoreServer, DEFAULT_IO_TIMEOUT, HANDSHAKE_TIMEOUT, MAX_FRAME_BYTES,
    MAX_PENDING_HANDSHAKES,
};
pub use unique_id::{UniqueId, UNIQUE_ID_BYTES};
