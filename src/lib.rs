//! sncl: collective communication for training clusters built of
//! supernodes — NCCL-style collectives on host memory over shared memory
//! and TCP, with pure schedules, stream-ordered execution, deadlines on
//! every wait and errors that name the rank, the operation and the peer.
//!
//! ```no_run
//! let comm = sncl::Communicator::from_env()?;          // torchrun / mpirun / srun / SNCL_*
//! let mut grad = vec![1.0f32; 1 << 20];
//! comm.all_reduce_in_place(&mut grad, sncl::ReduceOp::Sum)?;
//! # Ok::<(), sncl::Error>(())
//! ```

// Every Rust block of the README and docs/ is compiled (and run unless
// marked no_run) by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/ARCHITECTURE.md")]
struct ArchitectureDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/COST.md")]
struct CostDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/CUDA-MODEL.md")]
struct CudaModelDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/COMPRESSION.md")]
struct CompressionDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/DETERMINISM.md")]
struct DeterminismDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/FAULTS.md")]
struct FaultsDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/FUZZING.md")]
struct FuzzingDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/PERF.md")]
struct PerfDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/perf-notes/NOTEBOOK.md")]
struct PerfNotebookDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/RDMA.md")]
struct RdmaDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/SECURITY.md")]
struct SecurityDoctests;

mod api;
pub mod binding;
mod bucket;
mod bucket_device;
mod buffer;
mod coll_config;
mod comm;
mod compressed;
mod compressed_buffer;
mod compressed_device;
pub mod device;
/// The cudarc crate sncl's `cuda` feature works with (same version).
#[cfg(feature = "cuda")]
pub use cudarc;
mod agree;
mod element;
mod flight;
#[doc(hidden)]
pub mod fuzzing;
mod grow;
mod logging;
mod mem_stats;
mod order;
mod recovery;
mod setup;
mod shrink;
mod split;
mod stats;
mod suspend;
mod window;
mod work;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

pub use api::{Configured, ConfiguredScope};
pub use bucket::{BucketConfig, Bucketer};
#[allow(deprecated)]
pub use bucket_device::DeviceBucketer;
pub use buffer::{Buffer, BufferMut, DeviceId, Lent, Location, Stream};
pub use coll_config::{CollConfig, Protocol, MAX_CALL_CHUNK_BYTES};
pub use comm::{P2p, RawOp, VCounts};
pub use compress::{Codec, ErrorFeedback};
pub use compressed::CompressScope;
pub use compressed_buffer::CompressBuffer;
pub use compressed_device::{CompressedDeviceWork, DeviceFeedback};
pub use device::{DeviceOp, DeviceTransfer};

pub use comm_core::algo::Algorithm;
pub use comm_core::config::{
    DeviceSettings, LogLevel, LogSettings, NvlinkMode, NvlinkSettings, ShmSettings, SingleCopy,
    SubsystemFilter, TcpPacing, TcpSettings, RUNTIME_CONNECT_TCP_RANKS,
};
pub use comm_core::wire::Collective;
pub use comm_core::{Config, DataType, Error, ReduceOp, Result, MAX_RANKS};
pub use element::{as_bytes, as_bytes_mut, Element};
pub use logging::init_logging;
pub use mem_stats::{MemStats, Purpose, Residence, RELEASED_BY_SUSPEND};
pub use setup::node_identity;
pub use setup::transport_names;
pub use sncl_bootstrap::{ConfigFromEnv, LaunchEnv, MemoryStore, ReadEnvironment, Store, UniqueId};
pub use sncl_runtime::flight::InitPhase;
pub use sncl_runtime::tags;
pub use stats::Stats;
pub use window::Window;
pub use work::{Group, RawWork, Scope, Work};

use sncl_bootstrap::{TcpStore, TcpStoreServer};

/// Stores started by [`Communicator::unique_id`] with port 0, waiting for
/// this process's rank 0 to take them.
static PENDING_ROOTS: std::sync::Mutex<Vec<(UniqueId, TcpStoreServer)>> =
    std::sync::Mutex::new(Vec::new());

