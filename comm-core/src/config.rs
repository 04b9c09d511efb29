//! One typed configuration with an environment overlay. Each setting is
//! declared once, in [`crate::settings::SETTINGS`]; this module holds the
//! typed [`Config`] and its bounds.

use std::time::Duration;

use crate::algo::Algorithm;
use crate::error::{Error, Result};
use crate::wire::Collective;

mod ib_settings;
mod transport_settings;
pub use ib_settings::{
    HcaEntry, HcaFilter, IbSettings, DEFAULT_REG_CACHE_MB, DEFAULT_RETRY_CNT, DEFAULT_TIMEOUT,
    MAX_QPS_PER_CONN, MAX_REG_CACHE_MB,
};
pub use transport_settings::{
    DeviceSettings, LogLevel, LogSettings, NvlinkMode, NvlinkSettings, ShmSettings, SingleCopy,
    SubsystemFilter, TcpPacing, TcpSettings, TlsFiles, TlsSettings, DEFAULT_SINGLE_COPY_MIN_BYTES,
    LOG_SUBSYSTEMS, MAX_SINGLE_COPY_MIN_BYTES,
};

/// Which transport connects ranks: per pair the first kind of the
/// runtime's registry that can (`auto`), or one named kind between every
/// pair of distinct ranks (`SNCL_TRANSPORT=<name>`; see
/// [`crate::transport::registry`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportChoice {
    /// Per peer pair, the first kind in the registry's order that can
    /// connect it: shared memory within a node, TCP across (default).
    Auto,
    /// This kind between every pair of distinct ranks; setup fails naming
    /// the missing requirement where it cannot connect a pair.
    Only(TransportName),
}

#[allow(non_upper_case_globals)]
impl TransportChoice {
    /// TCP everywhere (`SNCL_TRANSPORT=tcp`).
    pub const Tcp: TransportChoice = TransportChoice::Only(TransportName::new_static("tcp"));
    /// Shared memory between every pair (`SNCL_TRANSPORT=shm`; all ranks on one node).
    pub const Shm: TransportChoice = TransportChoice::Only(TransportName::new_static("shm"));

    /// Parses `auto` (or empty) or a transport name.
    pub fn parse(v: &str) -> Result<TransportChoice> {
        match v.trim() {
            "" | "auto" => Ok(TransportChoice::Auto),
            name => TransportName::new(name)
                .map(TransportChoice::Only)
                .map_err(|e| Error::Config(format!("SNCL_TRANSPORT={name:?}: {e}"))),
        }
    }

    /// The forced kind's name, if any.
    pub fn forced(&self) -> Option<&str> {
        match self {
            TransportChoice::Auto => None,
            TransportChoice::Only(n) => Some(n.as_str()),
        }
    }
}

impl std::fmt::Display for TransportChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.forced().unwrap_or("auto"))
    }
}

/// A transport kind's name held inline (so that [`Config`] stays cheap to
/// copy): 1 to [`crate::transport::MAX_TRANSPORT_NAME`] bytes of `a-z`,
/// `0-9`, `-`, `_`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TransportName {
    len: u8,
    bytes: [u8; crate::transport::MAX_TRANSPORT_NAME],
}

impl TransportName {
    /// A name checked by [`crate::transport::registry::check_name`].
    pub fn new(name: &str) -> std::result::Result<TransportName, String> {
        crate::transport::registry::check_name(name)?;
        Ok(Self::new_static(name))
    }

