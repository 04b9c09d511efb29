//! The `SNCL_IB_*` settings (declared in comm-core's settings table, read
//! from an [`Environment`]).

use comm_core::settings::Environment;
use comm_core::Error;

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

/// Every `SNCL_IB_*` setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IbSettings {
    /// `SNCL_IB_DISABLE=1`: never use RDMA.
    pub disable: bool,
    /// `SNCL_IB_EMULATE=1`: the emulated provider instead of libibverbs.
    pub emulate: bool,
    /// `SNCL_IB_HCA`.
    pub hca: Option<HcaFilter>,
    /// `SNCL_IB_GID_INDEX`.
    pub gid_index: u8,
    /// `SNCL_IB_TIMEOUT`.
    pub timeout: u8,
    /// `SNCL_IB_RETRY_CNT`.
    pub retry_cnt: u8,
    /// `SNCL_IB_TC`.
    pub traffic_class: u8,
    /// `SNCL_IB_SL`.
    pub sl: u8,
    /// `SNCL_IB_QPS_PER_CONN`.
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
            hca: None,
            gid_index: 0,
            timeout: DEFAULT_TIMEOUT,
            retry_cnt: DEFAULT_RETRY_CNT,
            traffic_class: 0,
            sl: 0,
            qps_per_conn: 1,
            zero_copy: None,
            reg_cache_mb: DEFAULT_REG_CACHE_MB,
            gdr: None,
        }
    }
}

fn int(env: &Environment, name: &str, max: usize) -> Result<Option<usize>, Error> {
    let Some(raw) = env.get(name).map(str::trim).filter(|r| !r.is_empty()) else {
        return Ok(None);
    };
    match raw.parse::<usize>() {
        Ok(v) if v <= max => Ok(Some(v)),
        _ => Err(Error::Config(format!(
            "{name}={raw:?} is not an integer in range (allowed: 0..={max})"
        ))),
    }
}

fn flag(env: &Environment, name: &str) -> Result<bool, Error> {
    match env.get(name).map(str::trim) {
        None | Some("" | "0") => Ok(false),
        Some("1") => Ok(true),
        Some(other) => Err(Error::Config(format!("{name}={other:?}: expected 0 or 1"))),
    }
}

/// An `auto|0|1` setting: `None` for auto.
fn auto_flag(env: &Environment, name: &str) -> Result<Option<bool>, Error> {
    match env.get(name).map(str::trim) {
        None | Some("" | "auto") => Ok(None),
        Some("0") => Ok(Some(false)),
        Some("1") => Ok(Some(true)),
        Some(other) => Err(Error::Config(format!(
            "{name}={other:?}: expected auto, 0 or 1"
        ))),
    }
}

impl IbSettings {
    /// Reads the settings from `env`; a bad value is an error naming the
    /// variable and what is allowed.
    pub fn from_env(env: &Environment) -> Result<IbSettings, Error> {
        let d = IbSettings::default();
        let byte = |name: &str, max: usize, default: u8| -> Result<u8, Error> {
            Ok(int(env, name, max)?.map(|v| v as u8).unwrap_or(default))
        };
        let qps = match int(env, "SNCL_IB_QPS_PER_CONN", MAX_QPS_PER_CONN)? {
            Some(0) => {
                return Err(Error::Config(format!(
                    "SNCL_IB_QPS_PER_CONN=0 is out of range (allowed: 1..={MAX_QPS_PER_CONN})"
                )))
            }
            Some(n) => n,
            None => d.qps_per_conn,
        };
        Ok(IbSettings {
            disable: flag(env, "SNCL_IB_DISABLE")?,
            emulate: flag(env, "SNCL_IB_EMULATE")?,
            hca: env
                .get("SNCL_IB_HCA")
                .filter(|v| !v.trim().is_empty())
                .map(HcaFilter::parse)
                .transpose()?,
            gid_index: byte("SNCL_IB_GID_INDEX", 255, d.gid_index)?,
            timeout: byte("SNCL_IB_TIMEOUT", 31, d.timeout)?,
            retry_cnt: byte("SNCL_IB_RETRY_CNT", 7, d.retry_cnt)?,
            traffic_class: byte("SNCL_IB_TC", 255, d.traffic_class)?,
            sl: byte("SNCL_IB_SL", 15, d.sl)?,
            qps_per_conn: qps,
            zero_copy: auto_flag(env, "SNCL_IB_ZERO_COPY")?,
            gdr: auto_flag(env, "SNCL_IB_GDR")?,
            reg_cache_mb: int(env, "SNCL_IB_REG_CACHE_MB", MAX_REG_CACHE_MB)?
                .unwrap_or(DEFAULT_REG_CACHE_MB),
        })
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
        for bad in ["", "^", "mlx5_0:x", "mlx5_0:0", "a b"] {
            let e = HcaFilter::parse(bad).unwrap_err().to_string();
            assert!(e.contains("SNCL_IB_HCA"), "{bad}: {e}");
        }
    }

    #[test]
    fn settings_parse_and_reject() {
        let env = Environment::from_pairs([
            ("SNCL_IB_QPS_PER_CONN", "4"),
            ("SNCL_IB_EMULATE", "1"),
            ("SNCL_IB_TC", "106"),
            ("SNCL_IB_HCA", "^mlx5_2"),
        ]);
        let s = IbSettings::from_env(&env).unwrap();
        assert_eq!((s.qps_per_conn, s.emulate, s.traffic_class), (4, true, 106));
        assert!(s.hca.unwrap().exclude);
        for (k, v) in [
            ("SNCL_IB_QPS_PER_CONN", "0"),
            ("SNCL_IB_QPS_PER_CONN", "17"),
            ("SNCL_IB_RETRY_CNT", "8"),
            ("SNCL_IB_SL", "x"),
            ("SNCL_IB_DISABLE", "yes"),
        ] {
            let e = IbSettings::from_env(&Environment::from_pairs([(k, v)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(k), "{k}={v}: {e}");
        }
    }
}
