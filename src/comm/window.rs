//! Windows: host memory that every rank of a one-node communicator maps, so
//! that an all-reduce over buffers in windows reads its peers' inputs where
//! they lie (one copy) instead of moving them through the slot FIFOs.
//!
//! A window is allocated collectively ([`Inner::alloc_window`]): each rank
//! creates a shared-memory region, publishes its name in the store, and maps
//! every same-node peer's. The first window also creates each rank's
//! control record (offer, reduced and done flags; see [`Word`]).
//!
//! Once a communicator has windows and all its ranks share one node, every
//! collective starts with an offer: each rank writes the op's fingerprint
//! and, when its buffers lie in a window, the window and offsets, then reads
//! every peer's offer for the same sequence number. All ranks read the same
//! offers, so they decide alike: an all-reduce whose buffers lie at the same
//! offsets of the same window on every rank runs directly
//! ([`Inner::run_direct`]); anything else takes the usual path (which also
//! reports mismatched collectives, as the fingerprints differ).
//!
//! The direct all-reduce (2.5 S of memory traffic per rank on 2 ranks,
//! against about 4.5 S through the FIFOs): rank r reduces slice r of every
//! rank's input, in rank order, into its output and raises its `reduced`
//! flag; it then copies each peer's reduced slice from the peer's output
//! and raises `done`; it returns once every peer is done (peers read its
//! input and output until then). Every rank computes one slice, so all
//! ranks' results are bit-identical.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use comm_core::wire::Collective;
use comm_core::{DataType, Error, ReduceOp, Result};
use sncl_runtime::exec::{self, OpContext};
use transport_shm::region::{region_name, Region};

use super::windows::{fingerprint_hash, Control, Direct, WindowShared, Windows, Word};
use super::{Inner, RawOp, State};

/// All-reduces smaller than this take the usual path: below it the slot
/// FIFO's pipelining wins over the flag round trips.
pub(crate) const DIRECT_MIN_BYTES: usize = 256 * 1024;

/// Bytes of a rank's control region (one record, a page).
const CONTROL_BYTES: usize = 4096;

/// Reduction chunk when the output overlaps the inputs (in place): the fold
/// goes through a cache-resident buffer of this size.
const CHUNK_BYTES: usize = 64 * 1024;

impl Inner {
    fn windows_lock(&self) -> std::sync::MutexGuard<'_, Windows> {
        self.windows.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes of shared memory this rank created for its windows: each live
    /// window's own region and its control record.
    pub(super) fn window_bytes(&self) -> u64 {
        let w = self.windows_lock();
        let windows: usize = w
            .live
            .iter()
            .filter_map(|l| l.upgrade())
            .map(|l| l.len())
            .sum();
        let control = w.control.as_ref().map_or(0, |c| c.own.len());
        (windows + control) as u64
    }

    /// Whether this communicator has windows (every operation then starts
    /// with an offer).
    pub(super) fn has_windows(&self) -> bool {
        self.windows_lock().control.is_some()
    }

    fn window_error(&self, detail: String) -> Error {
        self.invalid("alloc_window", detail)
    }

    /// Allocates window `bytes` long on every rank (collective: every rank
    /// calls it with the same length, in the same order as its other
    /// window allocations).
    pub(crate) fn alloc_window(&self, bytes: usize) -> Result<Arc<WindowShared>> {
        if bytes == 0 || bytes > isize::MAX as usize {
            return Err(self.window_error(format!(
                "a window needs 1 to {} bytes, not {bytes}",
                isize::MAX
            )));
        }
        // In stream order: operations enqueued before the allocation run
        // without it (as on every rank), later ones with it; the windows'
        // own lock is not held while peers are awaited.
        let ticket = self.ticket();
        self.order.wait_turn(ticket);
        if self.is_suspended() {
            self.order.finish();
            return Err(self.suspended_error("alloc_window"));
        }
        let result = self.alloc_window_in_turn(bytes);
        if let Err(e) = &result {
            // Ranks could now disagree on whether windows exist (one timed
            // out where another got through), and would wait on each
            // other's offers: the communicator is unusable, and its peers
            // are told at once.
            let mut st = self.lock();
            self.fail(&mut st, e);
        }
        self.order.finish();
        result
    }