    /// For constants of known-good names (panics at compile time on a name
    /// that is too long).
    const fn new_static(name: &str) -> TransportName {
        let b = name.as_bytes();
        assert!(!b.is_empty() && b.len() <= crate::transport::MAX_TRANSPORT_NAME);
        let mut bytes = [0u8; crate::transport::MAX_TRANSPORT_NAME];
        let mut i = 0;
        while i < b.len() {
            bytes[i] = b[i];
            i += 1;
        }
        TransportName {
            len: b.len() as u8,
            bytes,
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        // Built only from a `&str` (checked ASCII in `new`), so the bytes
        // up to `len` are valid UTF-8.
        std::str::from_utf8(&self.bytes[..self.len as usize]).unwrap_or("")
    }
}

impl std::fmt::Debug for TransportName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

/// The default of [`Config::runtime_connect_tcp_ranks`]: a 64-rank job
/// over TCP opens 63 × `SNCL_NSOCKS` sockets per rank at init where a ring
/// uses 2 (measured: `tests/tcp_lazy.rs`).
pub const RUNTIME_CONNECT_TCP_RANKS: usize = 64;

/// Runtime configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// An operation fails when a peer it waits on made no progress this long
    /// (`SNCL_TIMEOUT_MS`, default 300000).
    pub timeout: Duration,
    /// How long creating a communicator from a unique id or a store, or
    /// growing one with new processes, waits for every rank to arrive and
    /// connect (`SNCL_INIT_TIMEOUT_MS`; zero,
    /// the default, means [`Config::timeout`]): launchers start ranks
    /// seconds apart, which a short operation timeout should not fail.
    pub init_timeout: Duration,
    /// Forced algorithms per collective (`SNCL_ALGO=all_reduce:ring;broadcast:tree`).
    pub algo: Vec<(Collective, Algorithm)>,
    /// Pipeline chunk in bytes (`SNCL_CHUNK_BYTES`, default 256 KiB).
    pub chunk_bytes: usize,
    /// Transport selection (`SNCL_TRANSPORT=auto|<name>`).
    pub transport: TransportChoice,
    /// Node identity override (`SNCL_NODE_ID`).
    pub node_id: Option<String>,
    /// Tier costs and placement from `SNCL_TOPO_FILE` / `SNCL_*_BW` / `SNCL_*_LAT`.
    pub tiers: crate::topofile::TierSpec,
    /// Operations the flight recorder keeps (`SNCL_FLIGHT_RECORDER_ENTRIES`,
    /// default 1000; 0 turns it off).
    pub flight_recorder_entries: usize,
    /// Where flight-recorder dumps go on timeout, abort or on demand
    /// (`SNCL_DEBUG_DUMP_DIR`; none: no automatic dumps).
    pub debug_dump_dir: Option<std::path::PathBuf>,
    /// Pieces carry a CRC32C of their payload, verified on receipt
    /// (`SNCL_CHECKSUM=1`; every rank must agree).
    pub checksum: bool,
    /// Rooted collectives (broadcast, reduce, gather, scatter) first check
    /// that every rank passed the same root, count, type and reduction, in
    /// ⌈log2 n⌉ empty exchanges, so that a disagreement fails every rank in
    /// that operation before any data moves (`SNCL_CHECK_ROOTS`, default on;
    /// every rank must agree).
    pub check_roots: bool,
    /// Deterministic reductions (`SNCL_DETERMINISTIC=1`, default off; every
    /// rank must agree): all-reduce, reduce and reduce-scatter reduce every
    /// element in one canonical order, a fixed binary tree over the ranks
    /// in rank order, whatever the algorithm, chunk, transport, placement
    /// or memory, so results are bitwise reproducible
    /// ([`crate::algo::build_deterministic`]).
    pub deterministic: bool,
    /// Whether the transports that connect lazily (RDMA; TCP from
    /// [`Config::runtime_connect_tcp_ranks`] ranks) make a pair's
    /// connection at the first operation that needs it, not at init
    /// (`SNCL_RUNTIME_CONNECT`, NCCL's `NCCL_RUNTIME_CONNECT`).
    pub runtime_connect: bool,
    /// From how many ranks TCP pairs, too, connect at their first use
    /// (with [`Config::runtime_connect`]; `SNCL_RUNTIME_CONNECT_TCP_RANKS`,
    /// default [`RUNTIME_CONNECT_TCP_RANKS`]): below it every TCP pair is
    /// connected at init, so a small job's first operation pays nothing.
    pub runtime_connect_tcp_ranks: usize,
    /// The device path's own settings (`SNCL_DEVICE_*`).
    pub device: DeviceSettings,
    /// The shared-memory transport's own settings (`SNCL_SHM_*`).
    pub shm: ShmSettings,
    /// The TCP transport's own settings (`SNCL_NSOCKS`, `SNCL_TCP_*`,
    /// `SNCL_SOCKET_IFNAME`, `SNCL_COMPRESS_PACING`).
    pub tcp: TcpSettings,
    /// The nvlink transport's own settings (`SNCL_NVLINK`).
    pub nvlink: NvlinkSettings,
    /// The RDMA transport's own settings (`SNCL_IB_*`).
    pub ib: IbSettings,
    /// sncl's log (`SNCL_DEBUG*`), read by `init_logging`.
    pub log: LogSettings,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            timeout: Duration::from_millis(300_000),
            init_timeout: Duration::ZERO,
            algo: Vec::new(),
            chunk_bytes: 256 << 10,
            transport: TransportChoice::Auto,
            node_id: None,
            tiers: crate::topofile::TierSpec::default(),
            flight_recorder_entries: crate::flight::DEFAULT_ENTRIES,
            debug_dump_dir: None,
            checksum: false,
            check_roots: true,
            deterministic: false,
            runtime_connect: true,
            runtime_connect_tcp_ranks: RUNTIME_CONNECT_TCP_RANKS,
            device: DeviceSettings::default(),
            shm: ShmSettings::default(),
            tcp: TcpSettings::default(),
            nvlink: NvlinkSettings::default(),
            ib: IbSettings::default(),
            log: LogSettings::default(),
        }
    }
}

