//! The per-transport parts of [`Config`](crate::Config) for the settings
//! that only one transport reads: parsed once with the rest of the
//! configuration (environment and settings files, through the settings
//! table) and settable in code, so that a `Config` passed to
//! `init_with_store` governs them too.

use std::path::PathBuf;

use crate::error::{Error, Result};

/// Single-copy shared memory (`SNCL_SHM_CMA`): the receiver reads a large
/// piece straight from the sender's buffer (cross-memory attach) instead
/// of through a slot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SingleCopy {
    /// Where the kernel permits it and this host's cross-memory reads are
    /// fast enough (measured once per process).
    #[default]
    Auto,
    /// Wherever the kernel permits it.
    On,
    /// Never.
    Off,
}

impl SingleCopy {
    /// Parses `auto`, `1` or `0` (the value of `setting`).
    pub fn parse(setting: &str, v: &str) -> Result<SingleCopy> {
        match v.trim() {
            "auto" | "" => Ok(SingleCopy::Auto),
            "1" => Ok(SingleCopy::On),
            "0" => Ok(SingleCopy::Off),
            other => Err(Error::Config(format!(
                "{setting}={other:?}: expected auto (on where permitted and fast), 1 (on where \
                 permitted) or 0 (off)"
            ))),
        }
    }
}

impl std::fmt::Display for SingleCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SingleCopy::Auto => "auto",
            SingleCopy::On => "1",
            SingleCopy::Off => "0",
        })
    }
}

/// The device path's own settings (every rank must agree on the sizes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSettings {
    /// The directory holding `cuda_fp16.h` that the device kernels are
    /// compiled with (`SNCL_CUDA_INCLUDE`; none: found beside NVRTC or the
    /// toolkit). Per process.
    pub cuda_include: Option<PathBuf>,
    /// The size of each of a device binding's staging buffers, and so of a
    /// device collective's segments (`SNCL_DEVICE_STAGING_BYTES`, default
    /// 4 MiB).
    pub staging_bytes: usize,
    /// The size of the device kernel path's internal window, through which
    /// its all-reduces go in rounds of this many bytes
    /// (`SNCL_DEVICE_LANE_BYTES`, default 16 MiB; 0: off).
    pub lane_bytes: usize,
}

impl Default for DeviceSettings {
    fn default() -> Self {
        DeviceSettings {
            cuda_include: None,
            staging_bytes: 4 << 20,
            lane_bytes: 16 << 20,
        }
    }
}

/// The shared-memory transport's own settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShmSettings {
    /// Slot size in bytes (`SNCL_SHM_SLOT_BYTES`, default 128 KiB; every
    /// rank must agree).
    pub slot_bytes: usize,
    /// Slots per direction (`SNCL_SHM_SLOTS`, default 8; every rank must
    /// agree).
    pub slots: usize,
    /// Single copy for large pieces (`SNCL_SHM_CMA`, default auto).
    pub single_copy: SingleCopy,
    /// The smallest piece lent for a cross-memory read instead of copied
    /// into a slot (`SNCL_SHM_CMA_MIN_BYTES`, default 64 KiB).
    pub single_copy_min_bytes: usize,
}

impl Default for ShmSettings {
    fn default() -> Self {
        ShmSettings {
            slot_bytes: 128 << 10,
            slots: 8,
            single_copy: SingleCopy::Auto,
            single_copy_min_bytes: DEFAULT_SINGLE_COPY_MIN_BYTES,
        }
    }
}

/// Default of [`ShmSettings::single_copy_min_bytes`], from the sweep in
/// docs/perf-notes/NOTEBOOK.md §12.
pub const DEFAULT_SINGLE_COPY_MIN_BYTES: usize = 64 << 10;

/// Largest [`ShmSettings::single_copy_min_bytes`] (a piece is at most a
/// slot, `MAX_SHM_SLOT_BYTES`; larger would turn single copy off, which
/// `SNCL_SHM_CMA=0` says).
pub const MAX_SINGLE_COPY_MIN_BYTES: usize = 64 << 20;

