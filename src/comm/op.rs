//! An operation as the runtime receives it ([`RawOp`]): collective, type,
//! reduction, root, count, raw buffers, variable counts or point-to-point
//! transfers, and the mark of the checks it passed ([`Checked`]).

use comm_core::shape::OpShape;
use comm_core::wire::{Collective, Fingerprint};
use comm_core::{DataType, ReduceOp};

/// Variable counts of all_gatherv / alltoallv, in elements.
/// all_gatherv uses only the receive side.
#[derive(Clone, Debug, Default)]
pub struct VCounts {
    /// Elements sent to each rank.
    pub send_counts: Vec<usize>,
    /// Where each rank's block starts in the input.
    pub send_displs: Vec<usize>,
    /// Elements received from each rank.
    pub recv_counts: Vec<usize>,
    /// Where each rank's block lands in the output.
    pub recv_displs: Vec<usize>,
}

/// One point-to-point transfer of a group: `count` elements of `dtype`, as
/// every other count (the transfers of one group may have different
/// types; a send and its receive must have the same size in bytes).
#[derive(Clone, Copy, Debug)]
pub struct P2p {
    /// The other rank.
    pub peer: usize,
    /// Send (true) or receive (false).
    pub is_send: bool,
    /// The buffer.
    pub ptr: *mut u8,
    /// Its length in elements of `dtype`.
    pub count: usize,
    /// The element type.
    pub dtype: DataType,
}

impl P2p {
    /// The buffer's length in bytes (checked addressable by the
    /// communicator before the transfer runs).
    pub fn bytes(&self) -> usize {
        self.count.saturating_mul(self.dtype.size())
    }
}

/// An operation on raw buffers, as the C ABI and framework bindings issue
/// them. Counts follow NCCL's conventions per collective (`count` is the
/// per-rank block for all_gather, reduce_scatter, alltoall, gather and
/// scatter). In place: `send == recv` (all_reduce, broadcast, reduce), `send
/// == recv + rank × count` (all_gather), `recv == send + rank × count`
/// (reduce_scatter).
#[derive(Clone, Debug)]
pub struct RawOp {
    /// The collective.
    pub coll: Collective,
    /// Element type.
    pub dtype: DataType,
    /// Reduction (reducing collectives).
    pub op: ReduceOp,
    /// Root (rooted collectives).
    pub root: usize,
    /// Element count (see above).
    pub count: usize,
    /// Input.
    pub send: *const u8,
    /// Output.
    pub recv: *mut u8,
    /// Variable counts (all_gatherv, alltoallv), boxed: every operation
    /// moves a `RawOp` a few times on its way to the executor, and the
    /// four vectors inline made it twice as large (those moves were 8 % of
    /// a small all-reduce's time, docs/perf-notes/NOTEBOOK.md §27).
    pub v: Option<Box<VCounts>>,
    /// Transfers of a point-to-point group (`Collective::SendRecv`; the
    /// group's `dtype` and `count` are not used: each transfer has its own).
    pub p2p: Vec<P2p>,
    /// The call's own settings (algorithm, chunk, protocol, tag); the
    /// default changes nothing.
    pub config: crate::CollConfig,
    /// The communicator's mark that the op passed its checks, kept from
    /// the check before the op took a ticket to the executor; checked again
    /// where the fields above no longer match it. Inline (not boxed): a box
    /// cost an allocation and a free per operation (docs/perf-notes/NOTEBOOK.md §7).
    pub(crate) prepared: Option<Checked>,
}

// SAFETY: the raw pointers are lent by the caller until the operation
// completes (the typed API's borrows and scopes enforce it); only one thread
// executes the operation.
unsafe impl Send for RawOp {}

impl RawOp {
    /// An op with null buffers, `Sum` and root 0; fill in the rest.
    pub fn new(coll: Collective, dtype: DataType, count: usize) -> RawOp {
        RawOp {
            coll,
            dtype,
            op: ReduceOp::Sum,
            root: 0,
            count,
            send: std::ptr::null(),
            recv: std::ptr::null_mut(),
            v: None,
            p2p: Vec::new(),
            config: crate::CollConfig::of_this_thread(),
            prepared: None,
        }
    }
}

/// What [`Inner::prepare`] established about an operation on one
/// communicator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Prepared {
    /// The shape (collective, dtype, count, ranks, root).
    pub shape: OpShape,
    /// What every piece of the operation carries.
    pub fingerprint: Fingerprint,
    /// Elements of the send buffer this rank reads.
    pub send_elems: usize,
    /// Elements of the receive buffer this rank writes.
    pub recv_elems: usize,
}

/// The mark [`Inner::prepare`] leaves in a [`RawOp`] that passed the
/// checks: the fields they read, to see that they still describe the op.
/// Everything else of [`Prepared`] is arithmetic on these, derived again
/// without the checks. Inline and small (16 bytes): a boxed [`Prepared`]
/// cost a malloc and a free per operation (docs/perf-notes/NOTEBOOK.md §7), and a
/// [`RawOp`] sits beside smaller variants in queued jobs and C ABI items
/// (a larger mark trips clippy's `large_enum_variant` there). Root and
/// ranks beyond `u16` leave no mark: such ops are checked every time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Checked {
    count: usize,
    root: u16,
    nranks: u16,
    coll: Collective,
    dtype: DataType,
    op: ReduceOp,
}

impl Checked {
    /// The mark of `op` on a communicator of `nranks` (`None` where a field
    /// does not fit: such an op is checked every time).
    pub(super) fn of(op: &RawOp, nranks: usize) -> Option<Checked> {
        Some(Checked {
            count: op.count,
            root: u16::try_from(op.root).ok()?,
            nranks: u16::try_from(nranks).ok()?,
            coll: op.coll,
            dtype: op.dtype,
            // The reduction only matters where the collective reduces.
            op: if op.coll.is_reducing() {
                op.op
            } else {
                ReduceOp::Sum
            },
        })
    }
}
