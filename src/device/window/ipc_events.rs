//! The lane of ranks whose processes share a device without MPS: device
//! collectives ordered between the processes by IPC events, with no kernel
//! spinning on another process's kernel and no host thread between the
//! streams (the "order cross-process steps with IPC events").
//!
//! Without MPS a device runs the kernels of one process at a time (MPS
//! guide: "A kernel from one CUDA context cannot execute concurrently with
//! a kernel from another CUDA context"), so the lane's kernels, which spin
//! on their peers' flags, would wait for kernels that cannot start. Here
//! each rank instead owns two interprocess events (`cuEventCreate` with
//! `CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING`, opened by the peers
//! with `cuIpcOpenEventHandle`): "ready" (its lane buffer holds this
//! round's input) and "done" (it has read every lane buffer of this round).
//! A round of a collective, on the caller's stream:
//!
//! 1. wait for every rank's "done" of the previous round (nobody reads
//!    this rank's lane buffer any more);
//! 2. copy this round's share of the input into this rank's lane buffer
//!    (copy-engine copies: one piece, or one per rank for reduce-scatter,
//!    all-to-all and a scatter's root) and record "ready";
//! 3. wait for every peer's "ready";
//! 4. take this rank's result from the lane buffers where they lie: a fold
//!    in rank order (all-reduce, reduce-scatter, a reduce's root:
//!    `Device::reduce_copy`, one kernel that waits for nothing) or copies
//!    (all-gather, broadcast, all-to-all, gather, scatter);
//! 5. record "done".
//!
//! Every wait is a GPU-side dependency (`cuStreamWaitEvent`). What the host
//! orders is only the enqueueing: a wait for an event waits for the
//! event's latest record *issued before the wait* (driver API,
//! `cuStreamWaitEvent`), so a rank enqueues its wait for a peer's round-r
//! record only once the peer has issued it, and a rank records round r + 1
//! only once every peer has enqueued its wait for round r. The ranks
//! publish these steps as counters in a board record per rank in host
//! shared memory (and the call's fingerprint with "ready": a peer that
//! called another operation fails the call on both sides). The host waits
//! there are for the peers' enqueueing, never for the device, bounded by
//! the communicator's timeout, and they end at once where a peer's board
//! says its lane broke (its communicator failed or was aborted) or its
//! process is gone, naming it. So an enqueue returns once every peer has
//! enqueued its part too (not run it): one thread cannot drive several
//! ranks of such a communicator. An operation ends with a wait for every
//! rank's last "done", so that, as on the kernel path, its completion
//! means every peer has read this rank's lane buffer (which may then be
//! freed).
//!
//! The collectives are the lane's (`lane.rs`), with the same rounds (a lane
//! buffer's worth a round, a share per piece) and the same fold order, so
//! results equal the kernel path's where the fold rounds alike (f32 and
//! wider, integers; f16 and bf16 round after each step here). Nothing of
//! this captures into a CUDA graph: a capture is refused with an error
//! naming the reason.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ::device::direct::StagedCollective;
use ::device::{Device, DevicePtr, EventHandle, IpcHandle, StreamHandle};
use comm_core::wire::Fingerprint;
use comm_core::{DataType, Error, ReduceOp, Result};
use transport_shm::region::Region;

use crate::comm::Inner;
use crate::device::host_records::share_host_records;
use sncl_runtime::device::binding::Binding;
use sncl_runtime::device::errors::{describe, device_error};

/// Bytes of a rank's board record (a page).
const BOARD_BYTES: usize = 4096;

/// The id the board regions are named with (the offer records use
/// `u64::MAX - 1`).
const REGION_ID: u64 = u64::MAX - 2;

/// A rank's store record: its "ready" and "done" event handles, its
/// process token, the two events as its process addresses them (for
/// peers of the same process, which cannot open its handles) and its
/// process id (liveness). An empty record: the rank has no interprocess
/// events (its device has none, or making them failed).
const RECORD: usize = 64 + 64 + 8 + 8 + 8 + 8;

/// The words of a rank's board.
#[derive(Clone, Copy, Debug)]
enum Word {
    /// The last round whose "ready" this rank recorded.
    ReadyRecorded = 0,
    /// The last round of its peers' "ready" it enqueued waits for.
    ReadyAwaited = 1,
    /// The last round whose "done" this rank recorded.
    DoneRecorded = 2,
    /// The last round of every rank's "done" it enqueued waits for.
    DoneAwaited = 3,
    /// The fingerprint digest of the call of its last "ready".
    Fingerprint = 4,
    /// Not 0 once its lane broke (its communicator failed or was
    /// aborted): its peers stop waiting for it.
    Failed = 5,
}

