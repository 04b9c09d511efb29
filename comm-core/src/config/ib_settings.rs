//! The RDMA transport's settings (`SNCL_IB_*`, as NCCL's `NCCL_IB_*`), a
//! part of [`Config`](crate::Config): parsed by the settings table with the
//! rest of the configuration, settable in code, read by `transport-rdma`.

use crate::error::Error;

/// Default `SNCL_IB_TIMEOUT` (4.096 µs × 2^20 ≈ 4.3 s per retry, as NCCL).
pub const DEFAULT_TIMEOUT: u8 = 20;
/// Default `SNCL_IB_RETRY_CNT`.
pub const DEFAULT_RETRY_CNT: u8 = 7;
/// Default `SNCL_IB_REG_CACHE_MB`.
pub const DEFAULT_REG_CACHE_MB: usize = 4096;
/// Largest `SNCL_IB_REG_CACHE_MB`.
pub const MAX_REG_CACHE_MB: usize = 1 << 20;
/// Largest `SNCL_IB_QPS_PER_CONN`.
pub const MAX_QPS_PER_CONN: usize = 16;

/// One entry of `SNCL_IB_HCA`: a device name (prefix, or exact with `=`)
/// and optionally a port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaEntry {
    /// Device name or prefix.
    pub name: String,
    /// Port, if given.
    pub port: Option<u8>,
}

/// `SNCL_IB_HCA` in NCCL's syntax: `mlx5_0:1,mlx5_1:1`; a leading `^`
/// excludes the listed devices; a leading `=` matches names exactly instead
/// of as prefixes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaFilter {
    /// `^`: the list is what to avoid.
    pub exclude: bool,
    /// `=`: names must match exactly.
    pub exact: bool,
    /// The entries.
    pub entries: Vec<HcaEntry>,
}

impl HcaFilter {
    /// Parses the value of `SNCL_IB_HCA`.
    pub fn parse(raw: &str) -> Result<HcaFilter, Error> {
        let mut s = raw.trim();
        let exclude = s.starts_with('^');
        if exclude {
            s = &s[1..];
        }
        let exact = s.starts_with('=');
        if exact {
            s = &s[1..];
        }
        let mut entries = Vec::new();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, port) = match item.split_once(':') {
                Some((n, p)) => {
                    let port = p.parse::<u8>().ok().filter(|p| *p >= 1).ok_or_else(|| {
                        Error::Config(format!(
                            "SNCL_IB_HCA={raw:?}: port {p:?} of {n:?} is not a number from 1 to 255"
                        ))
                    })?;
                    (n, Some(port))
                }
                None => (item, None),
            };
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
            {
                return Err(Error::Config(format!(
                    "SNCL_IB_HCA={raw:?}: {name:?} is not a device name (expected e.g. mlx5_0:1,mlx5_1:1, ^ to exclude)"
                )));
            }
            entries.push(HcaEntry {
                name: name.to_string(),
                port,
            });
        }
        if entries.is_empty() {
            return Err(Error::Config(format!(
                "SNCL_IB_HCA={raw:?} lists no device (expected e.g. mlx5_0:1,mlx5_1:1, ^ to exclude)"
            )));
        }
        Ok(HcaFilter {
            exclude,
            exact,
            entries,
        })
    }

    fn matches_name(&self, e: &HcaEntry, device: &str) -> bool {
        if self.exact {
            e.name == device
        } else {
            device.starts_with(&e.name)
        }
    }

    /// Whether `device` port `port` may be used.
    pub fn allows(&self, device: &str, port: u8) -> bool {
        let hit = self
            .entries
            .iter()
            .any(|e| self.matches_name(e, device) && e.port.is_none_or(|p| p == port));
        hit != self.exclude
    }
}

impl std::fmt::Display for HcaFilter {
    /// NCCL's syntax, as [`HcaFilter::parse`] reads it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.exclude {
            f.write_str("^")?;
        }
        if self.exact {
            f.write_str("=")?;
        }
        let items: Vec<String> = self
            .entries
            .iter()
            .map(|e| match e.port {
                Some(p) => format!("{}:{p}", e.name),
                None => e.name.clone(),
            })
            .collect();
        f.write_str(&items.join(","))
    }
}

