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
    cuMemGetHandleForAddressRange,
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
    cuFlushGPUDirectRDMAWrites,
    cuModuleLoad,
    cuModuleLoadFatBinary,
    cuLinkCreate_v2,
    cuCtxGetFlags,
    cuCtxSetLimit,
    cuCtxGetLimit,
    cuGetProcAddress_v2,
);
