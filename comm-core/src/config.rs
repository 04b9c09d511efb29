//! One typed configuration with an environment overlay. Every knob sncl has
//! is here; nothing else reads `SNCL_*` variables except the bootstrap's
//! launcher detection.

use std::time::Duration;

use crate::algo::Algorithm;
use crate::error::{Error, Result};
use crate::wire::Collective;

/// Which transport to use between ranks of one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportChoice {
    /// Shared memory within a node, TCP across nodes (default).
    Auto,
    /// TCP everywhere (`SNCL_TRANSPORT=tcp`).
    Tcp,
}

/// Runtime configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// An operation fails when a peer it waits on made no progress this long
    /// (`SNCL_TIMEOUT_MS`, default 300000).
    pub timeout: Duration,
    /// Forced algorithms per collective (`SNCL_ALGO=all_reduce:ring;broadcast:tree`).
    pub algo: Vec<(Collective, Algorithm)>,
    /// Pipeline chunk in bytes (`SNCL_CHUNK_BYTES`, default 256 KiB).
    pub chunk_bytes: usize,
    /// Sockets per TCP peer (`SNCL_NSOCKS`, default 2).
    pub nsocks: usize,
    /// Transport selection (`SNCL_TRANSPORT=auto|tcp`).
    pub transport: TransportChoice,
    /// Interface for TCP (`SNCL_SOCKET_IFNAME`).
    pub socket_ifname: Option<String>,
    /// Shared-memory slot size in bytes (`SNCL_SHM_SLOT_BYTES`, default 128 KiB).
    pub shm_slot_bytes: usize,
    /// Shared-memory slots per direction (`SNCL_SHM_SLOTS`, default 8).
    pub shm_slots: usize,
    /// TCP piece size in bytes (`SNCL_TCP_PIECE_BYTES`, default 512 KiB).
    pub tcp_piece_bytes: usize,
    /// Node identity override (`SNCL_NODE_ID`).
    pub node_id: Option<String>,
    /// Tier costs and placement from `SNCL_TOPO_FILE` / `SNCL_*_BW` / `SNCL_*_LAT`.
    pub tiers: crate::topofile::TierSpec,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            timeout: Duration::from_millis(300_000),
            algo: Vec::new(),
            chunk_bytes: 256 << 10,
            nsocks: 2,
            transport: TransportChoice::Auto,
            socket_ifname: None,
            shm_slot_bytes: 128 << 10,
            shm_slots: 8,
            tcp_piece_bytes: 512 << 10,
            node_id: None,
            tiers: crate::topofile::TierSpec::default(),
        }
    }
}

fn parse_num(name: &str, v: &str, min: usize) -> Result<usize> {
    let n: usize = v
        .trim()
        .parse()
        .map_err(|_| Error::Config(format!("{name}={v:?} is not a non-negative integer")))?;
    if n < min {
        return Err(Error::Config(format!("{name}={n} must be at least {min}")));
    }
    Ok(n)
}

impl Config {
    /// Defaults overlaid with the process environment.
    pub fn from_env() -> Result<Config> {
        Config::from_vars(&|k| std::env::var(k).ok())
    }

    /// Defaults overlaid with variables from `get` (testable form of [`Config::from_env`]).
    pub fn from_vars(get: &dyn Fn(&str) -> Option<String>) -> Result<Config> {
        let mut c = Config::default();
        if let Some(v) = get("SNCL_TIMEOUT_MS") {
            c.timeout = Duration::from_millis(parse_num("SNCL_TIMEOUT_MS", &v, 1)? as u64);
        }
        if let Some(v) = get("SNCL_ALGO") {
            c.algo = parse_algo(&v)?;
        }
        if let Some(v) = get("SNCL_CHUNK_BYTES") {
            c.chunk_bytes = parse_num("SNCL_CHUNK_BYTES", &v, 64)?;
        }
        if let Some(v) = get("SNCL_NSOCKS") {
            c.nsocks = parse_num("SNCL_NSOCKS", &v, 1)?.min(64);
        }
        if let Some(v) = get("SNCL_TRANSPORT") {
            c.transport = match v.trim() {
                "" | "auto" => TransportChoice::Auto,
                "tcp" => TransportChoice::Tcp,
                other => {
                    return Err(Error::Config(format!(
                        "SNCL_TRANSPORT={other:?}: expected auto or tcp"
                    )))
                }
            };
        }
        c.socket_ifname = get("SNCL_SOCKET_IFNAME").filter(|s| !s.is_empty());
        if let Some(v) = get("SNCL_SHM_SLOT_BYTES") {
            c.shm_slot_bytes = parse_num("SNCL_SHM_SLOT_BYTES", &v, 4096)? / 64 * 64;
        }
        if let Some(v) = get("SNCL_SHM_SLOTS") {
            c.shm_slots = parse_num("SNCL_SHM_SLOTS", &v, 2)?;
        }
        if let Some(v) = get("SNCL_TCP_PIECE_BYTES") {
            c.tcp_piece_bytes = parse_num("SNCL_TCP_PIECE_BYTES", &v, 4096)? / 64 * 64;
        }
        c.node_id = get("SNCL_NODE_ID").filter(|s| !s.is_empty());
        c.tiers = crate::topofile::TierSpec::from_vars(get)?;
        Ok(c)
    }

