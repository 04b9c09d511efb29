//! Strict mode's rule on a WRITE's source: its bytes belong to the NIC
//! from `ibv_post_send` until the work completion is retrieved from the
//! CQ (ibv_post_send(3): "The buffers used by a WR can only be safely
//! reused after the WR is fully executed and a work completion has been
//! retrieved from the corresponding completion queue"). A real NIC reads
//! them by DMA at some time in between, so a sender that reuses a staging
//! slot or writes into a lent user buffer early sends whatever is there
//! then. The emulation copies at post time, which would hide that; strict
//! mode takes a CRC32C of the source at post and again when the
//! completion is polled, and a source that changed in between completes
//! its work request with an error (`IBV_WC_GENERAL_ERR`) and an ERROR log
//! naming the QP and the range, so the bug fails the test that hits it.

use std::collections::VecDeque;

use super::strict::Watched;
use super::EmuVerbs;
use crate::verbs::{SendWr, WcStatus, WorkCompletion};

impl EmuVerbs {
    /// The source's digest, or `None` where it is not in a local
    /// registration (the copy then reports the protection error).
    fn source_digest(&self, (addr, len, lkey): (u64, usize, u32)) -> Option<u32> {
        let ptr = match super::copy::local_source(&self.mrs, (addr, len, lkey))? {
            Some((map, off)) => map.as_ptr().wrapping_add(off),
            None => addr as *const u8,
        };
        // SAFETY: a live mapping of this device, or a user registration
        // read while its work request is outstanding (reg_user_mr's
        // contract), `len` bytes in bounds (checked above).
        Some(unsafe { crate::mem::digest_raw(ptr, len) })
    }

    /// Strict mode: remembers the source of a WRITE posted on `qpn`
    /// (`wr`: `None` for one that completes without reading it).
    pub(super) fn watch_source(&mut self, qpn: u32, wr: Option<&SendWr>) {
        if self.strict.is_none() {
            return;
        }
        let source = wr.filter(|w| w.local.1 > 0).and_then(|w| {
            let local = (w.local.0, w.local.1 as usize, w.local.2);
            self.source_digest(local).map(|d| (local, d))
        });
        self.watched
            .entry(qpn)
            .or_default()
            .push_back(Watched { source });
    }

    /// Strict mode: a send completion being retrieved, covering `covered`
    /// unsignalled work requests posted before it; fails it where the
    /// source of any of them, or its own, changed since it was posted (an
    /// unsignalled request's buffer is the NIC's until a later completion
    /// is polled).
    pub(super) fn check_source(&mut self, w: &mut WorkCompletion, covered: u32) {
        if self.strict.is_none() {
            return;
        }
        for k in (0..=covered).rev() {
            let Some(Watched { source }) = self
                .watched
                .get_mut(&w.qp_num)
                .and_then(VecDeque::pop_front)
            else {
                return;
            };
            let Some((local, digest)) = source else {
                continue;
            };
            if w.status == WcStatus::SUCCESS && self.source_digest(local) != Some(digest) {
                tracing::error!(
                    qpn = w.qp_num,
                    wr_id = w.wr_id,
                    "strict RDMA model: the source of a WRITE ({} bytes at {:#x}, lkey {:#x}{}) \
                     changed between ibv_post_send and the completion that covers it: a real \
                     NIC may have sent the new bytes",
                    local.1,
                    local.0,
                    local.2,
                    if k > 0 {
                        format!(", unsignalled, {k} before this completion")
                    } else {
                        String::new()
                    }
                );
                w.status = WcStatus::GENERAL_ERR;
            }
        }
    }
}