/// What a lane operation needs of the lane window: the communicator, every
/// rank's lane buffer as this process addresses it, and the window's
/// "broken" flag (set when the communicator fails: host waits give up).
pub(crate) struct LaneOf<'a> {
    pub inner: &'a Inner,
    pub buffers: &'a [DevicePtr],
    pub broken: &'a AtomicBool,
}

/// The IPC-event lane of one communicator's lane window (see the module
/// docs).
pub(crate) struct IpcEventLane {
    events: LaneEvents,
    board: Region,
    peer_boards: Vec<Option<Region>>,
    /// Per rank: its process id where it is another process (0: this
    /// process), for the host waits' liveness checks.
    pids: Vec<u32>,
    /// The rounds this rank has run (every rank the same number).
    rounds: Mutex<u64>,
}

/// Every rank's ("ready", "done") events as this process addresses them.
struct LaneEvents {
    dev: Arc<dyn Device>,
    of_rank: Vec<(EventHandle, EventHandle)>,
    /// Per rank: the events were made or opened here (destroyed on drop);
    /// a same-process peer's are its own.
    ours: Vec<bool>,
}

impl Drop for LaneEvents {
    fn drop(&mut self) {
        for (r, &(ready, done)) in self.of_rank.iter().enumerate() {
            if !self.ours[r] {
                continue;
            }
            for e in [ready, done] {
                // SAFETY: made or opened here, destroyed once; work still
                // enqueued keeps what it needs (the driver releases an
                // event once its pending work completes).
                if let Err(err) = unsafe { self.dev.destroy_event(e) } {
                    tracing::warn!(error = %err, rank = r, "destroying an IPC event failed");
                }
            }
        }
    }
}

impl IpcEventLane {
    /// Makes and exports this rank's events, opens every peer's and
    /// shares the boards (collective: every rank of the lane window `id`
    /// calls it, in its turn). `None` on every rank where any rank's device
    /// has no interprocess events.
    pub(crate) fn open(
        inner: &Inner,
        binding: &Arc<Binding>,
        id: u64,
    ) -> Result<Option<IpcEventLane>> {
        let (me, n) = (inner.rank, inner.nranks);
        let dev = binding.dev.clone();
        let op = "device collective lane";
        let fail = |what: &str, e| device_error(me, &dev, (op, None), what, e);
        let mut lane = LaneEvents {
            dev: dev.clone(),
            of_rank: vec![(EventHandle(0), EventHandle(0)); n],
            ours: vec![false; n],
        };
        // From here `lane`'s Drop destroys what was made or opened.
        let mut record = Vec::new();
        match (dev.create_ipc_event(), dev.create_ipc_event()) {
            (Ok((ready, ready_h)), Ok((done, done_h))) => {
                lane.of_rank[me] = (ready, done);
                lane.ours[me] = true;
                record.extend_from_slice(&ready_h.0);
                record.extend_from_slice(&done_h.0);
                record.extend_from_slice(&transport_nvlink::process_token().to_le_bytes());
                record.extend_from_slice(&ready.0.to_le_bytes());
                record.extend_from_slice(&done.0.to_le_bytes());
                record.extend_from_slice(&u64::from(std::process::id()).to_le_bytes());
            }
            (a, b) => {
                for (e, _) in [a.as_ref().ok(), b.as_ref().ok()].into_iter().flatten() {
                    // SAFETY: made just now, used by nothing.
                    let _ = unsafe { dev.destroy_event(*e) };
                }
                // An empty record: every rank then stays host-driven.
                if let Err(e) = a.and(b) {
                    tracing::warn!(rank = me, error = %e, "no interprocess events");
                }
            }
        }
        let store = inner.store.as_ref().ok_or_else(|| Error::InvalidArgument {
            rank: me,
            op,
            detail: "this communicator has no store to exchange IPC events through".into(),
        })?;
        let key = |r: usize| format!("dwindow/{:x}/{id}/ipc-events/{r}", inner.comm_id);
        store.set(&key(me), &record)?;
        let mut records = vec![Vec::new(); n];
        for p in (0..n).filter(|&p| p != me) {
            records[p] = store.get(&key(p), inner.config.timeout)?;
        }
        records[me] = record;
        if let Some(p) = records.iter().position(|r| r.len() != RECORD) {
            tracing::info!(
                rank = me,
                "rank {p} has no interprocess events: no IPC-event lane"
            );
            return Ok(None);
        }
        let token = transport_nvlink::process_token();
        let mut pids = vec![0u32; n];
        let mut opened = Ok(());
        for p in (0..n).filter(|&p| p != me) {
            let raw = &records[p];
            let word = |at: usize| u64::from_le_bytes(raw[at..at + 8].try_into().expect("8 bytes"));
            if word(128) == token {
                lane.of_rank[p] = (EventHandle(word(136)), EventHandle(word(144)));
                continue;
            }
            pids[p] = u32::try_from(word(152)).unwrap_or(0);
            let open = |at: usize, what: &str| {
                let mut h = IpcHandle([0; 64]);
                h.0.copy_from_slice(&raw[at..at + 64]);
                dev.open_ipc_event(&h)
                    .map_err(|e| fail(&format!("opening peer rank {p}'s {what} event"), e))
            };
            match (open(0, "ready"), open(64, "done")) {
                (Ok(ready), Ok(done)) => {
                    lane.of_rank[p] = (ready, done);
                    lane.ours[p] = true;
                }
                (a, b) => {
                    for e in [a.as_ref().ok(), b.as_ref().ok()].into_iter().flatten() {
                        // SAFETY: opened just now, used by nothing.
                        let _ = unsafe { dev.destroy_event(*e) };
                    }
                    opened = a.and(b).map(|_| ());
                    break;
                }
            }
        }
        // Every rank learns whether every rank opened its peers' events,
        // so that all keep the lane or all stay host-driven.
        let verdict = |r: usize| format!("dwindow/{:x}/{id}/ipc-events-opened/{r}", inner.comm_id);
        store.set(&verdict(me), if opened.is_ok() { b"1" } else { b"0" })?;
        let mut all_opened = opened.is_ok();
        for p in (0..n).filter(|&p| p != me) {
            all_opened &= store.get(&verdict(p), inner.config.timeout)? == b"1";
        }
        if let Err(e) = opened {
            tracing::warn!(rank = me, error = %e, "no IPC-event lane");
        }
        if !all_opened {
            return Ok(None);
        }
        let (board, peer_boards) = share_host_records(
            inner,
            (REGION_ID, BOARD_BYTES),
            ("ipc-event-boards", "IPC-event board"),
            op,
        )?;
        Ok(Some(IpcEventLane {
            events: lane,
            board,
            peer_boards,
            pids,
            rounds: Mutex::new(0),
        }))
    }

