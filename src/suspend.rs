//! [`Communicator::suspend`] and [`Communicator::resume`] (NCCL's
//! `ncclCommSuspend(comm, NCCL_SUSPEND_MEM)` and `ncclCommResume`):
//! release a communicator's peer buffers between phases of a job (the
//! trainer's communicator while the inference engine holds the memory, in
//! reinforcement learning) and restore them, without tearing down its
//! membership. How it works: `crate::comm::suspend`.

use std::sync::{Arc, Weak};
use std::time::Duration;

use comm_core::Error;
use sncl_bootstrap::Store;

use crate::comm::Inner;
use crate::{setup, Communicator, Result};

/// How often a resume's waits check whether the communicator was aborted.
const ABORT_POLL: Duration = Duration::from_millis(100);

/// The domain tag of a resume's derived communicator id.
const RESUME_TAG: u64 = 0x7265_7375_6d65; // "resume"

impl Communicator {
    /// Releases this communicator's peer buffers: every connection (shared
    /// memory FIFOs, socket buffers, RDMA rings and registrations), the
    /// executor's scratch, and a device binding's kept temporaries, here
    /// and in the sub-communicators of compressed all-reduces. Like a
    /// collective, every rank calls it at the same point; it runs after the
    /// operations issued before it and returns once every rank suspended
    /// (within the timeout). The rank, size, windows, flight recorder and
    /// recovery stay, and so does what [`Communicator::mem_stats`] still
    /// reports. Operations are refused until [`Communicator::resume`]. A
    /// tagged message sent and not yet received makes every rank refuse
    /// the suspend (naming the pair; nothing changes); a suspend that
    /// fails (a rank that did not call it) aborts the communicator, as a
    /// failed collective does.
    pub fn suspend(&self) -> Result<()> {
        self.inner.suspend()?;
        if let Some(Some(layout)) = self.layout.get() {
            for sub in layout.comms() {
                // A sub-communicator that fails leaves this one suspended
                // where its peers may not be: abort, as any failure does.
                sub.suspend().inspect_err(|_| self.abort())?;
            }
        }
        if let Some(attached) = self.device.get() {
            // Kept temporaries are idle between operations (the stream ran
            // everything that used them), and this runs after the
            // operations issued before it.
            drop(attached.binding.take_temporaries());
        }
        Ok(())
    }

    /// Restores a suspended communicator's peer buffers: every rank
    /// connects anew, as at creation (lazily where `SNCL_RUNTIME_CONNECT`
    /// says so), and the operations after it run as before the suspend.
    /// Every rank calls it at the same point; it returns once every rank
    /// connected. A resume that fails aborts the communicator.
    pub fn resume(&self) -> Result<()> {
        let inner = &self.inner;
        inner.resume(|generation| {
            let mut config = inner.config.clone();
            config.node_id = Some(inner.node_ids[inner.rank].clone());
            let store: Arc<dyn Store> = Arc::new(AbortableStore {
                store: inner.own_store("resume")?,
                comm: Arc::downgrade(inner),
            });
            let args = setup::SetupArgs {
                store,
                rank: inner.rank,
                nranks: inner.nranks,
                // Nothing of an earlier generation's rendezvous is found.
                comm_id: crate::shrink::derived_id(inner.comm_id, RESUME_TAG, generation, &[]),
                secret: inner.secret,
                wait: config.timeout,
                config,
                local_ip: inner.local_ip,
                server: None,
            };
            // Each peer over the kind the creation chose (a device bound
            // since could make another kind the choice now): the plans and
            // the device tier were made for those.
            setup::build_keeping(args, Some(&inner.transports))
        })?;
        if let Some(Some(layout)) = self.layout.get() {
            for sub in layout.comms() {
                sub.resume().inspect_err(|_| self.abort())?;
            }
        }
        Ok(())
    }

    /// Whether the communicator is suspended ([`Communicator::suspend`]
    /// and not resumed yet).
    pub fn is_suspended(&self) -> bool {
        self.inner.is_suspended()
    }
}

/// The communicator's store as a resume's rendezvous sees it: a wait gives
/// up once the communicator is aborted (checked every [`ABORT_POLL`]), so
/// `abort` ends a resume that waits for a rank that will not come. (Weak:
/// the lazily connected kinds keep this store, and the communicator keeps
/// them.)
struct AbortableStore {
    store: Arc<dyn Store>,
    comm: Weak<Inner>,
}

impl AbortableStore {
    /// Runs `attempt` in slices of at most [`ABORT_POLL`] until `timeout`,
    /// ending it once the communicator was aborted.
    fn sliced<T>(&self, timeout: Duration, attempt: impl Fn(Duration) -> Result<T>) -> Result<T> {
        setup::lazy::in_slices(timeout, ABORT_POLL, attempt, |e| {
            let comm = self.comm.upgrade().filter(|c| c.abort_requested())?;
            Some(Error::Aborted {
                rank: comm.rank,
                reason: Some(format!("aborted while connecting again: {e}")),
            })
        })
    }
}

impl Store for AbortableStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.store.set(key, value)
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.sliced(timeout, |t| self.store.get(key, t))
    }

    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.store.try_get(key)
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        self.sliced(timeout, |t| self.store.wait(keys, t))
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.store.add(key, delta)
    }
}
