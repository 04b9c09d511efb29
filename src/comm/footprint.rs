//! The communicator's own share of [`crate::MemStats`]: its connections'
//! buffers, the executor's scratch, its windows and its flight recorder.

use comm_core::transport::footprint::{Purpose, Residence};

use super::{Inner, State};
use crate::MemStats;

impl Inner {
    /// What this rank of the communicator holds now (the device binding's
    /// staging is the [`crate::Communicator`]'s to add).
    pub(crate) fn mem_stats(&self) -> MemStats {
        let st = self.lock();
        self.mem_stats_of(&st)
    }

    /// [`Inner::mem_stats`] with the state held.
    pub(crate) fn mem_stats_of(&self, st: &State) -> MemStats {
        let mut m = MemStats {
            rank: self.rank,
            suspended: st.suspension.released(),
            ..MemStats::default()
        };
        for c in st.conns.iter().flatten() {
            m.connected_peers += 1;
            c.footprint(&mut |p, r, b| m.add(p, r, b));
        }
        m.add(
            Purpose::Scratch,
            Residence::Host,
            st.scratch.capacity() as u64,
        );
        m.add(Purpose::Windows, Residence::Shared, self.window_bytes());
        let flight = self.flight.allocated_bytes() as u64;
        m.add(Purpose::FlightRecorder, Residence::Host, flight);
        m
    }
}
