//! Device errors as sncl errors that name the rank, the operation and the
//! device.

use std::sync::Arc;

use ::device::{Device, DeviceError};
use comm_core::Error;

/// A device error in operation `op` (with its sequence number once it has
/// one) as an [`Error::Device`] naming the rank, the backend and the device.
pub fn device_error(
    rank: usize,
    dev: &Arc<dyn Device>,
    (op, seq): (&'static str, Option<u64>),
    what: &str,
    e: DeviceError,
) -> Error {
    Error::Device {
        rank,
        op,
        seq,
        device: describe(&**dev),
        what: what.to_string(),
        detail: e.to_string(),
    }
}

/// A device as errors name it: backend, ordinal and name (`cuda device 0
/// (NVIDIA H200)`).
pub fn describe(dev: &dyn Device) -> String {
    format!(
        "{} device {} ({})",
        dev.backend().name(),
        dev.ordinal(),
        dev.name()
    )
}