    fn alloc_window_in_turn(&self, bytes: usize) -> Result<Arc<WindowShared>> {
        let (id, need_control) = {
            let mut w = self.windows_lock();
            w.next_id += 1;
            (w.next_id - 1, w.control.is_none())
        };
        let local: Vec<usize> = (0..self.nranks)
            .filter(|&p| p != self.rank && self.node_ids[p] == self.node_ids[self.rank])
            .collect();
        let (own, peers) = self.share_region(&format!("{id}"), id, bytes, &local)?;
        let control = if need_control {
            let (own, peers) = self.share_region("control", u64::MAX, CONTROL_BYTES, &local)?;
            Some(Arc::new(Control { own, peers }))
        } else {
            None
        };
        let shared = Arc::new(WindowShared { id, own, peers });
        let mut w = self.windows_lock();
        if control.is_some() {
            w.control = control;
            // Operations start with an offer from now on: the choices made
            // without windows (lanes) are made again.
            self.forced_epoch.fetch_add(1, Ordering::Release);
        }
        w.live.retain(|l| l.strong_count() > 0);
        w.live.push(Arc::downgrade(&shared));
        tracing::debug!(rank = self.rank, window = id, bytes, "window allocated");
        Ok(shared)
    }

    /// Creates this rank's region `bytes` long, publishes it under `key`,
    /// maps the `local` peers' and waits until they mapped this one (then
    /// the name is removed).
    fn share_region(
        &self,
        key: &str,
        name_id: u64,
        bytes: usize,
        local: &[usize],
    ) -> Result<(Region, Vec<Option<Region>>)> {
        let io = |context: String, source: std::io::Error| Error::Io {
            rank: self.rank,
            context,
            source,
        };
        let name = region_name(self.comm_id, name_id, self.rank)
            .map_err(|e| io("naming a window".into(), e))?;
        let own = Region::create(&name, bytes).map_err(|e| {
            io(
                format!("creating window region {name:?} of {bytes} bytes"),
                e,
            )
        })?;
        let mut peers: Vec<Option<Region>> = (0..self.nranks).map(|_| None).collect();
        if local.is_empty() {
            own.unlink();
            return Ok((own, peers));
        }
        let store = self.store.as_ref().ok_or_else(|| {
            self.window_error("this communicator has no store to share windows through".into())
        })?;
        let cid = self.comm_id;
        let timeout = self.config.timeout;
        let result = (|| {
            store.set(
                &format!("window/{cid:x}/{key}/{}", self.rank),
                name.as_bytes(),
            )?;
            for &p in local {
                let raw = store.get(&format!("window/{cid:x}/{key}/{p}"), timeout)?;
                let peer_name = String::from_utf8(raw)
                    .ok()
                    .filter(|n| transport_shm::check_name(n).is_ok())
                    .ok_or_else(|| {
                        self.window_error(format!("peer rank {p} published an invalid window name"))
                    })?;
                let region = Region::open(&peer_name, bytes).map_err(|e| {
                    if e.kind() == std::io::ErrorKind::InvalidData {
                        self.window_error(format!(
                            "peer rank {p}'s window {key} differs from this rank's {bytes} \
                             bytes (every rank must allocate the same length): {e}"
                        ))
                    } else {
                        io(format!("mapping peer rank {p}'s window {key}"), e)
                    }
                })?;
                peers[p] = Some(region);
            }
            store.set(&format!("window/{cid:x}/{key}/mapped/{}", self.rank), b"1")?;
            for &p in local {
                store.get(&format!("window/{cid:x}/{key}/mapped/{p}"), timeout)?;
            }
            Ok(())
        })();
        own.unlink();
        result.map(|()| (own, peers))
    }

