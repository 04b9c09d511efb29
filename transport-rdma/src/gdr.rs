//! GPUDirect RDMA: the device regions ([`Payload::Device`](comm_core::transport::Payload::Device)) of an
//! [`RdmaConnection`](crate::RdmaConnection). Device pieces go from the sender's device memory
//! through the NIC into the receiver's device inbox; only their headers
//! cross host memory.
//!
//! * **Deciding, per pair.** At its first device operation each side
//!   decides whether it can take part (`SNCL_IB_GDR` is not `0`; its
//!   device exports dma-bufs, [`device::Device::dmabuf_supported`]; the
//!   verbs library has `ibv_reg_dmabuf_mr`; its inbox — `slots` slots of
//!   `slot_bytes - header` bytes of device memory — allocates, exports and
//!   registers) and writes its verdict, with the inbox's address and
//!   rkey or the reason it cannot, into the peer's *board* (a small
//!   registered host page exchanged at setup) by a WRITE with immediate.
//!   The pair uses the device path only if both said yes; else device
//!   pieces are staged through host memory (logged once at INFO), and with
//!   `SNCL_IB_GDR=1` the operation fails naming what is missing.
//! * **Sending.** Piece `k` shares the host pieces' numbering, FIFO slot
//!   and credits. Its source is registered once per allocation
//!   ([`DevRegs`]), or, where it does not register, copied on its stream
//!   into a registered device bounce buffer of the inbox's geometry (slot
//!   `k % slots`, free again once the header WRITE of piece `k - slots`,
//!   chained after its payload on one QP, was retired); an event recorded
//!   on the operation's stream marks the work that produced the data, and
//!   once it completes the payload is RDMA-WRITTEN into the peer's inbox
//!   slot `k % slots`, then the header
//!   (from staging) WRITE_WITH_IMM into its FIFO slot on the same QP (RC
//!   ordering: the receiver's completion covers both). The piece is sent
//!   when the payload write completes (`Connection::flush`).
//! * **Receiving.** The header is checked as for host pieces; where the
//!   device does not order GPUDirect writes with its own work
//!   ([`Device::gpudirect_flush_needed`], CUDA's
//!   `..._WRITES_ORDERING_NONE`), one flush
//!   ([`Device::flush_gpudirect_writes`]) covers every piece that has
//!   arrived before the first of them is handed over (risk 3 of issue 36;
//!   NCCL flushes after GPUDirect receives too); the executor enqueues
//!   the reduction or copy from the inbox slot on its stream; the slot's credit goes back once an event after that work
//!   completes.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use comm_core::wire::PieceHeader;
use comm_core::Error;
use device::{Device, DeviceBuffer, DeviceError, DeviceQueue, EventHandle};

use crate::devregs::DevRegs;
use crate::mem::Buf;
use crate::verbs::{Mr, Verbs};

mod ops;
/// How long dropping a connection waits for device work reading its inbox.
const DRAIN_ON_DROP: Duration = Duration::from_secs(5);
const OP: &str = "rdma transport (GPUDirect RDMA)";

static SENT: AtomicU64 = AtomicU64::new(0);
static RECEIVED: AtomicU64 = AtomicU64::new(0);
static STAGED_LOGGED: AtomicBool = AtomicBool::new(false);
static BOUNCED: AtomicU64 = AtomicU64::new(0);
static BOUNCED_LOGGED: AtomicBool = AtomicBool::new(false);

/// Bytes of device pieces this process sent through the registered device
/// bounce buffer because their source memory did not register (tests,
/// diagnostics; they are counted in [`gdr_bytes`] too).
pub fn gdr_bounced_bytes() -> u64 {
    BOUNCED.load(Ordering::Relaxed)
}

/// Bytes this process has sent and received device to device over RDMA
/// (GPUDirect), all connections together (diagnostics and tests; the
/// communicator's stats count them under the transport `rdma`).
pub fn gdr_bytes() -> (u64, u64) {
    (
        SENT.load(Ordering::Relaxed),
        RECEIVED.load(Ordering::Relaxed),
    )
}

/// This side's inbox: device memory registered for GPUDirect.
struct Inbox {
    /// How this side registers device memory (dma-buf or nvidia-peermem).
    route: crate::devregs::DeviceRoute,
    dev: Arc<dyn Device>,
    buf: DeviceBuffer,
    mr: Mr,
    /// The device does not order GPUDirect writes with its own work
    /// ([`Device::gpudirect_flush_needed`]): received pieces are flushed
    /// before they are handed over.
    needs_flush: bool,
    /// Registered device memory of the inbox's geometry, for sending: a
    /// piece whose source does not register (its allocation has no
    /// dma-buf: managed memory, a range across a VMM reservation's
    /// physical allocations) is copied into slot `k % slots` on its stream
    /// and written from there, instead of failing the operation.
    bounce: DeviceBuffer,
    bounce_mr: Mr,
}

/// A device piece waiting for the work that produced its data.
struct Queued {
    k: u64,
    header: PieceHeader,
    src: u64,
    lkey: u32,
    ev: Option<EventHandle>,
}

/// The device path once both sides said yes.
struct Active {
    inbox: Inbox,
    /// The peer's inbox: address, rkey.
    peer_inbox: (u64, u32),
    regs: DevRegs,
    events: Vec<EventHandle>,
    free_events: Vec<EventHandle>,
    /// Pieces whose payload write is not posted yet, oldest first.
    queue: VecDeque<Queued>,
    /// Received pieces whose reading work may still run: piece number and
    /// event, oldest first.
    recv_pending: VecDeque<(u64, Option<EventHandle>)>,
    /// Pieces numbered below this arrived before the last GPUDirect write
    /// flush (covered by it).
    flushed_below: u64,
}

