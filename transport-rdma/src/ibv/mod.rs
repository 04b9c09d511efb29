//! The real provider over libibverbs, loaded at run time (see
//! docs/RDMA.md). It is compiled and its layouts are checked at build time
//! everywhere, but its data path only runs on a machine with an RDMA
//! device: none of the project's machines has one, so it has never run in
//! CI (the emulated provider carries the transport's tests).

mod advise;
pub(crate) mod attr;
mod device_mr;
pub(crate) mod ffi;

use crate::sys::SYSFS_ROOT;
use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::OnceLock;

use crate::verbs::{
    AsyncEvent, LinkLayer, Mr, PortInfo, QpState, QpTransition, Result, SendWr, Verbs, VerbsError,
    WcOpcode, WcStatus, WorkCompletion,
};

pub use ffi::SONAME;

/// libibverbs, loaded once per process (`Err`: why it could not be).
fn lib() -> std::result::Result<&'static ffi::Lib, String> {
    static LIB: OnceLock<std::result::Result<ffi::Lib, String>> = OnceLock::new();
    LIB.get_or_init(|| {
        let lib = ffi::Lib::load()?;
        // Registrations must survive fork() (commbench --np, data-loader
        // workers): ibv_fork_init marks registered pages MADV_DONTFORK
        // (also set by RDMAV_FORK_SAFE=1; a no-op on kernels with
        // copy-on-fork for pinned pages).
        // SAFETY: called before any device is opened or memory registered.
        let rc = unsafe { (lib.fork_init)() };
        if rc != 0 {
            tracing::warn!(
                rc,
                "ibv_fork_init failed: forking after RDMA registration may corrupt registered buffers"
            );
        }
        Ok(lib)
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// A device port found by [`list_ports`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DevicePort {
    /// Device name.
    pub device: String,
    /// Port number.
    pub port: u8,
    /// Whether the port is ACTIVE.
    pub active: bool,
    /// Its link layer.
    pub link_layer: LinkLayer,
    /// InfiniBand: the subnet prefix (the upper 64 bits of GID 0).
    pub subnet_prefix: Option<u64>,
}

impl DevicePort {
    /// The port's fabric ([`crate::fabric::fabric_of`]).
    pub fn fabric(&self) -> String {
        crate::fabric::fabric_of(self.link_layer, self.subnet_prefix)
    }
}

/// Every device port libibverbs sees. `Err`: the library is missing (the
/// message names it and what to install).
pub fn list_ports() -> std::result::Result<Vec<DevicePort>, String> {
    let lib = lib().map_err(|e| {
        format!("{SONAME} could not be loaded ({e}); install libibverbs1 (rdma-core) and a provider (ibverbs-providers) to use RDMA")
    })?;
    let mut out = Vec::new();
    let mut n = 0;
    // SAFETY: ibv_get_device_list returns an array of `n` device pointers
    // (or null), freed below with ibv_free_device_list.
    let list = unsafe { (lib.get_device_list)(&mut n) };
    if list.is_null() {
        return Ok(out);
    }
    for i in 0..n.max(0) as usize {
        // SAFETY: `i < n`, the array is live until freed below.
        let dev = unsafe { *list.add(i) };
        // SAFETY: a device of the list; the name is a NUL-terminated string.
        let name = unsafe { CStr::from_ptr((lib.get_device_name)(dev)) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: opening a listed device; closed below.
        let ctx = unsafe { (lib.open_device)(dev) };
        if ctx.is_null() {
            continue;
        }
        for port in 1..=8u8 {
            let mut attr = [0u8; ffi::PORT_ATTR_BYTES];
            // SAFETY: `attr` is larger than any `struct ibv_port_attr`.
            if unsafe { (lib.query_port)(ctx, port, attr.as_mut_ptr()) } != 0 {
                break;
            }
            let link_layer = if attr[ffi::PORT_LINK_LAYER] == 2 {
                LinkLayer::Ethernet
            } else {
                LinkLayer::InfiniBand
            };
            let mut gid = ffi::Gid::default();
            // SAFETY: `ctx` is open; `gid` is a `union ibv_gid`.
            let rg = unsafe { (lib.query_gid)(ctx, port, 0, &mut gid) };
            let subnet_prefix = (link_layer == LinkLayer::InfiniBand && rg == 0)
                .then(|| u64::from_be_bytes(gid.0[..8].try_into().expect("8 bytes")));
            out.push(DevicePort {
                device: name.clone(),
                port,
                active: attr[ffi::PORT_STATE] == 4,
                link_layer,
                subnet_prefix,
            });
        }
        // SAFETY: opened above, nothing else uses it.
        unsafe { (lib.close_device)(ctx) };
    }
    // SAFETY: the list from ibv_get_device_list, freed once.
    unsafe { (lib.free_device_list)(list) };
    Ok(out)
}

struct RegisteredMr {
    mr: *mut ffi::MrHead,
    /// The memory behind it (`None`: a user registration, memory not ours).
    mem: Option<memmap2::MmapMut>,
}

/// An opened device port with one protection domain.
pub struct IbvVerbs {
    lib: &'static ffi::Lib,
    ctx: *mut ffi::Context,
    pd: *mut std::ffi::c_void,
    port: PortInfo,
    mrs: HashMap<u32, RegisteredMr>,
    cqs: Vec<*mut ffi::CqHead>,
    qps: HashMap<u32, *mut ffi::QpHead>,
    wcs: Vec<ffi::Wc>,
    /// Whether on-demand registration works (probed once).
    on_demand: Option<bool>,
    /// The process's pinning limit and capability, read once at open (a
    /// registration of a lent piece must not read /proc).
    pin: crate::sys::PinRules,
}

// SAFETY: libibverbs objects may be used from any thread (one at a time
// here: the connection owning this value is used by one thread at once).
unsafe impl Send for IbvVerbs {}

/// Logs once per process (INFO) which GID the connections use, for the
/// first-hardware checklist (docs/RDMA.md §8: `ib_write_bw -x <index>`).
fn report_gid_once(name: &str, link_layer: LinkLayer, table: &[crate::gid::GidEntry], index: u8) {
    static REPORTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if REPORTED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let entry = table.iter().find(|e| e.index == index);
    tracing::info!(
        "rdma: {name} ({link_layer:?}): GID index {index}{} (table of {} entries read from sysfs)",
        entry.map_or_else(String::new, |e| format!(
            ", {} {:?}",
            std::net::Ipv6Addr::from(e.gid),
            e.kind
        )),
        table.len()
    );
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

impl IbvVerbs {
    /// Keeps the registration `mr` of memory that is not ours (a user
    /// buffer, device memory) addressed at `addr` for `len` bytes, until
    /// it is deregistered; its keys.
    fn keep_user_registration(&mut self, mr: *mut ffi::MrHead, addr: u64, len: usize) -> Mr {
        // SAFETY: `mr` is a non-null registration just returned by
        // libibverbs (ibv_reg_mr or ibv_reg_dmabuf_mr), not yet freed.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        self.mrs.insert(lkey, RegisteredMr { mr, mem: None });
        Mr {
            addr,
            len,
            lkey,
            rkey,
        }
    }

    /// Opens `device` port `port` and reads its LID, MTU and the GID at
    /// `gid_index` (`SNCL_IB_GID_INDEX`; `None`: chosen from the port's
    /// GID table `table`, as sysfs lists it, [`crate::gid::choose_gid_index`]).
    pub fn open(
        device: &str,
        port: u8,
        gid_index: Option<u8>,
        table: &[crate::gid::GidEntry],
    ) -> Result<IbvVerbs> {
        let name = format!("{device}:{port}");
        let err = |op: &'static str, detail: String| VerbsError::Call {
            device: name.clone(),
            op,
            detail,
        };
        let lib = lib().map_err(|e| err("dlopen", e))?;
        let mut n = 0;
        // SAFETY: as in `list_ports`.
        let list = unsafe { (lib.get_device_list)(&mut n) };
        let mut ctx = std::ptr::null_mut();
        for i in 0..n.max(0) as usize {
            // SAFETY: `i < n`, the list is live until freed below.
            let dev = unsafe { *list.add(i) };
            // SAFETY: a listed device's NUL-terminated name.
            let dname = unsafe { CStr::from_ptr((lib.get_device_name)(dev)) };
            if dname.to_bytes() == device.as_bytes() {
                // SAFETY: opening a listed device; closed in Drop.
                ctx = unsafe { (lib.open_device)(dev) };
                break;
            }
        }
        if !list.is_null() {
            // SAFETY: freed once; an opened context stays valid.
            unsafe { (lib.free_device_list)(list) };
        }
        if ctx.is_null() {
            return Err(err(
                "ibv_open_device",
                format!("cannot open the device: {}", errno()),
            ));
        }
        let mut attr = [0u8; ffi::PORT_ATTR_BYTES];
        // SAFETY: `ctx` is open; `attr` is larger than the struct.
        let rp = unsafe { (lib.query_port)(ctx, port, attr.as_mut_ptr()) };
        let link_layer = if attr[ffi::PORT_LINK_LAYER] == 2 {
            LinkLayer::Ethernet
        } else {
            LinkLayer::InfiniBand
        };
        // SNCL_IB_GID_INDEX, else on RoCE the routable RoCE v2 entry of
        // the port's table (crate::gid).
        let (gid_index, why) = crate::gid::choose_gid_index(table, link_layer, gid_index);
        if let Some(why) = why {
            tracing::warn!("rdma: {name}: {why}");
        }
        report_gid_once(&name, link_layer, table, gid_index);
        let mut gid = ffi::Gid::default();
        // SAFETY: `ctx` is open; `gid` is a `union ibv_gid`.
        let rg = unsafe { (lib.query_gid)(ctx, port, gid_index.into(), &mut gid) };
        // SAFETY: `ctx` is open; the protection domain is freed in Drop.
        let pd = unsafe { (lib.alloc_pd)(ctx) };
        let mut me = IbvVerbs {
            lib,
            ctx,
            pd,
            port: PortInfo {
                device: device.to_string(),
                port,
                lid: u16::from_ne_bytes([attr[ffi::PORT_LID], attr[ffi::PORT_LID + 1]]),
                gid: gid.0,
                mtu: attr::mtu_bytes(attr[ffi::PORT_ACTIVE_MTU].into()).unwrap_or(1024),
                link_layer,
                gid_index,
                numa_node: crate::numa::nic_numa_node(SYSFS_ROOT.as_ref(), device),
            },
            mrs: HashMap::new(),
            cqs: Vec::new(),
            qps: HashMap::new(),
            wcs: Vec::new(),
            on_demand: None,
            pin: crate::sys::PinRules::of_process(),
        };
        if rp != 0 || pd.is_null() {
            me.pd = pd;
            return Err(err("ibv_query_port/ibv_alloc_pd", format!("{}", errno())));
        }
        if rg != 0 {
            return Err(err(
                "ibv_query_gid",
                format!(
                    "no GID at index {gid_index} (SNCL_IB_GID_INDEX, or the one chosen): {} (see `show_gids`)",
                    errno()
                ),
            ));
        }
        // SAFETY: `ctx` is open; async_fd is its event descriptor.
        let fd = unsafe { (*ctx).async_fd };
        // SAFETY: making a descriptor we own (through ctx) non-blocking.
        unsafe {
            let fl = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
        Ok(me)
    }

    fn err(&self, op: &'static str, detail: String) -> VerbsError {
        VerbsError::Call {
            device: self.port.name(),
            op,
            detail,
        }
    }

    fn qp(&self, op: &'static str, qpn: u32) -> Result<*mut ffi::QpHead> {
        self.qps
            .get(&qpn)
            .copied()
            .ok_or_else(|| self.err(op, format!("no queue pair {qpn}")))
    }
}

impl Verbs for IbvVerbs {
    fn port(&self) -> &PortInfo {
        &self.port
    }

    fn alloc_mr(&mut self, len: usize) -> Result<Mr> {
        crate::sys::check_pin(&self.pin, len).map_err(|e| self.err("ibv_reg_mr", e))?;
        let mut mem = memmap2::MmapMut::map_anon(len.max(1))
            .map_err(|e| self.err("ibv_reg_mr", format!("allocating {len} bytes: {e}")))?;
        // Placed before ibv_reg_mr faults the pages in.
        let port = &self.port;
        crate::numa::place(&port.device, port.numa_node, mem.as_ptr() as u64, mem.len());
        // SAFETY: `mem` is a live mapping of `len` bytes kept with the
        // registration; `pd` is this context's protection domain.
        let mr = unsafe {
            (self.lib.reg_mr)(
                self.pd,
                mem.as_mut_ptr().cast(),
                mem.len(),
                attr::mr_access(attr::Registration::Staging),
            )
        };
        if mr.is_null() {
            return Err(self.err(
                "ibv_reg_mr",
                format!(
                    "registering {len} bytes failed: {} (check RLIMIT_MEMLOCK: `ulimit -l`)",
                    errno()
                ),
            ));
        }
        // SAFETY: a registration returned by ibv_reg_mr.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        let out = Mr {
            addr: mem.as_ptr() as u64,
            len: mem.len(),
            lkey,
            rkey,
        };
        self.mrs.insert(lkey, RegisteredMr { mr, mem: Some(mem) });
        Ok(out)
    }

    unsafe fn reg_user_mr(&mut self, addr: u64, len: usize, on_demand: bool) -> Result<Mr> {
        if !on_demand {
            crate::sys::check_pin(&self.pin, len).map_err(|e| self.err("ibv_reg_mr", e))?;
        }
        let access = attr::mr_access(attr::Registration::UserSource { on_demand });
        // SAFETY: the caller keeps the range mapped while work requests
        // read it; `pd` is this context's protection domain. Local read
        // access needs no flag.
        let mr = unsafe { (self.lib.reg_mr)(self.pd, addr as *mut _, len, access) };
        if mr.is_null() {
            return Err(self.err(
                "ibv_reg_mr",
                format!(
                    "registering the user buffer {addr:#x}+{len}{} failed: {} (check RLIMIT_MEMLOCK: `ulimit -l`)",
                    if on_demand { " on demand (ODP)" } else { "" },
                    errno()
                ),
            ));
        }
        Ok(self.keep_user_registration(mr, addr, len))
    }

    fn supports_dmabuf(&self) -> bool {
        self.lib.reg_dmabuf_mr.is_some()
    }

    fn supports_peermem(&self) -> bool {
        crate::sys::peermem_loaded()
    }

    fn reg_peermem_mr(&mut self, _dev: &dyn device::Device, addr: u64, len: usize) -> Result<Mr> {
        self.register_peermem(addr, len)
    }

    fn reg_dmabuf_mr(
        &mut self,
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
    ) -> Result<Mr> {
        self.register_dmabuf(fd, offset, len, iova)
    }

    fn dereg_user_mr(&mut self, mr: &Mr) -> Result<()> {
        if self.mrs.get(&mr.lkey).is_some_and(|r| r.mem.is_some()) {
            return Err(self.err(
                "ibv_dereg_mr",
                format!("lkey {:#x} is not a user registration", mr.lkey),
            ));
        }
        self.dereg_mr(mr)
    }

    fn prefetch_on_demand(&mut self, mr: &Mr, addr: u64, len: usize) -> Result<bool> {
        if !self.mrs.contains_key(&mr.lkey) {
            return Err(self.err(
                "ibv_advise_mr",
                format!("no region with lkey {:#x}", mr.lkey),
            ));
        }
        let pd = self.pd;
        // SAFETY: `ctx` is this value's open context.
        let Some(advise) = (unsafe { advise::advise_mr_op(self.ctx) }) else {
            return Ok(false);
        };
        // One scatter entry holds at most 4 GiB - 1.
        let mut at = addr;
        let end = addr + len as u64;
        while at < end {
            let n = (end - at).min(u64::from(u32::MAX) & !0xfff);
            let mut sge = ffi::Sge {
                addr: at,
                length: n as u32,
                lkey: mr.lkey,
            };
            // SAFETY: the provider's advise_mr on this context's PD with one
            // valid scatter entry of a registration of this PD; no FLUSH:
            // the kernel prefetches asynchronously.
            let rc = unsafe { advise(pd, advise::ADVICE_PREFETCH, 0, &mut sge, 1) };
            if rc != 0 {
                return Err(self.err(
                    "ibv_advise_mr",
                    format!(
                        "prefetch of {n} bytes at {at:#x}: {}",
                        std::io::Error::from_raw_os_error(rc)
                    ),
                ));
            }
            at += n;
        }
        Ok(true)
    }

    fn supports_on_demand(&mut self) -> bool {
        if let Some(v) = self.on_demand {
            return v;
        }
        // Probe: register one page on demand. Devices without ODP refuse.
        let ok = match memmap2::MmapMut::map_anon(4096) {
            Ok(mut page) => {
                // SAFETY: a live mapping of one page, deregistered before it
                // is unmapped (below).
                let mr = unsafe {
                    (self.lib.reg_mr)(
                        self.pd,
                        page.as_mut_ptr().cast(),
                        page.len(),
                        attr::mr_access(attr::Registration::UserSource { on_demand: true }),
                    )
                };
                // SAFETY: registered just above, deregistered once.
                !mr.is_null() && unsafe { (self.lib.dereg_mr)(mr) } == 0
            }
            Err(_) => false,
        };
        tracing::debug!(device = %self.port.name(), on_demand = ok, "ODP probe");
        self.on_demand = Some(ok);
        ok
    }

    fn dereg_mr(&mut self, mr: &Mr) -> Result<()> {
        let r = self
            .mrs
            .remove(&mr.lkey)
            .ok_or_else(|| self.err("ibv_dereg_mr", format!("no region {:#x}", mr.lkey)))?;
        // SAFETY: registered by alloc_mr, deregistered once; the memory is
        // unmapped only after (when `r` drops).
        if unsafe { (self.lib.dereg_mr)(r.mr) } != 0 {
            return Err(self.err("ibv_dereg_mr", errno().to_string()));
        }
        Ok(())
    }

    fn create_cq(&mut self, depth: usize) -> Result<u32> {
        let cqe = i32::try_from(depth).map_err(|_| self.err("ibv_create_cq", "depth".into()))?;
        // SAFETY: `ctx` is open; no channel; destroyed in Drop.
        let cq = unsafe {
            (self.lib.create_cq)(self.ctx, cqe, std::ptr::null_mut(), std::ptr::null_mut(), 0)
        };
        if cq.is_null() {
            return Err(self.err("ibv_create_cq", errno().to_string()));
        }
        self.cqs.push(cq);
        Ok(self.cqs.len() as u32 - 1)
    }

    fn create_qp(&mut self, cq: u32, max_send: u32, max_recv: u32) -> Result<u32> {
        let cq = *self
            .cqs
            .get(cq as usize)
            .filter(|c| !c.is_null())
            .ok_or_else(|| self.err("ibv_create_qp", format!("no CQ {cq}")))?;
        let mut attr = ffi::QpInitAttr {
            qp_context: std::ptr::null_mut(),
            send_cq: cq.cast(),
            recv_cq: cq.cast(),
            srq: std::ptr::null_mut(),
            cap: ffi::QpCap {
                max_send_wr: max_send,
                max_recv_wr: max_recv,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ffi::QPT_RC,
            // Each work request says whether it is signalled.
            sq_sig_all: 0,
        };
        // SAFETY: `pd` and `cq` are live; `attr` is a valid init attr.
        let qp = unsafe { (self.lib.create_qp)(self.pd, &mut attr) };
        if qp.is_null() {
            return Err(self.err("ibv_create_qp", errno().to_string()));
        }
        // SAFETY: a queue pair returned by ibv_create_qp.
        let qpn = unsafe { (*qp).qp_num };
        self.qps.insert(qpn, qp);
        Ok(qpn)
    }

    fn destroy_qp(&mut self, qpn: u32) -> Result<()> {
        let qp = self.qp("ibv_destroy_qp", qpn)?;
        // SAFETY: a live queue pair of this context, destroyed once (it
        // leaves the table below whatever the outcome: after a failed
        // destroy libibverbs gives no way to use it again either).
        let rc = unsafe { (self.lib.destroy_qp)(qp) };
        self.qps.remove(&qpn);
        if rc != 0 {
            return Err(self.err(
                "ibv_destroy_qp",
                format!("QP {qpn}: {}", std::io::Error::from_raw_os_error(rc)),
            ));
        }
        Ok(())
    }

    fn destroy_cq(&mut self, cq: u32) -> Result<()> {
        let slot = self
            .cqs
            .get_mut(cq as usize)
            .filter(|c| !c.is_null())
            .ok_or_else(|| VerbsError::Call {
                device: self.port.name(),
                op: "ibv_destroy_cq",
                detail: format!("no CQ {cq}"),
            })?;
        let cqp = std::mem::replace(slot, std::ptr::null_mut());
        // SAFETY: a live completion queue of this context whose queue
        // pairs were destroyed first (the connection destroys them before
        // it); its slot is nulled above so it is destroyed once.
        let rc = unsafe { (self.lib.destroy_cq)(cqp) };
        if rc != 0 {
            return Err(self.err(
                "ibv_destroy_cq",
                format!(
                    "CQ {cq}: {} (queue pairs still on it?)",
                    std::io::Error::from_raw_os_error(rc)
                ),
            ));
        }
        Ok(())
    }

    fn modify_qp(&mut self, qpn: u32, to: QpTransition) -> Result<()> {
        let qp = self.qp("ibv_modify_qp", qpn)?;
        let (mut a, mask) = attr::modify_attrs(&to, &self.port);
        // SAFETY: a live queue pair and a fully initialised attribute.
        let rc = unsafe { (self.lib.modify_qp)(qp, &mut a, mask) };
        if rc != 0 {
            return Err(self.err(
                "ibv_modify_qp",
                format!("{to:?} failed: {}", std::io::Error::from_raw_os_error(rc)),
            ));
        }
        Ok(())
    }

    fn qp_state(&self, qpn: u32) -> Result<QpState> {
        let qp = self.qp("ibv_query_qp", qpn)?;
        // SAFETY: a live queue pair; libibverbs keeps `state` current for
        // the transitions made through ibv_modify_qp.
        Ok(match unsafe { (*qp).state } {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            _ => QpState::Error,
        })
    }

    fn post_send(&mut self, qpn: u32, wr: &SendWr) -> Result<()> {
        self.post_send_chain(qpn, std::slice::from_ref(wr))
    }

    fn post_send_chain(&mut self, qpn: u32, wrs: &[SendWr]) -> Result<()> {
        let qp = self.qp("ibv_post_send", qpn)?;
        let mut sges: Vec<ffi::Sge> = wrs
            .iter()
            .map(|wr| ffi::Sge {
                addr: wr.local.0,
                length: wr.local.1,
                lkey: wr.local.2,
            })
            .collect();
        let mut ws: Vec<ffi::SendWr> = wrs
            .iter()
            .map(|wr| {
                let mut w = ffi::SendWr::new();
                w.wr_id = wr.wr_id;
                w.opcode = if wr.imm.is_some() {
                    ffi::WR_RDMA_WRITE_WITH_IMM
                } else {
                    ffi::WR_RDMA_WRITE
                };
                w.send_flags = if wr.signaled { ffi::SEND_SIGNALED } else { 0 };
                w.imm_data = wr.imm.unwrap_or(0).to_be();
                w.remote_addr = wr.remote_addr;
                w.rkey = wr.rkey;
                w
            })
            .collect();
        // Link the list and its scatter entries (both vectors are final:
        // no reallocation moves them before the call).
        for i in 0..ws.len() {
            if wrs[i].local.1 > 0 {
                ws[i].sg_list = &mut sges[i];
                ws[i].num_sge = 1;
            }
            if i + 1 < ws.len() {
                let next: *mut ffi::SendWr = &mut ws[i + 1];
                ws[i].next = next;
            }
        }
        let Some(first) = ws.first_mut() else {
            return Ok(());
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: verbs.h's inline ibv_post_send: the context's ops table;
        // `qp` is live; the linked work requests and their scatter entries
        // live in `ws` and `sges`, unmoved until the call returns (the HCA
        // copies the descriptors when posting).
        let rc = unsafe { ((*(*qp).context).ops.post_send)(qp.cast(), first, &mut bad) };
        if rc != 0 {
            return Err(self.err(
                "ibv_post_send",
                format!("QP {qpn}: {}", std::io::Error::from_raw_os_error(rc)),
            ));
        }
        Ok(())
    }

    fn post_recv(&mut self, qpn: u32, wr_id: u64) -> Result<()> {
        let qp = self.qp("ibv_post_recv", qpn)?;
        let mut w = ffi::RecvWr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: verbs.h's inline ibv_post_recv through the ops table.
        let rc = unsafe { ((*(*qp).context).ops.post_recv)(qp.cast(), &mut w, &mut bad) };
        if rc != 0 {
            return Err(self.err(
                "ibv_post_recv",
                format!("QP {qpn}: {}", std::io::Error::from_raw_os_error(rc)),
            ));
        }
        Ok(())
    }

    fn poll_cq(&mut self, cq: u32, max: usize, out: &mut Vec<WorkCompletion>) -> Result<usize> {
        let cqp = *self
            .cqs
            .get(cq as usize)
            .filter(|c| !c.is_null())
            .ok_or_else(|| self.err("ibv_poll_cq", format!("no CQ {cq}")))?;
        self.wcs.resize(max, ffi::Wc::default());
        // SAFETY: verbs.h's inline ibv_poll_cq through the ops table; `wcs`
        // holds `max` entries.
        let n = unsafe {
            ((*(*cqp).context).ops.poll_cq)(cqp.cast(), max as i32, self.wcs.as_mut_ptr())
        };
        if n < 0 {
            return Err(self.err("ibv_poll_cq", format!("returned {n} (CQ overrun?)")));
        }
        for w in &self.wcs[..n as usize] {
            out.push(WorkCompletion {
                wr_id: w.wr_id,
                status: WcStatus(w.status),
                // The opcode of an error completion is undefined.
                opcode: match w.opcode {
                    _ if w.status != 0 => WcOpcode::Recv,
                    ffi::WC_RDMA_WRITE => WcOpcode::RdmaWrite,
                    ffi::WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
                    _ => WcOpcode::Recv,
                },
                byte_len: w.byte_len,
                imm: (w.opcode == ffi::WC_RECV_RDMA_WITH_IMM).then(|| u32::from_be(w.imm_data)),
                qp_num: w.qp_num,
                vendor_err: w.vendor_err,
            });
        }
        Ok(n as usize)
    }

    fn poll_async_event(&mut self) -> Option<AsyncEvent> {
        let mut ev = ffi::AsyncEventRaw {
            element: std::ptr::null_mut(),
            event_type: 0,
        };
        // SAFETY: `ctx` is open and its async fd non-blocking (set in open).
        if unsafe { (self.lib.get_async_event)(self.ctx, &mut ev) } != 0 {
            return None;
        }
        let out = match ev.event_type {
            0 => AsyncEvent::CqErr {
                // For CQ events the element is the `ibv_cq`.
                cq: self
                    .cqs
                    .iter()
                    .position(|c| c.cast() == ev.element)
                    .map_or(u32::MAX, |i| i as u32),
            },
            1..=3 => AsyncEvent::QpFatal {
                // SAFETY: for QP events the element is the `ibv_qp`.
                qpn: unsafe { (*ev.element.cast::<ffi::QpHead>()).qp_num },
            },
            4 => AsyncEvent::CommEst {
                // SAFETY: as above (IBV_EVENT_COMM_EST is a QP event).
                qpn: unsafe { (*ev.element.cast::<ffi::QpHead>()).qp_num },
            },
            8 => AsyncEvent::DeviceFatal,
            9 => AsyncEvent::PortActive {
                // For port events the union holds the port number.
                port: (ev.element as usize) as u8,
            },
            10 => AsyncEvent::PortErr {
                port: (ev.element as usize) as u8,
            },
            n => AsyncEvent::Other(n),
        };
        // SAFETY: every event from ibv_get_async_event is acknowledged once.
        unsafe { (self.lib.ack_async_event)(&mut ev) };
        Some(out)
    }
}

impl Drop for IbvVerbs {
    fn drop(&mut self) {
        // SAFETY: every object was created on this context and is destroyed
        // once, children before parents.
        unsafe {
            for qp in self.qps.values() {
                (self.lib.destroy_qp)(*qp);
            }
            for r in self.mrs.values() {
                (self.lib.dereg_mr)(r.mr);
            }
            for cq in self.cqs.iter().filter(|c| !c.is_null()) {
                (self.lib.destroy_cq)(*cq);
            }
            if !self.pd.is_null() {
                (self.lib.dealloc_pd)(self.pd);
            }
            (self.lib.close_device)(self.ctx);
        }
    }
}
