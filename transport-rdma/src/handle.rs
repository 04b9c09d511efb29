//! [`RdmaConnection`]: the executor's handle on an RDMA connection whose
//! state ([`ConnState`]) the NIC's progress thread (`progress.rs`) drives
//! too, while the executor is away from it.

use std::sync::Arc;

use comm_core::transport::registry::MemoryKind;
use comm_core::transport::{Connection, ConsumeResult, Outgoing, Payload, Space, TransportError};
use comm_core::wire::PieceHeader;
use comm_core::Error;

use crate::conn::ConnState;
use crate::progress::{Cell, Driver};
use crate::regcache::ZeroCopy;

/// An RDMA connection to one peer (both directions): RC queue pairs,
/// RDMA WRITE with immediate into the peer's slot FIFO (see `conn.rs`).
pub struct RdmaConnection {
    cell: Arc<Cell>,
    driver: Arc<Driver>,
    peer: usize,
    device: String,
    qps: Vec<u32>,
}

impl RdmaConnection {
    pub(crate) fn new(state: ConnState, driver: Arc<Driver>) -> RdmaConnection {
        let (peer, device, qps) = (state.peer, state.device.clone(), state.qps.clone());
        RdmaConnection {
            cell: driver.adopt(state),
            driver,
            peer,
            device,
            qps,
        }
    }

    /// Runs `f` on the state as the executor (the progress thread leaves
    /// the connection alone for a while after).
    fn with<R>(&self, f: impl FnOnce(&mut ConnState) -> R) -> R {
        self.cell.with(&self.driver, f)
    }

    /// The device this connection uses (`mlx5_0:1`, `emu_ib0:1`).
    pub fn device(&self) -> &str {
        &self.device
    }

    /// The queue pair numbers, in striping order.
    pub fn qp_numbers(&self) -> &[u32] {
        &self.qps
    }

    /// Whether a credit found the peer gone: it has left, after its last
    /// operation if this side asks nothing more of it (an error naming it
    /// as soon as this side needs it again).
    pub fn peer_left(&self) -> bool {
        self.cell.peek(|s| s.peer_left())
    }

    /// Injects a fault into this connection's provider (emulated only).
    pub fn inject(&mut self, fault: crate::verbs::Fault) -> Result<(), crate::verbs::VerbsError> {
        self.with(|s| s.inject(fault))
    }

    /// What the provider counted on this connection's device (doorbells,
    /// send work requests and completions; the emulated provider counts).
    pub fn verbs_counters(&self) -> crate::verbs::VerbsCounters {
        self.cell.peek(|s| s.verbs_counters())
    }

    /// How this connection sends lent pieces.
    pub fn zero_copy(&self) -> ZeroCopy {
        self.cell.peek(|s| s.zero_copy())
    }

    /// User-buffer registrations made so far, and bytes registered now.
    pub fn registrations(&self) -> (u64, usize) {
        self.cell.peek(|s| s.registrations())
    }

    /// Whether pieces to and from the peer go device to device (tests,
    /// diagnostics): `None` before the first device operation decided it.
    pub fn gdr_active(&self) -> Option<bool> {
        self.cell.peek(|s| s.gdr_active())
    }

    /// Device-memory registrations this connection made (dma-buf).
    pub fn gdr_registrations(&self) -> u64 {
        self.cell.peek(|s| s.gdr_registrations())
    }

    /// How many times the NIC's progress thread drove this connection
    /// while its executor was away (tests, diagnostics).
    pub fn background_progress(&self) -> u64 {
        self.cell.driven()
    }
}

impl Connection for RdmaConnection {
    fn peer(&self) -> usize {
        self.peer
    }

    fn footprint(&self, report: &mut comm_core::transport::footprint::FootprintReport<'_>) {
        self.cell.peek(|s| s.footprint(report))
    }

    fn memory_kinds(&self) -> &'static [MemoryKind] {
        &[MemoryKind::Host, MemoryKind::Device]
    }

    fn max_piece(&self, kind: MemoryKind) -> usize {
        self.cell.peek(|s| s.max_piece(kind))
    }

    fn ready(&mut self, device: &dyn std::any::Any) -> Result<Option<bool>, Error> {
        self.with(|s| s.ready(device))
    }

    fn try_post_send(&mut self, header: &PieceHeader, piece: Outgoing<'_>) -> Result<bool, Error> {
        self.with(|s| s.try_post_send(header, piece))
    }

    fn try_recv(
        &mut self,
        space: Space<'_>,
        consume: &mut dyn FnMut(&PieceHeader, Payload<'_>) -> ConsumeResult,
    ) -> Result<bool, Error> {
        self.with(|s| s.try_recv(space, consume))
    }

    fn flush(&mut self) -> Result<bool, Error> {
        self.with(|s| s.flush())
    }

    fn check_alive(&mut self) -> Result<(), TransportError> {
        self.with(|s| s.check_alive())
    }

    fn abort(&mut self, cause: Option<usize>) {
        self.with(|s| s.abort(cause))
    }

    fn kind(&self) -> &'static str {
        "rdma"
    }
}

impl Drop for RdmaConnection {
    fn drop(&mut self) {
        // The state (queue pairs, regions) goes on this thread, never on
        // the progress thread.
        drop(self.cell.take());
    }
}
