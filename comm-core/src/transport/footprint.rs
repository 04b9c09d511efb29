//! What memory a communicator holds, by purpose and by where it lives
//! (`Communicator::mem_stats`, NCCL's `ncclCommMemStats`): connections
//! report theirs through [`super::Connection::footprint`], the communicator
//! adds its own.

/// What a buffer is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Purpose {
    /// Per-peer FIFOs and their buffers (shared-memory segments, socket
    /// frame buffers, RDMA slot rings, device inboxes).
    Fifo,
    /// Host memory a transport copies pieces through (RDMA's registered
    /// staging area, a receiver's bounce buffer).
    Staging,
    /// User buffers registered with a NIC and kept for reuse.
    RegistrationCache,
    /// The executor's scratch space (reductions of algorithms that need it).
    Scratch,
    /// Windows (`alloc_window`) and their control records.
    Windows,
    /// The flight recorder's ring of operation records.
    FlightRecorder,
    /// Device memory a device binding allocated (staging, kept temporaries).
    DeviceStaging,
}

impl Purpose {
    /// Every purpose, in the order reports list them.
    pub const ALL: [Purpose; 7] = [
        Purpose::Fifo,
        Purpose::Staging,
        Purpose::RegistrationCache,
        Purpose::Scratch,
        Purpose::Windows,
        Purpose::FlightRecorder,
        Purpose::DeviceStaging,
    ];

    /// Short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Purpose::Fifo => "fifo",
            Purpose::Staging => "staging",
            Purpose::RegistrationCache => "registration-cache",
            Purpose::Scratch => "scratch",
            Purpose::Windows => "windows",
            Purpose::FlightRecorder => "flight-recorder",
            Purpose::DeviceStaging => "device-staging",
        }
    }
}

/// Where memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Residence {
    /// Host memory private to this process.
    Host,
    /// Host memory pinned for a NIC or a device (it counts against
    /// `RLIMIT_MEMLOCK` where the process lacks `CAP_IPC_LOCK`).
    Pinned,
    /// Shared memory this rank created (`/dev/shm` files, memfds) for
    /// its peers to map; what it maps of theirs is counted by them.
    Shared,
    /// Device memory.
    Device,
    /// Shared memory a peer created that this rank maps: resident in this
    /// process once touched, but counted in the creator's totals, so it is
    /// not in this rank's (`MemStats::total_bytes` leaves it out;
    /// `MemStats::resident_bytes` adds it).
    Mapped,
}

impl Residence {
    /// Every residence, in the order reports list them.
    pub const ALL: [Residence; 5] = [
        Residence::Host,
        Residence::Pinned,
        Residence::Shared,
        Residence::Device,
        Residence::Mapped,
    ];

    /// Short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Residence::Host => "host",
            Residence::Pinned => "pinned",
            Residence::Shared => "shared",
            Residence::Device => "device",
            Residence::Mapped => "mapped",
        }
    }
}

/// Where a connection reports its memory: `bytes` for `purpose` in
/// `residence` (called once per buffer or per kind, in any order).
pub type FootprintReport<'a> = dyn FnMut(Purpose, Residence, u64) + 'a;
