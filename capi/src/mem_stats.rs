//! `snclCommMemStats`: the memory a communicator holds on this rank
//! (`sncl::Communicator::mem_stats`), by residence and by purpose.

use std::ffi::c_int;

use super::args::*;
use super::comm::snclComm_t;
use super::error::{guard, CError};
use super::types::*;
use sncl_rs::{MemStats, Purpose, Residence};

/// What `snclCommMemStats` writes: bytes this rank of a communicator
/// holds. Each byte is counted once by where it lives (`hostBytes` …
/// `deviceBytes`) and once by what it is for (`fifoBytes` …
/// `deviceStagingBytes`). Shared memory counts the segments this rank
/// created for its peers.
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
