//! Topology: which ranks share a node, and the orders that keep rings and
//! trees inside nodes as much as possible whatever the rank numbering,
//! and the device tier the planner uses for device memory over `nvlink`.

use crate::cluster::{LinkCost, Shape};

/// Placement of ranks on nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    /// Node index of every rank (nodes numbered by first appearance).
    pub node_of: Vec<usize>,
    /// Ranks of each node, ascending.
    pub nodes: Vec<Vec<usize>>,
}

impl Topology {
    /// From each rank's node identity string.
    pub fn from_node_ids<S: AsRef<str>>(ids: &[S]) -> Topology {
        let mut names: Vec<&str> = Vec::new();
        let mut node_of = Vec::with_capacity(ids.len());
        for id in ids {
            let id = id.as_ref();
            let k = match names.iter().position(|n| *n == id) {
                Some(k) => k,
                None => {
                    names.push(id);
                    names.len() - 1
                }
            };
            node_of.push(k);
        }
        Topology::from_node_of(node_of)
    }

    /// From the node index of every rank.
    pub fn from_node_of(node_of: Vec<usize>) -> Topology {
        let nnodes = node_of.iter().copied().max().map_or(0, |m| m + 1);
        let mut nodes = vec![Vec::new(); nnodes];
        for (r, &k) in node_of.iter().enumerate() {
            nodes[k].push(r);
        }
        nodes.retain(|n| !n.is_empty());
        // Renumber so node indices are dense.
        let mut node_of = node_of;
        for (k, ranks) in nodes.iter().enumerate() {
            for &r in ranks {
                node_of[r] = k;
            }
        }
        Topology { node_of, nodes }
    }

    /// All ranks on one node.
    pub fn single_node(n: usize) -> Topology {
        Topology::from_node_of(vec![0; n])
    }

    /// Ranks.
    pub fn nranks(&self) -> usize {
        self.node_of.len()
    }

    /// Nodes.
    pub fn nnodes(&self) -> usize {
        self.nodes.len()
    }

    /// Index of `rank` among its node's ranks.
    pub fn local_rank(&self, rank: usize) -> usize {
        let k = self.node_of[rank];
        self.nodes[k]
            .iter()
            .position(|&x| x == rank)
            .expect("member")
    }

    /// Ranks ordered node by node: a ring in this order crosses a node
    /// boundary once per node (the minimum), whatever the numbering.
    pub fn ring_order(&self) -> Vec<usize> {
        self.nodes.iter().flatten().copied().collect()
    }

    /// Number of ring edges that cross nodes for a ring in `order`.
    pub fn crossings(&self, order: &[usize]) -> usize {
        let n = order.len();
        (0..n)
            .filter(|&i| n > 1 && self.node_of[order[i]] != self.node_of[order[(i + 1) % n]])
            .count()
    }

    /// Whether two ranks share a node.
    pub fn same_node(&self, a: usize, b: usize) -> bool {
        self.node_of[a] == self.node_of[b]
    }
}

/// Default cost of the device tier: version 1 of the `nvlink` transport,
/// host-driven (per piece an event poll, a descriptor through host memory
/// and a kernel launch: ~20 µs), over a link of ~100 GB/s (conservative for
/// NVLink; a topology file's `intra.*` keys replace it).
pub const NVLINK: LinkCost = LinkCost {
    alpha_us: 20.0,
    bytes_per_us: 100_000.0,
};

/// The planner's shape for an operation on device memory. Where every
/// same-node pair goes over `nvlink` on every rank (`nvlink_everywhere`:
/// forced, or ready on every rank — decided from the published records, so
/// every rank plans alike), intra-node pieces move device to device, so
/// the intra tier is the device tier: the topology file's `intra` section
/// when it has one (`configured_intra`: a topology file of a GPU cluster
/// describes its GPU links), else [`NVLINK`]. Otherwise (device pieces
/// staged through the host over shm/tcp) `shape` is returned unchanged.
pub fn device_shape(
    shape: &Shape,
    nvlink_everywhere: bool,
    configured_intra: Option<LinkCost>,
) -> Shape {
    if !nvlink_everywhere || shape.max_local < 2 {
        return *shape;
    }
    Shape {
        intra: configured_intra.unwrap_or(NVLINK),
        ..*shape
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_ops_over_nvlink_plan_with_the_device_tier() {
        let shape = Shape {
            nranks: 4,
            nnodes: 2,
            max_local: 2,
            intra: LinkCost::SHM,
            inter: LinkCost::TCP,
        };
        let d = device_shape(&shape, true, None);
        assert_eq!(d.intra, NVLINK);
        assert_eq!(d.inter, LinkCost::TCP);
        let file = LinkCost {
            alpha_us: 3.0,
            bytes_per_us: 400_000.0,
        };
        assert_eq!(device_shape(&shape, true, Some(file)).intra, file);
        // Pairs staged through the host (shm/tcp somewhere): unchanged.
        assert_eq!(device_shape(&shape, false, None), shape);
        // One rank per node: no intra-node link to price.
        let two = Shape::flat(2, LinkCost::TCP);
        let alone = Shape {
            nnodes: 2,
            max_local: 1,
            ..two
        };
        assert_eq!(device_shape(&alone, true, None), alone);
    }

    #[test]
    fn round_robin_placement_gets_a_node_major_ring() {
        // Rank r on node r % 4.
        let t = Topology::from_node_of((0..8).map(|r| r % 4).collect());
        let order = t.ring_order();
        assert_eq!(order, vec![0, 4, 1, 5, 2, 6, 3, 7]);
        assert_eq!(t.crossings(&order), 4);
        assert_eq!(t.crossings(&(0..8).collect::<Vec<_>>()), 8);
        assert_eq!(t.local_rank(5), 1);
    }

    #[test]
    fn names_map_to_dense_nodes() {
        let t = Topology::from_node_ids(&["b", "a", "b", "c"]);
        assert_eq!(t.node_of, vec![0, 1, 0, 2]);
        assert_eq!(t.nodes, vec![vec![0, 2], vec![1], vec![3]]);
    }
}
