//! Driver symbols the model exports but does not model: each answers
//! `CUDA_ERROR_NOT_SUPPORTED` and logs its name once, so a program that
//! probes for them learns so instead of crashing on a missing symbol.
//! (Called with whatever arguments the caller passes: the x86-64 C calling
//! convention lets a callee ignore its arguments.)

use std::sync::atomic::{AtomicBool, Ordering};

use crate::CUresult;

macro_rules! unsupported {
    ($($name:ident),* $(,)?) => {
        $(
            #[no_mangle]
            pub extern "C" fn $name() -> CUresult {
                static SAID: AtomicBool = AtomicBool::new(false);
                if !SAID.swap(true, Ordering::Relaxed) {
                    crate::log_line(concat!(stringify!($name), " is not modelled: CUDA_ERROR_NOT_SUPPORTED"));
                }
                crate::report::call(stringify!($name), CUresult::CUDA_ERROR_NOT_SUPPORTED);
                CUresult::CUDA_ERROR_NOT_SUPPORTED
            }
        )*
        /// The names of the unsupported symbols.
        pub const UNSUPPORTED: &[&str] = &[$(stringify!($name)),*];
    };
}

unsupported!(
    cuMemAllocAsync,
    cuMemFreeAsync,
    cuMemAllocManaged,
    cuMemAllocPitch_v2,
    cuMemCreate,
    cuMemRelease,
    cuMemMap,
    cuMemUnmap,
    cuMemSetAccess,
    cuMemAddressReserve,
    cuMemAddressFree,
    cuMemExportToShareableHandle,
    cuMemImportFromShareableHandle,
    cuMemPoolCreate,
    cuMemPrefetchAsync,
    cuMemAdvise,
    cuLaunchKernelEx,
    cuStreamAddCallback,
    cuStreamBatchMemOp_v2,
    cuGraphCreate,
    cuGraphAddKernelNode_v2,
    cuGraphExecUpdate_v2,
    cuGraphicsMapResources,
    cuModuleLoad,
    cuModuleLoadFatBinary,
    cuLinkCreate_v2,
    cuCtxGetFlags,
    cuCtxSetLimit,
    cuCtxGetLimit,
    cuGetProcAddress_v2,
);

/// `cuGetExportTable` (undocumented; NVRTC 13 looks it up in whatever
/// `libcuda.so.1` the loader finds, and dereferences the table it gets
/// without checking): no table, `CUDA_ERROR_NOT_SUPPORTED`, logged once.
/// Without this symbol NVRTC compiled small kernels but crashed on
/// sncl's (a null dereference in `nvrtcCompileProgram`) whenever the model
/// was on the loader's path.
///
/// # Safety
/// `table` is null or points at writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn cuGetExportTable(
    table: *mut *const std::ffi::c_void,
    _id: *const std::ffi::c_void,
) -> CUresult {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        crate::log_line("cuGetExportTable is not modelled: CUDA_ERROR_NOT_SUPPORTED");
    }
    if !table.is_null() {
        // SAFETY: the caller's contract: storage for one pointer.
        unsafe { *table = std::ptr::null() };
    }
    crate::report::call("cuGetExportTable", CUresult::CUDA_ERROR_NOT_SUPPORTED);
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
