//! sncl core: data types and reduction operators, pure schedules for every
//! collective with a symbolic checker, the planner, the executor that walks a
//! schedule over [`transport::Connection`]s, configuration and bootstrap.

pub mod algo;
pub mod auth;
pub mod bootstrap;
pub mod check;
pub mod error;
pub mod schedule;
pub mod transport;
pub mod wire;

pub use error::{Error, Result};
pub use kernels::{DataType, ReduceOp};
pub mod config;
pub mod exec;
mod mem;
pub mod topo;
pub mod topofile;
pub mod tune;

pub use config::Config;
