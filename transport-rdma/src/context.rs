//! One device context per port per process (issue 36, risk 7).
//!
//! Before, every connection opened its own device context (`ibv_open_device`,
//! a protection domain, a completion channel's worth of kernel objects and
//! an async-event file descriptor): N−1 contexts per rank, where NCCL opens
//! one per device per process (`ncclIbDevs`) and shares it between
//! connections and communicators. A context costs the kernel a uverbs file,
//! pinned doorbell pages and a UAR page each (the ConnectX driver hands out
//! a limited number of UARs per device), so N−1 of them fail first at scale.
//!
//! [`acquire`] hands out [`ContextHandle`]s on the process's one context for
//! a port (opened on first use, closed when its last handle goes). A handle
//! implements [`Verbs`] by locking the shared context for each call; each
//! connection keeps its own queue pairs, completion queue and regions on it
//! and destroys them when it goes ([`RdmaConnection`](crate::RdmaConnection)'s
//! `Drop`). Asynchronous events are per context in libibverbs
//! (`ibv_get_async_event(3)`: "the context's async event queue"), so a
//! handle's poll takes what the context has and routes it: a queue pair's
//! or a completion queue's event to the handle that created it, a port's or
//! the device's to every handle.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};

use crate::locks::lock;
use crate::verbs::{
    AsyncEvent, Fault, Mr, PortInfo, QpState, QpTransition, Result, SendWr, Verbs, VerbsCounters,
    WorkCompletion,
};

/// Whose device context a connection uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ContextScope {
    /// The process's one context for the port, shared with every other
    /// connection of every communicator of the process (what a deployment
    /// uses).
    #[default]
    Process,
    /// A context of the connection's own. Tests that run two "nodes" as
    /// threads of one process use it, so that a fault injected into one
    /// side's emulated NIC stays on that side, as it would on two machines.
    Connection,
}

/// What tells contexts apart: the provider (its name: device and port, or
/// the emulation), the strict emulation, and the GID index asked for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ContextKey {
    pub provider: String,
    pub strict: bool,
    pub gid_index: Option<u8>,
}

/// A context and who uses it.
struct Shared {
    verbs: Box<dyn Verbs>,
    /// Events taken from the context, per handle, not yet polled by it.
    mailboxes: HashMap<u64, VecDeque<AsyncEvent>>,
    /// Which handle created each queue pair and completion queue.
    qp_owner: HashMap<u32, u64>,
    cq_owner: HashMap<u32, u64>,
    next_handle: u64,
    /// The context's progress thread (`progress.rs`), while a connection
    /// on it lives.
    driver: Weak<crate::progress::Driver>,
}

impl Shared {
    /// Moves the context's pending events into the handles' mailboxes.
    fn route_events(&mut self) {
        while let Some(ev) = self.verbs.poll_async_event() {
            let owner = match ev {
                AsyncEvent::QpFatal { qpn } | AsyncEvent::CommEst { qpn } => {
                    Some(self.qp_owner.get(&qpn).copied())
                }
                AsyncEvent::CqErr { cq } => Some(self.cq_owner.get(&cq).copied()),
                _ => None,
            };
            match owner {
                // A resource's event goes to its handle (none: it was
                // destroyed in the meantime, nobody is left to tell).
                Some(Some(h)) => {
                    if let Some(m) = self.mailboxes.get_mut(&h) {
                        m.push_back(ev);
                    }
                }
                Some(None) => {
                    tracing::debug!("rdma: async event {ev} for a destroyed resource dropped")
                }
                // The port's and the device's events concern every handle.
                None => self.mailboxes.values_mut().for_each(|m| m.push_back(ev)),
            }
        }
    }
}

/// The process's open contexts, by key (weak: a context closes with its
/// last handle).
fn registry() -> &'static Mutex<HashMap<ContextKey, Weak<Mutex<Shared>>>> {
    static REGISTRY: std::sync::OnceLock<Mutex<HashMap<ContextKey, Weak<Mutex<Shared>>>>> =
        std::sync::OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

