//! Whether a communicator's peer buffers are there (`suspend.rs` suspends
//! and resumes; every operation asks).

/// Whether a communicator's peer buffers are there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Suspension {
    /// Connected (or connecting at first use): operations run.
    #[default]
    Active,
    /// Suspended, not resumed yet: its peer buffers (this many bytes)
    /// were released.
    Suspended {
        /// Bytes the suspend released.
        released: u64,
    },
}

impl Suspension {
    /// Bytes the suspend in effect released (0 while active).
    pub(crate) fn released(self) -> u64 {
        match self {
            Suspension::Active => 0,
            Suspension::Suspended { released } => released,
        }
    }
}
