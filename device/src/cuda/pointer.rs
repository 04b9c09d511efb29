//! [`Device::pointer_kind`](crate::Device::pointer_kind) on CUDA:
//! `cuPointerGetAttribute` (memory type, then device ordinal).

use std::ffi::c_void;

use cudarc::driver::sys::{self, CUmemorytype, CUpointer_attribute, CUresult};

use super::driver;
use crate::{DeviceError, PointerKind, Result};

/// Whether the loaded driver exports `cuPointerGetAttribute` (cudarc panics
/// on a missing symbol, so it is looked up first).
fn present() -> bool {
    static PRESENT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PRESENT.get_or_init(|| {
        driver::driver_present() && {
            // SAFETY: the library is present (checked above); looking the
            // symbol up calls nothing.
            let lib = unsafe { sys::culib() };
            // SAFETY: as above; the address is not used.
            unsafe { lib.get::<*const c_void>(b"cuPointerGetAttribute") }.is_ok()
        }
    })
}

/// One attribute of `addr` as a u32-sized value.
fn attribute(addr: u64, attr: CUpointer_attribute) -> std::result::Result<u32, CUresult> {
    let mut out: u32 = 0;
    // SAFETY: both attributes asked here are 4-byte values (a CUmemorytype
    // and an int); `out` is live and writable for 4 bytes. The driver only
    // inspects `addr`, never dereferences it on the host.
    let r =
        unsafe { sys::cuPointerGetAttribute(&mut out as *mut u32 as *mut c_void, attr, addr as _) };
    if r == CUresult::CUDA_SUCCESS {
        Ok(out)
    } else {
        Err(r)
    }
}

/// The kind of `addr`. `bind` makes the device's context current, for the
/// retry when no context is current on this thread.
pub(super) fn kind(
    ordinal: usize,
    addr: u64,
    bind: impl Fn() -> Result<()>,
) -> Result<PointerKind> {
    if !present() {
        return Err(DeviceError::Unsupported {
            what: "asking the memory type of a pointer".into(),
            why: "the CUDA driver does not export cuPointerGetAttribute".into(),
        });
    }
    let ask = |attr| match attribute(addr, attr) {
        Err(CUresult::CUDA_ERROR_INVALID_CONTEXT) => {
            bind()?;
            Ok(attribute(addr, attr))
        }
        r => Ok(r),
    };
    let mem = match ask(CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE)? {
        Ok(t) => t,
        // Memory CUDA does not know: ordinary host memory (or freed device
        // memory, which the driver cannot tell apart from it).
        Err(CUresult::CUDA_ERROR_INVALID_VALUE) => return Ok(PointerKind::Host),
        Err(r) => return Err(call_error(ordinal, r)),
    };
    if mem == CUmemorytype::CU_MEMORYTYPE_HOST as u32 {
        return Ok(PointerKind::Host);
    }
    let dev = ask(CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)?
        .map_err(|r| call_error(ordinal, r))?;
    Ok(PointerKind::Device {
        ordinal: dev as usize,
    })
}

fn call_error(ordinal: usize, r: CUresult) -> DeviceError {
    DeviceError::Call {
        ordinal,
        call: "cuPointerGetAttribute",
        detail: driver::describe(r),
    }
}

/// The kind of `addr` without an opened device, for a caller that could not
/// open one (NVRTC missing, say) and must still not take device memory for
/// host memory, and without making a context current. No driver, or one
/// that does not initialise, means no CUDA memory exists:
/// [`PointerKind::Host`]. The probes are made once per process.
pub fn pointer_kind(addr: u64) -> Result<PointerKind> {
    static INIT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ready = present() && *INIT.get_or_init(|| driver::init() == CUresult::CUDA_SUCCESS);
    if !ready {
        return Ok(PointerKind::Host);
    }
    kind(0, addr, || {
        Err(DeviceError::Unsupported {
            what: "asking the memory type of a pointer without a device".into(),
            why: "the driver wants a current context".into(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_memory_is_host_and_device_memory_has_its_ordinal() {
        let host = [0u8; 64];
        assert_eq!(
            pointer_kind(host.as_ptr() as u64).unwrap(),
            PointerKind::Host
        );
        let dev = match crate::cuda::open(0) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("skipping the device half: no usable CUDA device ({e})");
                return;
            }
        };
        assert_eq!(
            dev.pointer_kind(host.as_ptr() as u64).unwrap(),
            PointerKind::Host
        );
        let p = dev.alloc(256).unwrap();
        assert_eq!(
            dev.pointer_kind(p.add(100).0).unwrap(),
            PointerKind::Device { ordinal: 0 }
        );
        assert_eq!(
            pointer_kind(p.0).unwrap(),
            PointerKind::Device { ordinal: 0 }
        );
        // SAFETY: allocated above, freed once, unused.
        unsafe { dev.free(p) }.unwrap();
    }
}
