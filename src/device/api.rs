//! The Rust API of device collectives: binding a communicator to a device,
//! the unsafe raw forms on device pointers (on [`Communicator`]) and the
//! safe typed forms over [`DeviceBuffer`]s (on [`Scope`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use comm_core::wire::Collective;
use comm_core::{DataType, Error, ReduceOp, Result};

use ::device::{Backend, Device, DeviceBuffer, DeviceError, DevicePtr, StreamHandle};

use super::job::DeviceJob;
use super::offer::Attachment;
use super::window::WindowCore;
use crate::buffer::{DeviceSliceMut, Prefix};
use crate::comm::RawOp;
use crate::work::{JobKind, RawWork, Scope, Work};
use crate::{Communicator, Element};
use sncl_runtime::device::binding::Binding;

/// One collective on device memory, in NCCL's conventions (see
/// [`RawOp`] for the counts and the in-place forms). Host and device
/// buffers cannot be mixed: both pointers are device addresses of the
/// communicator's device.
#[derive(Clone, Copy, Debug)]
pub struct DeviceOp {
    /// The collective: all_reduce, reduce_scatter, all_gather, broadcast,
    /// reduce, alltoall, gather or scatter.
    pub coll: Collective,
    /// Element type.
    pub dtype: DataType,
    /// Reduction (reducing collectives).
    pub op: ReduceOp,
    /// Root (rooted collectives).
    pub root: usize,
    /// Element count (per rank's block where NCCL says so).
    pub count: usize,
    /// Input (device address).
    pub send: DevicePtr,
    /// Output (device address).
    pub recv: DevicePtr,
    /// The caller's stream: the collective runs after the work already
    /// enqueued there, and later work there runs after it.
    pub stream: StreamHandle,
    /// The call's own settings (algorithm, chunk, protocol, tag).
    pub config: crate::CollConfig,
}

impl DeviceOp {
    /// An operation with `Sum` and root 0; fill in the rest.
    pub fn new(
        coll: Collective,
        dtype: DataType,
        count: usize,
        send: DevicePtr,
        recv: DevicePtr,
        stream: StreamHandle,
    ) -> DeviceOp {
        DeviceOp {
            coll,
            dtype,
            op: ReduceOp::Sum,
            root: 0,
            count,
            send,
            recv,
            stream,
            config: crate::CollConfig::of_this_thread(),
        }
    }
}