/// Where rank 0's store listens: exactly the root's address when this host
/// has it (so the store is reachable there and nowhere else), else the
/// address of `SNCL_SOCKET_IFNAME` with the root's port (for a root address
/// that is forwarded to this host).
fn store_bind_addr(root: SocketAddr, config: &Config) -> Result<SocketAddr> {
    // Binding a UDP socket to an address succeeds exactly when it is one
    // of this host's; nothing is sent.
    if std::net::UdpSocket::bind(SocketAddr::new(root.ip(), 0)).is_ok() {
        return Ok(root);
    }
    if let Some(ifname) = &config.tcp.socket_ifname {
        let ip = transport_tcp::interface_addr(ifname).map_err(|e| Error::Io {
            rank: 0,
            context: format!("finding SNCL_SOCKET_IFNAME={ifname} for the rendezvous store"),
            source: e,
        })?;
        return Ok(SocketAddr::new(ip, root.port()));
    }
    Err(Error::Bootstrap {
        rank: 0,
        detail: format!(
            "rank 0 cannot serve the rendezvous store at {root}: {} is not an address of this \
             host; set SNCL_ROOT (or the launcher's MASTER_ADDR) to an address of rank 0's \
             host, or SNCL_SOCKET_IFNAME to the interface that address is forwarded to",
            root.ip()
        ),
    })
}

/// A communicator: a group of ranks that run collectives together.
///
/// Operations on one communicator run in the order they were called (stream
/// order), whether blocking or not. Several communicators may be used at
/// once from several threads.
pub struct Communicator {
    inner: Arc<comm::Inner>,
    worker: work::Worker,
    layout: std::sync::OnceLock<Option<Box<compressed::Layout>>>,
    /// The device kernel path's internal window, once the first device
    /// collective opened it (`None` inside: not available here).
    lane: std::sync::OnceLock<Option<Arc<device::WindowCore>>>,
    /// The device this communicator is bound to, and its windows (device
    /// collectives); after `worker`, so the progress thread has stopped
    /// before the binding goes.
    device: std::sync::OnceLock<Arc<device::Attachment>>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.inner.rank)
            .field("nranks", &self.inner.nranks)
            .field("comm_id", &format_args!("{:016x}", self.inner.comm_id))
            .finish()
    }
}

impl Communicator {
    fn from_inner(inner: comm::Inner) -> Communicator {
        let inner = Arc::new(inner);
        Communicator {
            worker: work::Worker::new(inner.clone()),
            inner,
            layout: std::sync::OnceLock::new(),
            lane: std::sync::OnceLock::new(),
            device: std::sync::OnceLock::new(),
        }
    }

    /// Creates a unique id whose root (rank 0's store) listens at `root`.
    /// Pass it to every rank (for instance as [`UniqueId::to_hex`]).
    ///
    /// With port 0 the store starts now, in this process, on a free port of
    /// `root`'s address (the id carries the port); this process must then
    /// be rank 0. Unlike picking a free port and binding it later, no other
    /// program can take the port in between.
    pub fn unique_id(root: SocketAddr) -> Result<UniqueId> {
        if root.port() != 0 {
            return UniqueId::new(root);
        }
        let mut id = UniqueId::new(root)?;
        // Rank 0 must take the store within the creation timeout
        // (`SNCL_INIT_TIMEOUT_MS`, else the operation timeout); after that it
        // stops by itself (no thread or port left behind).
        let config = Config::from_env()?;
        let tls = sncl_bootstrap::tls::TlsIdentity::from_settings(&config.tcp.tls)?;
        let server =
            TcpStoreServer::start_unclaimed_tls(root, id.secret, config.creation_timeout(), tls)
                .map_err(|e| Error::Io {
                    rank: 0,
                    context: format!(
                        "starting the rendezvous store on {} (it must be an address of this host)",
                        root.ip()
                    ),
                    source: e,
                })?;
        id.root.set_port(server.local_addr().port());
        let mut pending = PENDING_ROOTS.lock().unwrap_or_else(|e| e.into_inner());
        pending.retain(|(_, s)| s.is_serving());
        pending.push((id, server));
        Ok(id)
    }

    /// Joins the communicator `id` as `rank` of `nranks` (like
    /// `ncclCommInitRank`). Rank 0 serves the rendezvous store at the id's
    /// root address. Configuration comes from the environment.
    pub fn init_rank(id: &UniqueId, rank: usize, nranks: usize) -> Result<Communicator> {
        Communicator::init_rank_with_config(id, rank, nranks, Config::from_env()?)
    }

