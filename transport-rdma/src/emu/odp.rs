//! Strict mode's on-demand paging (issue 36, risk 8). An on-demand (ODP)
//! registration pins nothing: the NIC asks the kernel for a page's
//! translation the first time a work request touches it ("the HCA requests
//! the latest translations from the OS when pages are not present", NVIDIA
//! MLNX_OFED manual, *On-Demand Paging*). That page fault stalls the queue
//! pair: on a requester it is resolved by the driver (mlx5's
//! `pagefault_single_data_segment`, drivers/infiniband/hw/mlx5/odp.c, which
//! maps the faulting WQE's whole data segment), and the stall is of the
//! order of a millisecond — NP-RDMA (Shen et al., arXiv:2310.11062)
//! measures ODP's faults about 500× slower than its own 3.5–5.7 µs, and
//! Fukuoka, Sato and Taura (IPSJ SIG-HPC 2020) trace them to packet loss
//! and timeouts. So a first pass over fresh memory sent zero-copy from
//! an ODP registration stalls once per work request, where the permissive
//! emulation (which reads user memory at the post) never does.
//!
//! `ibv_advise_mr(3)` with `IBV_ADVISE_MR_ADVICE_PREFETCH` "make\[s\] pages
//! present ... before the actual IO is conducted": modelled as mapping the
//! range at once (for memory the process has mapped, the kernel's prefetch
//! finishes long before a WRITE's turn). The advice applies to ODP
//! registrations only (odp.c refuses it on others with EINVAL).
//!
//! Not modelled: invalidation (a page unmapped or migrated is absent again
//! and faults on its next use).

use std::time::{Duration, Instant};

/// How long a queue pair stalls on a page fault of an ODP registration.
pub(super) const ODP_FAULT: Duration = Duration::from_millis(1);
const PAGE: u64 = 4096;

/// Which pages of an ODP registration the NIC has translated, and since
/// when (a fault's pages are there once it is resolved).
pub(super) struct OdpPages {
    base: u64,
    ready_at: Vec<Option<Instant>>,
}

/// What a DMA read of an ODP range finds.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum OdpAccess {
    /// Every page is translated: the read proceeds.
    Ready,
    /// A page was absent: a fault was raised now; the queue pair stalls.
    Faulted,
    /// A fault is being resolved: the queue pair still stalls.
    Resolving,
}

impl OdpPages {
    /// A registration of `len` bytes at `addr`: no page translated yet.
    pub(super) fn new(addr: u64, len: usize) -> OdpPages {
        let base = addr / PAGE * PAGE;
        let end = (addr + len as u64).div_ceil(PAGE) * PAGE;
        OdpPages {
            base,
            ready_at: vec![None; ((end - base) / PAGE) as usize],
        }
    }

    fn pages(&self, addr: u64, len: usize) -> std::ops::Range<usize> {
        let first = (addr.saturating_sub(self.base) / PAGE) as usize;
        let end = (addr + len as u64)
            .div_ceil(PAGE)
            .saturating_sub(self.base / PAGE) as usize;
        first.min(self.ready_at.len())..end.min(self.ready_at.len())
    }

    /// `ibv_advise_mr` prefetch: the pages of the range are translated now.
    pub(super) fn prefetch(&mut self, addr: u64, len: usize, now: Instant) {
        let r = self.pages(addr, len);
        for p in &mut self.ready_at[r] {
            match p {
                Some(t) if *t <= now => {}
                _ => *p = Some(now),
            }
        }
    }

    /// A DMA read of `len` bytes at `addr` at `now`, part of a work request
    /// whose data segment is `wqe` (address, length): a fault resolves the
    /// whole segment's absent pages after [`ODP_FAULT`].
    pub(super) fn access(
        &mut self,
        addr: u64,
        len: usize,
        wqe: (u64, usize),
        now: Instant,
    ) -> OdpAccess {
        let r = self.pages(addr, len);
        let pages = &self.ready_at[r];
        if pages.iter().all(|p| p.is_some_and(|t| t <= now)) {
            return OdpAccess::Ready;
        }
        if pages.iter().all(Option::is_some) {
            return OdpAccess::Resolving;
        }
        let r = self.pages(wqe.0, wqe.1);
        for p in &mut self.ready_at[r] {
            p.get_or_insert(now + ODP_FAULT);
        }
        OdpAccess::Faulted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_touch_faults_once_per_work_request_and_a_prefetch_avoids_it() {
        let t0 = Instant::now();
        let mut odp = OdpPages::new(0x10_0800, 3 * 4096);
        assert_eq!(odp.ready_at.len(), 4, "pages the range touches");
        let wqe = (0x10_0800, 3 * 4096);
        assert_eq!(odp.access(0x10_0800, 4096, wqe, t0), OdpAccess::Faulted);
        // The fault covers the work request's whole segment.
        assert_eq!(
            odp.access(0x10_2000, 100, wqe, t0 + ODP_FAULT / 2),
            OdpAccess::Resolving
        );
        assert_eq!(
            odp.access(0x10_2000, 100, wqe, t0 + ODP_FAULT),
            OdpAccess::Ready
        );

        let mut fetched = OdpPages::new(0x20_0000, 8192);
        fetched.prefetch(0x20_0000, 8192, t0);
        assert_eq!(
            fetched.access(0x20_0000, 8192, (0x20_0000, 8192), t0),
            OdpAccess::Ready
        );
    }
}
