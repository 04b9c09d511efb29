//! sncl transport over RDMA verbs: RC queue pairs, RDMA WRITE with
//! immediate into the peer's registered slot FIFO, credits written back.
//!
//! Two verbs providers sit behind the small [`Verbs`] trait:
//! * [`IbvVerbs`]: libibverbs, loaded at run time (`libibverbs.so.1`), so
//!   a machine without it builds, starts and runs over shm/tcp; selected
//!   only where a device port is ACTIVE. None of the project's machines has
//!   an RDMA device, so this path has not run in CI;
//! * [`EmuVerbs`] (`SNCL_IB_EMULATE=1`): emulated verbs between processes of
//!   one machine (shared-memory regions, per-QP rings for immediates), with
//!   QP states, key and bounds checks, completion order, immediates, CQ
//!   overflow and fault injection: the transport's tests run on it.
//!
//! Use: the configuration's [`IbSettings`] (`Config::ib`, parsed from the
//! `SNCL_IB_*` settings), then [`probe`] once per process (an
//! [`Availability::Unavailable`] reason goes to [`log_skipped`]: one INFO
//! line), then [`establish`] with the bootstrap store and the peers; each
//! [`RdmaConnection`] implements the executor's
//! [`Connection`](comm_core::transport::Connection). Design and the binding
//! decision: docs/RDMA.md.
//!
//! ```no_run
//! use std::time::{Duration, Instant};
//! use sncl_bootstrap::MemoryStore;
//! use sncl_bootstrap::ConfigFromEnv;
//! use comm_core::transport::Connection;
//! use transport_rdma::{establish, log_skipped, probe, Availability, IbSettings, RdmaSetup};
//!
//! # fn main() -> Result<(), comm_core::Error> {
//! # let (rank, nranks, comm_id, store) = (0, 2, 7u64, MemoryStore::new());
//! # let rdma_peers = vec![1usize];
//! let ib: IbSettings = comm_core::Config::from_env()?.ib;
//! let provider = match probe(&ib) {
//!     Availability::Ready(p) => p,
//!     Availability::Unavailable(why) => {
//!         log_skipped(&why); // one INFO line; use shm/tcp
//!         return Ok(());
//!     }
//! };
//! let setup = RdmaSetup {
//!     rank,
//!     comm_id,
//!     settings: ib,
//!     slots: transport_rdma::DEFAULT_SLOTS,
//!     slot_bytes: transport_rdma::DEFAULT_SLOT_BYTES,
//!     deadline: Instant::now() + Duration::from_secs(30),
//!     // A dead peer seen at once (src/liveness.rs), not after the NIC's retries.
//!     liveness_ip: Some(std::net::Ipv4Addr::LOCALHOST.into()),
//!     // One device context per port per process, shared by every connection.
//!     context: transport_rdma::ContextScope::Process,
//! };
//! let mut conns: Vec<Option<Box<dyn Connection>>> = (0..nranks).map(|_| None).collect();
//! for c in establish(&setup, &provider, &store, &rdma_peers)? {
//!     let p = c.peer();
//!     conns[p] = Some(Box::new(c)); // kind() == "rdma"
//! }
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

mod completions;
mod conn;
mod context;
mod devregs;
pub mod emu;
pub mod fabric;
mod gdr;
mod gdr_board;
pub mod gid;
mod handle;
mod ibv;
mod kind;
mod link_watch;
mod liveness;
mod locks;
mod mem;
pub mod numa;
mod post;
mod progress;
mod regcache;
mod sendq;
mod setup;
mod sys;
pub mod topo;
pub mod verbs;

pub use comm_core::config::{HcaEntry, HcaFilter, IbSettings, MAX_QPS_PER_CONN};
pub use conn::ZERO_COPY_MIN;
pub use context::ContextScope;
pub use emu::EmuVerbs;
pub use gdr::{gdr_bounced_bytes, gdr_bytes};
#[doc(hidden)]
pub use gdr_board::fuzz_gdr_board;
pub use handle::RdmaConnection;
pub use ibv::{list_ports, DevicePort, IbvVerbs};
pub use kind::RdmaKind;
pub use regcache::ZeroCopy;
pub use setup::{
    establish, log_skipped, memlock_shortfall, pinned_for, probe, probe_for, usable_ports,
    Availability, Provider, RdmaSetup, DEFAULT_SLOTS, DEFAULT_SLOT_BYTES,
};
pub use sys::{memlock_advice, memlock_limit, PinRules};
pub use verbs::Verbs;
