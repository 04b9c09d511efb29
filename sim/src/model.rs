//! The cluster model: nodes × ranks per node, the cost of each tier, how the
//! inter-node NICs attach, and the fabric's oversubscription.

use comm_core::topo::Topology;
use comm_core::topofile::TierSpec;
use comm_core::tune::{LinkCost, Shape};

use crate::{Result, SimError};

/// One tier's link: bandwidth per endpoint and per-message latency.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tier {
    /// Bytes per second each endpoint sends (and receives) at most.
    pub bytes_per_s: f64,
    /// Latency of one message, µs.
    pub latency_us: f64,
}

impl Tier {
    /// The planner's view of this tier.
    pub fn link_cost(&self) -> LinkCost {
        LinkCost {
            alpha_us: self.latency_us,
            bytes_per_us: self.bytes_per_s / 1e6,
        }
    }
}

/// Where the inter-node NIC sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nic {
    /// One NIC per rank, each of the inter tier's bandwidth.
    PerRank,
    /// One NIC per node, shared by all its ranks.
    PerNode,
}

/// How ranks are numbered over nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Rank r on node r / ranks_per_node.
    NodeMajor,
    /// Rank r on node r mod nodes.
    RoundRobin,
}

/// A modelled cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct Cluster {
    /// Nodes (supernodes).
    pub nodes: usize,
    /// Ranks on each node.
    pub ranks_per_node: usize,
    /// Link between ranks of one node (per rank, each direction).
    pub intra: Tier,
    /// Link between nodes (per NIC, each direction).
    pub inter: Tier,
    /// NIC attachment.
    pub nic: Nic,
    /// Fabric oversubscription: a node's uplink carries its NICs' bandwidth / this.
    pub oversubscription: f64,
    /// Token-bucket burst of each NIC in bytes (0: no bucket). Buckets start
    /// empty (back-to-back operations) and fill while the NIC runs below its
    /// rate; while tokens remain the NIC runs at [`BURST_PEAK_FACTOR`] × its rate.
    pub burst_bytes: f64,
    /// Local copy / reduction speed in B/s (0: local work is free).
    pub reduce_bytes_per_s: f64,
    /// Rank numbering.
    pub placement: Placement,
    /// Nodes that are slower than the rest (stragglers, degraded links):
    /// the asymmetric cases, which only the per-rank frame executes.
    pub slowdowns: Vec<Slowdown>,
}

/// One node slower than the model's tiers say.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Slowdown {
    /// The node.
    pub node: usize,
    /// Its links between its own ranks take this factor longer (≥ 1).
    pub intra: f64,
    /// Its NICs (and uplink) take this factor longer (≥ 1; a degraded link).
    pub inter: f64,
    /// Its ranks' local copies and reductions take this factor longer (≥ 1;
    /// a slow or throttled device).
    pub compute: f64,
    /// Latency its links between its own ranks add to each message, µs
    /// (≥ 0; a node whose ranks talk over another transport).
    pub intra_extra_us: f64,
    /// Latency its NICs add to each message to or from another node, µs
    /// (≥ 0; a node on another network transport).
    pub inter_extra_us: f64,
}

impl Slowdown {
    /// A straggler node: links and compute `factor` times slower.
    pub fn straggler(node: usize, factor: f64) -> Slowdown {
        Slowdown {
            node,
            intra: factor,
            inter: factor,
            compute: factor,
            intra_extra_us: 0.0,
            inter_extra_us: 0.0,
        }
    }

    /// A node whose links are another transport's (mixed transports: one
    /// node's ranks on host shared memory where the others have NVLink, its
    /// NICs on TCP where the others have RDMA): `intra` / `inter` in place
    /// of `cl`'s tiers (`None`: the cluster's). A node's transport is no
    /// faster than the cluster's, in bandwidth or latency: an error names
    /// the tier that is.
    pub fn other_transport(
        node: usize,
        cl: &Cluster,
        intra: Option<Tier>,
        inter: Option<Tier>,
    ) -> Result<Slowdown> {
        let mut s = Slowdown::straggler(node, 1.0);
        for (name, own, base) in [("intra", intra, cl.intra), ("inter", inter, cl.inter)] {
            let Some(t) = own else { continue };
            if t.bytes_per_s > base.bytes_per_s || t.latency_us < base.latency_us {
                return Err(SimError::Model(format!(
                    "node {node}'s {name} transport ({} B/s, {} us) beats the cluster's \
                     ({} B/s, {} us); give the cluster the fastest one",
                    t.bytes_per_s, t.latency_us, base.bytes_per_s, base.latency_us
                )));
            }
            let factor = base.bytes_per_s / t.bytes_per_s.max(f64::MIN_POSITIVE);
            let extra = t.latency_us - base.latency_us;
            if name == "intra" {
                (s.intra, s.intra_extra_us) = (factor, extra);
            } else {
                (s.inter, s.inter_extra_us) = (factor, extra);
            }
        }
        Ok(s)
    }

