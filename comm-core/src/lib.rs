//! sncl core: data types and reduction operators, pure schedules for every
//! collective with a symbolic checker, the planner, the transport and memory
//! interfaces the executor (`sncl-runtime`) walks a schedule over, and the
//! settings table with the typed configuration. The bootstrap (stores, unique id, launcher
//! environment, the reading of the process environment) is `sncl-bootstrap`.

pub mod algo;
pub mod check;
pub mod cluster;
pub mod copies;
pub mod error;
pub mod hash;
pub mod schedule;
pub mod settings;
pub mod shape;
pub mod store;
pub mod throttle;
pub mod transport;
pub mod units;
pub mod wire;

pub use error::{Error, Result};
pub mod dtype;
pub use dtype::{DataType, ReduceOp};
pub mod config;
pub mod mem;
pub mod topo;
pub mod topofile;
pub mod tune;

pub use config::Config;

/// The most ranks one communicator may have.
///
/// Setup allocates per-peer state (connections, rendezvous records,
/// transports, traffic counters) sized by the world size before any peer
/// has answered, so a world size from a caller or a launcher is checked
/// against this bound first: a wrong value is an error, not an allocation
/// that aborts the process. The design targets about 65 536 accelerators
/// per job; this leaves 16× headroom.
pub const MAX_RANKS: usize = 1 << 20;

/// The flight recorder's bounds (the recorder itself, which reads the clock,
/// is `sncl_runtime::flight`).
pub mod flight {
    /// Default of `SNCL_FLIGHT_RECORDER_ENTRIES`.
    pub const DEFAULT_ENTRIES: usize = 1000;
    /// Largest `SNCL_FLIGHT_RECORDER_ENTRIES`.
    pub const MAX_ENTRIES: usize = 1 << 20;
}
