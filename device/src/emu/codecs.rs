//! sncl's codec kernels (`kernels/cuda/sncl_codec.cu`) compiled for the host
//! with the `SNCL_HOST_EMU` shim by `kernels/build.rs` (feature `host`): the emulated device
//! runs the launch plans of [`kernels::cuda_codec`] with them, and tests
//! call [`run_plan`] directly on host memory to compare against the
//! `compress` crate under several launch shapes.

use kernels::cuda_codec::{CodecArgs, Items, Launch};

use super::hostkernels::{HostKernelError, LaunchShape};

/// How a plan's launches are shaped: `threads` per block and at most
/// `max_grid` blocks (about one thread per work item below that).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanShape {
    /// Threads per block (at least 1).
    pub threads: u32,
    /// The most blocks of one launch (at least 1).
    pub max_grid: u32,
}

impl PlanShape {
    /// The emulated device's shape: 256 threads, at most 16 blocks.
    pub const EMU: PlanShape = PlanShape {
        threads: kernels::cuda::BLOCK_THREADS,
        max_grid: LaunchShape::MAX_HOST_GRID,
    };

    /// The launch shape for `items`.
    pub fn shape(&self, items: Items) -> LaunchShape {
        match items {
            Items::Single => LaunchShape { grid: 1, block: 1 },
            Items::Many(m) => LaunchShape {
                grid: m
                    .div_ceil(u64::from(self.threads.max(1)))
                    .clamp(1, u64::from(self.max_grid.max(1))) as u32,
                block: self.threads.max(1),
            },
        }
    }
}

/// Runs `launches` in order on this thread with the host-compiled kernels.
///
/// # Errors
/// [`HostKernelError`] when the C++ side's argument struct has another size,
/// a kernel is unknown or a launch is refused (a build mismatch); launches
/// before it have run.
///
/// # Safety
/// Every address in the launches' arguments is host memory valid for what
/// the plan does with it (see `kernels::cuda_codec`) for the whole call.
pub unsafe fn run_plan(launches: &[Launch], shape: PlanShape) -> Result<(), HostKernelError> {
    ffi::check_abi()?;
    for l in launches {
        let s = shape.shape(l.items);
        // SAFETY: forwarded from the caller; the shape is non-empty.
        let status = unsafe { ffi::codec(&l.kernel, &l.args, s) };
        if status != 0 {
            return Err(HostKernelError::Launch {
                kernel: l.kernel.clone(),
                status,
            });
        }
    }
    Ok(())
}

/// The C entry points of `kernels/cuda/sncl_host_codec.cpp`.
mod ffi {
    use std::ffi::{c_char, c_int, c_uint, c_ulonglong, CString};
    use std::sync::OnceLock;

    use super::{CodecArgs, HostKernelError, LaunchShape};

    extern "C" {
        fn sncl_host_codec_args_size() -> c_ulonglong;
        fn sncl_host_codec(
            name: *const c_char,
            args: *const CodecArgs,
            grid: c_uint,
            block: c_uint,
        ) -> c_int;
    }

    /// Checks (once) that the C++ `SnclCodecArgs` has the Rust size.
    pub(super) fn check_abi() -> Result<(), HostKernelError> {
        static C_SIZE: OnceLock<u64> = OnceLock::new();
        // SAFETY: a pure function of the C side with no arguments.
        let c = *C_SIZE.get_or_init(|| unsafe { sncl_host_codec_args_size() });
        let rust = std::mem::size_of::<CodecArgs>();
        if c != rust as u64 {
            return Err(HostKernelError::AbiMismatch {
                what: "SnclCodecArgs",
                c,
                rust,
            });
        }
        Ok(())
    }

    /// Runs codec kernel `name`; the C status (0 = ran).
    ///
    /// # Safety
    /// The addresses in `args` are valid for the kernel.
    pub(super) unsafe fn codec(name: &str, args: &CodecArgs, shape: LaunchShape) -> i32 {
        // Kernel names are built from fixed ASCII identifiers.
        let name = CString::new(name).unwrap_or_default();
        // SAFETY: `name` is NUL-terminated and outlives the call; the caller
        // vouches for the addresses in `args`; the C side copies `args`
        // before launching and keeps no pointer.
        unsafe { sncl_host_codec(name.as_ptr(), args, shape.grid, shape.block) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_layout_matches_the_cpp_side() {
        assert_eq!(ffi::check_abi(), Ok(()));
    }

    #[test]
    fn every_named_kernel_is_in_the_host_build() {
        for name in kernels::cuda_codec::kernel_names() {
            // n = 0: every kernel returns without touching memory except
            // the single ones, which get a workspace.
            // The top-k state and histogram copies (n = 0: nothing else).
            let mut work = vec![0u64; 16 + 256 * kernels::cuda_codec::TOPK_HCOPIES as usize];
            let mut hdr = [0u8; 8];
            let args = CodecArgs {
                work: work.as_mut_ptr() as u64,
                dst: hdr.as_mut_ptr() as u64,
                src: [hdr.as_ptr() as u64; 8],
                param: 1,
                nsrcs: 1,
                ..Default::default()
            };
            let l = Launch {
                kernel: name.clone(),
                args,
                items: Items::Many(0),
            };
            // SAFETY: n = 0; the workspace and header cover the single
            // kernels' accesses (state, histogram, a 4-byte header).
            let r = unsafe { run_plan(&[l], PlanShape::EMU) };
            assert_eq!(r, Ok(()), "{name}");
        }
    }

    #[test]
    fn block_kernels_refuse_more_threads_than_their_shared_arrays() {
        let too_many = PlanShape {
            threads: kernels::cuda_codec::BLOCK_KERNEL_THREADS + 1,
            max_grid: 1,
        };
        let mut src = [1.0f32; 4];
        let mut dst = [0u8; 8];
        let l = Launch {
            kernel: "sncl_codec_int8_encode".into(),
            args: CodecArgs {
                src: [src.as_mut_ptr() as u64; 8],
                dst: dst.as_mut_ptr() as u64,
                n: 4,
                param: 4,
                nsrcs: 1,
                ..Default::default()
            },
            items: Items::Many(4),
        };
        // SAFETY: refused before anything runs (and the buffers would fit).
        let r = unsafe { run_plan(std::slice::from_ref(&l), too_many) };
        assert!(matches!(r, Err(HostKernelError::Launch { status: -2, .. })));
        // SAFETY: 4 f32 in, 4 + 4 bytes out.
        let r = unsafe { run_plan(&[l], PlanShape::EMU) };
        assert_eq!(r, Ok(()));
        assert_eq!(&dst[4..], &[127, 127, 127, 127]);
        assert_eq!(&dst[..4], &(1.0f32 / 127.0).to_le_bytes());
    }

    #[test]
    fn unknown_kernel_is_an_error() {
        let l = Launch {
            kernel: "sncl_codec_nope".into(),
            args: CodecArgs {
                nsrcs: 1,
                ..Default::default()
            },
            items: Items::Single,
        };
        // SAFETY: refused before anything runs.
        let r = unsafe { run_plan(&[l], PlanShape::EMU) };
        assert!(matches!(r, Err(HostKernelError::Launch { status: -1, .. })));
    }
}
