//! The CUDA backend: [`CudaDevice`], on the driver API through cudarc
//! (loaded at run time) with kernels compiled by NVRTC ([`crate::nvrtc`]).
//!
//! # Loading
//!
//! Nothing CUDA is linked: [`open`] probes for the driver library
//! ([`DeviceError::NoDriver`](crate::DeviceError::NoDriver)), then NVRTC ([`DeviceError::NoNvrtc`](crate::DeviceError::NoNvrtc)), runs
//! `cuInit`, checks the driver version (12.0 or newer, else
//! [`DeviceError::DriverTooOld`](crate::DeviceError::DriverTooOld)), checks that the driver exports every
//! symbol the backend calls, and finds the device
//! ([`DeviceError::NoDevice`](crate::DeviceError::NoDevice)). It never panics.
//!
//! cudarc is built with its `cuda-12080` bindings: they name every call the
//! backend makes by a symbol that CUDA 12.0 and newer drivers (13.x
//! included) export — the driver keeps old entry points for programs built
//! against older toolkits — while the 13.x bindings would resolve, e.g.,
//! `cuEventElapsedTime` to `cuEventElapsedTime_v2`, which drivers before
//! 12.8 lack. cudarc derives the library names it tries from that feature,
//! which for NVRTC means `libnvrtc.so.12` but never `libnvrtc.so.13`, so
//! NVRTC is opened by sncl itself (`nvrtc_lib`: `libnvrtc.so.13`, then
//! `.12`, then `libnvrtc.so`).
//!
//! # Contexts and threads
//!
//! A device binds the device's primary context (`cuDevicePrimaryCtxRetain`)
//! or a user's cudarc context ([`CudaDevice::from_context`]) and makes it
//! current on the calling thread before each call, except inside a scope
//! of [`crate::Device::enter`], which checks it once (a collective's
//! enqueue).
//!
//! # Stream memory operations
//!
//! `stream_wait_u32`/`stream_write_u32` use `cuStreamWaitValue32` (GEQ)
//! and `cuStreamWriteValue32` on the device address of the pinned word.
//! CUDA 12 drivers support 32-bit stream memory operations on every device
//! (the old `CAN_USE_STREAM_MEM_OPS` attribute now reports only the legacy
//! v1 API); where a driver still refuses them, the calls answer
//! [`DeviceError::Unsupported`](crate::DeviceError::Unsupported).

use std::sync::Arc;

use crate::{Device, Result};

mod device;
mod dmabuf;
mod driver;
mod launch;
pub(crate) mod nvrtc_lib;
pub mod pointer;
mod probe;
pub(crate) mod scope;

pub use device::CudaDevice;
use probe::probe;
pub use probe::MIN_DRIVER_VERSION;

/// Opens CUDA device `ordinal` with its primary context.
pub fn open(ordinal: usize) -> Result<Arc<dyn Device>> {
    Ok(Arc::new(CudaDevice::open(ordinal)?))
}

/// The number of CUDA devices; the same errors as [`open`] where CUDA is not
/// usable ([`DeviceError::NoDevice`](crate::DeviceError::NoDevice) where the driver sees none).
pub fn device_count() -> Result<usize> {
    probe(0)
}

/// The device whose context is current on the calling thread (as
/// `cudaGetDevice` answers after `cudaSetDevice`), or `None` when no context
/// is current there.
pub fn current_device() -> Result<Option<usize>> {
    probe(0)?;
    driver::current_context_device()
}

/// Whether a CUDA driver library loads (nothing is initialised).
pub(crate) fn driver_present() -> bool {
    driver::driver_present()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Backend, DeviceError};

    #[test]
    fn open_without_cuda_says_cuda_is_missing() {
        let result = crate::open(Backend::Cuda, 0);
        if driver::driver_present() {
            // A machine with a driver: opening must not panic, whatever it
            // answers.
            eprintln!(
                "a CUDA driver is present here; open(Cuda, 0) gave {:?}",
                result.as_ref().map(|d| d.name())
            );
            return;
        }
        let err = result.expect_err("no driver here, yet open succeeded");
        assert!(matches!(err, DeviceError::NoDriver { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("CUDA is missing"), "{text}");
        assert!(
            text.contains("libcuda.so"),
            "the error names what was tried: {text}"
        );
        // The count and the current device say the same, without a panic.
        let count = crate::device_count(Backend::Cuda).expect_err("no driver, no count");
        assert!(matches!(count, DeviceError::NoDriver { .. }), "{count:?}");
        let current = crate::current_device(Backend::Cuda).expect_err("no driver, no context");
        assert!(
            matches!(current, DeviceError::NoDriver { .. }),
            "{current:?}"
        );
        // Asking again gives the same answer (no state left half set up).
        let again = crate::open(Backend::Cuda, 3).expect_err("still no driver");
        assert!(matches!(again, DeviceError::NoDriver { .. }), "{again:?}");
    }
}