    /// The live window holding `bytes` bytes at `ptr`, and the offset.
    fn locate(w: &Windows, ptr: *const u8, bytes: usize) -> Option<(Arc<WindowShared>, usize)> {
        let addr = ptr as usize;
        w.live.iter().filter_map(Weak::upgrade).find_map(|win| {
            let start = win.as_ptr() as usize;
            let off = addr.checked_sub(start)?;
            (off.checked_add(bytes)? <= win.len()).then_some((win, off))
        })
    }

    /// Exchanges offers for collective `op` (`ctx.seq`) when windows are in
    /// use, and decides whether it runs directly (the same decision on
    /// every rank). `Ok(None)`: the usual path.
    pub(super) fn window_decision(
        &self,
        st: &mut State,
        op: &RawOp,
        ctx: &OpContext,
    ) -> Result<Option<Direct>> {
        // Deterministic mode: the direct path folds in rank order, not in
        // the canonical tree; every rank has the same setting, so all skip.
        if self.nranks < 2 || self.topo.nnodes() != 1 || ctx.seq == 0 || self.config.deterministic {
            return Ok(None);
        }
        let (control, mine) = {
            let w = self.windows_lock();
            let Some(control) = w.control.clone() else {
                return Ok(None);
            };
            let bytes = op.count.saturating_mul(op.dtype.size());
            let mine = (op.coll == Collective::AllReduce && bytes > 0)
                .then(|| {
                    let (sw, so) = Self::locate(&w, op.send, bytes)?;
                    let (rw, ro) = Self::locate(&w, op.recv, bytes)?;
                    Some(Direct {
                        send_win: sw,
                        send_off: so,
                        recv_win: rw,
                        recv_off: ro,
                    })
                })
                .flatten();
            (control, mine)
        };
        let me = self.rank;
        let fp = fingerprint_hash(&ctx.fingerprint);
        let set = |w: Word, v: u64| control.word(me, me, w).store(v, Ordering::Relaxed);
        set(Word::Fingerprint, fp);
        match &mine {
            Some(d) => {
                set(Word::SendWindow, d.send_win.id + 1);
                set(Word::SendOffset, d.send_off as u64);
                set(Word::RecvWindow, d.recv_win.id + 1);
                set(Word::RecvOffset, d.recv_off as u64);
            }
            None => set(Word::SendWindow, 0),
        }
        control
            .word(me, me, Word::Offer)
            .store(ctx.seq, Ordering::Release);
        self.await_flag(st, ctx, &control, Word::Offer, "waiting for window offers")?;
        let Some(d) = mine else {
            return Ok(None);
        };
        let bytes = op.count * op.dtype.size();
        let agreed = (0..self.nranks).all(|r| {
            let get = |w: Word| control.word(r, me, w).load(Ordering::Relaxed);
            get(Word::Fingerprint) == fp
                && get(Word::SendWindow) == d.send_win.id + 1
                && get(Word::SendOffset) == d.send_off as u64
                && get(Word::RecvWindow) == d.recv_win.id + 1
                && get(Word::RecvOffset) == d.recv_off as u64
        });
        // Input and output either the same bytes (in place) or disjoint.
        let same_window = d.send_win.id == d.recv_win.id;
        let overlapping =
            same_window && d.send_off != d.recv_off && d.send_off.abs_diff(d.recv_off) < bytes;
        let direct = agreed
            && !overlapping
            && bytes >= DIRECT_MIN_BYTES
            && matches!(
                op.op,
                ReduceOp::Sum | ReduceOp::Prod | ReduceOp::Min | ReduceOp::Max | ReduceOp::Avg
            )
            && kernels::check_supported(op.dtype, op.op).is_ok()
            && (0..self.nranks)
                .all(|r| d.send_win.region(r, me).is_some() && d.recv_win.region(r, me).is_some());
        Ok(direct.then_some(d))
    }

