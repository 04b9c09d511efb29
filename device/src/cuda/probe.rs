//! The first contact with CUDA: the driver and NVRTC libraries load, the
//! driver initialises, is new enough and exports every symbol the backend
//! calls, and the device exists. Every backend entry point passes here
//! first, so a machine without CUDA gets a clear error, never a panic.

use crate::{DeviceError, Result};

use super::{driver, nvrtc_lib};

/// The oldest driver the backend supports (CUDA 12.0).
pub const MIN_DRIVER_VERSION: i32 = 12000;

/// Checks that the driver and NVRTC load, initialises the driver and
/// checks its version and symbols; returns the number of devices
/// ([`DeviceError::NoDevice`] where `ordinal` is not one of them).
pub(crate) fn probe(ordinal: usize) -> Result<usize> {
    if !driver::driver_present() {
        let tried = cudarc::get_lib_name_candidates("cuda");
        return Err(DeviceError::NoDriver {
            detail: format!("tried {}", tried.join(", ")),
        });
    }
    nvrtc_lib::get()?;
    let r = driver::init();
    if r == cudarc::driver::sys::CUresult::CUDA_ERROR_NO_DEVICE {
        return Err(DeviceError::NoDevice { ordinal, count: 0 });
    }
    driver::check(ordinal, "cuInit", r)?;
    let found = driver::driver_version(ordinal)?;
    if found < MIN_DRIVER_VERSION {
        return Err(DeviceError::DriverTooOld {
            found,
            needed: MIN_DRIVER_VERSION,
        });
    }
    let missing = driver::missing_symbols();
    if !missing.is_empty() {
        return Err(DeviceError::NoDriver {
            detail: format!(
                "the driver library (version {found}) lacks {}",
                missing.join(", ")
            ),
        });
    }
    let count = driver::device_count(ordinal)?;
    if ordinal >= count {
        return Err(DeviceError::NoDevice { ordinal, count });
    }
    Ok(count)
}
