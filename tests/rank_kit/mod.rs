//! Shared by the integration tests: element types with an independent
//! reference of every reduction operator, deterministic inputs every rank
//! can derive for every other rank, and checked collectives that record
//! failures instead of panicking (so the other ranks keep in step).
//!
//! * [`reference`]: element types, deterministic data, expected results;
//! * [`checked`]: collectives run and checked against the reference;
//! * [`launch`]: ranks as child processes.
// Each test binary uses a part of the kit.
#![allow(dead_code, unused_imports)]

pub mod checked;
pub mod launch;
pub mod reference;

pub use checked::*;
pub use launch::*;
pub use reference::*;
