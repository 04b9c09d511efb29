//! The clock of the operation path: every operation's start and duration
//! (the flight recorder, the busy time) and every wait's backoff and
//! deadline read it, several times per small operation.
//!
//! It is [`quanta`]'s: the CPU's time-stamp counter, scaled to nanoseconds,
//! where the CPU says its TSC is invariant (`constant_tsc`, `nonstop_tsc`),
//! and the OS's monotonic clock otherwise; it is calibrated against the OS
//! clock once per process (about half a millisecond, at the first read).
//! Measured on a 2-core x86_64 VM whose OS clock source is the TSC: 9.6 ns
//! a read against 23 ns for `std::time::Instant::now` (a vDSO
//! `clock_gettime`), and 250 ms slept read as 250.17 ms by both. At two to
//! five reads per small operation that was a tenth to a fifth of an 8-byte
//! all-reduce's time (docs/perf-notes/NOTEBOOK.md §27).
//!
//! Its instants are not `std::time::Instant`s: keep each duration's two
//! ends on one clock.

pub use quanta::Instant;
