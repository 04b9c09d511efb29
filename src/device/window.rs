//! Device windows (nvlink version 2): device memory that every rank of a
//! one-node communicator maps into its peers (CUDA IPC; the emulated
//! device's shared memory in CI), so an all-reduce over it runs as one
//! kernel per rank that reads the peers' buffers directly
//! (`kernels/cuda/sncl_direct.cu`): one-shot for small messages, two-shot
//! (reduce-scatter then all-gather through the peers' buffers) above the
//! planner's crossover (`comm_core::tune::choose_direct`), as TensorRT-LLM,
//! vLLM and PyTorch's symmetric memory do. Buffers that are not in windows
//! keep version 1 (copy-engine transfers into the peers' inboxes).
//!
//! A window is allocated collectively ([`Communicator::alloc_device_window`]):
//! each rank allocates the buffer and a flag area, exports both, publishes
//! the handles in the store, opens every peer's, and waits until every peer
//! opened its own. An all-reduce ([`DeviceWindow::all_reduce`]) takes its
//! turn in the communicator's stream order, launches the kernel on the
//! communicator's stream after the caller's stream's work, and waits for it
//! with the communicator's deadline, its abort and its liveness probes; on
//! a failure it sets the kernel's abort word (the kernel stops polling its
//! peers' flags), names the peer the kernel waited on, and aborts the
//! communicator so every peer fails fast. A window whose operation failed
//! refuses later ones (its epoch counters may be out of step).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use ::device::direct::DirectAlgo;
use ::device::direct::{self, DirectAllReduce, CONTROL_WORDS};
use comm_core::tune::{choose_direct, DirectKind};
use comm_core::wire::{Collective, Fingerprint};
use comm_core::{DataType, Error, ReduceOp, Result};
use sncl_runtime::exec;

use ::device::{DevicePtr, EventHandle, PinnedBuffer, StreamHandle};

use crate::comm::Inner;
use sncl_runtime::device::binding::Binding;
use sncl_runtime::device::errors::device_error;

/// A rank's store record: buffer handle, flag-area handle, window bytes,
/// process token, buffer address, flag-area address (the addresses are
/// used as they are by ranks of the same process: CUDA cannot open an IPC
/// handle its own process exported), a key of its device (a hash of the
/// PCI bus id) and whether that device runs kernels of several processes
/// at once (MPS), and how many direct-kernel blocks its device holds at
/// once.
const RECORD: usize = 64 + 64 + 8 + 8 + 8 + 8 + 8 + 8 + 8;

/// One-shot in place folds through a scratch buffer of this many bytes at
/// most (one-shot only pays off well below it).
const SCRATCH_BYTES: usize = 1 << 20;

/// How a window's all-reduce runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DirectChoice {
    /// The planner's choice by size (`comm_core::tune::choose_direct`).
    #[default]
    Auto,
    /// One-shot (tests and benchmarks).
    OneShot,
    /// Two-shot (tests and benchmarks).
    TwoShot,
}

/// Device memory of `bytes` bytes on every rank of a one-node
/// communicator, mapped by every peer (see the module docs). Write and read
/// it with device copies at [`DeviceWindow::ptr`]. Device all-reduces
/// ([`crate::Communicator::all_reduce_device_raw`], the typed forms) whose buffers
/// lie in windows at the same offsets on every rank run the direct kernel
/// too (`src/device/offer.rs`).
pub struct DeviceWindow {
    pub(crate) core: Arc<WindowCore>,
}