fn same_device(a: &Arc<dyn Device>, b: &Arc<dyn Device>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

impl Communicator {
    /// Binds this communicator to `device` (once; a communicator uses one
    /// device). Creates the stream its device collectives run on and a
    /// pinned flag callers' streams wait on, loads every kernel and
    /// allocates the staging (`SNCL_DEVICE_STAGING_BYTES`), so that no
    /// device collective loads, allocates or frees (each may synchronise
    /// the device). Device collectives need a bound device; host
    /// collectives are unaffected.
    ///
    /// Ranks bind independently (from one thread in turn, or each from its
    /// own); the first device collective of each rank starts with a host
    /// barrier, so no rank parks a stream on its first device collective
    /// while another rank of the same process still loads or allocates
    /// here (both synchronise a shared device).
    ///
    /// ```no_run
    /// # let comm = sncl::Communicator::from_env()?;
    /// let dev = sncl::device::open(sncl::device::Backend::Cuda, 0).expect("a GPU");
    /// comm.bind_device(dev)?;
    /// # Ok::<(), sncl::Error>(())
    /// ```
    pub fn bind_device(&self, device: Arc<dyn Device>) -> Result<()> {
        let inner = &self.inner;
        if let Some(b) = self.device.get().map(|a| &a.binding) {
            return Err(Error::InvalidArgument {
                rank: inner.rank,
                op: "bind_device",
                detail: format!(
                    "this communicator is already bound to {} device {}; a communicator binds to one device",
                    b.dev.backend().name(),
                    b.dev.ordinal()
                ),
            });
        }
        let binding = Arc::new(Binding::new(device, inner.rank, &inner.config.device)?);
        tracing::info!(
            rank = inner.rank,
            backend = binding.dev.backend().name(),
            ordinal = binding.dev.ordinal(),
            name = %binding.dev.name(),
            "communicator bound to a device"
        );
        self.device
            .set(Arc::new(Attachment::new(binding)))
            .map_err(|_| Error::InvalidArgument {
                rank: inner.rank,
                op: "bind_device",
                detail: "bound concurrently by another thread".into(),
            })
    }

    /// Binds this communicator to the default device of `backend`, as NCCL
    /// binds to the current device: the device current on the calling
    /// thread (CUDA: the current context's, after `cudaSetDevice` or a
    /// cudarc context bound to the thread), else the device at this rank's
    /// index among the ranks of its node (`LOCAL_RANK` under torchrun),
    /// modulo the number of devices. Returns the device. Ranks of one node
    /// that end up on the same device work (their operations share it) and
    /// are logged at WARN, since they usually mean one device per rank was
    /// intended.
    ///
    /// ```no_run
    /// # let comm = sncl::Communicator::from_env()?;
    /// let dev = comm.bind_default_device(sncl::device::Backend::Cuda)?;
    /// println!("rank {} uses {}", comm.rank(), dev.name());
    /// # Ok::<(), sncl::Error>(())
    /// ```
    pub fn bind_default_device(&self, backend: Backend) -> Result<Arc<dyn Device>> {
        let inner = &self.inner;
        let rank = inner.rank;
        let fail = |what: &str, e: DeviceError| Error::Device {
            rank,
            op: "bind_default_device",
            seq: None,
            device: format!("{} (no device open yet)", backend.name()),
            what: what.to_string(),
            detail: e.to_string(),
        };
        let count = ::device::device_count(backend).map_err(|e| fail("counting the devices", e))?;
        let local = inner.topo.local_rank(rank);
        let local_ranks = inner.topo.nodes[inner.topo.node_of[rank]].len();
        let ordinal = match ::device::current_device(backend)
            .map_err(|e| fail("asking for the current device", e))?
        {
            Some(current) => current,
            None => local % count.max(1),
        };
        if local_ranks > count {
            tracing::warn!(
                rank,
                local_ranks,
                devices = count,
                ordinal,
                "more ranks on this node than {} devices: ranks share devices",
                backend.name()
            );
        }
        let dev = ::device::open(backend, ordinal)
            .map_err(|e| fail(&format!("opening device {ordinal}"), e))?;
        self.bind_device(dev.clone())?;
        Ok(dev)
    }

    /// The bound device, after binding to `dev` when none is bound yet (the
    /// first typed operation binds to its buffers' device, as NCCL uses the
    /// current device); `dev` must be that device: else an error in `op`
    /// saying that `what` lives on another device.
    pub(crate) fn bind_or_check(
        &self,
        op: &'static str,
        what: &str,
        dev: &Arc<dyn Device>,
    ) -> Result<Arc<dyn Device>> {
        let inner = &self.inner;
        if self.device.get().is_none() {
            if let Err(e) = self.bind_device(dev.clone()) {
                // Lost a race with another binding thread: check against it.
                if self.device.get().is_none() {
                    return Err(e);
                }
            }
        }
        let bound = self.bound_device().ok_or_else(|| Error::InvalidArgument {
            rank: inner.rank,
            op,
            detail: "no device is bound to this communicator (call Communicator::bind_device)"
                .into(),
        })?;
        if !same_device(dev, &bound) {
            return Err(Error::InvalidArgument {
                rank: inner.rank,
                op,
                detail: format!(
                    "{what} lives on another device than the communicator's ({} {})",
                    bound.backend().name(),
                    bound.ordinal()
                ),
            });
        }
        Ok(bound)
    }

    /// [`Communicator::bind_or_check`] for a typed buffer's device: an open
    /// sncl device, or a cudarc context (feature `cuda`).
    pub(crate) fn bind_or_check_id(
        &self,
        op: &'static str,
        what: &str,
        device: &crate::buffer::DeviceId,
    ) -> Result<()> {
        match device {
            crate::buffer::DeviceId::Open(dev) => self.bind_or_check(op, what, dev).map(|_| ()),
            #[cfg(feature = "cuda")]
            crate::buffer::DeviceId::Cuda(ctx) => self.bind_or_check_cuda(op, ctx),
        }
    }

    /// The device this communicator is bound to, if any.
    pub fn bound_device(&self) -> Option<Arc<dyn Device>> {
        self.device.get().map(|a| a.binding.dev.clone())
    }

    /// Sets this communicator's device links up now, collectively: every
    /// rank calls it after binding its device (NCCL does this inside
    /// `ncclCommInitRank`). Every connection with a device path allocates
    /// and exports its device inbox, the ranks meet at a barrier, every
    /// connection maps its peer's inbox, and the kernel path's window
    /// opens. Without it the first device collective does this, on the
    /// caller's thread, between work the caller may already have queued
    /// and the operation's own: allocation and IPC mapping synchronise the
    /// device there. Idempotent; an error names the rank and what failed.
    pub fn connect_device(&self) -> Result<()> {
        let Some(a) = self.device.get() else {
            return Err(Error::InvalidArgument {
                rank: self.inner.rank,
                op: "connect_device",
                detail: "no device is bound: call bind_device first".into(),
            });
        };
        self.join_once(&a.binding)
    }

    /// Joins the peers on the device once: one thread joins, another
    /// calling at the same time waits for it; after that, nothing.
    pub(super) fn join_once(&self, b: &Arc<Binding>) -> Result<()> {
        if b.peers_bound.load(Ordering::Acquire) {
            return Ok(());
        }
        let _joining = b.joining.lock().unwrap_or_else(|e| e.into_inner());
        if !b.peers_bound.load(Ordering::Acquire) {
            self.join_peers_on_device(b)?;
            b.peers_bound.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Before this rank's first device collective, on the caller's thread:
    /// every connection with a device path (nvlink) allocates and exports
    /// its device inbox; a host barrier; then every connection maps its
    /// peer's inbox. After it, no operation allocates or opens IPC
    /// mappings, and no rank parks a stream before every rank has bound
    /// and allocated (allocation synchronises a device that ranks of one
    /// process share).
    fn join_peers_on_device(&self, b: &Arc<Binding>) -> Result<()> {
        let inner = &self.inner;
        let queue = ::device::DeviceQueue {
            dev: b.dev.clone(),
            stream: b.stream,
        };
        // Whether every peer's connection goes device to device over
        // device memory mapped between the ranks (nvlink: the kernel path
        // reads peers' memory directly, so it needs all; RDMA's GPUDirect
        // also goes device to device, but through the NIC, which a forced
        // `SNCL_TRANSPORT=rdma` asks for).
        let mut every_peer_direct = true;
        let mut connect = |wait: bool| -> Result<()> {
            let deadline = Instant::now() + inner.config.timeout;
            let mut st = inner.lock();
            for c in st.conns.iter_mut().flatten() {
                loop {
                    let ready = c.ready(&queue)?;
                    if !wait {
                        break;
                    }
                    if let Some(direct) = ready {
                        every_peer_direct &= direct && c.kind() == transport_nvlink::NAME;
                        break;
                    }
                    if Instant::now() >= deadline {
                        let e = DeviceError::Timeout {
                            ordinal: b.dev.ordinal(),
                            what: format!("peer rank {}'s device inbox", c.peer()),
                            ms: inner.config.timeout.as_millis() as u64,
                        };
                        return Err(b.error(inner.rank, "bind_device", None, "connecting", e));
                    }
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
            Ok(())
        };
        // A rank whose own side fails (e.g. a required device path it
        // cannot have) still passes the barrier, so its peers read the
        // verdict it published and fail naming the cause, not its absence.
        let published = connect(false);
        self.barrier()?;
        published?;
        connect(true)?;
        // Every rank decides alike whether to open the kernel path: only
        // where every pair of ranks goes device to device.
        // A peer still waiting for its first use (RDMA) is not nvlink.
        let none_pending = inner.lock().lazy.as_ref().is_none_or(|l| l.pending() == 0);
        let mut all_direct = [u8::from(
            every_peer_direct && none_pending && inner.nranks > 1,
        )];
        self.all_reduce_in_place(&mut all_direct, ReduceOp::Min)?;
        let lane = if all_direct[0] == 1 {
            WindowCore::open_lane(&self.inner, b)?
        } else {
            None
        };
        let _ = self.lane.set(lane);
        Ok(())
    }

    /// Checks `op` now (nothing is queued and no sequence number is taken
    /// when it is rejected) and returns what builds its job in stream order.
    pub(crate) fn prepare_device(&self, op: DeviceOp) -> Result<crate::work::DeviceJobMaker> {
        let inner = &self.inner;
        let (rank, name) = (inner.rank, op.coll.name());
        let invalid = |detail: String| Error::InvalidArgument {
            rank,
            op: name,
            detail,
        };
        let attached = self.device.get().cloned().ok_or_else(|| {
            invalid(
                "no device is bound to this communicator (call Communicator::bind_device)".into(),
            )
        })?;
        let b = attached.binding.clone();
        op.config.check(rank, op.coll, true)?;
        // At enqueue: the kernel path's launches run over windows, which a
        // suspend keeps, so its turn alone would not refuse them.
        if inner.is_suspended() {
            return Err(inner.suspended_error(name));
        }
        let mut raw = RawOp::new(op.coll, op.dtype, op.count);
        raw.op = op.op;
        raw.root = op.root;
        raw.config = op.config;
        let (send_elems, recv_elems) = inner.validate_device(&mut raw)?;
        if op.coll == Collective::AllToAll {
            // The raw op carries no addresses: its buffers are checked here.
            let bytes = send_elems * op.dtype.size();
            inner.check_ranges_apart(op.coll, (op.send.0, bytes), (op.recv.0, bytes))?;
        }
        if (send_elems > 0 && op.send.0 == 0) || (recv_elems > 0 && op.recv.0 == 0) {
            return Err(invalid("a device buffer is NULL".into()));
        }
        let esize = op.dtype.size();
        for (what, ptr, elems) in [
            ("send buffer", op.send, send_elems),
            ("receive buffer", op.recv, recv_elems),
        ] {
            if elems > 0 {
                b.check_buffer((rank, name), what, ptr.0, elems * esize)?;
            }
        }
        if !b.peers_bound.load(Ordering::Acquire) {
            if b.dev.is_capturing(op.stream).unwrap_or(false) {
                return Err(invalid(
                    "the first device collective of a communicator sets its device links up \
                     (allocations, a barrier) and cannot be captured into a CUDA graph; call \
                     connect_device (or run one device collective) before capturing"
                        .into(),
                ));
            }
            self.join_once(&b)?;
        }
        // The lanes' direct kernels are an algorithm of their own: a call
        // that names its algorithm or chunk runs the schedule it asked for.
        if let Some(lane) = op.config.planned().then(|| self.lane_for(&op)).flatten() {
            if lane.0.ipc_events.is_some() && b.dev.is_capturing(op.stream).unwrap_or(false) {
                return Err(invalid(
                    "cannot capture this collective into a CUDA graph: ranks of different \
                     processes share a device without MPS, so its steps are ordered between \
                     the processes by IPC events, which a graph cannot hold (enable MPS, or run \
                     the ranks as threads of one process)"
                        .into(),
                ));
            }
            return Ok(self.prepare_lane(&b, op, lane));
        }
        self.queue_host_driven(attached, raw, (op.send, op.recv), op.stream)
    }

    /// Queues the checked `raw` on the host-driven path: an event recorded
    /// now on the caller's stream and, in the operation's turn, the
    /// caller's stream parked on the binding's flag until the progress
    /// thread has run it. A device failure from here on is not an argument
    /// error: the operation is queued anyway and fails on every rank (its
    /// peers must not wait for it until their deadline).
    pub(super) fn queue_host_driven(
        &self,
        attached: Arc<Attachment>,
        raw: RawOp,
        (send, recv): (DevicePtr, DevicePtr),
        stream: StreamHandle,
    ) -> Result<crate::work::DeviceJobMaker> {
        let inner = &self.inner;
        let (rank, name) = (inner.rank, raw.coll.name());
        let invalid = |detail: String| Error::InvalidArgument {
            rank,
            op: name,
            detail,
        };
        let b = attached.binding.clone();
        let mut enqueue_error = None;
        match b.dev.is_capturing(stream) {
            Ok(false) => {}
            Ok(true) => {
                return Err(invalid(format!(
                    "the caller's stream is being captured into a CUDA graph; under capture only \
                     the kernel path's collectives are supported (all-reduce, reduce-scatter and \
                     reduce of types of 2 or more bytes with sum, prod, max, min or avg, \
                     all-gather, broadcast, gather, scatter and all-to-all of any type; 2 to 8 \
                     ranks of one node, SNCL_DEVICE_LANE_BYTES not 0: it is {})",
                    inner.config.device.lane_bytes
                )))
            }
            Err(e) => {
                enqueue_error = Some(b.error(rank, name, None, "checking the caller's stream", e))
            }
        }
        // What the caller's stream holds now runs before the collective.
        let created = match enqueue_error {
            Some(_) => Ok(None),
            None => b.take_event().map(Some),
        };
        let event = match created {
            Ok(None) => None,
            Ok(Some(ev)) => match b.dev.record_event(ev, stream) {
                Ok(()) => Some(ev),
                Err(e) => {
                    // SAFETY: created just above, not recorded, not used again.
                    let _ = unsafe { b.dev.destroy_event(ev) };
                    enqueue_error =
                        Some(b.error(rank, name, None, "recording on the caller's stream", e));
                    None
                }
            },
            Err(e) => {
                enqueue_error = Some(b.error(rank, name, None, "creating an event", e));
                None
            }
        };
        Ok(Box::new(move |_ticket| {
            // Values follow the stream order (this runs under the ticket lock).
            let flag_value = b.take_flag_value();
            if enqueue_error.is_none() {
                // SAFETY: the flag is an aligned u32 at the start of the
                // binding's pinned allocation, which lives as long as the
                // communicator (and is released to u32::MAX before it goes).
                let r = unsafe { b.dev.stream_wait_u32(stream, b.flag_word(), flag_value) };
                if let Err(e) = r {
                    enqueue_error =
                        Some(b.error(rank, name, None, "making the caller's stream wait", e));
                }
            }
            JobKind::Device(Box::new(DeviceJob {
                attached,
                raw,
                send,
                recv,
                event,
                flag_value,
                enqueue_error,
            }))
        }))
    }

    /// Queues a collective on device memory; returns at once (where ranks
    /// of different processes share a device without MPS, once every peer
    /// has enqueued its part too: see `src/device/window/ipc_events.rs`).
    /// See the [`crate::device`] module for the stream semantics. Errors in the
    /// arguments (no bound device, a bad root, an unsupported dtype/op, a
    /// stream under capture) are returned now; device and peer failures
    /// through the handle (on every rank).
    ///
    /// # Safety
    /// `op.send` and `op.recv` are live device ranges of the bound device
    /// for the extents the counts give (NCCL's conventions), and stay so,
    /// unused by anything not ordered on `op.stream`, until the handle
    /// reports completion (also if it is dropped early).
    pub unsafe fn enqueue_device(&self, op: DeviceOp) -> Result<RawWork> {
        let make = self.prepare_device(op)?;
        Ok(RawWork::from_state(self.worker.submit_with(make)))
    }

    /// All-reduce of `count` elements on device memory (in place when
    /// `send == recv`).
    ///
    /// # Safety
    /// As [`Communicator::enqueue_device`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_reduce_device_raw(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: StreamHandle,
    ) -> Result<RawWork> {
        let mut d = DeviceOp::new(Collective::AllReduce, dtype, count, send, recv, stream);
        d.op = op;
        // SAFETY: forwarded from the caller.
        unsafe { self.enqueue_device(d) }
    }

    /// Reduce-scatter: `count` elements per rank's block (`send` holds
    /// size × count).
    ///
    /// # Safety
    /// As [`Communicator::enqueue_device`].
    pub unsafe fn reduce_scatter_device_raw(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: StreamHandle,
    ) -> Result<RawWork> {
        let mut d = DeviceOp::new(Collective::ReduceScatter, dtype, count, send, recv, stream);
        d.op = op;
        // SAFETY: forwarded from the caller.
        unsafe { self.enqueue_device(d) }
    }

    /// All-gather: `count` elements per rank (`recv` holds size × count).
    ///
    /// # Safety
    /// As [`Communicator::enqueue_device`].
    pub unsafe fn all_gather_device_raw(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        stream: StreamHandle,
    ) -> Result<RawWork> {
        let d = DeviceOp::new(Collective::AllGather, dtype, count, send, recv, stream);
        // SAFETY: forwarded from the caller.
        unsafe { self.enqueue_device(d) }
    }

    /// Broadcast of `count` elements from `root` (`send` is read on the
    /// root only).
    ///
    /// # Safety
    /// As [`Communicator::enqueue_device`].
    pub unsafe fn broadcast_device_raw(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: StreamHandle,
    ) -> Result<RawWork> {
        let mut d = DeviceOp::new(Collective::Broadcast, dtype, count, send, recv, stream);
        d.root = root;
        // SAFETY: forwarded from the caller.
        unsafe { self.enqueue_device(d) }
    }

    /// Reduce of `count` elements to `root` (`recv` is written on the root
    /// only).
    ///
    /// # Safety
    /// As [`Communicator::enqueue_device`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce_device_raw(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
        stream: StreamHandle,
    ) -> Result<RawWork> {
        let mut d = DeviceOp::new(Collective::Reduce, dtype, count, send, recv, stream);
        d.op = op;
        d.root = root;
        // SAFETY: forwarded from the caller.
        unsafe { self.enqueue_device(d) }
    }
}

/// The device forms before the one typed API, kept for one release:
/// `DeviceBuffer`s with a count and a stream (in place where `send` and
/// `recv` are one buffer).
impl<'scope> Scope<'scope, '_> {
    /// Views `count` elements of the old forms' buffers (an error, not a
    /// panic, where a buffer is shorter) and runs `coll` on them.
    #[allow(clippy::too_many_arguments)]
    fn old_device_form<T: Element>(
        &'scope self,
        coll: Collective,
        count: usize,
        (op, root): (ReduceOp, usize),
        send: &'scope DeviceBuffer,
        recv: &'scope DeviceBuffer,
        stream: StreamHandle,
    ) -> Result<Work<'scope>> {
        let inner = &self.comm.inner;
        let shape =
            comm_core::shape::OpShape::new(coll, T::DTYPE, count, inner.nranks).with_root(root);
        let (rank, esize) = (inner.rank, T::DTYPE.size());
        let view = |buf: &'scope DeviceBuffer, elems: usize, what: &str| {
            let whole = DeviceSliceMut::<T>::shared(buf, stream);
            let fits = elems.checked_mul(esize).is_some_and(|b| b <= buf.bytes());
            Prefix::new(whole, elems)
                .filter(|_| fits)
                .ok_or_else(|| Error::InvalidArgument {
                    rank,
                    op: coll.name(),
                    detail: format!(
                        "the {what} buffer has {} bytes, expected at least {elems} × {}",
                        buf.bytes(),
                        T::DTYPE.name()
                    ),
                })
        };
        let (se, re) = (shape.send_elems(rank), shape.recv_elems(rank));
        if send.ptr() == recv.ptr() {
            let buf = view(recv, se.max(re), "receive")?;
            return match coll {
                Collective::AllReduce => self.all_reduce_in_place(buf, op),
                Collective::Broadcast => self.broadcast(buf, root),
                Collective::Reduce => self.reduce_in_place(buf, op, root),
                _ => Err(Error::InvalidArgument {
                    rank,
                    op: coll.name(),
                    detail: "send and receive are the same buffer; in place needs the raw \
                             form's offsets"
                        .into(),
                }),
            };
        }
        let (s, r) = (view(send, se, "send")?, view(recv, re, "receive")?);
        match coll {
            Collective::AllReduce => self.all_reduce(s, r, op),
            Collective::ReduceScatter => self.reduce_scatter(s, r, op),
            Collective::AllGather => self.all_gather(s, r),
            Collective::Broadcast => self.broadcast_from(s, r, root),
            _ => self.reduce(s, r, op, root),
        }
    }

    /// All-reduce of `count` elements of `T` on device buffers.
    #[deprecated(note = "use Scope::all_reduce on DeviceSlice / DeviceSliceMut views")]
    pub fn all_reduce_device<T: Element>(
        &'scope self,
        send: &'scope DeviceBuffer,
        recv: &'scope DeviceBuffer,
        count: usize,
        op: ReduceOp,
        stream: StreamHandle,
    ) -> Result<Work<'scope>> {
        let how = (op, 0);
        self.old_device_form::<T>(Collective::AllReduce, count, how, send, recv, stream)
    }

    /// Reduce-scatter of `count` elements per rank on device buffers.
    #[deprecated(note = "use Scope::reduce_scatter on DeviceSlice / DeviceSliceMut views")]
    pub fn reduce_scatter_device<T: Element>(
        &'scope self,
        send: &'scope DeviceBuffer,
        recv: &'scope DeviceBuffer,
        count: usize,
        op: ReduceOp,
        stream: StreamHandle,
    ) -> Result<Work<'scope>> {
        let how = (op, 0);
        self.old_device_form::<T>(Collective::ReduceScatter, count, how, send, recv, stream)
    }

    /// All-gather of `count` elements per rank on device buffers.
    #[deprecated(note = "use Scope::all_gather on DeviceSlice / DeviceSliceMut views")]
    pub fn all_gather_device<T: Element>(
        &'scope self,
        send: &'scope DeviceBuffer,
        recv: &'scope DeviceBuffer,
        count: usize,
        stream: StreamHandle,
    ) -> Result<Work<'scope>> {
        let how = (ReduceOp::Sum, 0);
        self.old_device_form::<T>(Collective::AllGather, count, how, send, recv, stream)
    }

    /// Broadcast of `count` elements from `root` on device buffers.
    #[deprecated(note = "use Scope::broadcast_from on DeviceSlice / DeviceSliceMut views")]
    pub fn broadcast_device<T: Element>(
        &'scope self,
        send: &'scope DeviceBuffer,
        recv: &'scope DeviceBuffer,
        count: usize,
        root: usize,
        stream: StreamHandle,
    ) -> Result<Work<'scope>> {
        let how = (ReduceOp::Sum, root);
        self.old_device_form::<T>(Collective::Broadcast, count, how, send, recv, stream)
    }

    /// Reduce of `count` elements to `root` on device buffers.
    #[deprecated(note = "use Scope::reduce on DeviceSlice / DeviceSliceMut views")]
    #[allow(clippy::too_many_arguments)]
    pub fn reduce_device<T: Element>(
        &'scope self,
        send: &'scope DeviceBuffer,
        recv: &'scope DeviceBuffer,
        count: usize,
        op: ReduceOp,
        root: usize,
        stream: StreamHandle,
    ) -> Result<Work<'scope>> {
        let how = (op, root);
        self.old_device_form::<T>(Collective::Reduce, count, how, send, recv, stream)
    }
}
