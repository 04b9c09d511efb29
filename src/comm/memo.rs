//! The plan memo: the planner's choices and the schedules of uniform-count
//! operations, kept per communicator by the shape they depend on; and
//! whether the lanes serve (`lane.rs`), decided once per epoch.

use std::sync::Arc;

use comm_core::algo::Algorithm;
use comm_core::schedule::Schedule;
use comm_core::wire::Collective;

/// The per-communicator maps keyed by a few integers (the plan memo, the
/// per-collective counts) hash with FxHash: fast, not DoS-resistant (the
/// keys are the program's own operation shapes, not outside input).
pub(crate) use rustc_hash::FxHashMap;

/// What the planner's choice and an operation's schedule depend on beyond
/// the communicator's fixed inputs (topology, tier costs, chunk size,
/// reduction speed: set at creation; a shrink builds a new communicator)
/// and the forced algorithms (a change clears the memo, see
/// [`Inner::force_algorithm`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct PlanKey {
    pub(super) coll: Collective,
    pub(super) esize: usize,
    pub(super) count: usize,
    pub(super) root: usize,
    pub(super) device: bool,
    /// The call's own algorithm and chunk ([`crate::CollConfig`]).
    pub(super) algo: Option<Algorithm>,
    pub(super) chunk_bytes: usize,
}

/// The memoised plans of uniform-count operations: key → (schedule,
/// algorithm), as [`Inner::schedule`] would build them afresh.
#[derive(Default)]
pub(crate) struct PlanMemo {
    pub(super) plans: FxHashMap<PlanKey, (Arc<Schedule>, Algorithm)>,
    /// [`Inner::forced_epoch`] when `plans` was last valid.
    pub(super) epoch: u64,
}

/// At most this many memoised plans; beyond it the memo starts over.
pub(super) const MEMO_ENTRIES: usize = 256;

/// Whether lanes serve this communicator's small all-reduces (`lane.rs`),
/// decided once per [`Inner::forced_epoch`] (a window allocation starts a
/// new one too).
#[derive(Default)]
pub(crate) struct LaneChoice {
    /// The epoch of the decision; `None` before the first.
    pub(super) epoch: Option<u64>,
    /// Lanes serve.
    pub(super) on: bool,
}
