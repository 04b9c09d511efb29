//! Device memory registered with the emulated NIC (GPUDirect RDMA): the
//! dma-buf route (`ibv_reg_dmabuf_mr`) and the nvidia-peermem route
//! (`ibv_reg_mr` on a device pointer), both mapping the emulated device
//! allocation's shared-memory file as a NIC maps the GPU's pages; the
//! test switches that stand for a verbs library without the dma-buf call
//! and for a kernel with the peermem module live in the parent module.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use device::{Device, DevicePtr};

use super::shared::LocalRegion;
use super::{call_err, EmuVerbs, LocalMr, PEERMEM};
use crate::ibv::attr::Registration;
use crate::verbs::{Mr, Result, Verbs};

/// Where peers find an emulated dma-buf's pages: the name of an emulated
/// device allocation's file in `/dev/shm`, or, for the strict CUDA model's
/// allocations (memfds), `/proc/PID/fd/N` of `file`, which the
/// registration keeps open while it lives.
fn dmabuf_backing(file: &std::fs::File) -> std::result::Result<String, String> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .map_err(|e| format!("finding the dma-buf's file: {e}"))?;
    match (link.parent(), link.file_name().and_then(|n| n.to_str())) {
        (Some(dir), Some(name)) if dir == std::path::Path::new("/dev/shm") => Ok(name.to_string()),
        _ if super::shared::is_memfd(&link) => Ok(format!("/proc/{}/fd/{fd}", std::process::id())),
        _ => Err(format!(
            "the dma-buf is {} (the emulated NIC maps only emulated device memory, files in \
             /dev/shm, and the CUDA model's, memfds; a freed allocation's file is gone)",
            link.display()
        )),
    }
}

impl EmuVerbs {
    /// `ibv_reg_dmabuf_mr` (`Verbs::reg_dmabuf_mr`): refused where the
    /// emulated library lacks it or the kernel takes no dma-bufs.
    pub(super) fn reg_dmabuf(
        &mut self,
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
    ) -> Result<Mr> {
        let op = "ibv_reg_dmabuf_mr";
        self.check_registration(op, Registration::DmaBuf)?;
        if self.dmabuf_refused {
            return Err(call_err(
                op,
                "Operation not supported (EOPNOTSUPP): the kernel or the NIC's driver takes no \
                 dma-bufs (Linux 5.12 or newer and a driver with dma-buf support, e.g. mlx5)"
                    .into(),
            ));
        }
        if !self.supports_dmabuf() {
            return Err(call_err(
                op,
                "this (emulated) verbs library has no ibv_reg_dmabuf_mr".into(),
            ));
        }
        if len == 0 || iova.checked_add(len as u64).is_none() {
            return Err(call_err(
                op,
                format!("{len} bytes at iova {iova:#x} is not a region"),
            ));
        }
        self.register_device_file(op, fd, offset, len, iova)
    }

    /// `ibv_reg_mr` on device memory: with the module loaded, the NIC
    /// reaches the allocation's pages (here: its file, as the dma-buf
    /// route maps it).
    pub(super) fn reg_peermem(&mut self, dev: &dyn Device, addr: u64, len: usize) -> Result<Mr> {
        let op = "ibv_reg_mr";
        if !PEERMEM.load(Ordering::Relaxed) {
            return Err(call_err(
                op,
                format!(
                    "{addr:#x} is not host memory and nvidia-peermem is not loaded (Bad address, \
                     EFAULT)"
                ),
            ));
        }
        self.check_registration(op, Registration::DmaBuf)?;
        if dev.is_managed(DevicePtr(addr)).unwrap_or(false) {
            return self.pin_host_pages_behind_managed(op, addr, len);
        }
        let d = dev
            .dmabuf_export(DevicePtr(addr), len)
            .map_err(|e| call_err(op, format!("reaching device memory at {addr:#x}: {e}")))?;
        let offset = d.offset + (addr - d.base.0);
        self.register_device_file(op, std::os::fd::AsFd::as_fd(&d.fd), offset, len, addr)
    }

    /// What `ibv_reg_mr` does with managed memory where nvidia-peermem is
    /// loaded: the module does not claim it (`nvidia_p2p_get_pages` takes
    /// no managed memory), so the core pins the host pages mapped at the
    /// address at that moment; the NIC then reads and writes those, not
    /// the data the device holds. Emulated as a registration of `len`
    /// fresh host pages at the device address: its WRITEs send zeros.
    fn pin_host_pages_behind_managed(
        &mut self,
        op: &'static str,
        addr: u64,
        len: usize,
    ) -> Result<Mr> {
        let (lkey, rkey) = self.take_keys();
        let region =
            LocalRegion::create(&self.port.gid, rkey, len.max(1)).map_err(|e| call_err(op, e))?;
        tracing::warn!(
            addr = format_args!("{addr:#x}"),
            len,
            "emulated NIC: {op} pinned the host pages behind managed memory (nvidia-peermem does \
             not take it); the NIC sees them, not the device's data"
        );
        let mr = Mr {
            addr,
            len,
            lkey,
            rkey,
        };
        self.mrs
            .insert(lkey, LocalMr::of_region(mr, region, None, 0));
        Ok(mr)
    }

    /// Registers `len` bytes from `offset` of the device allocation's file
    /// `fd`, addressed at `iova`.
    pub(super) fn register_device_file(
        &mut self,
        op: &'static str,
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
    ) -> Result<Mr> {
        // The emulated NIC maps the dma-buf's file, as a NIC maps its
        // pages; peers find it by the name in the descriptor.
        let file = std::fs::File::from(
            fd.try_clone_to_owned()
                .map_err(|e| call_err(op, format!("duplicating the dma-buf fd: {e}")))?,
        );
        let name = dmabuf_backing(&file).map_err(|d| call_err(op, d))?;
        let map = memmap2::MmapRaw::map_raw(&file)
            .map_err(|e| call_err(op, format!("mapping the dma-buf: {e}")))?;
        let start = usize::try_from(offset)
            .ok()
            .filter(|o| o.checked_add(len).is_some_and(|e| e <= map.len()))
            .ok_or_else(|| {
                call_err(
                    op,
                    format!(
                        "{len} bytes at offset {offset} run past the dma-buf's {} bytes",
                        map.len()
                    ),
                )
            })?;
        let (lkey, rkey) = self.take_keys();
        let desc =
            LocalRegion::create_dmabuf(&self.port.gid, rkey, (iova, len), (&name, offset), file)
                .map_err(|e| call_err(op, e))?;
        let mr = Mr {
            addr: iova,
            len,
            lkey,
            rkey,
        };
        self.mrs.insert(
            lkey,
            LocalMr::of_region(mr, desc, Some((Arc::new(map), start)), 0),
        );
        Ok(mr)
    }
}
