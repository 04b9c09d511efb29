//! Tier costs and node placement from configuration: `SNCL_TOPO_FILE`
//! (format below) and the variables `SNCL_INTRA_BW`, `SNCL_INTRA_LAT`,
//! `SNCL_INTER_BW`, `SNCL_INTER_LAT`.
//!
//! The file is plain text, one `key = value` per line, `#` starts a comment:
//!
//! ```text
//! # two tiers: bandwidth in B/s with K/M/G (bytes) or kbit/mbit/gbit (bits) units,
//! # latency in ns/us/ms/s
//! intra.bandwidth = 20GB/s
//! intra.latency   = 1us
//! inter.bandwidth = 1gbit
//! inter.latency   = 60us
//! # optional: the node of a rank (overrides SNCL_NODE_ID and the host identity)
//! node.0 = supernode-a
//! node.1 = supernode-b
//! # optional, read by the simulator and `commbench plan` (the runtime ignores them):
//! nodes            = 171          # node count of the modelled cluster
//! ranks_per_node   = 384
//! placement        = node-major   # or round-robin (rank r on node r mod nodes)
//! inter.nic        = rank         # one NIC per rank, or `node` (one shared by the node)
//! inter.oversubscription = 1      # fabric: node uplink = NIC bandwidth of the node / this
//! inter.burst      = 1MB          # token-bucket burst of a rate-limited node link (bytes)
//! intra.reduce_bandwidth = 10GB/s # local reduction / copy speed (0 or absent: free)
//! ```
//!
//! `commbench calibrate` writes this format; [`TierSpec::to_text`] renders it.

use crate::cluster::LinkCost;
use crate::error::{Error, Result};

/// What the configuration says about the tiers and placement.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TierSpec {
    /// Intra-node link, when configured.
    pub intra: Option<LinkCost>,
    /// Inter-node link, when configured.
    pub inter: Option<LinkCost>,
    /// Node names by rank, when configured.
    pub nodes: Vec<(usize, String)>,
    /// The modelled cluster's shape and fabric (simulator and planner only).
    pub cluster: ClusterKeys,
}

/// Keys of a topology file that describe a whole cluster for the simulator
/// (`sim` crate) and `commbench plan`; of these the runtime's planner uses
/// only `intra.reduce_bandwidth` (to charge local reductions).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterKeys {
    /// `nodes`.
    pub nodes: Option<usize>,
    /// `ranks_per_node`.
    pub ranks_per_node: Option<usize>,
    /// `placement`: `node-major` or `round-robin`.
    pub placement: Option<String>,
    /// `inter.nic`: `rank` or `node`.
    pub nic: Option<String>,
    /// `inter.oversubscription` (≥ 1).
    pub oversubscription: Option<f64>,
    /// `inter.burst` in bytes.
    pub burst_bytes: Option<f64>,
    /// `intra.reduce_bandwidth` in B/s.
    pub reduce_bytes_per_s: Option<f64>,
}

/// Parses a bandwidth: `20GB/s`, `125MB/s`, `1gbit`, `100mbit`, `4000000` (B/s).
pub fn parse_bandwidth(v: &str) -> Option<f64> {
    let s = v
        .trim()
        .to_ascii_lowercase()
        .replace("/s", "")
        .replace("ps", "");
    let units: [(&str, f64); 8] = [
        ("gbit", 1e9 / 8.0),
        ("mbit", 1e6 / 8.0),
        ("kbit", 1e3 / 8.0),
        ("gb", 1e9),
        ("mb", 1e6),
        ("kb", 1e3),
        ("g", 1e9),
        ("m", 1e6),
    ];
    for (u, mul) in units {
        if let Some(num) = s.strip_suffix(u) {
            return num
                .trim()
                .parse::<f64>()
                .ok()
                .map(|x| x * mul)
                .filter(|x| x.is_finite() && *x > 0.0);
        }
    }
    s.strip_suffix('b')
        .unwrap_or(&s)
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|x| x.is_finite() && *x > 0.0)
}

