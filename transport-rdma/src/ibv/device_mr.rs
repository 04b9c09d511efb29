//! Device memory registered with the NIC (GPUDirect RDMA): through its
//! dma-buf (`ibv_reg_dmabuf_mr`, rdma-core 34+) or through nvidia-peermem
//! (`ibv_reg_mr` on the device pointer).

use super::{attr, errno, IbvVerbs, SONAME};
use crate::verbs::{Mr, Result};

impl IbvVerbs {
    /// `ibv_reg_mr` on a device pointer, which nvidia-peermem resolves
    /// (`Verbs::reg_peermem_mr`).
    pub(super) fn register_peermem(&mut self, addr: u64, len: usize) -> Result<Mr> {
        let access = attr::mr_access(attr::Registration::DmaBuf);
        // SAFETY: `pd` is this context's protection domain; `addr` is device
        // memory of this process, which nvidia-peermem pins through the
        // GPU driver (no host page is touched); the caller keeps it
        // allocated until the registration is dropped.
        let mr = unsafe { (self.lib.reg_mr)(self.pd, addr as *mut _, len, access) };
        if mr.is_null() {
            return Err(self.err(
                "ibv_reg_mr",
                format!(
                    "registering device memory {addr:#x}+{len} through nvidia-peermem failed: {}",
                    errno()
                ),
            ));
        }
        Ok(self.keep_user_registration(mr, addr, len))
    }

    /// `ibv_reg_dmabuf_mr` (`Verbs::reg_dmabuf_mr`), where libibverbs has it.
    pub(super) fn register_dmabuf(
        &mut self,
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
    ) -> Result<Mr> {
        use std::os::fd::AsRawFd;
        let Some(reg) = self.lib.reg_dmabuf_mr else {
            return Err(self.err(
                "ibv_reg_dmabuf_mr",
                format!(
                    "{} has no ibv_reg_dmabuf_mr (rdma-core 34 or newer has)",
                    SONAME
                ),
            ));
        };
        // SAFETY: `pd` is this context's protection domain; the dma-buf
        // fd is open for the call (the registration takes its own
        // reference to the memory).
        let mr = unsafe {
            reg(
                self.pd,
                offset,
                len,
                iova,
                fd.as_raw_fd(),
                attr::mr_access(attr::Registration::DmaBuf),
            )
        };
        if mr.is_null() {
            return Err(self.err(
                "ibv_reg_dmabuf_mr",
                format!(
                    "registering {len} bytes of device memory (dma-buf, iova {iova:#x}) failed: {} \
                     (GPUDirect RDMA needs a NIC driver with dma-buf support, e.g. mlx5, and \
                     Linux 5.12 or newer; SNCL_IB_GDR=0 stages device memory instead)",
                    errno()
                ),
            ));
        }
        Ok(self.keep_user_registration(mr, iova, len))
    }
}
