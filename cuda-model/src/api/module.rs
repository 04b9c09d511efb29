//! Module, function and launch entry points.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use super::{h, out, ptr, run};
use crate::config::Loading;
use crate::{config, launch, module, CUresult};

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(m: *mut *mut c_void, image: *const c_void) -> CUresult {
    run("cuModuleLoadData", || {
        if m.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the driver's contract: `image` is a CUBIN or PTX.
        out(m, ptr(unsafe { module::load_data(image as *const u8)? }))
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    m: *mut *mut c_void,
    image: *const c_void,
    _n: c_uint,
    _options: *mut c_int,
    _values: *mut *mut c_void,
) -> CUresult {
    cuModuleLoadData(m, image)
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    f: *mut *mut c_void,
    m: *mut c_void,
    name: *const c_char,
) -> CUresult {
    run("cuModuleGetFunction", || {
        if name.is_null() || f.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a NUL-terminated name from the caller.
        let n = unsafe { CStr::from_ptr(name) };
        out(f, ptr(module::get_function(h(m), n)?))
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuModuleUnload(m: *mut c_void) -> CUresult {
    run("cuModuleUnload", || module::unload(h(m)))
}

/// `CU_MODULE_LAZY_LOADING` = 1, `CU_MODULE_EAGER_LOADING` = 2... as
/// cuda.h numbers `CUmoduleLoadingMode`: EAGER 0x1, LAZY 0x2.
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetLoadingMode(mode: *mut c_uint) -> CUresult {
    run("cuModuleGetLoadingMode", || {
        out(
            mode,
            match config::get().loading {
                Loading::Eager => 1,
                Loading::Lazy => 2,
            },
        )
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLaunchKernel(
    f: *mut c_void,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    s: *mut c_void,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    run("cuLaunchKernel", || {
        // SAFETY: the driver's contract for kernelParams.
        unsafe {
            launch::launch(
                h(f),
                [gx, gy, gz],
                [bx, by, bz],
                shared,
                h(s),
                params,
                extra,
                false,
            )
        }
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLaunchCooperativeKernel(
    f: *mut c_void,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    s: *mut c_void,
    params: *mut *mut c_void,
) -> CUresult {
    run("cuLaunchCooperativeKernel", || {
        // SAFETY: the driver's contract for kernelParams.
        unsafe {
            launch::launch(
                h(f),
                [gx, gy, gz],
                [bx, by, bz],
                shared,
                h(s),
                params,
                std::ptr::null_mut(),
                true,
            )
        }
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    n: *mut c_int,
    f: *mut c_void,
    block: c_int,
    _shared: usize,
) -> CUresult {
    run("cuOccupancyMaxActiveBlocksPerMultiprocessor", || {
        module::FUNCTIONS.get(h(f))?;
        if !(1..=1024).contains(&block) {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let per_sm = launch::resident_blocks(block as u32) / u64::from(config::get().sms);
        out(n, per_sm as c_int)
    })
}

/// The driver API entry point of this name (see the CUDA Driver API
/// reference).
///
/// # Safety
/// Pointer arguments follow that call's contract in the driver API.
#[no_mangle]
pub unsafe extern "C" fn cuFuncGetAttribute(
    v: *mut c_int,
    attr: c_int,
    f: *mut c_void,
) -> CUresult {
    run("cuFuncGetAttribute", || {
        module::FUNCTIONS.get(h(f))?;
        // CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0; the rest 0.
        out(v, if attr == 0 { 1024 } else { 0 })
    })
}