    /// [`Communicator::init_rank`] with an explicit configuration.
    pub fn init_rank_with_config(
        id: &UniqueId,
        rank: usize,
        nranks: usize,
        config: Config,
    ) -> Result<Communicator> {
        init_logging();
        setup::check_world(rank, nranks, "init_rank")?;
        let pending = if rank == 0 {
            let mut p = PENDING_ROOTS.lock().unwrap_or_else(|e| e.into_inner());
            p.iter()
                .position(|(i, _)| i == id)
                .map(|k| p.swap_remove(k).1)
        } else {
            None
        };
        let tls = sncl_bootstrap::tls::TlsIdentity::from_settings(&config.tcp.tls)?;
        let server = match pending {
            Some(server) if server.claim() => Some(server),
            Some(_) => {
                return Err(Error::Bootstrap {
                    rank,
                    detail: format!(
                        "the rendezvous store of this unique id (root {}) stopped because rank 0 \
                         did not join within {} ms of creating the id; create a new id",
                        id.root,
                        config.creation_timeout().as_millis()
                    ),
                })
            }
            None if rank == 0 => {
                let bind = store_bind_addr(id.root, &config)?;
                Some(
                    TcpStoreServer::start_tls(bind, id.secret, tls.clone()).map_err(|e| {
                        Error::Io {
                            rank,
                            context: format!("starting the rendezvous store on {bind}"),
                            source: e,
                        }
                    })?,
                )
            }
            None => None,
        };
        let wait = config.creation_timeout();
        let deadline = Instant::now() + wait;
        let store = TcpStore::connect_tls(id.root, id.secret, rank, deadline, tls.as_ref())
            .map_err(|e| setup::creation_error(e, wait))?
            .with_io_timeout(config.timeout);
        let local_ip = store.local_ip();
        let inner = setup::build(setup::SetupArgs {
            store: Arc::new(store),
            rank,
            nranks,
            comm_id: id.comm_id(),
            secret: id.secret,
            wait,
            config,
            local_ip,
            server,
        })
        .map_err(|e| setup::creation_error(e, wait))?;
        Ok(Communicator::from_inner(inner))
    }

    /// Joins the job described by the launcher's environment: `SNCL_RANK` /
    /// `SNCL_WORLD_SIZE` / `SNCL_ROOT`, or torchrun, Open MPI or Slurm
    /// variables (see [`LaunchEnv`]).
    pub fn from_env() -> Result<Communicator> {
        init_logging();
        // One snapshot of the environment for both the launch and the
        // configuration.
        let vars = comm_core::settings::Environment::from_process()?;
        let env = LaunchEnv::from_environment(&vars)?;
        let config = Config::from_environment(&vars)?;
        Communicator::init_rank_with_config(&env.unique_id(), env.rank, env.world_size, config)
    }

    /// Builds a communicator over any [`Store`] (ranks as threads use a
    /// [`MemoryStore`]; a framework may pass its own). `comm_id` must be the
    /// same on every rank and unique per communicator.
    pub fn init_with_store(
        store: Arc<dyn Store>,
        rank: usize,
        nranks: usize,
        comm_id: u64,
        config: Config,
    ) -> Result<Communicator> {
        init_logging();
        setup::check_world(rank, nranks, "init_with_store")?;
        let secret = comm_id
            .to_le_bytes()
            .repeat(2)
            .try_into()
            .expect("16 bytes");
        let wait = config.creation_timeout();
        let inner = setup::build(setup::SetupArgs {
            store,
            rank,
            nranks,
            comm_id,
            secret,
            wait,
            config,
            local_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            server: None,
        })
        .map_err(|e| setup::creation_error(e, wait))?;
        Ok(Communicator::from_inner(inner))
    }