impl Active {
    fn take_event(&mut self) -> Result<EventHandle, DeviceError> {
        if let Some(ev) = self.free_events.pop() {
            return Ok(ev);
        }
        let ev = self.inbox.dev.create_event()?;
        self.events.push(ev);
        Ok(ev)
    }
}

enum State {
    /// Nothing published yet.
    Idle,
    /// Our board is written; the peer's not read yet.
    Published { local: Option<Inbox> },
    /// Decided: device to device (`Some`), or staged.
    Decided(Option<Box<Active>>),
    /// `SNCL_IB_GDR=1` could not be met: the message, returned again.
    Failed(String),
}

/// A connection's GPUDirect state (see the module documentation).
pub(crate) struct Gdr {
    setting: Option<bool>,
    /// The peer's board has arrived (its WRITE_WITH_IMM completed).
    pub(crate) board_arrived: bool,
    /// Payload writes from device memory posted and not completed.
    pub(crate) in_flight: u64,
    board_mr: Mr,
    board: Buf,
    remote_board: (u64, u32),
    state: State,
}

impl Gdr {
    pub(crate) fn new(setting: Option<bool>, board_mr: Mr, remote_board: (u64, u32)) -> Gdr {
        // SAFETY: the board was allocated by the connection's provider,
        // which outlives this value (the connection deregisters it last);
        // the peer writes only its first page, once, before its immediate.
        let board = unsafe { Buf::new(&board_mr) };
        Gdr {
            setting,
            board_arrived: false,
            in_flight: 0,
            board_mr,
            board,
            remote_board,
            state: State::Idle,
        }
    }

    /// Pieces received so far whose inbox slots are free again: all of
    /// `received` but those whose reading work may still run.
    pub(crate) fn released(&self, received: u64) -> u64 {
        match &self.state {
            State::Decided(Some(a)) => a.recv_pending.front().map_or(received, |p| p.0),
            _ => received,
        }
    }

    /// Device pieces waiting for their copy to be posted, or inbox slots
    /// waiting for the work that reads them.
    pub(crate) fn waiting(&self) -> bool {
        match &self.state {
            State::Decided(Some(a)) => !a.queue.is_empty() || !a.recv_pending.is_empty(),
            _ => false,
        }
    }

    /// Frees inbox slots whose reading work completed.
    pub(crate) fn release_done(&mut self) -> Result<(), DeviceError> {
        let State::Decided(Some(a)) = &mut self.state else {
            return Ok(());
        };
        while let Some(&(_, ev)) = a.recv_pending.front() {
            if let Some(ev) = ev {
                if !a.inbox.dev.event_done(ev)? {
                    break;
                }
                a.free_events.push(ev);
            }
            a.recv_pending.pop_front();
        }
        Ok(())
    }

    /// Releases everything (the connection goes away; its QPs are in
    /// ERROR, so the NIC touches none of this memory any more).
    pub(crate) fn clear(&mut self, verbs: &mut dyn Verbs) {
        let inbox = match std::mem::replace(&mut self.state, State::Idle) {
            State::Published { local } => local,
            State::Decided(Some(mut a)) => {
                // Work still queued (a failed operation) may read the inbox:
                // wait for it, bounded, before the memory goes.
                let deadline = Instant::now() + DRAIN_ON_DROP;
                let dev = a.inbox.dev.clone();
                let pending: Vec<EventHandle> = a
                    .recv_pending
                    .iter()
                    .filter_map(|p| p.1)
                    .chain(a.queue.iter().filter_map(|q| q.ev))
                    .collect();
                for ev in pending {
                    while !matches!(dev.event_done(ev), Ok(true) | Err(_)) {
                        if Instant::now() >= deadline {
                            tracing::warn!("rdma: device work of a dropped connection still runs after {DRAIN_ON_DROP:?}; freeing its inbox anyway");
                            break;
                        }
                        std::thread::sleep(Duration::from_micros(50));
                    }
                }
                for ev in a.events.drain(..) {
                    // SAFETY: created on this device here; destroyed once.
                    if let Err(e) = unsafe { dev.destroy_event(ev) } {
                        tracing::warn!(error = %e, "destroying a GPUDirect event failed");
                    }
                }
                a.regs.clear(verbs);
                Some(a.inbox)
            }
            _ => None,
        };
        if let Some(i) = inbox {
            for mr in [&i.mr, &i.bounce_mr] {
                if let Err(e) = verbs.dereg_user_mr(mr) {
                    tracing::warn!("deregistering the GPUDirect inbox or bounce failed: {e}");
                }
            }
        }
        let _ = verbs.dereg_mr(&self.board_mr);
    }

    /// Registrations of device memory made so far by this connection.
    fn registrations(&self) -> u64 {
        match &self.state {
            State::Decided(Some(a)) => a.regs.made,
            _ => 0,
        }
    }
}

fn queue_of(rank: usize, device: &dyn std::any::Any) -> Result<&DeviceQueue, Error> {
    device
        .downcast_ref::<DeviceQueue>()
        .ok_or_else(|| Error::InvalidArgument {
            rank,
            op: OP,
            detail: "the operation's device queue is not the device layer's".into(),
        })
}

fn describe(dev: &dyn Device) -> String {
    format!(
        "{} device {} ({})",
        dev.backend().name(),
        dev.ordinal(),
        dev.name()
    )
}
