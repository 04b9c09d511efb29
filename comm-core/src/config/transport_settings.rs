//! The per-transport parts of [`Config`](crate::Config) for the settings
//! that only one transport reads: parsed once with the rest of the
//! configuration (environment and settings files, through the settings
//! table) and settable in code, so that a `Config` passed to
//! `init_with_store` governs them too.

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

/// The device path's own settings (every rank must agree on both).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceSettings {
    /// The size of each of a device binding's staging buffers, and so of a
    /// device collective's segments (`SNCL_DEVICE_STAGING_BYTES`, default
    /// 4 MiB).
    pub staging_bytes: usize,
    /// The largest all-reduce the device kernel path runs, and the size of
    /// its internal window (`SNCL_DEVICE_LANE_BYTES`, default 256 KiB; 0:
    /// off).
    pub lane_bytes: usize,
}

impl Default for DeviceSettings {
    fn default() -> Self {
        DeviceSettings {
            staging_bytes: 4 << 20,
            lane_bytes: 256 << 10,
        }
    }
}

/// The shared-memory transport's own settings (per process).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShmSettings {
    /// Single copy for large pieces (`SNCL_SHM_CMA`, default auto).
    pub single_copy: SingleCopy,
    /// The smallest piece lent for a cross-memory read instead of copied
    /// into a slot (`SNCL_SHM_CMA_MIN_BYTES`, default 64 KiB).
    pub single_copy_min_bytes: usize,
}

impl Default for ShmSettings {
    fn default() -> Self {
        ShmSettings {
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