/// Parses a latency into µs: `1us`, `60 us`, `0.5ms`, `200ns`, `1s`.
pub fn parse_latency_us(v: &str) -> Option<f64> {
    let s = v.trim().to_ascii_lowercase();
    let (num, mul) = if let Some(n) = s.strip_suffix("ns") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1e6)
    } else {
        (s.as_str(), 1.0)
    };
    num.trim()
        .parse::<f64>()
        .ok()
        .map(|x| x * mul)
        .filter(|x| x.is_finite() && *x >= 0.0)
}

fn key_values(text: &str, origin: &str) -> Result<Vec<(String, String)>> {
    let mut kv = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let (k, v) = line.split_once('=').ok_or_else(|| {
            Error::Config(format!(
                "{origin}:{}: expected `key = value`, got {line:?}",
                i + 1
            ))
        })?;
        kv.push((k.trim().to_string(), v.trim().to_string()));
    }
    Ok(kv)
}

fn link(bw: Option<f64>, lat: Option<f64>, default: LinkCost) -> Option<LinkCost> {
    if bw.is_none() && lat.is_none() {
        return None;
    }
    Some(LinkCost {
        alpha_us: lat.unwrap_or(default.alpha_us),
        bytes_per_us: bw.map(|b| b / 1e6).unwrap_or(default.bytes_per_us),
    })
}

impl TierSpec {
    /// The topology file's text `topo_text` (that of the file
    /// `SNCL_TOPO_FILE` names, read by the caller: comm-core reads no files)
    /// with the `SNCL_*_BW` / `_LAT` variables overlaid. `SNCL_TOPO_FILE`
    /// set without its text is an error rather than a silent default.
    pub fn from_vars(
        get: &dyn Fn(&str) -> Option<String>,
        topo_text: Option<&str>,
    ) -> Result<TierSpec> {
        let mut kv: Vec<(String, String)> = Vec::new();
        if let Some(path) = get("SNCL_TOPO_FILE").filter(|p| !p.is_empty()) {
            let text = topo_text.ok_or_else(|| {
                Error::Config(format!(
                    "SNCL_TOPO_FILE={path}: the file was not read (comm-core reads no files: \
                     build the settings with sncl_bootstrap::ReadEnvironment::from_process, \
                     or attach the text with Environment::set_topo_text)"
                ))
            })?;
            kv = key_values(text, &path)?;
        }
        for (var, key) in [
            ("SNCL_INTRA_BW", "intra.bandwidth"),
            ("SNCL_INTRA_LAT", "intra.latency"),
            ("SNCL_INTER_BW", "inter.bandwidth"),
            ("SNCL_INTER_LAT", "inter.latency"),
        ] {
            if let Some(v) = get(var).filter(|v| !v.is_empty()) {
                kv.push((key.to_string(), v));
            }
        }
        TierSpec::from_pairs(kv)
    }

