//! Registrations of user buffers, so that a lent piece
//! ([`comm_core::transport::Outgoing::lent`]) is RDMA-written
//! straight from where it lies instead of being copied into the
//! transport's registered staging area first.
//!
//! Two kinds of registration, chosen per connection ([`ZeroCopy`]):
//! - **on demand** (ODP, where the device supports it; the emulated
//!   provider always does): nothing is pinned and the NIC follows the page
//!   tables, so a registration stays correct after the buffer is freed and
//!   the address reused. Registrations are cached across operations, in
//!   2 MiB-aligned windows, least recently used dropped beyond
//!   `SNCL_IB_REG_CACHE_MB`.
//! - **pinned** (`SNCL_IB_ZERO_COPY=1` on a device without ODP): a pinned
//!   registration would keep the old pages of a freed buffer, so it lives
//!   only while the pieces lent from it are in flight: every registration
//!   is dropped as soon as the connection has nothing lent
//!   ([`RegCache::idle`]), i.e. by the end of each step. Exact page
//!   ranges.
//!
//! Every registration is dropped when the connection is (the communicator
//! destroyed).

use crate::verbs::{Mr, Result, Verbs};

/// How a connection sends lent pieces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZeroCopy {
    /// Always through the staging area (one copy on the sender).
    Off,
    /// Registered on demand and cached across operations.
    OnDemand,
    /// Pinned for the duration of the step that lends the memory.
    Pinned,
}

impl ZeroCopy {
    /// The mode for a device: `setting` is `SNCL_IB_ZERO_COPY` (`None`:
    /// auto = on demand where the device supports it, else off).
    pub fn choose(setting: Option<bool>, dev: &mut dyn Verbs) -> ZeroCopy {
        match setting {
            Some(false) => ZeroCopy::Off,
            _ if dev.supports_on_demand() => ZeroCopy::OnDemand,
            Some(true) => ZeroCopy::Pinned,
            None => ZeroCopy::Off,
        }
    }
}

/// On-demand registrations cover aligned windows of this size, so that
/// the pieces of one buffer share one registration.
const WINDOW: u64 = 2 << 20;
const PAGE: u64 = 4096;

#[derive(Debug)]
struct Entry {
    mr: Mr,
    last_use: u64,
    /// On demand: the part of the registration asked to be prefetched
    /// since the connection was last idle (start, end).
    prefetched: Option<(u64, u64)>,
}

/// The registrations of one connection's device.
#[derive(Debug)]
pub(crate) struct RegCache {
    mode: ZeroCopy,
    entries: Vec<Entry>,
    registered: usize,
    limit: usize,
    clock: u64,
    /// Registrations made and dropped (for tests and logs).
    pub(crate) made: u64,
}

impl RegCache {
    /// A cache of `mode` keeping at most `limit` bytes registered on demand.
    pub(crate) fn new(mode: ZeroCopy, limit: usize) -> RegCache {
        RegCache {
            mode,
            entries: Vec::new(),
            registered: 0,
            limit,
            clock: 0,
            made: 0,
        }
    }

    pub(crate) fn mode(&self) -> ZeroCopy {
        self.mode
    }

    /// A registration covering `addr .. addr + len`, made if none does.
    ///
    /// # Safety
    /// The range is memory of this process that stays mapped until the
    /// work requests reading it have completed (see `Verbs::reg_user_mr`).
    pub(crate) unsafe fn lookup(
        &mut self,
        dev: &mut dyn Verbs,
        addr: u64,
        len: usize,
    ) -> Result<Mr> {
        self.clock += 1;
        let end = addr + len as u64;
        if let Some(i) = self
            .entries
            .iter()
            .position(|e| e.mr.addr <= addr && end <= e.mr.addr + e.mr.len as u64)
        {
            self.entries[i].last_use = self.clock;
            self.prefetch(dev, i, addr, end);
            return Ok(self.entries[i].mr);
        }
        let (on_demand, align) = match self.mode {
            ZeroCopy::OnDemand => (true, WINDOW),
            _ => (false, PAGE),
        };
        let start = addr / align * align;
        let stop = end.div_ceil(align) * align;
        // SAFETY: on demand, the NIC touches only pages a work request
        // reads (all inside the caller's range, which the caller keeps
        // mapped); pinned registrations cover exactly the caller's pages.
        let mr = unsafe { dev.reg_user_mr(start, (stop - start) as usize, on_demand)? };
        self.made += 1;
        self.registered += mr.len;
        self.entries.push(Entry {
            mr,
            last_use: self.clock,
            prefetched: None,
        });
        self.prefetch(dev, self.entries.len() - 1, addr, end);
        Ok(mr)
    }