/// Shortest `SNCL_TIMEOUT_MS`.
pub const MIN_TIMEOUT_MS: u64 = 1;
/// Longest `SNCL_TIMEOUT_MS` (30 days): deadlines computed from it never overflow.
pub const MAX_TIMEOUT_MS: u64 = 30 * 24 * 3600 * 1000;
/// Smallest `SNCL_CHUNK_BYTES`.
pub const MIN_CHUNK_BYTES: usize = 64;
/// Largest `SNCL_CHUNK_BYTES` (1 GiB).
pub const MAX_CHUNK_BYTES: usize = 1 << 30;
/// Fewest `SNCL_NSOCKS`.
pub const MIN_NSOCKS: usize = 1;
/// Most `SNCL_NSOCKS`; equals transport-tcp's `MAX_NSOCKS` (checked by a
/// test of the `sncl` crate, which sees both).
pub const MAX_NSOCKS: usize = 64;
/// Smallest `SNCL_DEVICE_STAGING_BYTES` (64 KiB).
pub const MIN_DEVICE_STAGING_BYTES: usize = 64 << 10;
/// Largest `SNCL_DEVICE_STAGING_BYTES` (1 GiB).
pub const MAX_DEVICE_STAGING_BYTES: usize = 1 << 30;
/// Largest `SNCL_DEVICE_LANE_BYTES` (64 MiB: device memory on every rank
/// of every communicator with a device lane).
pub const MAX_DEVICE_LANE_BYTES: usize = 64 << 20;
/// `SNCL_DEVICE_STAGING_BYTES` and `SNCL_DEVICE_LANE_BYTES` are rounded
/// down to a multiple of this.
pub const DEVICE_STAGING_ALIGN: usize = 256;
/// Smallest `SNCL_SHM_SLOT_BYTES`.
pub const MIN_SHM_SLOT_BYTES: usize = 4096;
/// Largest `SNCL_SHM_SLOT_BYTES` (64 MiB; the segment header stores it as u32).
pub const MAX_SHM_SLOT_BYTES: usize = 64 << 20;
/// `SNCL_SHM_SLOT_BYTES` is rounded down to (and `shm_slot_bytes` must be) a multiple of this.
pub const SHM_SLOT_ALIGN: usize = 64;
/// Fewest `SNCL_SHM_SLOTS`.
pub const MIN_SHM_SLOTS: usize = 2;
/// Most `SNCL_SHM_SLOTS`.
pub const MAX_SHM_SLOTS: usize = 1024;
/// Largest payload of one shared-memory segment, `SNCL_SHM_SLOTS` ×
/// `SNCL_SHM_SLOT_BYTES` (1 GiB); each rank maps one per local peer and direction.
pub const MAX_SHM_SEGMENT_BYTES: usize = 1 << 30;
/// Smallest `SNCL_TCP_PIECE_BYTES`.
pub const MIN_TCP_PIECE_BYTES: usize = 4096;
/// Largest `SNCL_TCP_PIECE_BYTES` (1 GiB, transport-tcp's `MAX_PIECE_LIMIT`).
pub const MAX_TCP_PIECE_BYTES: usize = 1 << 30;
/// `SNCL_TCP_PIECE_BYTES` is rounded down to (and `tcp_piece_bytes` must be) a multiple of this.
pub const TCP_PIECE_ALIGN: usize = 64;

impl Config {
    /// The forced algorithm for a collective, if any.
    pub fn forced(&self, coll: Collective) -> Option<Algorithm> {
        self.algo.iter().find(|(c, _)| *c == coll).map(|(_, a)| *a)
    }

