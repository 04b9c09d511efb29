//! `snclCommMemStats`: the memory a communicator holds on this rank
//! (`sncl::Communicator::mem_stats`), by residence and by purpose; and
//! `snclCommSuspend` / `snclCommResume` (NCCL 2.29's `ncclCommSuspend` and
//! `ncclCommResume`), which release and restore the peer buffers.

use std::ffi::c_int;

use super::args::*;
use super::comm::snclComm_t;
use super::error::{guard, CError};
use super::types::*;
use sncl_rs::{Error, MemStats, Purpose, Residence};

/// `snclCommSuspend`'s flag: release the peer buffers (NCCL's
/// `NCCL_SUSPEND_MEM`), the only one there is.
pub const SNCL_SUSPEND_MEM: c_int = 0x01;

/// What `snclCommMemStats` writes: bytes this rank of a communicator
/// holds. Each byte is counted once by where it lives (`hostBytes` …
/// `deviceBytes`) and once by what it is for (`fifoBytes` …
/// `deviceStagingBytes`). Shared memory counts the segments this rank
/// created for its peers; what it maps of theirs is `mappedBytes`, apart
/// from both (it is in the creators' counts).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct snclMemStats_t {
    /// Host memory private to this process.
    pub hostBytes: u64,
    /// Host memory pinned for a NIC or a device.
    pub pinnedBytes: u64,
    /// Shared memory this rank created for its peers.
    pub sharedBytes: u64,
    /// Device memory.
    pub deviceBytes: u64,
    /// Per-peer FIFOs (shared-memory segments, socket buffers, RDMA rings,
    /// device inboxes).
    pub fifoBytes: u64,
    /// Host staging of transports.
    pub stagingBytes: u64,
    /// User buffers kept registered with a NIC (pinned).
    pub registrationCacheBytes: u64,
    /// The executor's scratch space.
    pub scratchBytes: u64,
    /// Windows and their control records.
    pub windowBytes: u64,
    /// The flight recorder.
    pub flightRecorderBytes: u64,
    /// A device binding's staging and kept temporaries.
    pub deviceStagingBytes: u64,
    /// Peers this rank has a connection to.
    pub connectedPeers: c_int,
    /// Bytes `snclCommSuspend` would release now (FIFOs, staging,
    /// registrations, scratch; NCCL's `ncclStatGpuMemSuspend`).
    pub releasableBytes: u64,
    /// Bytes the suspend in effect released (0 while not suspended; NCCL's
    /// `ncclStatGpuMemSuspended`).
    pub suspendedBytes: u64,
    /// Shared memory peers created that this rank maps (resident in this
    /// process, in the peers' `sharedBytes`): with the four residences
    /// above but `deviceBytes`, what the communicator adds to the
    /// process's resident memory.
    pub mappedBytes: u64,
}

impl From<&MemStats> for snclMemStats_t {
    fn from(m: &MemStats) -> snclMemStats_t {
        snclMemStats_t {
            hostBytes: m.total(Residence::Host),
            pinnedBytes: m.total(Residence::Pinned),
            sharedBytes: m.total(Residence::Shared),
            deviceBytes: m.total(Residence::Device),
            fifoBytes: m.of(Purpose::Fifo),
            stagingBytes: m.of(Purpose::Staging),
            registrationCacheBytes: m.of(Purpose::RegistrationCache),
            scratchBytes: m.of(Purpose::Scratch),
            windowBytes: m.of(Purpose::Windows),
            flightRecorderBytes: m.of(Purpose::FlightRecorder),
            deviceStagingBytes: m.of(Purpose::DeviceStaging),
            connectedPeers: c_int::try_from(m.connected_peers).unwrap_or(c_int::MAX),
            releasableBytes: m.releasable(),
            suspendedBytes: m.suspended,
            mappedBytes: m.total(Residence::Mapped),
        }
    }
}

/// Writes the memory `comm` holds on this rank into `*stats` (like
/// `ncclCommMemStats`, as one struct instead of one statistic per call).
///
/// # Safety
/// `comm` is a live handle; `stats` points to a writable `snclMemStats_t`.
#[no_mangle]
pub unsafe extern "C" fn snclCommMemStats(
    comm: snclComm_t,
    stats: *mut snclMemStats_t,
) -> snclResult_t {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let shared = unsafe { comm_arg(comm) }?;
        if stats.is_null() {
            return Err(CError::invalid("stats is NULL"));
        }
        let m = snclMemStats_t::from(&shared.get()?.mem_stats());
        // SAFETY: checked non-NULL; the caller provides storage.
        unsafe { stats.write(m) };
        Ok(OK)
    })
}

/// Releases the peer buffers of `comm` on this rank (NCCL's
/// `ncclCommSuspend(comm, NCCL_SUSPEND_MEM)`; see
/// `Communicator::suspend`): every rank calls it at the same point, after
/// the operations issued before it, and it returns once every rank
/// suspended. `flags` is `SNCL_SUSPEND_MEM`. Operations on `comm` fail
/// with `snclInvalidArgument` until `snclCommResume`. A suspend that fails
/// (a rank that did not call it within the timeout) aborts `comm`.
///
/// # Safety
/// `comm` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn snclCommSuspend(comm: snclComm_t, flags: c_int) -> snclResult_t {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let shared = unsafe { comm_arg(comm) }?;
        if flags != SNCL_SUSPEND_MEM {
            return Err(CError::invalid(format!(
                "flags {flags:#x}: SNCL_SUSPEND_MEM ({SNCL_SUSPEND_MEM:#x}) is the only flag"
            )));
        }
        in_turn(&shared, |c| c.suspend())
    })
}

/// Restores the peer buffers of a suspended `comm` (NCCL's
/// `ncclCommResume`; see `Communicator::resume`): every rank calls it,
/// and it returns once every rank connected again. A resume that fails
/// aborts `comm`.
///
/// # Safety
/// `comm` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn snclCommResume(comm: snclComm_t) -> snclResult_t {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let shared = unsafe { comm_arg(comm) }?;
        in_turn(&shared, |c| c.resume())
    })
}

/// Runs `f` after the operations issued on `shared` before it (a
/// non-blocking handle's included); a failure other than misuse aborted
/// the communicator and is recorded as its error.
fn in_turn(
    shared: &super::comm::CommShared,
    f: impl FnOnce(&sncl_rs::Communicator) -> sncl_rs::Result<()>,
) -> Result<snclResult_t, CError> {
    let c = shared.get()?;
    let mut ticket = shared.ticket();
    ticket.wait_turn();
    let r = f(c);
    drop(ticket);
    r.map_err(|e| {
        let misuse = matches!(e, Error::InvalidArgument { .. });
        let e = CError::from(e);
        if !misuse {
            shared.record(&e);
        }
        e
    })?;
    Ok(OK)
}