    /// On demand: asks the NIC to translate the pages from `addr` to the
    /// end of entry `i`'s window before the WRITE reads them (issue 36,
    /// risk 8: an ODP page fault stalls the QP for about a millisecond;
    /// `ibv_advise_mr(3)` prefetch, asynchronous), once per window between
    /// two idle points, so a buffer sent in pieces costs one call per
    /// 2 MiB, and memory unmapped and mapped again since is fetched again
    /// at its next step. Advice only: a failure is logged, not fatal.
    fn prefetch(&mut self, dev: &mut dyn Verbs, i: usize, addr: u64, end: u64) {
        if self.mode != ZeroCopy::OnDemand {
            return;
        }
        let e = &mut self.entries[i];
        if e.prefetched.is_some_and(|(lo, hi)| lo <= addr && end <= hi) {
            return;
        }
        let stop = e.mr.addr + e.mr.len as u64;
        match dev.prefetch_on_demand(&e.mr, addr, (stop - addr) as usize) {
            Ok(_) => {
                e.prefetched = Some(match e.prefetched {
                    Some((lo, hi)) if lo <= stop && addr <= hi => (lo.min(addr), hi.max(stop)),
                    _ => (addr, stop),
                });
            }
            Err(err) => {
                tracing::debug!("rdma: prefetching a lent buffer's pages: {err}");
                e.prefetched = Some((addr, stop));
            }
        }
    }

    /// Sends lent pieces through the staging copy from now on (a
    /// registration failed); existing registrations are dropped by the
    /// next [`RegCache::idle`], once the writes reading them completed.
    pub(crate) fn disable(&mut self) {
        self.mode = ZeroCopy::Off;
    }

    /// Nothing lent is in flight: pinned registrations are dropped, on-demand
    /// ones trimmed to the limit (least recently used first); after
    /// [`RegCache::disable`], all of them.
    pub(crate) fn idle(&mut self, dev: &mut dyn Verbs) {
        match self.mode {
            ZeroCopy::Off => self.clear(dev),
            ZeroCopy::Pinned => self.clear(dev),
            ZeroCopy::OnDemand => {
                // Pages may be unmapped and mapped again before the next
                // step: its first use of each window prefetches again.
                self.entries.iter_mut().for_each(|e| e.prefetched = None);
                if self.registered <= self.limit {
                    return;
                }
                self.entries.sort_by_key(|e| std::cmp::Reverse(e.last_use));
                while self.registered > self.limit {
                    let Some(e) = self.entries.pop() else { break };
                    self.drop_entry(dev, e);
                }
            }
        }
    }

    /// Drops every registration (connection closing).
    pub(crate) fn clear(&mut self, dev: &mut dyn Verbs) {
        for e in std::mem::take(&mut self.entries) {
            self.drop_entry(dev, e);
        }
    }

    fn drop_entry(&mut self, dev: &mut dyn Verbs, e: Entry) {
        self.registered -= e.mr.len;
        if let Err(err) = dev.dereg_user_mr(&e.mr) {
            tracing::warn!("dropping a user-buffer registration: {err}");
        }
    }

    /// Bytes registered now.
    pub(crate) fn registered(&self) -> usize {
        self.registered
    }
}