/// How the nvlink transport runs between ranks of one node (`SNCL_NVLINK`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NvlinkMode {
    /// Device to device where both ranks see each other's device with peer
    /// access (or share it), else device pieces are staged through the host.
    #[default]
    Auto,
    /// Device to device or an error naming what is missing.
    Required,
    /// Not used: same-node pairs are left to shm.
    Off,
}

impl NvlinkMode {
    /// Parses `auto`, `1` or `0` (the value of `setting`).
    pub fn parse(setting: &str, v: &str) -> Result<NvlinkMode> {
        match v.trim() {
            "auto" | "" => Ok(NvlinkMode::Auto),
            "1" => Ok(NvlinkMode::Required),
            "0" => Ok(NvlinkMode::Off),
            other => Err(Error::Config(format!(
                "{setting}={other:?}: expected auto (device to device where both ranks can, else \
                 staged), 1 (device to device or an error) or 0 (not used)"
            ))),
        }
    }
}

impl std::fmt::Display for NvlinkMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NvlinkMode::Auto => "auto",
            NvlinkMode::Required => "1",
            NvlinkMode::Off => "0",
        })
    }
}

/// The nvlink transport's own settings (per process).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvlinkSettings {
    /// `SNCL_NVLINK`, default auto.
    pub mode: NvlinkMode,
}

/// Pacing of cross-node TCP sockets (`SNCL_TCP_PACING`): each socket's
/// kernel pacing rate (`SO_MAX_PACING_RATE`) is a share of the node link's
/// rate, so that the flows a node starts together do not overflow the
/// link's queue (transport-tcp's `socket_pacing_rate` computes the share).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TcpPacing {
    /// No pacing (default): the congestion control alone.
    Off,
    /// The link rate is the topology's inter-node bandwidth
    /// (`inter.bandwidth` of `SNCL_TOPO_FILE`, e.g. written by `commbench
    /// calibrate`, or `SNCL_INTER_BW`); no pacing where none is configured.
    Auto,
    /// The node link's rate, in bytes per second.
    Rate(f64),
}

impl TcpPacing {
    /// Parses `off` (or empty), `auto`, or a bandwidth as the topology file
    /// writes them (`100mbit`, `12.5MB/s`, `1gbit`, bytes per second).
    pub fn parse(v: &str) -> Result<TcpPacing> {
        Self::parse_setting("SNCL_TCP_PACING", v)
    }

    /// [`TcpPacing::parse`] for the setting `name` (named in the error).
    pub fn parse_setting(name: &str, v: &str) -> Result<TcpPacing> {
        match v.trim() {
            "" | "off" | "0" => Ok(TcpPacing::Off),
            "auto" => Ok(TcpPacing::Auto),
            rate => crate::topofile::parse_bandwidth(rate)
                .filter(|b| b.is_finite() && *b >= 1.0)
                .map(TcpPacing::Rate)
                .ok_or_else(|| {
                    Error::Config(format!(
                        "{name}={rate:?} is not off, auto or a link rate such as 100mbit or 12.5MB/s"
                    ))
                }),
        }
    }
}

impl std::fmt::Display for TcpPacing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TcpPacing::Off => f.write_str("off"),
            TcpPacing::Auto => f.write_str("auto"),
            TcpPacing::Rate(b) => write!(f, "{b}"),
        }
    }
}

