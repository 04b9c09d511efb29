//! Registrations of device memory as the source of RDMA WRITEs
//! (GPUDirect RDMA): each allocation is registered once, through its
//! dma-buf ([`Device::dmabuf_export`], [`Verbs::reg_dmabuf_mr`]) or
//! nvidia-peermem ([`Verbs::reg_peermem_mr`]) ([`DeviceRoute`]), and cached, as
//! `regcache.rs` caches host memory. A cached registration is used only
//! while the allocation that holds the address is still the one
//! registered ([`Device::allocation_id`]): a freed and reallocated
//! address registers anew. An allocation that does not register is
//! remembered as such (the caller copies its pieces into registered
//! memory instead). Stale and surplus registrations go when no
//! write is in flight.

use std::collections::VecDeque;
use std::os::fd::AsFd;

use device::{Device, DevicePtr};

use crate::verbs::{Mr, Verbs};

/// How device memory registers with the NIC (GPUDirect RDMA).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DeviceRoute {
    /// Exported as a dma-buf ([`Device::dmabuf_export`]) and registered
    /// with `ibv_reg_dmabuf_mr`: the open GPU kernel modules, Linux 5.12+.
    DmaBuf,
    /// Registered with `ibv_reg_mr` on the device pointer, which the
    /// nvidia-peermem kernel module resolves: the older route, NCCL's
    /// default where it is loaded.
    PeerMem,
}

impl DeviceRoute {
    /// The route name in logs and errors.
    pub(crate) fn name(self) -> &'static str {
        match self {
            DeviceRoute::DmaBuf => "dma-buf",
            DeviceRoute::PeerMem => "nvidia-peermem",
        }
    }

    /// Registers `len` bytes of `dev`'s memory at `addr` (addressed at
    /// `addr` by work requests and peers).
    pub(crate) fn register(
        self,
        dev: &dyn Device,
        verbs: &mut dyn Verbs,
        addr: u64,
        len: usize,
    ) -> Result<Mr, String> {
        match self {
            DeviceRoute::DmaBuf => {
                let d = dev
                    .dmabuf_export(DevicePtr(addr), len)
                    .map_err(|e| format!("exporting device memory at {addr:#x} as dma-buf: {e}"))?;
                let offset = d.offset + (addr - d.base.0);
                verbs
                    .reg_dmabuf_mr(d.fd.as_fd(), offset, len, addr)
                    .map_err(|e| e.to_string())
            }
            // Never managed memory: nvidia-peermem does not take it, and
            // `ibv_reg_mr` would pin the host pages behind it at that
            // moment while its data migrates to the device (the dma-buf
            // route's export refuses it by itself).
            DeviceRoute::PeerMem => match dev.is_managed(DevicePtr(addr)) {
                Ok(true) => Err(format!(
                    "{addr:#x} is managed memory, which nvidia-peermem cannot register (its \
                     host pages would be pinned instead)"
                )),
                Ok(false) => verbs
                    .reg_peermem_mr(dev, addr, len)
                    .map_err(|e| e.to_string()),
                Err(e) => Err(format!("asking whether {addr:#x} is managed memory: {e}")),
            },
        }
    }
}

/// Registrations kept per connection (least recently used dropped first
/// when nothing is in flight).
const MAX_ENTRIES: usize = 64;

struct Entry {
    base: u64,
    len: usize,
    id: u64,
    mr: Mr,
    used: u64,
}

/// A connection's device-memory registrations.
#[derive(Default)]
pub(crate) struct DevRegs {
    entries: Vec<Entry>,
    /// Registrations no longer valid, dropped once nothing is in flight.
    stale: Vec<Mr>,
    /// Allocations that did not export or register, with why (the most
    /// recent [`MAX_ENTRIES`]): not tried again on every piece.
    refused: VecDeque<(u64, String)>,
    clock: u64,
    /// Registrations made so far (tests, diagnostics).
    pub made: u64,
}