    /// Publishes an offer without windows for collective `seq` that has
    /// nothing to exchange on this rank (its peers may have work and wait
    /// for every rank's offer); it does not wait for theirs.
    pub(super) fn offer_nothing(&self, seq: u64) {
        if self.nranks < 2 || self.topo.nnodes() != 1 || seq == 0 {
            return;
        }
        let Some(control) = self.windows_lock().control.clone() else {
            return;
        };
        let me = self.rank;
        control
            .word(me, me, Word::SendWindow)
            .store(0, Ordering::Relaxed);
        control
            .word(me, me, Word::Offer)
            .store(seq, Ordering::Release);
    }

    /// Waits until every peer's `word` reached this op's sequence number.
    fn await_flag(
        &self,
        st: &mut State,
        ctx: &OpContext,
        control: &Control,
        word: Word,
        doing: &str,
    ) -> Result<()> {
        let me = self.rank;
        let mut next = 0;
        exec::wait_on_ranks(ctx, &mut st.conns, Some(&self.abort_flag), doing, || {
            while next < self.nranks {
                if next != me && control.word(next, me, word).load(Ordering::Acquire) < ctx.seq {
                    return Some(next);
                }
                next += 1;
            }
            None
        })
    }

    /// Runs an all-reduce directly over window memory (see the module
    /// docs); `ctx.seq`'s offers agreed on `d`.
    pub(super) fn run_direct(
        &self,
        st: &mut State,
        op: &RawOp,
        ctx: &OpContext,
        d: &Direct,
    ) -> Result<()> {
        let control = self
            .windows_lock()
            .control
            .clone()
            .expect("offers agreed, so the control records exist");
        let (me, n) = (self.rank, self.nranks);
        let esize = op.dtype.size();
        let count = op.count;
        // Slices of whole cache lines (64 bytes) where the count allows.
        let align = (64 / esize).max(1);
        let per = count.div_ceil(n).div_ceil(align) * align;
        let slice = |j: usize| (j * per).min(count)..((j + 1) * per).min(count);
        let input = |r: usize| {
            d.send_win
                .region(r, me)
                .expect("agreed: every rank mapped")
                .as_ptr()
        };
        let output = |r: usize| {
            d.recv_win
                .region(r, me)
                .expect("agreed: every rank mapped")
                .as_ptr()
        };
        let mine = slice(me);
        let (lo, len) = (mine.start * esize, mine.len() * esize);
        // Phase 1: slice `me` of every rank's input, folded in rank order.
        let dtype = op.dtype;
        let reduce_op = if op.op == ReduceOp::Avg {
            ReduceOp::Sum
        } else {
            op.op
        };
        let in_place = d.send_win.id == d.recv_win.id && d.send_off == d.recv_off;
        let mut chunk = vec![0u8; if in_place { CHUNK_BYTES.min(len) } else { 0 }];
        let step = if in_place {
            chunk.len().max(1)
        } else {
            len.max(1)
        };
        let mut at = 0;
        while at < len {
            let m = step.min(len - at);
            // SAFETY: every rank's input slice lies in its window (offsets
            // agreed, `send_off + count × esize ≤ window length` checked by
            // `locate` on every rank for the same values); peers do not
            // write their inputs while the op runs (they lent them), and
            // this rank's output slice is written by this rank only.
            unsafe {
                let srcs = (0..n)
                    .map(|r| {
                        std::slice::from_raw_parts(
                            input(r).add(d.send_off + lo + at) as *const u8,
                            m,
                        )
                    })
                    .collect();
                let out = output(me).add(d.recv_off + lo + at);
                let tmp = if in_place {
                    Some(&mut chunk[..m])
                } else {
                    None
                };
                fold(dtype, reduce_op, srcs, out, m, tmp);
                if op.op == ReduceOp::Avg {
                    kernels::divide(dtype, std::slice::from_raw_parts_mut(out, m), n);
                }
            }
            at += m;
        }
        // This rank reads slice `me` of every peer's input and, below,
        // slice r of peer r's output; each peer reads as much from it.
        let others: usize = (0..n).filter(|&r| r != me).map(|r| slice(r).len()).sum();
        let moved = ((len * (n - 1)) + others * esize) as u64;
        st.window_bytes.0 += moved;
        st.window_bytes.1 += moved;
        control
            .word(me, me, Word::Reduced)
            .store(ctx.seq, Ordering::Release);
        // Phase 2: every peer's reduced slice, from its output.
        for k in 1..n {
            let j = (me + k) % n;
            self.await_one(
                st,
                ctx,
                &control,
                j,
                Word::Reduced,
                "waiting for a peer's reduced slice",
            )?;
            let s = slice(j);
            let (off, m) = (s.start * esize, s.len() * esize);
            // SAFETY: peer j's output slice j is final (its Reduced flag,
            // acquired above) and stays so until this rank's Done; this
            // rank's output slice j is written by this rank only, and peer
            // j finished reading this rank's input slice j (in place: the
            // same bytes) before raising Reduced.
            unsafe {
                let src = std::slice::from_raw_parts(output(j).add(d.recv_off + off), m);
                let dst = std::slice::from_raw_parts_mut(output(me).add(d.recv_off + off), m);
                kernels::copy(dst, src);
            }
        }
        control
            .word(me, me, Word::Done)
            .store(ctx.seq, Ordering::Release);
        // Peers read this rank's input and output until they are done.
        self.await_flag(
            st,
            ctx,
            &control,
            Word::Done,
            "waiting for peers to finish reading",
        )?;
        // A peer that gave up (timed out on this rank, or was aborted) after
        // raising its flags may have handed its buffers back to its caller
        // while this rank still copied from them: its abort reached the
        // connections before that, so check them once more.
        if self.abort_requested() {
            return Err(Error::Aborted {
                rank: me,
                reason: Some(format!("{} (seq {}) aborted", ctx.fingerprint, ctx.seq)),
            });
        }
        exec::check_peers(ctx, &mut st.conns, (0..n).filter(|&p| p != me))
    }