/// The TCP transport's own settings.
#[derive(Clone, Debug, PartialEq)]
pub struct TcpSettings {
    /// Sockets per peer (`SNCL_NSOCKS`, default 1).
    pub nsocks: usize,
    /// Piece size in bytes (`SNCL_TCP_PIECE_BYTES`, default 512 KiB; every
    /// rank must agree).
    pub piece_bytes: usize,
    /// The interface sockets bind to (`SNCL_SOCKET_IFNAME`).
    pub socket_ifname: Option<String>,
    /// Pacing of cross-node sockets (`SNCL_TCP_PACING`, default off).
    pub pacing: TcpPacing,
    /// Pacing of the compressed all-reduce's cross-node exchange
    /// (`SNCL_COMPRESS_PACING`, default auto): it sends to every other node
    /// at once, so its sockets get the share of
    /// [`TcpSettings::flows_per_rank`] flows per rank; `Auto` without a
    /// configured `inter` tier measures the node links first; `Off` leaves
    /// that communicator to `pacing`.
    pub compress_pacing: TcpPacing,
    /// Cross-node peers each rank of this communicator sends to at once
    /// (not a setting): 1 for rings and trees (the default); the compressed
    /// all-reduce's replica communicator sets the number of other nodes,
    /// which divides each socket's pacing share.
    pub flows_per_rank: usize,
    /// TLS on every TCP connection and the store's (`SNCL_TLS_*`, off by
    /// default).
    pub tls: TlsSettings,
}

/// TLS on TCP: the transport's sockets and the rendezvous store's
/// connections, with mutual authentication by certificates (`SNCL_TLS_CERT`,
/// `SNCL_TLS_KEY`, `SNCL_TLS_CA`: PEM files). All three or none: with none,
/// TCP is authenticated by the job secret but not encrypted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// This rank's certificate chain, leaf first (`SNCL_TLS_CERT`).
    pub cert: Option<PathBuf>,
    /// The private key of that certificate (`SNCL_TLS_KEY`; a file of this
    /// user that group and others cannot read).
    pub key: Option<PathBuf>,
    /// The certificate authorities a peer's certificate must chain to
    /// (`SNCL_TLS_CA`).
    pub ca: Option<PathBuf>,
}

/// The three files of [`TlsSettings`], when TLS is on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// This rank's certificate chain (PEM, leaf first).
    pub cert: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// The certificate authorities peers' certificates must chain to (PEM).
    pub ca: PathBuf,
}

impl TlsSettings {
    /// The files when all three are set, `None` when none is; an error
    /// naming the missing settings when only some are (TLS half-configured
    /// must not silently run in the clear).
    pub fn files(&self) -> Result<Option<TlsFiles>> {
        match (&self.cert, &self.key, &self.ca) {
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(ca)) => Ok(Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                ca: ca.clone(),
            })),
            _ => {
                let missing: Vec<&str> = [
                    ("SNCL_TLS_CERT", self.cert.is_none()),
                    ("SNCL_TLS_KEY", self.key.is_none()),
                    ("SNCL_TLS_CA", self.ca.is_none()),
                ]
                .iter()
                .filter(|(_, m)| *m)
                .map(|(n, _)| *n)
                .collect();
                Err(Error::Config(format!(
                    "TLS is half configured: {} not set; set SNCL_TLS_CERT, SNCL_TLS_KEY and \
                     SNCL_TLS_CA together (TLS on) or none of them (TLS off)",
                    missing.join(" and ")
                )))
            }
        }
    }
}

impl Default for TcpSettings {
    fn default() -> Self {
        TcpSettings {
            nsocks: 1,
            piece_bytes: 512 << 10,
            socket_ifname: None,
            pacing: TcpPacing::Off,
            compress_pacing: TcpPacing::Auto,
            flows_per_rank: 1,
            tls: TlsSettings::default(),
        }
    }
}

/// The level of sncl's log (`SNCL_DEBUG`, as `NCCL_DEBUG`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogLevel {
    /// Nothing.
    Off,
    /// Errors only.
    Error,
    /// Warnings and errors (default; `VERSION`, NCCL's banner-only level,
    /// means this too).
    #[default]
    Warn,
    /// Setup and tuning decisions.
    Info,
    /// Per-operation detail.
    Debug,
    /// Per-piece detail.
    Trace,
}