    /// Tells the peers that this rank's lane broke (its communicator
    /// failed or was aborted): their host waits for it end at once.
    pub(crate) fn mark_failed(&self, me: usize) {
        self.word(me, me, Word::Failed).store(1, Ordering::Release);
    }

    /// A peer whose process is gone, or that marked its lane broken (then
    /// the processes are looked at first: a peer that broke because
    /// another one died is not the one to name). Processes are looked at
    /// where `check_processes` says so too.
    fn failed_peer(&self, me: usize, check_processes: bool) -> Option<(usize, &'static str)> {
        let peers = || (0..self.pids.len()).filter(move |&p| p != me);
        let broke = peers().find(|&p| self.word(p, me, Word::Failed).load(Ordering::Acquire) != 0);
        if broke.is_none() && !check_processes {
            return None;
        }
        let gone = peers().find(|&p| {
            let pid = self.pids[p];
            // SAFETY: signal 0 only checks that the process exists.
            pid != 0
                && unsafe { libc::kill(pid as libc::pid_t, 0) } != 0
                && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
        });
        gone.map(|p| (p, "is gone (its process exited)"))
            .or(broke.map(|p| (p, "failed or was aborted")))
    }

    fn word(&self, rank: usize, me: usize, w: Word) -> &AtomicU64 {
        let region = if rank == me {
            &self.board
        } else {
            self.peer_boards[rank]
                .as_ref()
                .expect("every peer's board is mapped")
        };
        // SAFETY: the region is page-aligned and BOARD_BYTES long (more
        // than the 6 words of `Word`), so the word is aligned and in bounds;
        // the words are only accessed atomically, here and by the peers.
        unsafe { &*(region.as_ptr().add(w as usize * 8) as *const AtomicU64) }
    }

