//! Ordinary device all-reduces over device windows (nvlink version 2
//! reached from [`crate::Communicator::all_reduce_device_raw`], the typed
//! forms and the C ABI's `snclAllReduce`).
//!
//! Once a communicator has device windows (the first window's allocation
//! also shares a control record per rank, in host shared memory: all ranks
//! of a window are on one node), every queued device collective starts
//! with an offer, in its turn: each rank writes the operation's fingerprint
//! and, for an all-reduce whose input and output lie in live windows of
//! this communicator, the windows and offsets, then reads every peer's
//! offer of the same number. All ranks read the same offers, so they
//! decide alike: an all-reduce whose buffers lie at the same offsets of the
//! same windows on every rank (input and output the same bytes or
//! disjoint, offsets aligned to the element, a reduction the direct
//! kernels have) runs the direct kernel, one-shot or two-shot as
//! `comm_core::tune::choose_direct` says; anything else, on every rank,
//! takes version 1. A rank whose buffer is not in a window offers nothing,
//! so every rank falls back; a rank that never offers is waited for with
//! the communicator's deadline, abort and liveness probes.
//!
//! Records have two slots, by the offer number's parity: a rank may write
//! offer k + 1 while a slower peer still reads offer k, but not offer k + 2
//! (that waits for every peer's offer k + 1, which each makes after
//! reading offer k).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use comm_core::wire::{Collective, Fingerprint};
use comm_core::{Error, Result};
use sncl_runtime::exec::{self, AbortFlag};
use transport_shm::region::Region;

use ::device::direct::DirectAlgo;
use ::device::DevicePtr;

use super::host_records::share_host_records;
use super::window::{
    auto_kind, fit_scratch, next_id, open_window, opening_fingerprint, DeviceWindow, DirectRun,
    WindowCore,
};
use crate::comm::{Inner, RawOp, State};
use crate::Communicator;
use sncl_runtime::device::binding::{Binding, DirectCounts};

/// Bytes of a rank's offer record (a page).
const RECORD_BYTES: usize = 4096;

/// The id the record regions are named with (host windows count from 0
/// and name their control records `u64::MAX`).
const REGION_ID: u64 = u64::MAX - 1;

/// Words of an offer slot: fingerprint hash, input window id + 1 (0: no
/// window), input offset, output window id + 1, output offset.
const SLOT_WORDS: usize = 5;

/// What a rank offers for one operation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Offer {
    fingerprint: u64,
    send_win: u64,
    send_off: u64,
    recv_win: u64,
    recv_off: u64,
}

impl Offer {
    fn words(self) -> [u64; SLOT_WORDS] {
        [
            self.fingerprint,
            self.send_win,
            self.send_off,
            self.recv_win,
            self.recv_off,
        ]
    }
}

/// Every rank's offer record: word 0 the latest offer number, then two
/// slots of [`SLOT_WORDS`].
pub(crate) struct Records {
    own: Region,
    peers: Vec<Option<Region>>,
}

impl Records {
    fn word(&self, r: usize, me: usize, i: usize) -> &AtomicU64 {
        let region = if r == me {
            &self.own
        } else {
            self.peers[r]
                .as_ref()
                .expect("every peer's record is mapped (windows need one node)")
        };
        debug_assert!(i < 1 + 2 * SLOT_WORDS);
        // SAFETY: the region is page-aligned and RECORD_BYTES long (more
        // than the 11 words used), so the word is aligned and in bounds;
        // the words are only accessed atomically, here and by the peers.
        unsafe { &*(region.as_ptr().add(i * 8) as *const AtomicU64) }
    }

    fn slot(number: u64, k: usize) -> usize {
        1 + (number % 2) as usize * SLOT_WORDS + k
    }
}

/// A communicator's live device windows (held weakly: dropping a window
/// removes it), its offer records, and how many offers it made.
#[derive(Default)]
pub(crate) struct Registry {
    records: Option<Arc<Records>>,
    live: Vec<Weak<WindowCore>>,
    offers: u64,
}

impl Registry {
    /// Whether this communicator ever opened a window (its offer records
    /// exist from then on, and every device collective offers): the same
    /// answer on every rank, since opening is collective and ordered.
    pub(crate) fn offers_windows(&self) -> bool {
        self.records.is_some()
    }

    /// Adds a window just made.
    pub(crate) fn add(&mut self, w: &Arc<WindowCore>) {
        self.live.retain(|l| l.strong_count() > 0);
        self.live.push(Arc::downgrade(w));
    }

    /// A live window whose buffer on this rank overlaps `bytes` bytes at
    /// `ptr`: (id, start, length).
    pub(crate) fn overlapping(
        &self,
        ptr: DevicePtr,
        bytes: usize,
    ) -> Option<(u64, DevicePtr, usize)> {
        let (lo, hi) = (ptr.0, ptr.0.saturating_add(bytes as u64));
        self.live.iter().filter_map(Weak::upgrade).find_map(|w| {
            let start = w.buffers[w.rank()];
            let end = start.0 + w.bytes as u64;
            (lo < end && start.0 < hi).then_some((w.id, start, w.bytes))
        })
    }