    /// A node whose NICs run `factor` times slower (a degraded link).
    pub fn degraded_link(node: usize, factor: f64) -> Slowdown {
        Slowdown {
            inter: factor,
            ..Slowdown::straggler(node, 1.0)
        }
    }
}

#[cfg(test)]
impl Cluster {
    /// The cluster the per-rank frame's tests use (issue 34's target):
    /// `nodes` × `rpn`, 400 GB/s / 2 µs within a node, 50 GB/s / 5 µs
    /// between nodes, 200 GB/s reductions.
    pub(crate) fn per_rank_test(nodes: usize, rpn: usize) -> Cluster {
        let mut cl = Cluster::new(
            nodes,
            rpn,
            Tier {
                bytes_per_s: 400e9,
                latency_us: 2.0,
            },
            Tier {
                bytes_per_s: 50e9,
                latency_us: 5.0,
            },
        );
        cl.reduce_bytes_per_s = 200e9;
        cl
    }
}

/// How much faster than its rate a NIC sends while its token bucket has tokens.
pub const BURST_PEAK_FACTOR: f64 = 10.0;

/// Most ranks a model may have.
pub const MAX_SIM_RANKS: usize = 1 << 20;

impl Cluster {
    /// A cluster of `nodes` × `ranks_per_node` with the given tiers, one NIC
    /// per rank, no oversubscription, node-major numbering.
    pub fn new(nodes: usize, ranks_per_node: usize, intra: Tier, inter: Tier) -> Cluster {
        Cluster {
            nodes,
            ranks_per_node,
            intra,
            inter,
            nic: Nic::PerRank,
            oversubscription: 1.0,
            burst_bytes: 0.0,
            reduce_bytes_per_s: 0.0,
            placement: Placement::NodeMajor,
            slowdowns: Vec::new(),
        }
    }

    /// The latency `node`'s links add per message, µs: (intra, inter)
    /// ([`Slowdown::intra_extra_us`], summed over its slowdowns).
    pub fn extra_latency_of(&self, node: usize) -> (f64, f64) {
        self.slowdowns
            .iter()
            .filter(|s| s.node == node)
            .fold((0.0, 0.0), |(a, b), s| {
                (a + s.intra_extra_us, b + s.inter_extra_us)
            })
    }

    /// The factors (intra, inter, compute) by which `node` is slower: the
    /// product of its [`Slowdown`]s, (1, 1, 1) for a node without one.
    pub fn slowdown_of(&self, node: usize) -> (f64, f64, f64) {
        self.slowdowns
            .iter()
            .filter(|s| s.node == node)
            .fold((1.0, 1.0, 1.0), |(a, b, c), s| {
                (a * s.intra, b * s.inter, c * s.compute)
            })
    }

    /// From a topology file's spec; `nodes` / `ranks_per_node` given here win
    /// over the file. Tiers the file does not set are errors.
    pub fn from_spec(
        spec: &TierSpec,
        nodes: Option<usize>,
        ranks_per_node: Option<usize>,
    ) -> Result<Cluster> {
        let tier = |l: Option<LinkCost>, name: &str| {
            l.map(|l| Tier {
                bytes_per_s: l.bytes_per_us * 1e6,
                latency_us: l.alpha_us,
            })
            .ok_or_else(|| {
                SimError::Model(format!(
                    "the topology sets no {name} tier ({name}.bandwidth / {name}.latency)"
                ))
            })
        };
        let c = &spec.cluster;
        let nodes = nodes.or(c.nodes).ok_or_else(|| {
            SimError::Model("no node count (--nodes or `nodes =` in the topology file)".into())
        })?;
        let rpn = ranks_per_node.or(c.ranks_per_node).ok_or_else(|| {
            SimError::Model(
                "no ranks per node (--ranks-per-node or `ranks_per_node =` in the topology file)"
                    .into(),
            )
        })?;
        let mut cl = Cluster::new(
            nodes,
            rpn,
            tier(spec.intra, "intra")?,
            tier(spec.inter, "inter")?,
        );
        if c.nic.as_deref() == Some("node") {
            cl.nic = Nic::PerNode;
        }
        if c.placement.as_deref() == Some("round-robin") {
            cl.placement = Placement::RoundRobin;
        }
        cl.oversubscription = c.oversubscription.unwrap_or(1.0);
        cl.burst_bytes = c.burst_bytes.unwrap_or(0.0);
        cl.reduce_bytes_per_s = c.reduce_bytes_per_s.unwrap_or(0.0);
        cl.validate()?;
        Ok(cl)
    }

