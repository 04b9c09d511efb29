//! sncl runtime: what of the collective machinery waits, sleeps or reads the
//! clock, over comm-core's pure descriptions.
//!
//! * [`exec`]: the executor — walks one rank's [`comm_core::schedule::Schedule`]
//!   over the peers' [`comm_core::transport::Connection`]s piece by piece,
//!   reducing through [`comm_core::mem::Memory`]; waits spin, yield, then
//!   sleep, each with a deadline, probing the peers' liveness.
//! * [`device`]: a communicator's device binding and the executor's
//!   memory over device buffers (staged through pinned host memory).
//! * [`clock`]: the clock of the operation path (timestamps, waits).
//! * [`flight`]: the flight recorder (the last operations per communicator
//!   with their times, dumped as JSON lines on failure or demand).

// The executor's modules name comm-core's as they did inside it
// (`crate::wire`, `crate::transport`, ...).
pub(crate) use comm_core::{error, mem, schedule, transport, wire};

mod buffers;
pub mod clock;
pub mod device;
pub mod exec;
pub mod flight;
pub mod tags;
