//! User memory registered with the emulated NIC (`ibv_reg_mr`): pinned
//! (strict mode notes the pages it holds, `stale_pages.rs`) or on demand
//! (`odp.rs`), and the on-demand prefetch (`ibv_advise_mr`).

use super::{call_err, odp, stale_pages, EmuVerbs, LocalMr};
use crate::ibv::attr::Registration;
use crate::verbs::{Mr, Result};

impl EmuVerbs {
    /// `ibv_reg_mr` of user memory (`Verbs::reg_user_mr`).
    ///
    /// # Safety
    /// As `Verbs::reg_user_mr`: the range is memory of this process that
    /// stays mapped while the registration is used.
    pub(super) unsafe fn register_user(
        &mut self,
        addr: u64,
        len: usize,
        on_demand: bool,
    ) -> Result<Mr> {
        self.check_registration("ibv_reg_mr", Registration::UserSource { on_demand })?;
        if len == 0 || addr.checked_add(len as u64).is_none() {
            return Err(call_err(
                "ibv_reg_mr",
                format!("{len} bytes at {addr:#x} is not a region"),
            ));
        }
        // The emulation reads user memory by its address; strict mode notes
        // the pages a pinned registration holds (`stale_pages.rs`).
        let pinned_pages = if on_demand || self.strict.is_none() {
            None
        } else {
            // SAFETY: this function's contract: the range is memory of this
            // process, mapped while the registration is used.
            unsafe { stale_pages::PinnedPages::pin(addr, len) }
        };
        let (key, _) = self.take_keys();
        let mr = Mr {
            addr,
            len,
            lkey: key,
            rkey: 0,
        };
        self.mrs.insert(
            key,
            LocalMr {
                region: None,
                dmabuf: None,
                mr,
                pinned: 0,
                on_demand,
                odp: (on_demand && self.strict.is_some()).then(|| odp::OdpPages::new(addr, len)),
                pinned_pages,
            },
        );
        Ok(mr)
    }

    /// `ibv_advise_mr` prefetch (`Verbs::prefetch_on_demand`).
    pub(super) fn prefetch(&mut self, mr: &Mr, addr: u64, len: usize) -> Result<bool> {
        let m = self
            .mrs
            .get_mut(&mr.lkey)
            .filter(|m| m.mr == *mr)
            .ok_or_else(|| {
                call_err(
                    "ibv_advise_mr",
                    format!("no registration with lkey {:#x}", mr.lkey),
                )
            })?;
        // drivers/infiniband/hw/mlx5/odp.c: prefetch of a registration that
        // is not on demand, or outside it, is EINVAL.
        if !m.on_demand || addr < mr.addr || addr + len as u64 > mr.addr + mr.len as u64 {
            return Err(call_err(
                "ibv_advise_mr",
                format!(
                    "EINVAL: prefetch of {len} bytes at {addr:#x} in {} registration of {} \
                     bytes at {:#x}",
                    if m.on_demand {
                        "the on-demand"
                    } else {
                        "a pinned"
                    },
                    mr.len,
                    mr.addr
                ),
            ));
        }
        if let Some(pages) = &mut m.odp {
            pages.prefetch(addr, len, std::time::Instant::now());
        }
        Ok(true)
    }
}