/// Every `SNCL_IB_*` setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IbSettings {
    /// `SNCL_IB_DISABLE=1`: never use RDMA.
    pub disable: bool,
    /// `SNCL_IB_EMULATE=1` or `strict`: the emulated provider instead of
    /// libibverbs.
    pub emulate: bool,
    /// `SNCL_IB_EMULATE=strict`: the emulated provider applies the rules a
    /// real NIC and kernel apply (transport-rdma's `emu` module lists them).
    pub emulate_strict: bool,
    /// `SNCL_IB_HCA`.
    pub hca: Option<HcaFilter>,
    /// `SNCL_IB_GID_INDEX`: `None` = auto (RoCE: the first RoCE v2 entry
    /// with an IPv4-mapped address; InfiniBand: 0).
    pub gid_index: Option<u8>,
    /// `SNCL_IB_TIMEOUT`.
    pub timeout: u8,
    /// `SNCL_IB_RETRY_CNT`.
    pub retry_cnt: u8,
    /// `SNCL_IB_TC`.
    pub traffic_class: u8,
    /// `SNCL_IB_SL`.
    pub sl: u8,
    /// `SNCL_IB_QPS_PER_CONN`: queue pairs per peer, 1 to
    /// [`MAX_QPS_PER_CONN`]; 0 = auto (2 on a RoCE port, 1 on InfiniBand).
    pub qps_per_conn: usize,
    /// `SNCL_IB_ZERO_COPY`: `None` = auto (on demand where the device
    /// supports ODP), `Some(false)` = always staged, `Some(true)` = also
    /// pinned per-step registrations where there is no ODP.
    pub zero_copy: Option<bool>,
    /// `SNCL_IB_REG_CACHE_MB`: user-buffer registrations kept per connection.
    pub reg_cache_mb: usize,
    /// `SNCL_IB_GDR`: `None` = auto (GPUDirect RDMA where both ranks of a
    /// pair can), `Some(true)` = required, `Some(false)` = device pieces
    /// always staged through host memory.
    pub gdr: Option<bool>,
}

impl Default for IbSettings {
    fn default() -> Self {
        IbSettings {
            disable: false,
            emulate: false,
            emulate_strict: false,
            hca: None,
            gid_index: None,
            timeout: DEFAULT_TIMEOUT,
            retry_cnt: DEFAULT_RETRY_CNT,
            traffic_class: 0,
            sl: 0,
            qps_per_conn: 0,
            zero_copy: None,
            reg_cache_mb: DEFAULT_REG_CACHE_MB,
            gdr: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hca_syntax_follows_nccl() {
        let f = HcaFilter::parse("mlx5_0:1,mlx5_1").unwrap();
        assert!(f.allows("mlx5_0", 1) && !f.allows("mlx5_0", 2));
        assert!(f.allows("mlx5_1", 2) && !f.allows("mlx4_0", 1));
        assert!(f.allows("mlx5_10", 1), "prefix match as NCCL");
        let f = HcaFilter::parse("=mlx5_1").unwrap();
        assert!(f.allows("mlx5_1", 1) && !f.allows("mlx5_10", 1));
        let f = HcaFilter::parse("^mlx5_0").unwrap();
        assert!(!f.allows("mlx5_0", 1) && f.allows("mlx5_1", 1));
        for text in ["^=mlx5_0:1,mlx5_1", "mlx5_2"] {
            assert_eq!(HcaFilter::parse(text).unwrap().to_string(), text);
        }
        for bad in ["", "^", "mlx5_0:x", "mlx5_0:0", "a b"] {
            let e = HcaFilter::parse(bad).unwrap_err().to_string();
            assert!(e.contains("SNCL_IB_HCA"), "{bad}: {e}");
        }
    }
}