    /// The usable live window holding `bytes` bytes at `ptr`, and the
    /// offset.
    fn locate(&self, ptr: DevicePtr, bytes: usize) -> Option<(Arc<WindowCore>, usize)> {
        self.live.iter().filter_map(Weak::upgrade).find_map(|w| {
            let off = ptr.0.checked_sub(w.buffers[w.rank()].0)? as usize;
            let fits = off.checked_add(bytes)? <= w.bytes;
            (fits && !w.broken.load(Ordering::Acquire) && w.no_direct.is_none()).then_some((w, off))
        })
    }
}

/// A communicator's device attachment: its binding and the registry of
/// its live device windows and offer records (the progress thread reaches
/// both through the device jobs, which carry it).
pub(crate) struct Attachment {
    pub(crate) binding: Arc<Binding>,
    windows: Mutex<Registry>,
}

impl Attachment {
    pub(crate) fn new(binding: Arc<Binding>) -> Attachment {
        Attachment {
            binding,
            windows: Mutex::new(Registry::default()),
        }
    }

    pub(crate) fn registry(&self) -> MutexGuard<'_, Registry> {
        self.windows.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Shares this rank's offer record with its peers once (the first window's
/// allocation, in its turn, on every rank).
fn ensure_control(inner: &Inner, attached: &Attachment) -> Result<()> {
    if attached.registry().records.is_some() {
        return Ok(());
    }
    let (own, peers) = share_host_records(
        inner,
        (REGION_ID, RECORD_BYTES),
        ("offers", "device offer record"),
        "alloc_device_window",
    )?;
    attached.registry().records = Some(Arc::new(Records { own, peers }));
    Ok(())
}

/// The turn a queued device operation runs in, as the caller of
/// [`Inner::run_device_window`] knows it: the sequence number the
/// operation takes if it runs here, the waiters' spin and the abort flag.
pub(crate) type Turn<'a> = (u64, std::time::Duration, &'a AbortFlag);

impl Inner {
    /// Offers `job`'s buffers where this communicator has device windows
    /// and runs it directly when every rank's offer agrees (see the module
    /// docs). `None`: the usual path (also where no offer was due);
    /// `Some`: the operation ran here, or the offer failed (the caller
    /// fails the communicator then).
    pub(crate) fn run_device_window(
        &self,
        st: &mut State,
        (attached, op, (send, recv)): (&Attachment, &RawOp, (DevicePtr, DevicePtr)),
        fingerprint: Fingerprint,
        (seq, spin, abort): Turn<'_>,
    ) -> Option<Result<()>> {
        // Deterministic mode: the direct kernels fold in rank order, not in
        // the canonical tree; every rank has the same setting, so all skip.
        if self.config.deterministic {
            return None;
        }
        let bytes = op.count.saturating_mul(op.dtype.size());
        let (records, number, windows) = {
            let mut reg = attached.registry();
            let records = reg.records.clone()?;
            reg.offers += 1;
            let windows = (op.coll == Collective::AllReduce && bytes > 0)
                .then(|| Some((reg.locate(send, bytes)?, reg.locate(recv, bytes)?)))
                .flatten();
            (records, reg.offers, windows)
        };
        let mut mine = Offer {
            fingerprint: fingerprint.digest(),
            ..Offer::default()
        };
        if let Some(((sw, so), (rw, ro))) = &windows {
            mine.send_win = sw.id + 1;
            mine.send_off = *so as u64;
            mine.recv_win = rw.id + 1;
            mine.recv_off = *ro as u64;
        }
        let me = self.rank;
        for (k, v) in mine.words().into_iter().enumerate() {
            records
                .word(me, me, Records::slot(number, k))
                .store(v, Ordering::Relaxed);
        }
        records.word(me, me, 0).store(number, Ordering::Release);
        let ctx = self.op_context(seq, fingerprint, op.op, spin);
        let mut next = 0;
        let waited = exec::wait_on_ranks(
            &ctx,
            &mut st.conns,
            Some(abort),
            "waiting for device window offers",
            || {
                while next < self.nranks {
                    if next != me && records.word(next, me, 0).load(Ordering::Acquire) < number {
                        return Some(next);
                    }
                    next += 1;
                }
                None
            },
        );
        if let Err(e) = waited {
            return Some(Err(e));
        }
        let ((sw, so), (rw, ro)) = windows?;
        let agreed = (0..self.nranks).all(|r| {
            let theirs: Vec<u64> = (0..SLOT_WORDS)
                .map(|k| {
                    records
                        .word(r, me, Records::slot(number, k))
                        .load(Ordering::Relaxed)
                })
                .collect();
            theirs == mine.words()
        });
        let esize = op.dtype.size();
        // Input and output either the same bytes (in place) or disjoint.
        let in_place = sw.id == rw.id && so == ro;
        let overlapping = sw.id == rw.id && !in_place && so.abs_diff(ro) < bytes;
        let direct = agreed
            && !overlapping
            && so % esize == 0
            && ro % esize == 0
            && kernels::cuda::direct_kernel(op.dtype, op.op).is_some();
        tracing::trace!(
            rank = me,
            offer = number,
            direct,
            "device window offers read"
        );
        if !direct {
            return None;
        }
        let algo = fit_scratch(auto_kind(self, op.dtype, op.count), in_place, bytes)
            .unwrap_or(DirectAlgo::TwoShot);
        let run = DirectRun {
            send: (&sw, so),
            recv: (&rw, ro),
            algo,
            count: op.count,
            dtype: op.dtype,
            op: op.op,
            // `run_device` waited for the caller's stream before the offer.
            after: None,
            max_ctas: op.config.max_ctas,
        };
        Some(sw.run_direct(st, &ctx, abort, &run))
    }
}