    /// Checks values set in code the way [`Config::from_vars`] checks the
    /// environment.
    pub fn validate(&self) -> Result<()> {
        let check = |name: &str, v: usize, min: usize, multiple: usize| {
            if v < min || !v.is_multiple_of(multiple) {
                Err(Error::Config(format!(
                    "{name} = {v}: must be at least {min} and a multiple of {multiple}"
                )))
            } else {
                Ok(())
            }
        };
        check("chunk_bytes", self.chunk_bytes, 64, 1)?;
        check("shm_slot_bytes", self.shm_slot_bytes, 4096, 64)?;
        check("shm_slots", self.shm_slots, 2, 1)?;
        check("tcp_piece_bytes", self.tcp_piece_bytes, 4096, 64)?;
        check("nsocks", self.nsocks, 1, 1)?;
        if self.timeout.is_zero() {
            return Err(Error::Config("timeout must be positive".into()));
        }
        Ok(())
    }

    /// The forced algorithm for a collective, if any.
    pub fn forced(&self, coll: Collective) -> Option<Algorithm> {
        self.algo.iter().find(|(c, _)| *c == coll).map(|(_, a)| *a)
    }

    /// The settings every rank must share (the planner's inputs), as text:
    /// rank 0 publishes them at init and every rank adopts them.
    pub fn shared_digest(&self) -> String {
        let algo: Vec<String> = self
            .algo
            .iter()
            .map(|(c, a)| format!("{}:{}", c.name(), a.name()))
            .collect();
        format!(
            "algo={};chunk={};slot={};slots={};piece={};transport={}",
            algo.join(","),
            self.chunk_bytes,
            self.shm_slot_bytes,
            self.shm_slots,
            self.tcp_piece_bytes,
            match self.transport {
                TransportChoice::Auto => "auto",
                TransportChoice::Tcp => "tcp",
            }
        )
    }

    /// Adopts the shared settings published by rank 0.
    pub fn adopt_digest(&mut self, digest: &str) -> Result<()> {
        for part in digest.split(';') {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| Error::Config(format!("bad shared digest part {part:?}")))?;
            match k {
                "algo" => self.algo = parse_algo(&v.replace(',', ";"))?,
                "chunk" => self.chunk_bytes = parse_num("chunk", v, 64)?,
                "slot" => self.shm_slot_bytes = parse_num("slot", v, 64)?,
                "slots" => self.shm_slots = parse_num("slots", v, 2)?,
                "piece" => self.tcp_piece_bytes = parse_num("piece", v, 64)?,
                "transport" => {
                    self.transport = if v == "tcp" {
                        TransportChoice::Tcp
                    } else {
                        TransportChoice::Auto
                    }
                }
                _ => return Err(Error::Config(format!("unknown shared setting {k:?}"))),
            }
        }
        Ok(())
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
        let algo = Algorithm::from_name(a.trim()).ok_or_else(|| {
            Error::Config(format!(
                "SNCL_ALGO: unknown algorithm {a:?}; expected ring, tree, rd or pairwise"
            ))
        })?;
        if !Algorithm::available(coll).contains(&algo) {
            let avail: Vec<_> = Algorithm::available(coll)
                .iter()
                .map(|a| a.name())
                .collect();
            return Err(Error::Config(format!(
                "SNCL_ALGO: {} has no {} algorithm; available: {}",
                coll.name(),
                algo.name(),
                avail.join(", ")
            )));
        }
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
}