    /// Waits until every peer's `w` is at least `round`, within
    /// `deadline`; an error names the peers still behind.
    fn await_peers(
        &self,
        (window, op): (&LaneOf<'_>, &'static str),
        w: Word,
        round: u64,
        deadline: Instant,
    ) -> Result<()> {
        let (me, n) = (window.inner.rank, window.inner.nranks);
        let behind = || -> Vec<usize> {
            (0..n)
                .filter(|&p| p != me && self.word(p, me, w).load(Ordering::Acquire) < round)
                .collect()
        };
        let stuck = |peers: String, detail: String| Error::Device {
            rank: me,
            op,
            seq: None,
            device: describe(&*self.events.dev),
            what: format!(
                "waiting for peer rank{peers} to enqueue round {round} ({w:?}) of the IPC-event \
                 lane"
            ),
            detail,
        };
        let mut spins = 0u32;
        loop {
            let late = behind();
            if late.is_empty() {
                return Ok(());
            }
            if let Some((p, why)) = self.failed_peer(me, spins % 1024 == 1023) {
                return Err(stuck(format!(" {p}"), format!("peer rank {p} {why}")));
            }
            if window.broken.load(Ordering::Acquire) || window.inner.abort_requested() {
                return Err(Error::Aborted {
                    rank: me,
                    reason: Some(format!(
                        "{op}: the communicator failed or was aborted while waiting for peer \
                         rank(s) {late:?} to enqueue their part"
                    )),
                });
            }
            if Instant::now() > deadline {
                let detail = format!(
                    "Timed out after {} ms (the communicator's timeout): the peers did not \
                     enqueue this operation (another one, or none)",
                    window.inner.config.timeout.as_millis()
                );
                return Err(stuck(format!("(s) {late:?}"), detail));
            }
            spins += 1;
            if spins < 1000 {
                std::hint::spin_loop();
            } else if spins < 2000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// Enqueues `staged` of `count` elements a piece from `source` to
    /// `result` (the buffers this rank uses: `WindowCore::enqueue_lane`
    /// picks them; in place allowed as NCCL allows it) on `stream`, in
    /// rounds of `chunk` elements a piece through `window`'s lane buffers
    /// (see the module docs); avg's divide is the caller's. `fingerprint`
    /// is the call's: a peer that publishes another digest fails the call
    /// here, naming it.
    ///
    /// # Safety
    /// `source` and `result` hold their extents of `dtype` until the work
    /// enqueued here completes on `stream`; `chunk` elements a piece fit a
    /// lane buffer (`WindowCore::lane_chunk`).
    pub(crate) unsafe fn enqueue(
        &self,
        window: &LaneOf<'_>,
        stream: StreamHandle,
        (staged, source, result): (StagedCollective, DevicePtr, DevicePtr),
        (count, dtype, op, chunk): (usize, DataType, ReduceOp, usize),
        call: &Fingerprint,
    ) -> Result<()> {
        let fingerprint = call.digest();
        let (me, n) = (window.inner.rank, window.inner.nranks);
        let name = staged.name();
        let dev = &self.events.dev;
        let fail = |what: &str, e| device_error(me, dev, (name, None), what, e);
        let deadline = Instant::now() + window.inner.config.timeout;
        let mut rounds = self.rounds.lock().unwrap_or_else(|e| e.into_inner());
        let size = dtype.size();
        // Byte offsets: element `e` of piece `q` of a caller's buffer, and
        // of piece `q` of rank `p`'s lane buffer.
        let at = |buf: DevicePtr, q: usize, e: usize| buf.add((q * count + e) * size);
        let lane = |p: usize, q: usize| window.buffers[p].add(q * chunk * size);
        let copy = |dst: DevicePtr, src: DevicePtr, len: usize, what: &str| {
            // SAFETY: `dst` and `src` lie in the caller's buffers (their
            // extents: the caller's contract) or in lane buffers (a piece
            // of `chunk` elements each: the caller's contract); see the
            // steps below for who else touches them.
            unsafe { dev.copy_d2d_async(dst, src, len * size, stream) }.map_err(|e| fail(what, e))
        };
        let mut off = 0;
        while off < count {
            let len = chunk.min(count - off);
            let round = *rounds + 1;
            // 1. Nobody reads this rank's lane buffer any more (this rank
            //    on another stream neither).
            if round > 1 {
                self.await_peers((window, name), Word::DoneRecorded, round - 1, deadline)?;
                for &(_, done) in &self.events.of_rank {
                    dev.stream_wait_event(stream, done)
                        .map_err(|e| fail("waiting for the ranks' previous round", e))?;
                }
                self.word(me, me, Word::DoneAwaited)
                    .store(round - 1, Ordering::Release);
            }
            // 2. This round's input into the lane buffer (copy-engine
            //    copies), then "ready", once every peer waits for the last
            //    one already.
            self.await_peers((window, name), Word::ReadyAwaited, round - 1, deadline)?;
            // A root-only input (broadcast, scatter) is the root's alone.
            let puts = staged.root().is_none_or(|root| root == me)
                || !matches!(
                    staged,
                    StagedCollective::Broadcast { .. } | StagedCollective::Scatter { .. }
                );
            let pieces = if staged.has_pieces() { n } else { 1 };
            for q in (0..pieces).filter(|_| puts) {
                copy(
                    lane(me, q),
                    at(source, q, off),
                    len,
                    "copying into the lane",
                )?;
            }
            dev.record_event(self.events.of_rank[me].0, stream)
                .map_err(|e| fail("recording the lane's ready event", e))?;
            self.word(me, me, Word::Fingerprint)
                .store(fingerprint, Ordering::Release);
            self.word(me, me, Word::ReadyRecorded)
                .store(round, Ordering::Release);
            // 3. Every peer's input is in its lane buffer.
            self.await_peers((window, name), Word::ReadyRecorded, round, deadline)?;
            for p in (0..n).filter(|&p| p != me) {
                if self.word(p, me, Word::Fingerprint).load(Ordering::Acquire) != fingerprint {
                    return Err(Error::InvalidArgument {
                        rank: me,
                        op: name,
                        detail: format!(
                            "the ranks called different operations: this rank called {call}, \
                             peer rank {p} another (its collective, type, op, count or root \
                             differs); the IPC-event lane stopped before writing a result"
                        ),
                    });
                }
                dev.stream_wait_event(stream, self.events.of_rank[p].0)
                    .map_err(|e| fail(&format!("waiting for peer rank {p}'s lane"), e))?;
            }
            self.word(me, me, Word::ReadyAwaited)
                .store(round, Ordering::Release);
            // 4. What this rank takes from the lane buffers: folds in rank
            //    order (`Device::reduce_copy`, one kernel that waits for
            //    nothing) or copies.
            let fold = |piece: usize, out: DevicePtr| {
                let lanes: Vec<DevicePtr> = (0..n).map(|p| lane(p, piece)).collect();
                // SAFETY: every lane buffer is a live allocation or open
                // mapping holding this round's `len` elements of the piece
                // (step 3); `out` lies in the caller's output (its extent:
                // the caller's contract), which is no lane buffer.
                unsafe { dev.reduce_copy(stream, dtype, op, &lanes, &[out], len) }
                    .map_err(|e| fail("folding the lanes", e))
            };
            let is_root = staged.root() == Some(me);
            let take = |p: usize, piece: usize, slot: usize| {
                copy(
                    at(result, slot, off),
                    lane(p, piece),
                    len,
                    "copying from the lanes",
                )
            };
            match staged {
                StagedCollective::AllReduce => fold(0, at(result, 0, off))?,
                StagedCollective::Reduce { .. } if is_root => fold(0, at(result, 0, off))?,
                StagedCollective::ReduceScatter => fold(me, at(result, 0, off))?,
                StagedCollective::AllGather => (0..n).try_for_each(|p| take(p, 0, p))?,
                StagedCollective::Gather { .. } if is_root => {
                    (0..n).try_for_each(|p| take(p, 0, p))?
                }
                StagedCollective::AllToAll => (0..n).try_for_each(|p| take(p, me, p))?,
                StagedCollective::Broadcast { root } => take(root, 0, 0)?,
                StagedCollective::Scatter { root } => take(root, me, 0)?,
                StagedCollective::Reduce { .. } | StagedCollective::Gather { .. } => {}
            }
            // 5. "done", once every peer waits for the last one already.
            self.await_peers((window, name), Word::DoneAwaited, round - 1, deadline)?;
            dev.record_event(self.events.of_rank[me].1, stream)
                .map_err(|e| fail("recording the lane's done event", e))?;
            self.word(me, me, Word::DoneRecorded)
                .store(round, Ordering::Release);
            *rounds = round;
            off += len;
        }
        // Every rank has read this rank's lane buffer before the operation
        // counts as done (as the kernel path's kernels end only then): the
        // buffer and the events outlive what reads or waits on them, also
        // when the communicator is destroyed next.
        let last = *rounds;
        self.await_peers((window, name), Word::DoneRecorded, last, deadline)?;
        for &(_, done) in &self.events.of_rank {
            dev.stream_wait_event(stream, done)
                .map_err(|e| fail("waiting for the ranks' last round", e))?;
        }
        self.word(me, me, Word::DoneAwaited)
            .store(last, Ordering::Release);
        Ok(())
    }
}
