//! The flight recorder's hooks on the communicator: dumps on failure, on
//! abort and on demand (see `sncl_runtime::flight` for the format).

use std::path::PathBuf;

use comm_core::{Error, Result};

use crate::comm::Inner;
use crate::Communicator;
use crate::InitPhase;

impl Inner {
    /// Writes the flight recorder to `dir`.
    fn dump_flight(&self, dir: &std::path::Path, reason: &str) -> Result<PathBuf> {
        self.flight
            .dump(dir, self.rank, self.nranks, self.comm_id, reason)
            .map_err(|source| Error::Io {
                rank: self.rank,
                context: format!(
                    "writing the flight recorder of communicator {:016x} to {}",
                    self.comm_id,
                    dir.display()
                ),
                source,
            })
    }

    /// After a failure or an abort: dumps to `SNCL_DEBUG_DUMP_DIR` if set
    /// (a failed dump is logged, never a second error).
    pub(crate) fn auto_dump(&self, reason: &str) {
        let Some(dir) = &self.config.debug_dump_dir else {
            return;
        };
        if self.flight.capacity() == 0 {
            return;
        }
        match self.dump_flight(dir, reason) {
            Ok(path) => {
                tracing::warn!(rank = self.rank, path = %path.display(), "sncl flight recorder dumped")
            }
            Err(e) => {
                tracing::error!(rank = self.rank, error = %e, "sncl flight recorder dump failed")
            }
        }
    }
}

impl Communicator {
    /// Dumps this rank's flight recorder (its last `SNCL_FLIGHT_RECORDER_ENTRIES`
    /// operations) as JSON lines to `SNCL_DEBUG_DUMP_DIR`, mode 0600, and
    /// returns the file's path. `commbench trace` reads the dumps of all
    /// ranks. An error when no dump directory is configured or the file
    /// cannot be written. Never waits for a running operation.
    pub fn dump_flight_recorder(&self) -> Result<PathBuf> {
        let inner = &self.inner;
        let dir = inner.config.debug_dump_dir.as_ref().ok_or_else(|| {
            Error::Config(format!(
                "rank {}: dump_flight_recorder: SNCL_DEBUG_DUMP_DIR (Config::debug_dump_dir) is not set",
                inner.rank
            ))
        })?;
        inner.dump_flight(dir, "on demand")
    }

    /// How this rank's creation of the communicator went, phase by phase
    /// (`prepare`, `rendezvous`, `connect`, `barrier`; [`InitPhase`]): the
    /// same phases the log's "sncl communicator ready" line, the flight
    /// recorder's dumps and `commbench trace --chrome` show. Empty for a
    /// communicator made without a creation of its own.
    pub fn init_phases(&self) -> Vec<InitPhase> {
        self.inner.flight.init_phases()
    }

    /// This rank's flight recorder as JSON lines (the dump's content).
    pub fn flight_recorder_json(&self) -> String {
        let i = &self.inner;
        i.flight
            .to_json_lines(i.rank, i.nranks, i.comm_id, "on demand")
    }
}