    /// Checks the numbers: counts ≥ 1, at most [`MAX_SIM_RANKS`] ranks,
    /// positive finite bandwidths, non-negative latencies, oversubscription ≥ 1.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(SimError::Model(m));
        if self.nodes == 0 || self.ranks_per_node == 0 {
            return bad(format!(
                "nodes ({}) and ranks per node ({}) must be at least 1",
                self.nodes, self.ranks_per_node
            ));
        }
        match self.nodes.checked_mul(self.ranks_per_node) {
            Some(n) if n <= MAX_SIM_RANKS => {}
            _ => {
                return bad(format!(
                    "{} nodes x {} ranks exceeds {MAX_SIM_RANKS} ranks",
                    self.nodes, self.ranks_per_node
                ))
            }
        }
        for (name, t) in [("intra", self.intra), ("inter", self.inter)] {
            if !(t.bytes_per_s.is_finite() && t.bytes_per_s > 0.0) {
                return bad(format!(
                    "{name} bandwidth {} B/s must be > 0",
                    t.bytes_per_s
                ));
            }
            if !(t.latency_us.is_finite() && t.latency_us >= 0.0) {
                return bad(format!("{name} latency {} us must be >= 0", t.latency_us));
            }
        }
        if !(self.oversubscription.is_finite() && self.oversubscription >= 1.0) {
            return bad(format!(
                "oversubscription {} must be >= 1",
                self.oversubscription
            ));
        }
        if !(self.burst_bytes.is_finite() && self.burst_bytes >= 0.0) {
            return bad(format!("burst {} must be >= 0 bytes", self.burst_bytes));
        }
        if !(self.reduce_bytes_per_s.is_finite() && self.reduce_bytes_per_s >= 0.0) {
            return bad(format!(
                "reduce bandwidth {} must be >= 0",
                self.reduce_bytes_per_s
            ));
        }
        for s in &self.slowdowns {
            if s.node >= self.nodes {
                return bad(format!(
                    "slowdown of node {}: the cluster has nodes 0..{}",
                    s.node, self.nodes
                ));
            }
            for (what, f) in [
                ("intra", s.intra),
                ("inter", s.inter),
                ("compute", s.compute),
            ] {
                if !(f.is_finite() && f >= 1.0) {
                    return bad(format!(
                        "slowdown of node {}: {what} factor {f} must be a finite number >= 1",
                        s.node
                    ));
                }
            }
            for (what, us) in [("intra", s.intra_extra_us), ("inter", s.inter_extra_us)] {
                if !(us.is_finite() && us >= 0.0) {
                    return bad(format!(
                        "slowdown of node {}: {what} extra latency {us} us must be >= 0",
                        s.node
                    ));
                }
            }
        }
        Ok(())
    }

    /// Ranks.
    pub fn nranks(&self) -> usize {
        self.nodes * self.ranks_per_node
    }

    /// Node of `rank`.
    pub fn node_of(&self, rank: usize) -> usize {
        match self.placement {
            Placement::NodeMajor => rank / self.ranks_per_node,
            Placement::RoundRobin => rank % self.nodes,
        }
    }

    /// The runtime's topology for this numbering.
    pub fn topology(&self) -> Topology {
        Topology::from_node_of((0..self.nranks()).map(|r| self.node_of(r)).collect())
    }

    /// The planner's view (what `Communicator` builds from its topology).
    pub fn shape(&self) -> Shape {
        Shape {
            nranks: self.nranks(),
            nnodes: self.nodes,
            max_local: self.ranks_per_node,
            intra: self.intra.link_cost(),
            inter: self.inter.link_cost(),
        }
    }

    /// A topology file's spec describing this cluster (what calibrate writes).
    pub fn to_spec(&self) -> TierSpec {
        let mut s = TierSpec {
            intra: Some(self.intra.link_cost()),
            inter: Some(self.inter.link_cost()),
            ..TierSpec::default()
        };
        s.cluster.nodes = Some(self.nodes);
        s.cluster.ranks_per_node = Some(self.ranks_per_node);
        s.cluster.placement = Some(
            match self.placement {
                Placement::NodeMajor => "node-major",
                Placement::RoundRobin => "round-robin",
            }
            .into(),
        );
        s.cluster.nic = Some(
            match self.nic {
                Nic::PerRank => "rank",
                Nic::PerNode => "node",
            }
            .into(),
        );
        s.cluster.oversubscription = Some(self.oversubscription);
        if self.burst_bytes > 0.0 {
            s.cluster.burst_bytes = Some(self.burst_bytes);
        }
        if self.reduce_bytes_per_s > 0.0 {
            s.cluster.reduce_bytes_per_s = Some(self.reduce_bytes_per_s);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_round_trip_and_errors() {
        let mut c = Cluster::new(
            4,
            2,
            Tier {
                bytes_per_s: 4e9,
                latency_us: 2.0,
            },
            Tier {
                bytes_per_s: 125e6,
                latency_us: 60.0,
            },
        );
        c.nic = Nic::PerNode;
        c.placement = Placement::RoundRobin;
        c.burst_bytes = 1048576.0;
        let text = c.to_spec().to_text();
        let back = Cluster::from_spec(&TierSpec::parse(&text, "t").unwrap(), None, None).unwrap();
        assert_eq!(back, c);
        assert_eq!(back.node_of(5), 1);
        let spec = TierSpec::parse("intra.bandwidth = 1GB/s\n", "t").unwrap();
        let e = Cluster::from_spec(&spec, Some(2), Some(2)).unwrap_err();
        assert!(e.to_string().contains("inter"), "{e}");
        let mut c2 = c.clone();
        c2.nodes = 0;
        assert!(c2.validate().is_err());
    }
}