    /// Creates `nranks` communicators in this process, one per thread-rank,
    /// connected as configured (shared memory by default). For tests and
    /// single-process use.
    pub fn init_threads(nranks: usize, config: Config) -> Result<Vec<Communicator>> {
        if nranks > 0 {
            setup::check_world(0, nranks, "init_threads")?;
        }
        let store = MemoryStore::new();
        // A random id, as any unique id gets from its secret.
        let comm_id = UniqueId::new(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?.comm_id();
        let handles: Vec<_> = (0..nranks)
            .map(|r| {
                let store: Arc<dyn Store> = Arc::new(store.for_rank(r));
                let config = config.clone();
                std::thread::spawn(move || {
                    Communicator::init_with_store(store, r, nranks, comm_id, config)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("init thread panicked"))
            .collect()
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.inner.nranks
    }

    /// The communicator's id (same on every rank).
    pub fn comm_id(&self) -> u64 {
        self.inner.comm_id
    }

    /// The configuration every rank plans with (rank 0's shared settings).
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Node identity of every rank.
    pub fn node_ids(&self) -> &[String] {
        &self.inner.node_ids
    }

    /// Transport used to each peer (`"shm"`, `"tcp"`, or `"self"`).
    pub fn transports(&self) -> &[&'static str] {
        &self.inner.transports
    }

    /// The algorithm an operation of `coll` over `count` elements of `dtype`
    /// runs now: the one forced for `coll` (see [`Communicator::force_algorithm`]),
    /// else the planner's choice from the cost functions of the collective's
    /// rows in [`comm_core::algo::ALGORITHMS`], or `one-shot` for an
    /// all-reduce that takes the lanes (at most 32 bytes, every peer over
    /// shared memory, nothing forced). Operations run exactly this choice.
    pub fn algorithm_for(
        &self,
        coll: Collective,
        dtype: DataType,
        count: usize,
    ) -> Result<&'static str> {
        self.inner.algorithm_for(coll, dtype, count)
    }

    /// Forces `algo` for `coll` from now on, or returns to the planner's
    /// choice with `None`. The names are the collective's rows of
    /// [`comm_core::algo::ALGORITHMS`] (as listed in the README and by
    /// `comm_core::algo::names`, e.g. `ring`, `tree`, `rd`, `hier`,
    /// `flat-ring` for all_reduce); any other name is an
    /// [`Error::InvalidArgument`] listing them, and leaves the current choice
    /// in place. Like a collective, every rank must make the same call at
    /// the same point.
    pub fn force_algorithm(&self, coll: Collective, algo: Option<&str>) -> Result<()> {
        self.inner.force_algorithm(coll, algo)
    }

    /// Bytes sent and received on each tier (intra-node, inter-node),
    /// operation counts and time spent waiting on peers, since creation.
    pub fn stats(&self) -> Stats {
        let mut s = self.inner.stats();
        // Compressed all-reduces run on the node / replica sub-communicators.
        if let Some(Some(l)) = self.layout.get() {
            for sub in l.comms() {
                s.absorb(&sub.stats());
            }
        }
        s
    }

    /// The memory this rank of the communicator holds, by purpose and
    /// residence (NCCL's `ncclCommMemStats`): its connections' FIFOs and
    /// staging, registrations kept for zero copy, scratch, windows, the
    /// flight recorder, the device binding's staging, and those of the
    /// sub-communicators of compressed all-reduces. A single-rank
    /// communicator holds no peer buffers.
    pub fn mem_stats(&self) -> MemStats {
        let mut m = self.inner.mem_stats();
        if let Some(a) = self.device.get() {
            a.binding.footprint(&mut |p, r, b| m.add(p, r, b));
        }
        if let Some(Some(l)) = self.layout.get() {
            for sub in l.comms() {
                m.absorb(&sub.mem_stats());
            }
        }
        m
    }

    /// The two tiers the planner uses: `(intra-node, inter-node)` link costs
    /// (from `SNCL_TOPO_FILE` / `SNCL_*_BW` / `SNCL_*_LAT`, else built-in).
    pub fn tiers(&self) -> (comm_core::tune::LinkCost, comm_core::tune::LinkCost) {
        (self.inner.shape.intra, self.inner.shape.inter)
    }

    /// The placement of ranks on nodes.
    pub fn topology(&self) -> &comm_core::topo::Topology {
        &self.inner.topo
    }

    /// Aborts the communicator, from any thread: an operation blocked on
    /// it returns [`Error::Aborted`] at its next wait (well under 100 ms),
    /// later operations fail at once, and the peers' pending and later
    /// operations fail naming this rank instead of waiting for their
    /// deadline. Never waits for the running operation. See docs/FAULTS.md.
    pub fn abort(&self) {
        self.inner.abort("aborted by the application");
        // Kernel-path kernels (a captured graph's included) stop waiting.
        if let Some(Some(lane)) = self.lane.get() {
            lane.stop_lane_kernels();
        }
    }

    /// The error that aborted the communicator, if any (like
    /// `ncclCommGetAsyncError`).
    pub fn async_error(&self) -> Option<String> {
        self.inner.async_error()
    }
}