/// A window's state, shared with the communicator's registry of live
/// windows (which holds it weakly) and with operations running over it.
pub(crate) struct WindowCore {
    inner: Arc<Inner>,
    binding: Arc<Binding>,
    pub(crate) id: u64,
    pub(crate) bytes: usize,
    /// Every rank's buffer and flag area as this process addresses them.
    pub(crate) buffers: Vec<DevicePtr>,
    flags: Vec<DevicePtr>,
    scratch: Option<DevicePtr>,
    control: PinnedBuffer,
    /// "After the caller's stream" and "done" (created at allocation).
    events: Vec<EventHandle>,
    epoch: Mutex<u64>,
    pub(crate) broken: AtomicBool,
    /// This rank's buffer was allocated here (freed on drop), not lent by
    /// the caller ([`Communicator::register_device_window`]).
    owned: bool,
    /// Per rank: its buffer and flag area were opened from IPC handles
    /// (closed on drop); a peer of this process is addressed directly.
    imported: Vec<bool>,
    /// The kernel path only: the stream of the last lane operation and
    /// its completion event; the next one on another stream waits for that
    /// event, so lane operations run in issue order on any streams. (The
    /// event may have gone back to the binding's pool and been recorded
    /// again by a later operation, but only once the lane operation it
    /// marked had completed: waiting for the later record is still after
    /// it.)
    lane_last: Mutex<Option<(StreamHandle, EventHandle)>>,
    /// Why the direct kernels cannot run over this window (every rank
    /// decides alike from every rank's record): two ranks of different
    /// processes share a device without MPS, so a kernel would spin on a
    /// kernel that cannot start. `None`: they can.
    pub(crate) no_direct: Option<String>,
    /// The most blocks a direct kernel over this window launches: what
    /// every device holds at once over the ranks sharing it (every rank
    /// alike, from every rank's record), so that the kernels of ranks on
    /// one device are resident together.
    pub(crate) grid_cap: u32,
    /// The kernel path's lane where processes share a device without MPS:
    /// its collectives ordered between the processes by IPC events
    /// (`window/ipc_events.rs`) instead of the spinning kernels.
    pub(crate) ipc_events: Option<ipc_events::IpcEventLane>,
}

impl std::fmt::Debug for DeviceWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceWindow")
            .field("id", &self.core.id)
            .field("bytes", &self.core.bytes)
            .field("rank", &self.core.inner.rank)
            .finish()
    }
}

