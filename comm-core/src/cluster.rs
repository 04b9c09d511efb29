//! What the planner's cost model knows about the links between ranks: the
//! alpha-beta cost of one link ([`LinkCost`]) and the communicator's shape
//! on its two tiers ([`Shape`]). Read by the topology (file and detection),
//! the algorithm table's cost functions and the planner above them.

/// Alpha-beta cost of one link: a message of `b` bytes takes
/// `alpha_us + b / bytes_per_us` microseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkCost {
    /// Per-message latency, µs.
    pub alpha_us: f64,
    /// Bandwidth, bytes per µs.
    pub bytes_per_us: f64,
}

impl LinkCost {
    /// Host shared memory on one node (measured here: ~1 µs, ~4 GB/s per copy).
    pub const SHM: LinkCost = LinkCost {
        alpha_us: 1.0,
        bytes_per_us: 4000.0,
    };
    /// TCP (loopback ~15 µs, a few GB/s; across nodes the link rate).
    pub const TCP: LinkCost = LinkCost {
        alpha_us: 15.0,
        bytes_per_us: 1000.0,
    };

    /// RDMA verbs between nodes (RC WRITE with immediate: a few µs through
    /// the NIC; about a 100 Gbit/s port's rate, 12 GB/s). Used for the
    /// inter-node tier when every rank can use the rdma transport and no
    /// topology file or `SNCL_INTER_*` says otherwise.
    pub const RDMA: LinkCost = LinkCost {
        alpha_us: 5.0,
        bytes_per_us: 12_000.0,
    };

    /// Time in µs of one message of `bytes`.
    pub fn msg(&self, bytes: f64) -> f64 {
        self.alpha_us + bytes / self.bytes_per_us
    }
}

/// What the planner knows about the communicator: its size, its nodes and
/// the cost of each tier.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    /// Ranks.
    pub nranks: usize,
    /// Nodes.
    pub nnodes: usize,
    /// Most ranks on one node.
    pub max_local: usize,
    /// Link cost between ranks of one node.
    pub intra: LinkCost,
    /// Link cost between nodes.
    pub inter: LinkCost,
}

impl Shape {
    /// All ranks on one node, linked by `link`.
    pub fn flat(nranks: usize, link: LinkCost) -> Shape {
        Shape {
            nranks,
            nnodes: 1,
            max_local: nranks,
            intra: link,
            inter: link,
        }
    }

    /// The slowest link a flat algorithm crosses.
    pub fn slowest(&self) -> LinkCost {
        if self.nnodes > 1 {
            self.inter
        } else {
            self.intra
        }
    }
}