impl DevRegs {
    /// The lkey that covers `addr .. addr + len` of `dev`'s memory,
    /// registering the allocation that holds it when needed.
    pub(crate) fn lookup(
        &mut self,
        (dev, route): (&dyn Device, DeviceRoute),
        verbs: &mut dyn Verbs,
        addr: u64,
        len: usize,
    ) -> Result<u32, String> {
        self.clock += 1;
        let id = dev
            .allocation_id(DevicePtr(addr))
            .map_err(|e| format!("finding the allocation of device address {addr:#x}: {e}"))?;
        let covers = |e: &Entry| {
            addr >= e.base
                && (addr - e.base)
                    .checked_add(len as u64)
                    .is_some_and(|end| end <= e.len as u64)
        };
        if let Some(i) = self.entries.iter().position(covers) {
            if self.entries[i].id == id {
                self.entries[i].used = self.clock;
                return Ok(self.entries[i].mr.lkey);
            }
            // The allocation was freed and the address used again.
            let old = self.entries.swap_remove(i);
            self.stale.push(old.mr);
        }
        let (base, bytes) = dev
            .allocation_range(addr)
            .map_err(|e| format!("finding the allocation of device address {addr:#x}: {e}"))?;
        let base = base.0;
        // A range across two allocations (a VMM reservation's physical
        // chunks): no one registration covers it (not remembered: other
        // ranges of the allocation may fit).
        if (addr - base)
            .checked_add(len as u64)
            .is_none_or(|end| end > bytes as u64)
        {
            return Err(format!(
                "{len} bytes at {addr:#x} run past the allocation that holds them \
                 ({base:#x}, {bytes} bytes)"
            ));
        }
        if let Some((_, why)) = self.refused.iter().find(|r| r.0 == id) {
            return Err(why.clone());
        }
        // The whole allocation, once.
        let registered = route.register(dev, verbs, base, bytes);
        let mr = match registered {
            Ok(r) => r,
            Err(why) => {
                if self.refused.len() == MAX_ENTRIES {
                    self.refused.pop_front();
                }
                self.refused.push_back((id, why.clone()));
                return Err(why);
            }
        };
        self.made += 1;
        self.entries.push(Entry {
            base,
            len: bytes,
            id,
            mr,
            used: self.clock,
        });
        Ok(mr.lkey)
    }

    /// Nothing is in flight: drops stale registrations and trims to
    /// [`MAX_ENTRIES`].
    pub(crate) fn idle(&mut self, verbs: &mut dyn Verbs) {
        for mr in self.stale.drain(..) {
            if let Err(e) = verbs.dereg_user_mr(&mr) {
                tracing::warn!("deregistering device memory failed: {e}");
            }
        }
        while self.entries.len() > MAX_ENTRIES {
            let (i, _) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.used)
                .expect("not empty");
            let e = self.entries.swap_remove(i);
            if let Err(err) = verbs.dereg_user_mr(&e.mr) {
                tracing::warn!("deregistering device memory failed: {err}");
            }
        }
    }

    /// Drops every registration (the connection goes away).
    pub(crate) fn clear(&mut self, verbs: &mut dyn Verbs) {
        self.stale.extend(self.entries.drain(..).map(|e| e.mr));
        self.idle(verbs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A piece inside an allocation registers the allocation once; a piece
    /// that runs past its allocation (as one across a VMM reservation's
    /// physical chunks does) is refused, so the caller bounces it, and
    /// not remembered: a later piece inside the allocation still registers.
    #[test]
    fn a_range_past_its_allocation_is_refused_not_remembered() {
        let dev = device::open(device::Backend::Emu, 0).expect("the emulated device");
        let mut verbs = crate::emu::EmuVerbs::open().expect("the emulated NIC");
        let buf = device::DeviceBuffer::new(&dev, 8192).expect("alloc");
        let base = buf.ptr().0;
        let mut regs = DevRegs::default();
        let route = (&*dev, DeviceRoute::DmaBuf);
        let e = regs
            .lookup(route, &mut verbs, base + 8000, 400)
            .expect_err("a range past its allocation");
        assert!(e.contains("run past the allocation"), "{e}");
        assert_eq!(regs.made, 0);
        regs.lookup(route, &mut verbs, base + 100, 400)
            .expect("a range inside it");
        regs.lookup(route, &mut verbs, base + 4000, 4192)
            .expect("another, to its end");
        assert_eq!(regs.made, 1, "one registration for the allocation");
        regs.clear(&mut verbs);
    }

    /// Managed memory is refused on the nvidia-peermem route (whose
    /// `ibv_reg_mr` would pin its host pages) and remembered as refused;
    /// device memory beside it registers.
    #[test]
    fn managed_memory_is_refused_on_the_peermem_route() {
        let dev = device::open(device::Backend::Emu, 0).expect("the emulated device");
        let mut verbs = crate::emu::EmuVerbs::open().expect("the emulated NIC");
        crate::emu::set_peermem_loaded(true);
        let managed = device::DeviceBuffer::new(&dev, 8192).expect("alloc");
        let plain = device::DeviceBuffer::new(&dev, 8192).expect("alloc");
        device::emu::mark_managed(managed.ptr()).expect("an emulated address");
        let mut regs = DevRegs::default();
        let route = (&*dev, DeviceRoute::PeerMem);
        for _ in 0..2 {
            let e = regs
                .lookup(route, &mut verbs, managed.ptr().0, 4096)
                .expect_err("managed memory");
            assert!(e.contains("managed memory"), "{e}");
        }
        assert_eq!(regs.refused.len(), 1, "refused once, then remembered");
        regs.lookup(route, &mut verbs, plain.ptr().0, 4096)
            .expect("device memory registers");
        assert_eq!(regs.made, 1);
        regs.clear(&mut verbs);
    }
}