impl LogLevel {
    /// Parses a level name, in any case.
    pub fn parse(v: &str) -> Result<LogLevel> {
        Ok(match v.trim().to_ascii_uppercase().as_str() {
            "OFF" | "NONE" => LogLevel::Off,
            "ERROR" => LogLevel::Error,
            "" | "WARN" | "VERSION" => LogLevel::Warn,
            "INFO" => LogLevel::Info,
            "DEBUG" => LogLevel::Debug,
            "TRACE" => LogLevel::Trace,
            other => {
                return Err(Error::Config(format!(
                    "SNCL_DEBUG={other:?}: expected one of OFF, ERROR, WARN, INFO, DEBUG, TRACE"
                )))
            }
        })
    }

    /// The `tracing` filter's name of this level.
    pub fn directive(self) -> &'static str {
        match self {
            LogLevel::Off => "off",
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

impl std::fmt::Display for LogLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.directive().to_ascii_uppercase())
    }
}

/// The subsystems `SNCL_DEBUG_SUBSYS` names (as `NCCL_DEBUG_SUBSYS`); the
/// `tracing` targets each covers are the logger's (`sncl::logging`).
pub const LOG_SUBSYSTEMS: &[&str] = &[
    "INIT", "COLL", "P2P", "SHM", "NET", "GRAPH", "TUNING", "ENV", "ALLOC",
];

/// sncl's log (per process): read by the logger the C ABI and commbench
/// install.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogSettings {
    /// The level (`SNCL_DEBUG`, default WARN).
    pub level: LogLevel,
    /// The subsystems whose messages above WARN are shown, upper case
    /// (`SNCL_DEBUG_SUBSYS`, default all).
    pub subsystems: SubsystemFilter,
    /// The file the log goes to instead of stderr, `%h` host name, `%p`
    /// process id (`SNCL_DEBUG_FILE`).
    pub file: Option<String>,
}

/// `SNCL_DEBUG_SUBSYS`: which subsystems' messages above WARN are shown.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum SubsystemFilter {
    /// Every subsystem (default, `ALL`).
    #[default]
    All,
    /// Only these ([`LOG_SUBSYSTEMS`] names).
    Only(Vec<&'static str>),
    /// All but these (a leading `^`).
    Except(Vec<&'static str>),
}

impl SubsystemFilter {
    /// Parses a comma-separated list of [`LOG_SUBSYSTEMS`] names (any case)
    /// and `ALL`, optionally after `^`.
    pub fn parse(v: &str) -> Result<SubsystemFilter> {
        let spec = v.trim();
        let (exclude, list) = match spec.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, spec),
        };
        let mut names = Vec::new();
        let mut all = spec.is_empty();
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let upper = name.to_ascii_uppercase();
            if upper == "ALL" {
                all = true;
                continue;
            }
            let known = LOG_SUBSYSTEMS
                .iter()
                .find(|n| **n == upper)
                .ok_or_else(|| {
                    Error::Config(format!(
                    "SNCL_DEBUG_SUBSYS: unknown subsystem {name:?}; expected a comma-separated \
                     list of {}, ALL, optionally after ^",
                    LOG_SUBSYSTEMS.join(", ")
                ))
                })?;
            names.push(*known);
        }
        Ok(match (exclude, all) {
            (false, true) => SubsystemFilter::All,
            // `^ALL`: none above WARN.
            (true, true) => SubsystemFilter::Only(Vec::new()),
            (false, false) => SubsystemFilter::Only(names),
            (true, false) => SubsystemFilter::Except(names),
        })
    }
}

impl std::fmt::Display for SubsystemFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SubsystemFilter::All => f.write_str("ALL"),
            SubsystemFilter::Only(n) if n.is_empty() => f.write_str("^ALL"),
            SubsystemFilter::Only(n) => f.write_str(&n.join(",")),
            SubsystemFilter::Except(n) => write!(f, "^{}", n.join(",")),
        }
    }
}
