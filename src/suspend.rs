//! [`Communicator::suspend`] and [`Communicator::resume`] (NCCL's
//! `ncclCommSuspend(comm, NCCL_SUSPEND_MEM)` and `ncclCommResume`):
//! release a communicator's peer buffers between phases of a job (the
//! trainer's communicator while the inference engine holds the memory, in
//! reinforcement learning) and restore them, without tearing down its
//! membership. How it works: `crate::comm::suspend`.

use crate::{setup, Communicator, Result};

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
    /// reports. Operations are refused until [`Communicator::resume`]; a
    /// suspend that fails (a rank that did not call it) aborts the
    /// communicator, as a failed collective does.
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
            let args = setup::SetupArgs {
                store: inner.own_store("resume")?,
                rank: inner.rank,
                nranks: inner.nranks,
                // Nothing of an earlier generation's rendezvous is found.
                comm_id: crate::shrink::derived_id(inner.comm_id, RESUME_TAG, generation, &[]),
                secret: inner.secret,
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