/// One direct all-reduce over windows: input and output window with the
/// offsets of the buffers in them (the same on every rank), the kernel,
/// and what it reduces.
pub(crate) struct DirectRun<'a> {
    pub send: (&'a WindowCore, usize),
    pub recv: (&'a WindowCore, usize),
    pub algo: DirectAlgo,
    pub count: usize,
    pub dtype: DataType,
    pub op: ReduceOp,
    /// The caller's stream to order after on the device (the explicit
    /// window API); `None` where the host already waited for it (queued
    /// device operations).
    pub after: Option<StreamHandle>,
    /// The call's cap on the kernel's blocks (`CollConfig::max_ctas`; 0:
    /// none).
    pub max_ctas: u32,
}

/// The most blocks a kernel of a call may run with: the launch's `limit`,
/// or the call's `max_ctas` (`CollConfig::max_ctas`, the same on every
/// rank) where that is set and lower.
pub(crate) fn blocks_limit(limit: u32, max_ctas: u32) -> u32 {
    match max_ctas {
        0 => limit,
        cap => limit.min(cap),
    }
}

/// Window ids per communicator and rank (the same sequence on every rank:
/// windows are allocated collectively; ranks may share a process).
pub(crate) fn next_id(comm_id: u64, rank: usize) -> u64 {
    static IDS: Mutex<Option<HashMap<(u64, usize), u64>>> = Mutex::new(None);
    let mut g = IDS.lock().unwrap_or_else(|e| e.into_inner());
    let n = g
        .get_or_insert_with(HashMap::new)
        .entry((comm_id, rank))
        .or_insert(0);
    *n += 1;
    *n
}

/// What opening a window of `bytes` takes its turn as (its failures name it).
pub(crate) fn opening_fingerprint(bytes: usize) -> Fingerprint {
    Fingerprint {
        collective: Collective::AllReduce,
        dtype: DataType::Uint8,
        op: ReduceOp::Sum,
        root: -1,
        count: bytes as u64,
        settings: 0,
    }
}

/// Allocates (or takes the lent buffer) `bytes` and a zeroed flag area of
/// `flag_bytes` (`device::direct::DirectAllReduce::flag_bytes`), exports,
/// publishes and opens (see the module docs).
pub(crate) fn open_window(
    inner: &Arc<Inner>,
    binding: &Arc<Binding>,
    (id, op): (u64, &'static str),
    (bytes, flag_bytes): (usize, usize),
    lent: Option<DevicePtr>,
) -> Result<WindowCore> {
    let (me, n) = (inner.rank, inner.nranks);
    let dev = &binding.dev;
    let fail = |what: &str, e| device_error(me, dev, (op, None), what, e);
    let control = PinnedBuffer::new(dev, CONTROL_WORDS * 4)
        .map_err(|e| fail("allocating the control block", e))?;
    // Pinned memory is not promised to be zero, and the lane's kernels
    // read the words from their first launch on.
    // SAFETY: the block is CONTROL_WORDS u32 words of ours that no kernel
    // uses yet.
    unsafe { std::ptr::write_bytes(control.as_ptr(), 0, CONTROL_WORDS * 4) };
    let mut w = WindowCore {
        inner: inner.clone(),
        binding: binding.clone(),
        id,
        bytes,
        buffers: vec![DevicePtr(0); n],
        flags: vec![DevicePtr(0); n],
        scratch: None,
        control,
        events: Vec::new(),
        epoch: Mutex::new(0),
        broken: AtomicBool::new(true),
        owned: lent.is_none(),
        imported: vec![false; n],
        no_direct: None,
        grid_cap: u32::MAX,
        lane_last: Mutex::new(None),
        ipc_events: None,
    };
    // From here `w`'s Drop frees whatever was made.
    for _ in 0..2 {
        let e = dev
            .create_event()
            .map_err(|e| fail("creating an event", e))?;
        w.events.push(e);
    }
    w.buffers[me] = match lent {
        Some(p) => p,
        None => dev
            .alloc(bytes)
            .map_err(|e| fail("allocating the window", e))?,
    };
    w.flags[me] = dev
        .alloc(flag_bytes)
        .map_err(|e| fail("allocating the flag area", e))?;
    let scratch = bytes.min(SCRATCH_BYTES);
    w.scratch = Some(
        dev.alloc(scratch)
            .map_err(|e| fail("allocating scratch", e))?,
    );
    // Flags start at 0 (epochs count from 1; LL lines carry flag 0): copy
    // zeros in.
    let zeros = PinnedBuffer::new(dev, flag_bytes).map_err(|e| fail("allocating zeros", e))?;
    // SAFETY: `zeros` is flag_bytes of pinned memory of ours that no
    // device work uses yet; it lives until the synchronize below, and the
    // flag area is a live flag_bytes allocation.
    unsafe { std::ptr::write_bytes(zeros.as_ptr(), 0, flag_bytes) };
    // SAFETY: as above.
    unsafe { dev.copy_h2d_async(w.flags[me], zeros.as_ptr(), flag_bytes, binding.stream) }
        .and_then(|()| {
            let deadline = Instant::now() + inner.config.timeout;
            dev.synchronize(binding.stream, deadline)
        })
        .map_err(|e| fail("zeroing the flag area", e))?;
    // Freed now, before this rank publishes: freeing synchronises the
    // device, and once every rank has published, a peer thread of this
    // process may already run a kernel that spins on this rank.
    drop(zeros);
    let mut handle = [0u8; RECORD];
    let buf_h = dev.ipc_export(w.buffers[me]).map_err(|e| {
        let what = if lent.is_some() {
            "exporting the registered buffer (it must be the start of an allocation)"
        } else {
            "exporting the window"
        };
        fail(what, e)
    })?;
    let flag_h = dev
        .ipc_export(w.flags[me])
        .map_err(|e| fail("exporting the flag area", e))?;
    handle[..64].copy_from_slice(&buf_h.0);
    handle[64..128].copy_from_slice(&flag_h.0);
    let token = transport_nvlink::process_token();
    handle[128..136].copy_from_slice(&(bytes as u64).to_le_bytes());
    handle[136..144].copy_from_slice(&token.to_le_bytes());
    handle[144..152].copy_from_slice(&w.buffers[me].0.to_le_bytes());
    handle[152..160].copy_from_slice(&w.flags[me].0.to_le_bytes());
    let device_key = device_key(&**dev);
    handle[160..168].copy_from_slice(&device_key.to_le_bytes());
    handle[168..176].copy_from_slice(&u64::from(dev.mps_enabled()).to_le_bytes());
    let holds = dev
        .direct_resident_blocks()
        .map_err(|e| fail("asking how many direct-kernel blocks the device holds", e))?
        .unwrap_or(u64::MAX);
    handle[176..184].copy_from_slice(&holds.to_le_bytes());
    let mut devices = vec![(device_key, holds); n];
    // (process, device, MPS) of every rank, for the direct-path verdict.
    let mut placement = vec![(token, device_key, dev.mps_enabled()); n];
    let store = inner.store.as_ref().ok_or_else(|| Error::InvalidArgument {
        rank: me,
        op,
        detail: "this communicator has no store to exchange IPC handles through".into(),
    })?;
    let key = |what: &str, r: usize| format!("dwindow/{:x}/{id}/{what}/{r}", inner.comm_id);
    let timeout = inner.config.timeout;
    store.set(&key("handles", me), &handle)?;
    for p in (0..n).filter(|&p| p != me) {
        let raw = store.get(&key("handles", p), timeout)?;
        let word = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&raw[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let theirs = (raw.len() == RECORD).then(|| word(128));
        if theirs != Some(bytes as u64) {
            return Err(Error::InvalidArgument {
                rank: me,
                op,
                detail: format!(
                    "peer rank {p} made window {id} with {} bytes, this rank with {bytes} \
                     (every rank must give the same size)",
                    theirs.map_or_else(|| "an unreadable record of".to_string(), |t| t.to_string())
                ),
            });
        }
        placement[p] = (word(136), word(160), word(168) != 0);
        devices[p] = (word(160), word(176));
        if word(136) == token && dev.backend() == ::device::Backend::Cuda {
            // A rank of this process: its addresses are valid here.
            w.buffers[p] = DevicePtr(word(144));
            w.flags[p] = DevicePtr(word(152));
            continue;
        }
        w.imported[p] = true;
        let mut h = ::device::IpcHandle([0; 64]);
        h.0.copy_from_slice(&raw[..64]);
        let open = |h: &::device::IpcHandle, what: &str| {
            dev.ipc_import(h)
                .map_err(|e| fail(&format!("opening peer rank {p}'s {what}"), e))
        };
        w.buffers[p] = open(&h, "window")?;
        h.0.copy_from_slice(&raw[64..128]);
        w.flags[p] = open(&h, "flag area")?;
    }
    w.no_direct = shared_without_mps(&placement, |a, b| inner.topo.same_node(a, b));
    let cap = direct_grid_cap(&devices, |a, b| inner.topo.same_node(a, b));
    w.grid_cap = u32::try_from(cap).unwrap_or(u32::MAX);
    if w.grid_cap == 0 && w.no_direct.is_none() {
        w.no_direct = Some(format!(
            "the device holds fewer direct-kernel blocks at once than ranks share it ({cap} each)"
        ));
    }
    if let Some(why) = &w.no_direct {
        tracing::info!(
            rank = me,
            window = id,
            "{why}: the direct kernels are off for this window"
        );
    }
    store.set(&key("opened", me), b"1")?;
    for p in (0..n).filter(|&p| p != me) {
        store.get(&key("opened", p), timeout)?;
    }
    w.broken.store(false, Ordering::Release);
    tracing::debug!(
        rank = me,
        window = id,
        bytes,
        lent = lent.is_some(),
        "device window made"
    );
    Ok(w)
}

impl DeviceWindow {
    /// This rank's buffer (device memory of [`DeviceWindow::len`] bytes).
    pub fn ptr(&self) -> DevicePtr {
        self.core.buffers[self.core.inner.rank]
    }

    /// Bytes in the window.
    pub fn len(&self) -> usize {
        self.core.bytes
    }

    /// Whether the window is empty (never: windows hold 1 byte or more).
    pub fn is_empty(&self) -> bool {
        self.core.bytes == 0
    }

    /// The window's id on its communicator (the same on every rank).
    pub fn id(&self) -> u64 {
        self.core.id
    }

    /// The direct kernel [`DeviceWindow::all_reduce`] runs for `count`
    /// elements of `dtype` with `choice` (before its one-shot-in-place
    /// scratch limit: above it, two-shot).
    pub fn kind_for(&self, dtype: DataType, count: usize, choice: DirectChoice) -> DirectAlgo {
        match choice {
            DirectChoice::OneShot => DirectAlgo::OneShot,
            DirectChoice::TwoShot => DirectAlgo::TwoShot,
            DirectChoice::Auto => auto_kind(&self.core.inner, dtype, count),
        }
    }

    /// Closes the window on every rank (collective, in stream order): no
    /// rank releases its buffer or its mappings before every rank has
    /// reached the close, so no peer still reads them. Dropping a window
    /// instead releases this rank's part at once.
    pub fn close(self) -> Result<()> {
        let core = &self.core;
        let inner = &core.inner;
        let fp = Fingerprint {
            collective: Collective::Barrier,
            dtype: DataType::Uint8,
            op: ReduceOp::Sum,
            root: -1,
            count: core.id,
            settings: 0,
        };
        inner.run_in_turn(fp, |_, _, _| {
            let store = inner.store.as_ref().ok_or_else(|| Error::InvalidArgument {
                rank: inner.rank,
                op: "close_device_window",
                detail: "this communicator has no store".into(),
            })?;
            let key = |r: usize| format!("dwindow/{:x}/{}/closed/{r}", inner.comm_id, core.id);
            store.set(&key(inner.rank), b"1")?;
            for p in (0..inner.nranks).filter(|&p| p != inner.rank) {
                store.get(&key(p), inner.config.timeout)?;
            }
            Ok(())
        })
    }

    /// All-reduces the first `count` elements of `dtype` of every rank's
    /// window, into `output`'s (another window of this communicator) or in
    /// place (`None`), with the direct kernel `choice` names (collective:
    /// every rank calls it with the same arguments). It runs after the work
    /// enqueued on `stream` so far and returns when the result is in
    /// place; a failure (a peer that died or never came, the deadline, the
    /// communicator's abort) is an error naming the peer, and aborts the
    /// communicator.
    pub fn all_reduce(
        &self,
        output: Option<&DeviceWindow>,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        choice: DirectChoice,
        stream: StreamHandle,
    ) -> Result<()> {
        let core = &*self.core;
        let inner = &core.inner;
        let me = inner.rank;
        let bad = |detail: String| Error::InvalidArgument {
            rank: me,
            op: "device window all_reduce",
            detail,
        };
        if inner.config.deterministic {
            // Every rank has the same setting: all refuse alike.
            return Err(bad(
                "this communicator is in deterministic mode (SNCL_DETERMINISTIC=1), and the \
                 direct kernels fold the ranks in rank order, not in the canonical tree; use \
                 the communicator's device all-reduce on the window's memory"
                    .into(),
            ));
        }
        let bytes = count
            .checked_mul(dtype.size())
            .filter(|&b| b <= core.bytes)
            .ok_or_else(|| {
                bad(format!(
                    "{count} {} elements do not fit window {}'s {} bytes",
                    dtype.name(),
                    core.id,
                    core.bytes
                ))
            })?;
        let out = output.map_or(core, |o| &*o.core);
        if !Arc::ptr_eq(&out.inner, inner) || bytes > out.bytes {
            return Err(bad(format!(
                "the output window {} must be of this communicator and hold {bytes} bytes",
                out.id
            )));
        }
        if let Some(w) = [core, out]
            .into_iter()
            .find(|w| w.broken.load(Ordering::Acquire))
        {
            return Err(bad(format!(
                "window {} is unusable after a failed operation",
                w.id
            )));
        }
        if let Some(why) = [core, out].into_iter().find_map(|w| w.no_direct.as_ref()) {
            return Err(bad(format!(
                "{why}: the direct kernels would spin on a kernel that cannot start (enable MPS, \
                 or use the device collectives, which do not spin)"
            )));
        }
        if kernels::cuda::direct_kernel(dtype, op).is_none() {
            return Err(bad(format!(
                "{} {}: the direct kernels reduce with sum, prod, max, min or avg",
                dtype.name(),
                op.name()
            )));
        }
        let in_place = out.id == core.id;
        let algo = match fit_scratch(self.kind_for(dtype, count, choice), in_place, bytes) {
            Some(a) => a,
            None if choice == DirectChoice::OneShot => {
                return Err(bad(format!(
                    "one-shot in place folds through {SCRATCH_BYTES} bytes of scratch; \
                     {bytes} bytes need two-shot"
                )))
            }
            None => DirectAlgo::TwoShot,
        };
        let fp = Fingerprint {
            collective: Collective::AllReduce,
            dtype,
            op,
            root: -1,
            count: count as u64,
            settings: 0,
        };
        if count == 0 {
            return Ok(());
        }
        let run = DirectRun {
            send: (core, 0),
            recv: (out, 0),
            algo,
            count,
            dtype,
            op,
            after: Some(stream),
            max_ctas: 0,
        };
        inner.run_in_turn(fp, |st, ctx, abort| core.run_direct(st, ctx, abort, &run))
    }
}

/// The planner's direct kernel for `count` elements of `dtype`.
pub(crate) fn auto_kind(inner: &Inner, dtype: DataType, count: usize) -> DirectAlgo {
    let bytes = count.saturating_mul(dtype.size());
    algo_of(choose_direct(bytes, inner.nranks, inner.device_shape.intra))
}

/// The kernel that runs the planner's `kind`.
pub(crate) fn algo_of(kind: DirectKind) -> DirectAlgo {
    match kind {
        DirectKind::OneShot => DirectAlgo::OneShot,
        DirectKind::TwoShot => DirectAlgo::TwoShot,
        DirectKind::LowLatency => DirectAlgo::LowLatency,
    }
}

/// `algo` where it fits the scratch (one-shot in place folds through
/// [`SCRATCH_BYTES`]); `None` where it does not.
pub(crate) fn fit_scratch(algo: DirectAlgo, in_place: bool, bytes: usize) -> Option<DirectAlgo> {
    (algo == DirectAlgo::TwoShot || !in_place || bytes <= SCRATCH_BYTES).then_some(algo)
}

impl WindowCore {
    /// This rank.
    pub(crate) fn rank(&self) -> usize {
        self.inner.rank
    }

    /// Runs `run` (whose input window is `self`) in its turn: launches the
    /// kernel on the communicator's stream and waits for it with the
    /// communicator's deadline, abort and liveness probes. A failure marks
    /// both windows unusable.
    pub(crate) fn run_direct(
        &self,
        st: &mut crate::comm::State,
        ctx: &exec::OpContext,
        abort: &exec::AbortFlag,
        run: &DirectRun<'_>,
    ) -> Result<()> {
        let r = self.launch_and_wait(st, ctx, abort, run);
        match &r {
            Ok(()) => self.binding.count_direct(run.algo),
            Err(_) => {
                self.broken.store(true, Ordering::Release);
                run.recv.0.broken.store(true, Ordering::Release);
            }
        }
        r
    }

    fn launch_and_wait(
        &self,
        st: &mut crate::comm::State,
        ctx: &exec::OpContext,
        abort: &exec::AbortFlag,
        run: &DirectRun<'_>,
    ) -> Result<()> {
        let (me, n) = (self.inner.rank, self.inner.nranks);
        let dev = &self.binding.dev;
        let ours = self.binding.stream;
        let seq = Some(ctx.seq);
        let fail = |what: &str, e| device_error(me, dev, ("all_reduce", seq), what, e);
        let (algo, count, dtype, op) = (run.algo, run.count, run.dtype, run.op);
        let ((input, in_off), (out, out_off)) = (run.send, run.recv);
        let epoch = {
            let mut e = self.epoch.lock().unwrap_or_else(|e| e.into_inner());
            *e += 1;
            *e
        };
        let words = self.control_words();
        for w in words {
            w.store(0, Ordering::Release);
        }
        let (after, done) = (self.events[0], self.events[1]);
        if let Some(stream) = run.after {
            dev.record_event(after, stream)
                .and_then(|()| dev.stream_wait_event(ours, after))
                .map_err(|e| fail("ordering after the caller's stream", e))?;
        }
        let inputs: Vec<DevicePtr> = input.buffers.iter().map(|p| p.add(in_off)).collect();
        let outputs: Vec<DevicePtr> = out.buffers.iter().map(|p| p.add(out_off)).collect();
        let in_place = input.id == out.id && in_off == out_off;
        let (block, max_blocks) = direct::launch_limits(dev.backend());
        let launch = DirectAllReduce {
            algo,
            dtype,
            op,
            count,
            rank: me,
            inputs: &inputs,
            outputs: &outputs,
            flags: &self.flags,
            // Only one-shot in place folds through it (it holds at most
            // SCRATCH_BYTES; checked by the callers).
            scratch: self
                .scratch
                .filter(|_| algo == DirectAlgo::OneShot && in_place),
            control: self.control.as_ptr() as *mut u32,
            epoch,
            grid: direct::grid(
                dtype,
                count,
                block,
                blocks_limit(max_blocks.min(self.grid_cap), run.max_ctas),
            ),
            staged: None,
        };
        // SAFETY: every buffer is a live allocation or open IPC mapping
        // holding `count` elements from its offset (checked against both
        // windows' sizes by the callers; the windows live as long as
        // `run`'s borrows, which outlive the wait below or the abort's
        // synchronize), the flag areas are FLAG_BYTES, scratch holds
        // SCRATCH_BYTES or the window (one-shot in place is refused above
        // that), the control block is CONTROL_WORDS pinned words. Every
        // rank runs the same epoch (collective calls, or agreed offers).
        unsafe { dev.direct_all_reduce(ours, &launch) }
            .map_err(|e| fail("launching the direct all-reduce", e))?;
        if op == ReduceOp::Avg {
            // SAFETY: the output holds `count` elements (checked).
            unsafe { dev.divide(ours, dtype, outputs[me], count, n) }
                .map_err(|e| fail("enqueueing avg's divide", e))?;
        }
        dev.record_event(done, ours)
            .map_err(|e| fail("recording completion", e))?;
        let doing = format!("direct all-reduce ({}, epoch {epoch})", algo.name());
        self.wait_kernel(st, ctx, abort, done, &doing)
    }

    /// Waits until `done` (recorded after a direct kernel) completes, with
    /// the communicator's deadline, abort and liveness probes, naming the
    /// peer the kernel waits on; at a failure, stops the kernel (its abort
    /// word) and fails.
    pub(crate) fn wait_kernel(
        &self,
        st: &mut crate::comm::State,
        ctx: &exec::OpContext,
        abort: &exec::AbortFlag,
        done: EventHandle,
        doing: &str,
    ) -> Result<()> {
        let (me, n) = (self.inner.rank, self.inner.nranks);
        let dev = &self.binding.dev;
        let fail = |what: &str, e| device_error(me, dev, ("all_reduce", Some(ctx.seq)), what, e);
        let words = self.control_words();
        let mut device_failed = None;
        let waited = exec::wait_on_ranks(ctx, &mut st.conns, Some(abort), doing, || {
            if words[3].load(Ordering::Acquire) != 0 {
                // A peer called another operation: stopped below, whatever
                // blocks of the launch still wait.
                return None;
            }
            match dev.event_done(done) {
                Ok(true) => None,
                Ok(false) => {
                    let p = words[1].load(Ordering::Acquire) as usize;
                    Some(if (1..=n).contains(&p) {
                        p - 1
                    } else {
                        (me + 1) % n
                    })
                }
                Err(e) => {
                    device_failed = Some(e);
                    None
                }
            }
        });
        if let Some(e) = device_failed {
            self.stop_kernel();
            return Err(fail("running the direct all-reduce", e));
        }
        if let Err(e) = waited {
            self.stop_kernel();
            return Err(e);
        }
        let differing = words[3].load(Ordering::Acquire) as usize;
        if differing != 0 {
            self.stop_kernel();
            return Err(self.lane_mismatch(ctx, differing - 1));
        }
        if words[2].load(Ordering::Acquire) != 0 {
            return Err(Error::InvalidArgument {
                rank: me,
                op: "all_reduce",
                detail: "the direct kernel stopped at an abort this rank did not set".into(),
            });
        }
        Ok(())
    }

    /// The control block's words (see `device::direct::CONTROL_WORDS`).
    fn control_words(&self) -> &[AtomicU32; CONTROL_WORDS] {
        // SAFETY: the pinned block is CONTROL_WORDS u32 words, aligned
        // (PinnedBuffer allocations are page-aligned), alive with `self`;
        // the kernel and the host only access it atomically / volatile.
        unsafe { &*(self.control.as_ptr() as *const [AtomicU32; CONTROL_WORDS]) }
    }

    /// Sets the abort word and waits (briefly) for the kernel to stop.
    fn stop_kernel(&self) {
        self.control_words()[0].store(1, Ordering::Release);
        let deadline = Instant::now() + Duration::from_secs(5);
        if let Err(e) = self.binding.dev.synchronize(self.binding.stream, deadline) {
            tracing::warn!(rank = self.inner.rank, window = self.id, error = %e,
                "the direct kernel did not stop after its abort");
        }
    }
}

impl Drop for WindowCore {
    fn drop(&mut self) {
        let dev = &self.binding.dev;
        let me = self.inner.rank;
        // A kernel still running (an abandoned operation) stops first.
        if !self.events.is_empty() {
            self.stop_kernel();
        }
        for (p, (&b, &f)) in self.buffers.iter().zip(&self.flags).enumerate() {
            if p != me && !self.imported[p] {
                // A rank of this process owns (and frees) its memory.
                continue;
            }
            // A lent buffer stays the caller's.
            let own_buffer = (p != me || self.owned).then_some(b);
            for ptr in own_buffer.into_iter().chain([f]).filter(|p| p.0 != 0) {
                // SAFETY: from alloc (own) or ipc_import (peers' of other
                // processes), released once here; the stream is
                // synchronised above.
                let r = unsafe {
                    if p == me {
                        dev.free(ptr)
                    } else {
                        dev.ipc_close(ptr)
                    }
                };
                if let Err(e) = r {
                    tracing::warn!(rank = me, peer = p, error = %e, "releasing a device window");
                }
            }
        }
        if let Some(s) = self.scratch {
            // SAFETY: from alloc, freed once, no work pending.
            let _ = unsafe { dev.free(s) };
        }
        for &e in &self.events {
            // SAFETY: created here, destroyed once.
            let _ = unsafe { dev.destroy_event(e) };
        }
    }
}

mod ipc_events;
mod lane;
mod placement;
use placement::{device_key, direct_grid_cap, shared_without_mps};

#[cfg(test)]
mod tests {
    use super::blocks_limit;

    #[test]
    fn a_calls_cap_lowers_the_launch_limit_and_never_raises_it() {
        assert_eq!(blocks_limit(32, 0), 32);
        assert_eq!(blocks_limit(32, 1), 1);
        assert_eq!(blocks_limit(32, 3), 3);
        assert_eq!(blocks_limit(4, 16), 4);
    }
}
