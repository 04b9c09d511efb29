//! sncl's simulator and training-step cost model.
//!
//! [`collective::simulate`] runs the schedules the planner
//! ([`comm_core::tune::plan`]) would choose — the same builders
//! ([`comm_core::algo::build`]), chunking and algorithm choice — on a
//! [`model::Cluster`]: nodes × ranks per node, per-tier bandwidth and
//! latency, NICs per node or per rank, an oversubscribed fabric, links
//! shared by concurrent flows with max-min fairness ([`engine`]). Large jobs
//! run in the symmetric frame: one entity per local position of a node.
//!
//! [`cost`] turns a training configuration (model, parallel degrees, their
//! mapping onto tiers) into per-step communication volumes and, with the
//! simulator, exposed time, utilisation and the cost of the waiting.
//! Pure: no sockets, no threads, no clocks.

pub mod bootstrap;
pub mod collective;
pub mod cost;
pub mod critical;
pub mod engine;
pub mod model;
pub mod program;
pub mod waits;

/// Errors of the simulator and the cost model.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The cluster model is unusable.
    #[error("cluster model: {0}")]
    Model(String),
    /// The collective cannot be simulated as asked.
    #[error("simulating {op} with {algo} on {nranks} ranks: {why}")]
    Collective {
        /// The collective.
        op: &'static str,
        /// The algorithm.
        algo: &'static str,
        /// Ranks.
        nranks: usize,
        /// What went wrong.
        why: String,
    },
    /// The training configuration is inconsistent.
    #[error("training configuration: {0}")]
    Config(String),
    /// The planner refused.
    #[error("planner: {0}")]
    Planner(#[from] comm_core::Error),
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, SimError>;
