//! The CUDA backend (cudarc, driver API and NVRTC loaded at run time).
//! Being built on its branch; until then `open` says so.

use std::sync::Arc;

use crate::{Device, DeviceError, Result};

/// Opens CUDA device `ordinal`.
pub fn open(ordinal: usize) -> Result<Arc<dyn Device>> {
    Err(DeviceError::Unsupported {
        what: format!("CUDA device {ordinal}"),
        why: "the CUDA backend is not in this build yet".into(),
    })
}
