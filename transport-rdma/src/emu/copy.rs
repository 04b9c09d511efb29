//! The emulated NIC's data movement: an RDMA WRITE's bytes from a local
//! registration into the peer's region, with the checks a NIC makes (lkey
//! and bounds locally, rkey, validity and bounds at the peer).

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use super::{shared::RemoteRegion, EmuVerbs, LocalMr, HEADER};
use crate::mem;
use crate::verbs::WcStatus;

/// Where the `len` bytes at `addr` of the local registration `lkey`
/// lie: `Some(Some((mapping, offset)))` in a region this device maps
/// (after its header, or at its dma-buf offset), `Some(None)` in a user
/// registration (read at `addr` itself), `None` where `lkey` does not
/// cover them (a local protection error).
pub(super) fn local_source(
    mrs: &HashMap<u32, LocalMr>,
    (addr, len, lkey): (u64, usize, u32),
) -> Option<Option<(&memmap2::MmapRaw, usize)>> {
    let m = mrs.get(&lkey).filter(|m| {
        addr >= m.mr.addr
            && (addr - m.mr.addr)
                .checked_add(len as u64)
                .is_some_and(|e| e <= m.mr.len as u64)
    })?;
    let at = (addr - m.mr.addr) as usize;
    Some(match (&m.dmabuf, &m.region) {
        (Some((map, start)), _) => Some((&**map, start + at)),
        (None, Some(r)) => Some((r.map(), HEADER + at)),
        (None, None) => None,
    })
}

impl EmuVerbs {
    /// Copies `len` bytes of the local region `lkey` at `laddr` to the
    /// peer's region `rkey` at `raddr`; the failure status otherwise.
    pub(super) fn copy(
        &mut self,
        gid: [u8; 16],
        (laddr, len, lkey): (u64, usize, u32),
        (raddr, rkey): (u64, u32),
    ) -> std::result::Result<(), WcStatus> {
        let src = local_source(&self.mrs, (laddr, len, lkey)).ok_or(WcStatus::LOC_PROT_ERR)?;
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