    fn await_one(
        &self,
        st: &mut State,
        ctx: &OpContext,
        control: &Control,
        peer: usize,
        word: Word,
        doing: &str,
    ) -> Result<()> {
        let me = self.rank;
        exec::wait_on_ranks(ctx, &mut st.conns, Some(&self.abort_flag), doing, || {
            (control.word(peer, me, word).load(Ordering::Acquire) < ctx.seq).then_some(peer)
        })
    }
}

/// `out[..m] = srcs[0] ∘ srcs[1] ∘ … ∘ srcs[n-1]` in rank order, through
/// `chunk` when `out` may alias the sources.
///
/// # Safety
/// `out` must be valid for `m` bytes of writes; with `chunk = None` it must
/// not overlap any source.
unsafe fn fold(
    dtype: DataType,
    op: ReduceOp,
    srcs: Vec<&[u8]>,
    out: *mut u8,
    m: usize,
    chunk: Option<&mut [u8]>,
) {
    match chunk {
        Some(tmp) => {
            kernels::reduce_into(dtype, op, tmp, srcs[0], srcs[1]);
            for s in &srcs[2..] {
                kernels::reduce_inplace(dtype, op, tmp, s);
            }
            drop(srcs);
            // SAFETY: the caller's: `out` valid for m bytes; the sources'
            // borrows ended above.
            let dst = unsafe { std::slice::from_raw_parts_mut(out, m) };
            kernels::copy(dst, tmp);
        }
        None => {
            // SAFETY: the caller's: `out` valid for m bytes, disjoint from
            // every source.
            let dst = unsafe { std::slice::from_raw_parts_mut(out, m) };
            kernels::reduce_into(dtype, op, dst, srcs[0], srcs[1]);
            for s in &srcs[2..] {
                kernels::reduce_inplace(dtype, op, dst, s);
            }
        }
    }
}
