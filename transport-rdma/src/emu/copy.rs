//! The emulated NIC's data movement: an RDMA WRITE's bytes from a local
//! registration into the peer's region, with the checks a NIC makes (lkey
//! and bounds locally, rkey, validity and bounds at the peer).

use std::collections::hash_map::Entry;

use super::{shared::RemoteRegion, EmuVerbs, HEADER};
use crate::mem;
use crate::verbs::WcStatus;

impl EmuVerbs {
    /// Copies `len` bytes of the local region `lkey` at `laddr` to the
    /// peer's region `rkey` at `raddr`; the failure status otherwise.
    pub(super) fn copy(
        &mut self,
        gid: [u8; 16],
        (laddr, len, lkey): (u64, usize, u32),
        (raddr, rkey): (u64, u32),
    ) -> std::result::Result<(), WcStatus> {
        let src = self
            .mrs
            .get(&lkey)
            .filter(|m| {
                laddr >= m.mr.addr
                    && (laddr - m.mr.addr)
                        .checked_add(len as u64)
                        .is_some_and(|e| e <= m.mr.len as u64)
            })
            .ok_or(WcStatus::LOC_PROT_ERR)?;
        let at = (laddr - src.mr.addr) as usize;
        let src: Option<(&memmap2::MmapRaw, usize)> = match (&src.dmabuf, &src.region) {
            (Some((map, start)), _) => Some((&**map, start + at)),
            (None, Some(r)) => Some((&r.0.map, HEADER + at)),
            (None, None) => None,
        };
        let dst = match self.remote_mrs.entry((gid, rkey)) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                e.insert(RemoteRegion::open(&gid, rkey).ok_or(WcStatus::REM_ACCESS_ERR)?)
            }
        };
        let dst_off = dst.offset(raddr, len).ok_or(WcStatus::REM_ACCESS_ERR)?;
        match src {
            Some((map, src_off)) => mem::copy_between(map, src_off, &dst.map, dst_off, len),
            // SAFETY: a user registration, in bounds (checked above);
            // `reg_user_mr`'s contract keeps it mapped while work requests
            // reading it are outstanding, and this is one of them.
            None => unsafe { mem::copy_from_user(laddr, &dst.map, dst_off, len) },
        }
        Ok(())
    }
}