    /// How long creating a communicator may wait for every rank:
    /// [`Config::init_timeout`], or [`Config::timeout`] where that is zero.
    pub fn creation_timeout(&self) -> Duration {
        if self.init_timeout.is_zero() {
            self.timeout
        } else {
            self.init_timeout
        }
    }
}

/// Parses `SNCL_ALGO`: `collective:algorithm` pairs separated by `;`.
/// An algorithm the collective does not implement is an error.
pub fn parse_algo(spec: &str) -> Result<Vec<(Collective, Algorithm)>> {
    let mut out = Vec::new();
    for item in spec.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        let (c, a) = item.split_once(':').ok_or_else(|| {
            Error::Config(format!(
                "SNCL_ALGO item {item:?} is not collective:algorithm (e.g. all_reduce:ring)"
            ))
        })?;
        let coll = Collective::from_name(c.trim()).ok_or_else(|| {
            let names: Vec<_> = Collective::ALL.iter().map(|c| c.name()).collect();
            Error::Config(format!(
                "SNCL_ALGO: unknown collective {c:?}; expected one of {}",
                names.join(", ")
            ))
        })?;
        // Names and the error listing them come from the algorithm table.
        let algo = Algorithm::parse_for(coll, a.trim())
            .map_err(|e| Error::Config(format!("SNCL_ALGO: {e}")))?;
        out.retain(|(c2, _)| *c2 != coll);
        out.push((coll, algo));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algo_overrides_parse_and_reject() {
        let v = parse_algo("all_reduce:ring; broadcast:tree").unwrap();
        assert_eq!(
            v,
            vec![
                (Collective::AllReduce, Algorithm::Ring),
                (Collective::Broadcast, Algorithm::Tree)
            ]
        );
        let e = parse_algo("alltoall:ring").unwrap_err().to_string();
        assert!(e.contains("alltoall has no ring"), "{e}");
        assert!(e.contains("available: pairwise"), "{e}");
        // Every name of the table parses for its collective; an unknown name
        // is an error listing the collective's names.
        for row in crate::algo::ALGORITHMS {
            let spec = format!("{}:{}", row.coll.name(), row.algo.name());
            assert_eq!(parse_algo(&spec).unwrap(), vec![(row.coll, row.algo)]);
        }
        let e = parse_algo("all_reduce:fast").unwrap_err().to_string();
        assert!(
            e.contains("\"fast\"") && e.contains(&crate::algo::names(Collective::AllReduce)),
            "{e}"
        );
        assert!(parse_algo("allreduce:ring").is_err());
        assert!(parse_algo("all_reduce").is_err());
    }

    #[test]
    fn digest_round_trip() {
        let mut a = Config::from_vars(&|k| match k {
            "SNCL_ALGO" => Some("all_reduce:tree;reduce:ring".into()),
            "SNCL_CHUNK_BYTES" => Some("4096".into()),
            _ => None,
        })
        .unwrap();
        let d = a.shared_digest();
        let mut b = Config::default();
        b.adopt_digest(&d).unwrap();
        a.timeout = b.timeout;
        assert_eq!(a, b);
    }

    fn env(pairs: &[(&str, &str)]) -> Result<Config> {
        Config::from_vars(&|k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    /// The error for one bad variable names it, the value and the range.
    fn rejects(var: &str, value: &str, range: &str) {
        let e = env(&[(var, value)])
            .expect_err(&format!("{var}={value} must be rejected"))
            .to_string();
        assert!(e.contains(var), "{var}={value}: {e}");
        assert!(e.contains(value), "{var}={value}: {e}");
        assert!(e.contains(range), "{var}={value}: {e}");
    }

    #[test]
    fn out_of_range_environment_is_an_error_not_a_clamp() {
        rejects("SNCL_SHM_SLOT_BYTES", "4294967296", "4096..=67108864");
        rejects("SNCL_SHM_SLOT_BYTES", "4095", "4096..=67108864");
        rejects("SNCL_SHM_SLOT_BYTES", "-1", "4096..=67108864");
        rejects("SNCL_NSOCKS", "65", "1..=64");
        rejects("SNCL_NSOCKS", "0", "1..=64");
        rejects("SNCL_NSOCKS", "99999999999999999999999", "1..=64");
        rejects("SNCL_SHM_SLOTS", "0", "2..=1024");
        rejects("SNCL_SHM_SLOTS", "1025", "2..=1024");
        rejects("SNCL_CHUNK_BYTES", "63", "64..=1073741824");
        rejects("SNCL_CHUNK_BYTES", "1073741825", "64..=1073741824");
        rejects("SNCL_TCP_PIECE_BYTES", "1073741888", "4096..=1073741824");
        rejects("SNCL_TCP_PIECE_BYTES", "64", "4096..=1073741824");
        rejects("SNCL_TIMEOUT_MS", "0", "1..=2592000000");
        rejects("SNCL_TIMEOUT_MS", "18446744073709551615", "1..=2592000000");
        rejects("SNCL_TIMEOUT_MS", "soon", "1..=2592000000");
    }

    #[test]
    fn bounds_are_inclusive_and_sizes_round_down() {
        let c = env(&[
            ("SNCL_NSOCKS", "64"),
            ("SNCL_SHM_SLOT_BYTES", "67108864"),
            ("SNCL_SHM_SLOTS", "16"),
            ("SNCL_TCP_PIECE_BYTES", "1073741824"),
            ("SNCL_CHUNK_BYTES", "1073741824"),
            ("SNCL_TIMEOUT_MS", "2592000000"),
        ])
        .unwrap();
        assert_eq!(c.tcp.nsocks, MAX_NSOCKS);
        assert_eq!(c.shm.slot_bytes * c.shm.slots, MAX_SHM_SEGMENT_BYTES);
        let c = env(&[
            ("SNCL_NSOCKS", "1"),
            ("SNCL_SHM_SLOT_BYTES", "4159"),
            ("SNCL_SHM_SLOTS", "2"),
            ("SNCL_TCP_PIECE_BYTES", "4100"),
            ("SNCL_TIMEOUT_MS", "1"),
        ])
        .unwrap();
        assert_eq!((c.shm.slot_bytes, c.tcp.piece_bytes), (4096, 4096));
        assert_eq!(c.timeout, Duration::from_millis(1));
    }

    #[test]
    fn oversized_shm_segment_is_rejected() {
        let e = env(&[
            ("SNCL_SHM_SLOT_BYTES", "67108864"),
            ("SNCL_SHM_SLOTS", "1024"),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("SNCL_SHM_SLOTS") && e.contains("SNCL_SHM_SLOT_BYTES"),
            "{e}"
        );
        assert!(e.contains("68719476736") && e.contains("1073741824"), "{e}");
    }

    #[test]
    fn validate_uses_the_same_bounds() {
        assert!(Config::default().validate().is_ok());
        type Tweak = fn(&mut Config);
        let bad: [(&str, Tweak); 12] = [
            ("SNCL_DEVICE_STAGING_BYTES", |c| {
                c.device.staging_bytes = 4096
            }),
            ("SNCL_DEVICE_STAGING_BYTES", |c| {
                c.device.staging_bytes = (1 << 20) + 1
            }),
            ("SNCL_SHM_SLOT_BYTES", |c| c.shm.slot_bytes = 1 << 32),
            ("SNCL_SHM_SLOT_BYTES", |c| c.shm.slot_bytes = 64),
            ("SNCL_SHM_SLOT_BYTES", |c| c.shm.slot_bytes = 4096 + 1),
            ("SNCL_NSOCKS", |c| c.tcp.nsocks = 0),
            ("SNCL_NSOCKS", |c| c.tcp.nsocks = 65),
            ("SNCL_SHM_SLOTS", |c| c.shm.slots = 1),
            ("SNCL_CHUNK_BYTES", |c| c.chunk_bytes = usize::MAX),
            ("SNCL_TCP_PIECE_BYTES", |c| c.tcp.piece_bytes = 1 << 31),
            ("SNCL_TIMEOUT_MS", |c| c.timeout = Duration::ZERO),
            ("SNCL_TIMEOUT_MS", |c| c.timeout = Duration::MAX),
        ];
        for (var, tweak) in bad {
            let mut c = Config::default();
            tweak(&mut c);
            let e = c.validate().expect_err(var).to_string();
            assert!(e.contains(var) && e.contains("allowed"), "{e}");
        }
    }

    #[test]
    fn digest_with_out_of_range_values_is_rejected() {
        let mut c = Config::default();
        let e = c.adopt_digest("slot=4294967296").unwrap_err().to_string();
        assert!(e.contains("slot") && e.contains("4294967296"), "{e}");
        assert!(Config::default().adopt_digest("slots=1").is_err());
        assert!(Config::default().adopt_digest("piece=64").is_err());
        assert!(Config::default()
            .adopt_digest("slot=67108864;slots=1024")
            .is_err());
    }
}
