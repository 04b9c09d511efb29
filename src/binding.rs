//! What bindings to other languages build on, beyond the typed API: the C
//! ABI (the `sncl-capi` crate, `libsncl`) uses exactly this module and the
//! raw operations at the crate root.
//!
//! * Raw operations on host memory: [`crate::RawOp`] (with
//!   [`crate::VCounts`] and [`crate::P2p`]), run by
//!   [`crate::Communicator::run_raw`] or queued by
//!   [`crate::Communicator::enqueue_raw`] (a [`crate::RawWork`]).
//! * Raw operations on device memory: [`crate::DeviceOp`], queued by
//!   [`crate::Communicator::enqueue_device`]; [`runs_on_device`] says which
//!   collectives it takes, [`bind_or_check`] binds the communicator to the
//!   buffers' device.
//! * An order of the binding's own calls: [`IssueOrder`] and its
//!   [`Ticket`]s, the mechanism the communicator orders its operations with
//!   (a binding whose calls span several operations, or start before the
//!   communicator exists, keeps one of its own per communicator).

use std::sync::Arc;

use ::device::Device;

use crate::{Collective, Communicator, Result};

pub use crate::order::{IssueOrder, Ticket};

/// Whether [`crate::Communicator::enqueue_device`] runs `coll` (all-reduce,
/// reduce-scatter, all-gather, broadcast, reduce, all-to-all, gather and
/// scatter); the others are host-only.
pub fn runs_on_device(coll: Collective) -> bool {
    crate::comm::Inner::runs_on_device(coll)
}

/// The device `comm` is bound to, binding it to `dev` first when none is
/// (as NCCL binds to the current device). `dev` must be the bound device:
/// else [`crate::Error::InvalidArgument`] in operation `op`, saying that
/// `what` (e.g. "the buffers") lives on another device.
pub fn bind_or_check(
    comm: &Communicator,
    op: &'static str,
    what: &str,
    dev: &Arc<dyn Device>,
) -> Result<Arc<dyn Device>> {
    comm.bind_or_check(op, what, dev)
}