/// A handle on the process's context for `key` (opened with `open` where
/// none is open), or on a context of its own for [`ContextScope::Connection`].
pub(crate) fn acquire(
    key: ContextKey,
    scope: ContextScope,
    open: impl FnOnce() -> Result<Box<dyn Verbs>>,
) -> Result<ContextHandle> {
    let fresh = |verbs: Box<dyn Verbs>| {
        Arc::new(Mutex::new(Shared {
            verbs,
            mailboxes: HashMap::new(),
            qp_owner: HashMap::new(),
            cq_owner: HashMap::new(),
            next_handle: 0,
            driver: Weak::new(),
        }))
    };
    let shared = match scope {
        ContextScope::Connection => fresh(open()?),
        ContextScope::Process => {
            // Held while opening, so that two connecting threads open one
            // context between them.
            let mut reg = lock(registry());
            reg.retain(|_, w| w.strong_count() > 0);
            match reg.get(&key).and_then(Weak::upgrade) {
                Some(s) => s,
                None => {
                    let s = fresh(open()?);
                    let (device, numa_node) = {
                        let port = lock(&s).verbs.port().clone();
                        (port.name(), port.numa_node)
                    };
                    tracing::debug!(provider = %key.provider, device, ?numa_node,
                        "rdma: device context opened for the process (registered memory on the NIC's NUMA node)");
                    reg.insert(key, Arc::downgrade(&s));
                    s
                }
            }
        }
    };
    let (id, port) = {
        let mut s = lock(&shared);
        let id = s.next_handle;
        s.next_handle += 1;
        s.mailboxes.insert(id, VecDeque::new());
        (id, s.verbs.port().clone())
    };
    Ok(ContextHandle { shared, id, port })
}

/// One connection's use of a shared device context.
pub(crate) struct ContextHandle {
    shared: Arc<Mutex<Shared>>,
    id: u64,
    port: PortInfo,
}

impl ContextHandle {
    fn with<R>(&self, f: impl FnOnce(&mut Shared) -> R) -> R {
        f(&mut lock(&self.shared))
    }

    /// The progress thread of this handle's context (started with its
    /// first connection, shared by all of them).
    pub(crate) fn driver(&self) -> Arc<crate::progress::Driver> {
        self.with(|s| match s.driver.upgrade() {
            Some(d) => d,
            None => {
                let d = Arc::new(crate::progress::Driver::new(self.port.name()));
                s.driver = Arc::downgrade(&d);
                d
            }
        })
    }

    /// How many handles use this handle's context (itself included).
    #[cfg(test)]
    pub fn users(&self) -> usize {
        Arc::strong_count(&self.shared)
    }
}

impl Drop for ContextHandle {
    fn drop(&mut self) {
        self.with(|s| {
            s.mailboxes.remove(&self.id);
            s.qp_owner.retain(|_, h| *h != self.id);
            s.cq_owner.retain(|_, h| *h != self.id);
        });
    }
}

impl Verbs for ContextHandle {
    fn port(&self) -> &PortInfo {
        &self.port
    }

    fn alloc_mr(&mut self, len: usize) -> Result<Mr> {
        self.with(|s| s.verbs.alloc_mr(len))
    }

    fn dereg_mr(&mut self, mr: &Mr) -> Result<()> {
        self.with(|s| s.verbs.dereg_mr(mr))
    }

    unsafe fn reg_user_mr(&mut self, addr: u64, len: usize, on_demand: bool) -> Result<Mr> {
        // SAFETY: the caller's promise (the range stays mapped while work
        // requests read it) is passed on unchanged.
        self.with(|s| unsafe { s.verbs.reg_user_mr(addr, len, on_demand) })
    }

    fn dereg_user_mr(&mut self, mr: &Mr) -> Result<()> {
        self.with(|s| s.verbs.dereg_user_mr(mr))
    }

    fn prefetch_on_demand(&mut self, mr: &Mr, addr: u64, len: usize) -> Result<bool> {
        self.with(|s| s.verbs.prefetch_on_demand(mr, addr, len))
    }

    fn supports_on_demand(&mut self) -> bool {
        self.with(|s| s.verbs.supports_on_demand())
    }

    fn supports_dmabuf(&self) -> bool {
        self.with(|s| s.verbs.supports_dmabuf())
    }

    fn reg_dmabuf_mr(
        &mut self,
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
    ) -> Result<Mr> {
        self.with(|s| s.verbs.reg_dmabuf_mr(fd, offset, len, iova))
    }

    fn supports_peermem(&self) -> bool {
        self.with(|s| s.verbs.supports_peermem())
    }

    fn reg_peermem_mr(&mut self, dev: &dyn device::Device, addr: u64, len: usize) -> Result<Mr> {
        self.with(|s| s.verbs.reg_peermem_mr(dev, addr, len))
    }

    fn create_cq(&mut self, depth: usize) -> Result<u32> {
        let id = self.id;
        self.with(|s| {
            let cq = s.verbs.create_cq(depth)?;
            s.cq_owner.insert(cq, id);
            Ok(cq)
        })
    }

    fn destroy_cq(&mut self, cq: u32) -> Result<()> {
        self.with(|s| {
            s.verbs.destroy_cq(cq)?;
            s.cq_owner.remove(&cq);
            Ok(())
        })
    }