impl Communicator {
    /// The direct (nvlink version 2) all-reduces this rank ran so far
    /// (zero without a bound device).
    pub fn direct_all_reduces(&self) -> DirectCounts {
        self.device
            .get()
            .map(|a| a.binding.direct_counts())
            .unwrap_or_default()
    }
}

impl Communicator {
    /// Allocates a device window of `bytes` bytes on every rank
    /// (collective: every rank calls it with the same size, in the same
    /// order). Needs a bound device, 2 to 8 ranks, all on one node, and a
    /// backend with IPC and the direct kernels.
    pub fn alloc_device_window(&self, bytes: usize) -> Result<DeviceWindow> {
        self.open_device_window("alloc_device_window", bytes, None)
    }

    /// Makes a window of the caller's device memory: `bytes` bytes at
    /// `ptr`, which must be the start of an allocation of the bound device
    /// that can be exported for IPC (`snclMemAlloc`'s, [`Device::alloc`]'s;
    /// NCCL's `ncclCommWindowRegister`). Collective, as
    /// [`Communicator::alloc_device_window`]; every rank registers the same
    /// size. A range that overlaps a live window of this communicator is
    /// refused before anything collective happens.
    ///
    /// # Safety
    /// `ptr .. ptr + bytes` is live device memory of the bound device, and
    /// stays so until the window is dropped or closed; peers read and write
    /// it during the all-reduces over it.
    ///
    /// [`Device::alloc`]: ::device::Device::alloc
    pub unsafe fn register_device_window(
        &self,
        ptr: DevicePtr,
        bytes: usize,
    ) -> Result<DeviceWindow> {
        if ptr.0 == 0 {
            return Err(Error::InvalidArgument {
                rank: self.inner.rank,
                op: "register_device_window",
                detail: "the buffer is NULL".into(),
            });
        }
        self.open_device_window("register_device_window", bytes, Some(ptr))
    }

    fn open_device_window(
        &self,
        op: &'static str,
        bytes: usize,
        lent: Option<DevicePtr>,
    ) -> Result<DeviceWindow> {
        let inner = &self.inner;
        let bad = |detail: String| Error::InvalidArgument {
            rank: inner.rank,
            op,
            detail,
        };
        let attached = self
            .device
            .get()
            .cloned()
            .ok_or_else(|| bad("no device is bound (call bind_device first)".into()))?;
        let binding = &attached.binding;
        let n = inner.nranks;
        if !(2..=kernels::cuda::DIRECT_MAX_RANKS).contains(&n) || inner.topo.nnodes() != 1 {
            return Err(bad(format!(
                "device windows need 2 to {} ranks on one node; this communicator has {n} \
                 ranks on {} nodes",
                kernels::cuda::DIRECT_MAX_RANKS,
                inner.topo.nnodes()
            )));
        }
        if bytes == 0 || bytes > isize::MAX as usize {
            return Err(bad(format!("a window needs 1 or more bytes, not {bytes}")));
        }
        if let Some(ptr) = lent {
            if let Some((id, start, len)) = attached.registry().overlapping(ptr, bytes) {
                return Err(bad(format!(
                    "{bytes} bytes at {ptr:?} overlap window {id} ({len} bytes at {start:?}); \
                     windows of a communicator do not overlap"
                )));
            }
        }
        let id = next_id(inner.comm_id, inner.rank);
        let core = inner.run_in_turn(opening_fingerprint(bytes), |_, _, _| {
            let core = open_window(
                inner,
                binding,
                (id, op),
                (bytes, ::device::direct::FLAG_BYTES),
                lent,
            )?;
            ensure_control(inner, &attached)?;
            Ok(Arc::new(core))
        })?;
        attached.registry().add(&core);
        Ok(DeviceWindow { core })
    }
}