    /// Parses the text of a topology file; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<TierSpec> {
        TierSpec::from_pairs(key_values(text, origin)?)
    }

    fn from_pairs(kv: Vec<(String, String)>) -> Result<TierSpec> {
        let mut spec = TierSpec::default();
        let (mut ib, mut il, mut xb, mut xl) = (None, None, None, None);
        for (k, v) in kv {
            let bad = |what: &str| Error::Config(format!("topology: {k} = {v:?} is not a {what}"));
            let count = |v: &str| v.parse::<usize>().ok().filter(|&n| n >= 1);
            let c = &mut spec.cluster;
            match k.as_str() {
                "intra.bandwidth" => {
                    ib = Some(parse_bandwidth(&v).ok_or_else(|| bad("bandwidth"))?)
                }
                "intra.latency" => il = Some(parse_latency_us(&v).ok_or_else(|| bad("latency"))?),
                "inter.bandwidth" => {
                    xb = Some(parse_bandwidth(&v).ok_or_else(|| bad("bandwidth"))?)
                }
                "inter.latency" => xl = Some(parse_latency_us(&v).ok_or_else(|| bad("latency"))?),
                "nodes" => c.nodes = Some(count(&v).ok_or_else(|| bad("count >= 1"))?),
                "ranks_per_node" => {
                    c.ranks_per_node = Some(count(&v).ok_or_else(|| bad("count >= 1"))?)
                }
                "placement" => match v.as_str() {
                    "node-major" | "round-robin" => c.placement = Some(v.clone()),
                    _ => return Err(bad("placement (node-major or round-robin)")),
                },
                "inter.nic" => match v.as_str() {
                    "node" | "rank" => c.nic = Some(v.clone()),
                    _ => return Err(bad("NIC attachment (node or rank)")),
                },
                "inter.oversubscription" => {
                    c.oversubscription = Some(
                        v.parse::<f64>()
                            .ok()
                            .filter(|x| x.is_finite() && *x >= 1.0)
                            .ok_or_else(|| bad("factor >= 1"))?,
                    )
                }
                "inter.burst" => {
                    c.burst_bytes = Some(
                        parse_bandwidth(&v)
                            .or_else(|| {
                                v.trim()
                                    .parse::<f64>()
                                    .ok()
                                    .filter(|x| x.is_finite() && *x >= 0.0)
                            })
                            .ok_or_else(|| bad("size in bytes"))?,
                    )
                }
                "intra.reduce_bandwidth" => {
                    c.reduce_bytes_per_s = Some(
                        parse_bandwidth(&v)
                            .or_else(|| (v.trim() == "0").then_some(0.0))
                            .ok_or_else(|| bad("bandwidth"))?,
                    )
                }
                _ => {
                    let Some(r) = k.strip_prefix("node.") else {
                        return Err(Error::Config(format!(
                            "topology: unknown key {k:?} (expected intra.bandwidth, intra.latency, inter.bandwidth, inter.latency, node.<rank>, nodes, ranks_per_node, placement, inter.nic, inter.oversubscription, inter.burst or intra.reduce_bandwidth)"
                        )));
                    };
                    let r: usize = r.parse().map_err(|_| bad("rank number in node.<rank>"))?;
                    spec.nodes.push((r, v));
                }
            }
        }
        spec.intra = link(ib, il, LinkCost::SHM);
        spec.inter = link(xb, xl, LinkCost::TCP);
        Ok(spec)
    }

    /// Renders the spec in the file format ([`TierSpec::parse`] reads it back).
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let mut tier = |name: &str, l: &Option<LinkCost>| {
            if let Some(l) = l {
                out.push_str(&format!(
                    "{name}.bandwidth = {}\n{name}.latency = {}us\n",
                    l.bytes_per_us * 1e6,
                    l.alpha_us
                ));
            }
        };
        tier("intra", &self.intra);
        tier("inter", &self.inter);
        let c = &self.cluster;
        let mut kv = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                out.push_str(&format!("{k} = {v}\n"));
            }
        };
        kv("nodes", c.nodes.map(|n| n.to_string()));
        kv("ranks_per_node", c.ranks_per_node.map(|n| n.to_string()));
        kv("placement", c.placement.clone());
        kv("inter.nic", c.nic.clone());
        kv(
            "inter.oversubscription",
            c.oversubscription.map(|x| x.to_string()),
        );
        kv("inter.burst", c.burst_bytes.map(|x| x.to_string()));
        kv(
            "intra.reduce_bandwidth",
            c.reduce_bytes_per_s.map(|x| x.to_string()),
        );
        for (r, n) in &self.nodes {
            out.push_str(&format!("node.{r} = {n}\n"));
        }
        out
    }

    /// The node named for `rank`, if any.
    pub fn node_of(&self, rank: usize) -> Option<&str> {
        self.nodes
            .iter()
            .rev()
            .find(|(r, _)| *r == rank)
            .map(|(_, n)| n.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse_bandwidth("1gbit"), Some(125e6));
        assert_eq!(parse_bandwidth("20GB/s"), Some(20e9));
        assert_eq!(parse_bandwidth("100mbit"), Some(12.5e6));
        assert_eq!(parse_bandwidth("4000"), Some(4000.0));
        assert_eq!(parse_bandwidth("fast"), None);
        // Found by the fuzz targets (fuzz/): non-finite values were accepted.
        for bad in ["inf", "infGB/s", "1e400gb", "NaN", "-inf"] {
            assert_eq!(parse_bandwidth(bad), None, "{bad}");
        }
        for bad in ["inf", "infus", "1e308s", "nan"] {
            assert_eq!(parse_latency_us(bad), None, "{bad}");
        }
        assert!(TierSpec::parse("inter.burst = inf", "t").is_err());
        assert_eq!(parse_latency_us("60us"), Some(60.0));
        assert_eq!(parse_latency_us("0.5ms"), Some(500.0));
        assert_eq!(parse_latency_us("200ns"), Some(0.2));
    }

    #[test]
    fn file_and_env() {
        let text = "# test\nintra.bandwidth = 10GB/s\ninter.bandwidth=1gbit # link\ninter.latency = 50us\nnode.3 = b\n";
        let vars = |k: &str| match k {
            "SNCL_TOPO_FILE" => Some("/somewhere/topo".to_string()),
            "SNCL_INTRA_LAT" => Some("2us".into()),
            _ => None,
        };
        // The file named but its text not attached: an error naming it.
        let e = TierSpec::from_vars(&vars, None).unwrap_err().to_string();
        assert!(
            e.contains("SNCL_TOPO_FILE=/somewhere/topo") && e.contains("not read"),
            "{e}"
        );
        let s = TierSpec::from_vars(&vars, Some(text)).unwrap();
        assert_eq!(
            s.intra,
            Some(LinkCost {
                alpha_us: 2.0,
                bytes_per_us: 10_000.0
            })
        );
        assert_eq!(
            s.inter,
            Some(LinkCost {
                alpha_us: 50.0,
                bytes_per_us: 125.0
            })
        );
        assert_eq!(s.node_of(3), Some("b"));
        assert_eq!(s.node_of(2), None);
        let e = TierSpec::from_vars(
            &|k| (k == "SNCL_INTER_BW").then(|| "quick".to_string()),
            None,
        );
        assert!(e.is_err());
    }

    #[test]
    fn cluster_keys_round_trip() {
        let text = "intra.bandwidth = 900GB/s\nintra.latency = 1us\ninter.bandwidth = 50GB/s\n\
                    inter.latency = 5us\nnodes = 171\nranks_per_node = 384\nplacement = round-robin\n\
                    inter.nic = node\ninter.oversubscription = 2\ninter.burst = 1MB\n";
        let s = TierSpec::parse(text, "t").unwrap();
        assert_eq!(s.cluster.nodes, Some(171));
        assert_eq!(s.cluster.ranks_per_node, Some(384));
        assert_eq!(s.cluster.nic.as_deref(), Some("node"));
        assert_eq!(s.cluster.oversubscription, Some(2.0));
        assert_eq!(s.cluster.burst_bytes, Some(1e6));
        assert_eq!(s.inter.unwrap().bytes_per_us, 50_000.0);
        let back = TierSpec::parse(&s.to_text(), "round trip").unwrap();
        assert_eq!(back, s);
        for bad in [
            "nodes = 0",
            "inter.nic = switch",
            "inter.oversubscription = 0.5",
            "placement = x",
        ] {
            assert!(TierSpec::parse(bad, "t").is_err(), "{bad}");
        }
    }
}