    fn create_qp(&mut self, cq: u32, max_send: u32, max_recv: u32) -> Result<u32> {
        let id = self.id;
        self.with(|s| {
            let qpn = s.verbs.create_qp(cq, max_send, max_recv)?;
            s.qp_owner.insert(qpn, id);
            Ok(qpn)
        })
    }

    fn destroy_qp(&mut self, qpn: u32) -> Result<()> {
        self.with(|s| {
            s.verbs.destroy_qp(qpn)?;
            s.qp_owner.remove(&qpn);
            Ok(())
        })
    }

    fn modify_qp(&mut self, qpn: u32, to: QpTransition) -> Result<()> {
        self.with(|s| s.verbs.modify_qp(qpn, to))
    }

    fn qp_state(&self, qpn: u32) -> Result<QpState> {
        self.with(|s| s.verbs.qp_state(qpn))
    }

    fn post_send(&mut self, qpn: u32, wr: &SendWr) -> Result<()> {
        self.with(|s| s.verbs.post_send(qpn, wr))
    }

    fn post_send_chain(&mut self, qpn: u32, wrs: &[SendWr]) -> Result<()> {
        self.with(|s| s.verbs.post_send_chain(qpn, wrs))
    }

    fn counters(&self) -> VerbsCounters {
        self.with(|s| s.verbs.counters())
    }

    fn post_recv(&mut self, qpn: u32, wr_id: u64) -> Result<()> {
        self.with(|s| s.verbs.post_recv(qpn, wr_id))
    }

    fn poll_cq(&mut self, cq: u32, max: usize, out: &mut Vec<WorkCompletion>) -> Result<usize> {
        self.with(|s| s.verbs.poll_cq(cq, max, out))
    }

    fn poll_async_event(&mut self) -> Option<AsyncEvent> {
        let id = self.id;
        self.with(|s| {
            s.route_events();
            s.mailboxes.get_mut(&id).and_then(VecDeque::pop_front)
        })
    }

    fn needs_progress(&self) -> bool {
        self.with(|s| s.verbs.needs_progress())
    }

    fn inject(&mut self, fault: Fault) -> Result<()> {
        self.with(|s| s.verbs.inject(fault))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emu::EmuVerbs;

    fn key() -> ContextKey {
        ContextKey {
            provider: "emulated".into(),
            strict: false,
            gid_index: Some(0xee),
        }
    }

    fn open() -> Result<Box<dyn Verbs>> {
        Ok(Box::new(EmuVerbs::open()?))
    }

    #[test]
    fn connections_of_a_process_share_one_context_and_events_reach_their_owner() {
        let mut a = acquire(key(), ContextScope::Process, open).unwrap();
        let mut b = acquire(key(), ContextScope::Process, || panic!("opened twice")).unwrap();
        assert_eq!(a.users(), 2, "both handles on one context");
        assert_eq!(a.port(), b.port());
        let own = acquire(key(), ContextScope::Connection, open).unwrap();
        assert_eq!(own.users(), 1, "a connection-scoped context is its own");
        assert_ne!(own.port().gid, a.port().gid);

        let cq_a = a.create_cq(16).unwrap();
        let cq_b = b.create_cq(16).unwrap();
        let qp_a = a.create_qp(cq_a, 4, 4).unwrap();
        let qp_b = b.create_qp(cq_b, 4, 4).unwrap();
        assert_ne!(qp_a, qp_b);
        // A queue pair's fatal error is its owner's; the port's, everyone's.
        a.inject(Fault::QpFatal { qpn: qp_b }).unwrap();
        a.inject(Fault::PortDown).unwrap();
        assert_eq!(a.poll_async_event(), Some(AsyncEvent::PortErr { port: 1 }));
        assert_eq!(a.poll_async_event(), None);
        assert_eq!(
            b.poll_async_event(),
            Some(AsyncEvent::QpFatal { qpn: qp_b })
        );
        assert_eq!(b.poll_async_event(), Some(AsyncEvent::PortErr { port: 1 }));
        assert_eq!(b.poll_async_event(), None);

        // A destroyed queue pair frees its place; the context closes with
        // its last handle.
        b.destroy_qp(qp_b).unwrap();
        b.destroy_cq(cq_b).unwrap();
        assert!(b.qp_state(qp_b).is_err());
        drop(b);
        assert_eq!(a.users(), 1);
        drop(a);
        let again = acquire(key(), ContextScope::Process, open).unwrap();
        assert_eq!(again.users(), 1, "a new context after the last handle went");
    }
}
