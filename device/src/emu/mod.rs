//! The emulated device (tests only). Being built on its branch.

use std::sync::Arc;

use crate::{Device, DeviceError, Result};

pub mod hostkernels;

/// Opens emulated device `ordinal`.
pub fn open(ordinal: usize) -> Result<Arc<dyn Device>> {
    Err(DeviceError::Unsupported {
        what: format!("emulated device {ordinal}"),
        why: "the emulated backend is not in this build yet".into(),
    })
}
