//! The device kernel path's enqueue (`window/lane.rs` runs it): which
//! collectives the lane takes, and putting one on the caller's stream in
//! its turn for the progress thread to watch.

use std::sync::Arc;

use ::device::direct::{DirectAlgo, StagedCollective};

use super::api::DeviceOp;
use super::job::LaneJob;
use super::window::WindowCore;
use crate::work::JobKind;
use crate::Communicator;
use sncl_runtime::device::binding::Binding;

impl Communicator {
    /// The kernel path's lane and what `op` runs as on it (see
    /// `window/lane.rs`): a collective the lane takes, on a communicator
    /// whose lane opened. Every rank answers alike for the same call.
    pub(super) fn lane_for(&self, op: &DeviceOp) -> Option<(Arc<WindowCore>, StagedCollective)> {
        let lane = self.lane.get()?.as_ref()?;
        // Users' windows come first: once a window exists, every device
        // all-reduce offers (and runs directly where the buffers are in
        // one), on every rank alike.
        let windows = self
            .device
            .get()
            .is_some_and(|a| a.registry().offers_windows());
        if windows {
            return None;
        }
        let staged = lane.lane_collective(op.coll, op.root, (op.dtype, op.op, op.count))?;
        Some((lane.clone(), staged))
    }

    /// `op` on the lane: in its turn, the copy, kernel and divide go on the
    /// caller's stream (also under stream capture, where nothing is
    /// watched), and the progress thread watches the completion event.
    pub(super) fn prepare_lane(
        &self,
        b: &Arc<Binding>,
        op: DeviceOp,
        (lane, staged): (Arc<WindowCore>, StagedCollective),
    ) -> Box<dyn FnOnce(u64) -> JobKind> {
        let (rank, name) = (self.inner.rank, op.coll.name());
        // One context check for the whole enqueue (the scope moves into
        // the maker, which runs on this thread in the operation's turn).
        let entered = b.dev.enter().ok();
        let mut enqueue_error = None;
        let ipc_ordered = lane.ipc_events.is_some();
        let done = match b.dev.is_capturing(op.stream) {
            // Under capture nothing is recorded (`prepare_device` refused
            // it for the IPC-event lane).
            Ok(true) => None,
            Ok(false) => match b.take_event() {
                Ok(ev) => Some(ev),
                Err(e) => {
                    enqueue_error = Some(b.error(rank, name, None, "creating an event", e));
                    None
                }
            },
            Err(e) => {
                enqueue_error = Some(b.error(rank, name, None, "checking the caller's stream", e));
                None
            }
        };
        let fingerprint = comm_core::wire::Fingerprint {
            collective: op.coll,
            dtype: op.dtype,
            op: op.op,
            root: if op.coll.is_rooted() {
                op.root as i32
            } else {
                -1
            },
            count: op.count as u64,
            settings: 0,
        };
        let binding = b.clone();
        let algo = (staged == StagedCollective::AllReduce && !ipc_ordered)
            .then(|| lane.lane_algo(op.dtype, op.count, op.config.max_ctas));
        let kernel = match algo {
            Some(DirectAlgo::TwoShot) => "lane two-shot",
            Some(DirectAlgo::LowLatency) => "lane ll",
            Some(DirectAlgo::OneShot) => "lane one-shot",
            None if ipc_ordered => "lane ipc-events",
            None => "lane",
        };
        // As the host path records it: the larger of this rank's extents.
        let shape = comm_core::shape::OpShape::new(op.coll, op.dtype, op.count, self.inner.nranks)
            .with_root(op.root);
        let elems = shape.send_elems(rank).max(shape.recv_elems(rank));
        let recorded_as = (kernel, (elems * op.dtype.size()) as u64, op.config.tag);
        Box::new(move |_ticket| {
            if enqueue_error.is_none() {
                // SAFETY: the caller's contract (`enqueue_device`): the
                // buffers hold the extents until the stream completes the
                // work; checked against their allocations above.
                let r = unsafe {
                    lane.enqueue_lane(
                        op.stream,
                        (staged, op.send, op.recv),
                        (op.count, op.dtype, op.op),
                        (op.config.max_ctas, &fingerprint, algo),
                        done,
                    )
                };
                enqueue_error = r.err();
            }
            drop(entered);
            JobKind::Device(Box::new(LaneJob {
                lane,
                binding,
                fingerprint,
                done,
                algo,
                ipc_ordered,
                recorded_as,
                enqueue_error,
            }))
        })
    }
}
