//! Whether a communicator's peer buffers are there (`suspend.rs` suspends
//! and resumes; every operation asks).

/// Whether a communicator's peer buffers are there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Suspension {
    /// Connected (or connecting at first use): operations run.
    #[default]
    Active,
    /// Suspended `n` times so far, the last not resumed yet.
    Suspended(u64),
}
