//! sncl's device kernels (the CUDA C++ in `kernels/cuda/`) compiled for the
//! host with the `SNCL_HOST_EMU` shim by `kernels/build.rs` (feature `host`), so the emulated
//! device runs the very sources a GPU runs, looked up by the same kernel
//! names ([`kernels::cuda::reduce_copy_kernel`], [`kernels::cuda::divide_kernel`]).
//!
//! A launch runs every thread of a `grid` × `block` shape one after the other
//! on the calling thread; the kernels are grid-stride loops, so any shape
//! gives the same bits. [`reduce_copy_with_shape`] and [`divide_with_shape`]
//! choose the shape (tests use them to cover several); the crate-internal
//! `reduce_copy` and `divide` pick one with [`LaunchShape::for_count`].

use kernels::{cuda, DataType, ReduceOp};

use crate::MAX_REDUCE_ARGS;

/// Why a host kernel launch was refused. Nothing is written then.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HostKernelError {
    /// The dtype/op pair has no kernel (a bitwise op on a float type).
    #[error("host kernels: reduce-copy {op} is not defined for {dtype}")]
    Unsupported {
        /// The element type.
        dtype: &'static str,
        /// The operator.
        op: &'static str,
    },
    /// An argument was out of range.
    #[error("host kernels: invalid argument to {call}: {detail}")]
    InvalidArgument {
        /// `reduce_copy` or `divide`.
        call: &'static str,
        /// What was wrong and what was expected.
        detail: String,
    },
    /// The C++ compiler laid out `SnclReduceCopyArgs` differently from the
    /// Rust side (a build problem; nothing can be launched).
    #[error("host kernels: {what} is {c} bytes in C++ but {rust} in Rust")]
    AbiMismatch {
        /// The struct (`SnclReduceCopyArgs`, `SnclDirectArgs`).
        what: &'static str,
        /// The C++ size.
        c: u64,
        /// The Rust size.
        rust: usize,
    },
    /// The host build does not have the kernel the name table promises, or
    /// refused the launch (a build mismatch between the Rust and C++ sides).
    #[error("host kernels: launching {kernel} failed with status {status} (-1: no such kernel, -2: bad launch)")]
    Launch {
        /// The kernel's name.
        kernel: String,
        /// The C side's status.
        status: i32,
    },
}

/// A launch shape: `grid` blocks of `block` threads (both at least 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchShape {
    /// Blocks in the grid.
    pub grid: u32,
    /// Threads per block.
    pub block: u32,
}

impl LaunchShape {
    /// The most blocks [`LaunchShape::for_count`] asks for on the host
    /// (every thread runs sequentially, so more only costs time).
    pub const MAX_HOST_GRID: u32 = 16;

    /// The shape the emulated device uses for `count` elements of `dtype`:
    /// [`cuda::BLOCK_THREADS`] threads a block, about one thread per 16-byte
    /// pack, at most [`LaunchShape::MAX_HOST_GRID`] blocks.
    pub fn for_count(dtype: DataType, count: usize) -> LaunchShape {
        let packs = count.saturating_mul(dtype.size()).div_ceil(16);
        let block = cuda::BLOCK_THREADS;
        let grid = packs
            .div_ceil(block as usize)
            .clamp(1, Self::MAX_HOST_GRID as usize) as u32;
        LaunchShape { grid, block }
    }
}

fn check_shape(call: &'static str, shape: LaunchShape) -> Result<(), HostKernelError> {
    if shape.grid == 0 || shape.block == 0 {
        return Err(HostKernelError::InvalidArgument {
            call,
            detail: format!(
                "launch shape {}x{}: expected at least one block of at least one thread",
                shape.grid, shape.block
            ),
        });
    }
    Ok(())
}

/// Runs `dsts[j][i] = srcs[0][i] op srcs[1][i] op ...` for `i < count` and
/// every destination `j` with the host-compiled device kernel, launched as
/// `shape`. The fold is left to right with the CPU kernels' rounding (see
/// `Device::reduce_copy`); `Avg` runs the sum kernel.
///
/// # Errors
/// [`HostKernelError`] for a dtype/op pair without a kernel, 0 or more than
/// [`MAX_REDUCE_ARGS`] sources or destinations, or an empty shape.
///
/// # Safety
/// Every pointer is valid for `count` elements of `dtype` (reads for
/// sources, writes for destinations) for the whole call; a destination may
/// equal a source but must not otherwise overlap any other buffer.
pub unsafe fn reduce_copy_with_shape(
    dtype: DataType,
    op: ReduceOp,
    srcs: &[*const u8],
    dsts: &[*mut u8],
    count: usize,
    shape: LaunchShape,
) -> Result<(), HostKernelError> {
    const CALL: &str = "reduce_copy";
    let Some(kernel) = cuda::reduce_copy_kernel(dtype, op) else {
        return Err(HostKernelError::Unsupported {
            dtype: dtype.name(),
            op: op.name(),
        });
    };
    for (what, n) in [("sources", srcs.len()), ("destinations", dsts.len())] {
        if !(1..=MAX_REDUCE_ARGS).contains(&n) {
            return Err(HostKernelError::InvalidArgument {
                call: CALL,
                detail: format!("{n} {what}: expected 1 to {MAX_REDUCE_ARGS}"),
            });
        }
    }
    check_shape(CALL, shape)?;
    ffi::check_abi()?;
    let mut args = ffi::ReduceCopyArgs {
        srcs: [std::ptr::null(); MAX_REDUCE_ARGS],
        dsts: [std::ptr::null_mut(); MAX_REDUCE_ARGS],
        count: count as u64,
        nsrcs: srcs.len() as i32,
        ndsts: dsts.len() as i32,
    };
    for (slot, &p) in args.srcs.iter_mut().zip(srcs) {
        *slot = p.cast();
    }
    for (slot, &p) in args.dsts.iter_mut().zip(dsts) {
        *slot = p.cast();
    }
    // SAFETY: the caller guarantees every pointer covers `count` elements
    // of `dtype` (the kernel's element type, named from the same table);
    // nsrcs/ndsts and the shape were checked above.
    let status = unsafe { ffi::reduce_copy(&kernel, &args, shape) };
    if status != 0 {
        return Err(HostKernelError::Launch { kernel, status });
    }
    Ok(())
}

/// Runs `data[i] /= divisor` for `i < count` (the last step of `Avg`; as
/// the CPU's `kernels::divide`: integers truncate) with the host-compiled
/// device kernel, launched as `shape`.
///
/// # Errors
/// [`HostKernelError`] for a divisor of 0 or an empty shape.
///
/// # Safety
/// `data` is valid for reads and writes of `count` elements of `dtype` for
/// the whole call.
pub unsafe fn divide_with_shape(
    dtype: DataType,
    data: *mut u8,
    count: usize,
    divisor: usize,
    shape: LaunchShape,
) -> Result<(), HostKernelError> {
    const CALL: &str = "divide";
    if divisor == 0 {
        return Err(HostKernelError::InvalidArgument {
            call: CALL,
            detail: "divisor 0: expected the number of ranks, at least 1".into(),
        });
    }
    check_shape(CALL, shape)?;
    let kernel = cuda::divide_kernel(dtype);
    // SAFETY: the caller guarantees `data` covers `count` elements of
    // `dtype`, the kernel's element type; the shape was checked above.
    let status = unsafe { ffi::divide(&kernel, data, count as u64, divisor as u64, shape) };
    if status != 0 {
        return Err(HostKernelError::Launch { kernel, status });
    }
    Ok(())
}

/// [`reduce_copy_with_shape`] with the shape of [`LaunchShape::for_count`],
/// for the emulated device. Bad arguments (which the emulator rejects
/// before enqueueing) are logged and nothing is written.
///
/// # Safety
/// As for [`reduce_copy_with_shape`].
// Called by the emulated device (emu/mod.rs); until that is merged only
// the tests call the shaped versions.
pub(crate) unsafe fn reduce_copy(
    dtype: DataType,
    op: ReduceOp,
    srcs: &[*const u8],
    dsts: &[*mut u8],
    count: usize,
) {
    let shape = LaunchShape::for_count(dtype, count);
    // SAFETY: forwarded from the caller.
    if let Err(e) = unsafe { reduce_copy_with_shape(dtype, op, srcs, dsts, count, shape) } {
        tracing::error!(error = %e, "emulated reduce-copy not run");
    }
}

/// [`divide_with_shape`] with the shape of [`LaunchShape::for_count`], for
/// the emulated device. Bad arguments are logged and nothing is written.
///
/// # Safety
/// As for [`divide_with_shape`].
// Called by the emulated device (emu/mod.rs); until that is merged only
// the tests call the shaped versions.
pub(crate) unsafe fn divide(dtype: DataType, data: *mut u8, count: usize, divisor: usize) {
    let shape = LaunchShape::for_count(dtype, count);
    // SAFETY: forwarded from the caller.
    if let Err(e) = unsafe { divide_with_shape(dtype, data, count, divisor, shape) } {
        tracing::error!(error = %e, "emulated divide not run");
    }
}

/// Runs this rank's direct all-reduce kernel `kernel` (named by
/// [`cuda::direct_kernel`]) over `grid` blocks of [`cuda::BLOCK_THREADS`]
/// with `args` holding host addresses. It returns when every peer process
/// has done its share, or when the control block's abort word is set.
///
/// # Safety
/// Every address in `args` is valid host memory of the sizes the kernel
/// uses (checked by the emulated device against its allocations) for the
/// whole call.
pub(crate) unsafe fn direct(
    kernel: &str,
    args: &crate::direct::DirectArgs,
    grid: u32,
) -> Result<(), HostKernelError> {
    ffi::check_direct_abi()?;
    // SAFETY: forwarded from the caller.
    let status = unsafe { ffi::direct(kernel, args, grid) };
    if status != 0 {
        return Err(HostKernelError::Launch {
            kernel: kernel.to_string(),
            status,
        });
    }
    Ok(())
}

/// The C entry points of `kernels/cuda/sncl_host_launch.cpp`.
mod ffi {
    use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CString};

    use std::sync::OnceLock;

    use super::{cuda, HostKernelError, LaunchShape};
    use crate::MAX_REDUCE_ARGS;

    /// `SnclReduceCopyArgs` of `kernels/cuda/sncl_reduce.cu`.
    #[repr(C)]
    pub(super) struct ReduceCopyArgs {
        pub(super) srcs: [*const c_void; MAX_REDUCE_ARGS],
        pub(super) dsts: [*mut c_void; MAX_REDUCE_ARGS],
        pub(super) count: u64,
        pub(super) nsrcs: i32,
        pub(super) ndsts: i32,
    }

    // The ABI's size (144 bytes); the C side's is checked by `check_abi`.
    const _: () = assert!(std::mem::size_of::<ReduceCopyArgs>() == 144);

    extern "C" {
        fn sncl_host_reduce_copy_args_size() -> c_ulonglong;
        fn sncl_host_reduce_copy(
            name: *const c_char,
            args: *const ReduceCopyArgs,
            grid: c_uint,
            block: c_uint,
        ) -> c_int;
        fn sncl_host_divide(
            name: *const c_char,
            data: *mut c_void,
            count: c_ulonglong,
            divisor: c_ulonglong,
            grid: c_uint,
            block: c_uint,
        ) -> c_int;
    }

    extern "C" {
        fn sncl_host_direct_args_size() -> c_ulonglong;
        fn sncl_host_direct(
            name: *const c_char,
            args: *const crate::direct::DirectArgs,
            grid: c_uint,
            block: c_uint,
        ) -> c_int;
    }

    /// Checks (once) that the C++ side's `SnclDirectArgs` has the Rust
    /// side's size.
    pub(super) fn check_direct_abi() -> Result<(), HostKernelError> {
        static C_SIZE: OnceLock<u64> = OnceLock::new();
        // SAFETY: a pure function of the C side with no arguments.
        let c = *C_SIZE.get_or_init(|| unsafe { sncl_host_direct_args_size() });
        let rust = crate::direct::DIRECT_ARGS_BYTES;
        if c != rust as u64 {
            return Err(HostKernelError::AbiMismatch {
                what: "SnclDirectArgs",
                c,
                rust,
            });
        }
        Ok(())
    }

    /// Runs direct kernel `name`; the C status (0 = ran).
    ///
    /// # Safety
    /// As for [`super::direct`].
    pub(super) unsafe fn direct(name: &str, args: &crate::direct::DirectArgs, grid: u32) -> i32 {
        let name = c_name(name);
        // SAFETY: `name` is NUL-terminated and outlives the call; the
        // caller vouches for the addresses in `args`; the C side copies
        // `args` and keeps no pointer after it returns.
        unsafe { sncl_host_direct(name.as_ptr(), args, grid, cuda::BLOCK_THREADS) }
    }

    fn c_name(name: &str) -> CString {
        // Kernel names are built from fixed ASCII identifiers.
        CString::new(name).unwrap_or_default()
    }

    /// Checks (once) that the C++ side's `SnclReduceCopyArgs` has the Rust
    /// side's size.
    pub(super) fn check_abi() -> Result<(), HostKernelError> {
        static C_SIZE: OnceLock<u64> = OnceLock::new();
        // SAFETY: a pure function of the C side with no arguments.
        let c = *C_SIZE.get_or_init(|| unsafe { sncl_host_reduce_copy_args_size() });
        let rust = std::mem::size_of::<ReduceCopyArgs>();
        if c != rust as u64 {
            return Err(HostKernelError::AbiMismatch {
                what: "SnclReduceCopyArgs",
                c,
                rust,
            });
        }
        Ok(())
    }

    /// Runs reduce-copy kernel `name`; the C status (0 = ran).
    ///
    /// # Safety
    /// `args` holds `nsrcs` readable and `ndsts` writable pointers of
    /// `count` elements of the kernel's type.
    pub(super) unsafe fn reduce_copy(name: &str, args: &ReduceCopyArgs, shape: LaunchShape) -> i32 {
        let name = c_name(name);
        // SAFETY: `name` is NUL-terminated and outlives the call; `args` is
        // a valid ReduceCopyArgs whose pointers the caller vouches for. The
        // C side copies `args` before launching and keeps no pointer.
        unsafe { sncl_host_reduce_copy(name.as_ptr(), args, shape.grid, shape.block) }
    }

    /// Runs divide kernel `name`; the C status (0 = ran).
    ///
    /// # Safety
    /// `data` is readable and writable for `count` elements of the
    /// kernel's type.
    pub(super) unsafe fn divide(
        name: &str,
        data: *mut u8,
        count: u64,
        divisor: u64,
        shape: LaunchShape,
    ) -> i32 {
        let name = c_name(name);
        // SAFETY: `name` is NUL-terminated and outlives the call; the
        // caller vouches for `data`; the C side keeps no pointer.
        unsafe {
            sncl_host_divide(
                name.as_ptr(),
                data.cast(),
                count,
                divisor,
                shape.grid,
                shape.block,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_layout_matches_the_cpp_side() {
        assert_eq!(ffi::check_abi(), Ok(()));
        assert_eq!(ffi::check_direct_abi(), Ok(()));
    }

    #[test]
    fn every_named_kernel_is_in_the_host_build() {
        let mut buf = [0u8; 16];
        for (dtype, op, name) in cuda::reduce_copy_kernels() {
            let p = buf.as_mut_ptr();
            // SAFETY: 16 bytes hold one element of any dtype.
            let r = unsafe {
                reduce_copy_with_shape(
                    dtype,
                    op,
                    &[p as *const u8],
                    &[p],
                    1,
                    LaunchShape { grid: 1, block: 1 },
                )
            };
            assert_eq!(r, Ok(()), "{name}");
        }
        for dtype in DataType::ALL {
            // SAFETY: as above.
            let r = unsafe {
                divide_with_shape(
                    dtype,
                    buf.as_mut_ptr(),
                    1,
                    3,
                    LaunchShape { grid: 1, block: 1 },
                )
            };
            assert_eq!(r, Ok(()), "{}", cuda::divide_kernel(dtype));
        }
    }

    #[test]
    fn bad_arguments_are_errors() {
        let mut buf = [0u8; 16];
        let p = buf.as_mut_ptr();
        let one = LaunchShape { grid: 1, block: 1 };
        // SAFETY: every call is refused before any pointer is used.
        unsafe {
            assert!(matches!(
                reduce_copy_with_shape(
                    DataType::Float32,
                    ReduceOp::BitXor,
                    &[p as *const u8],
                    &[p],
                    1,
                    one
                ),
                Err(HostKernelError::Unsupported { .. })
            ));
            assert!(
                reduce_copy_with_shape(DataType::Int8, ReduceOp::Sum, &[], &[p], 1, one).is_err()
            );
            assert!(reduce_copy_with_shape(
                DataType::Int8,
                ReduceOp::Sum,
                &[p as *const u8; 9],
                &[p],
                1,
                one
            )
            .is_err());
            assert!(reduce_copy_with_shape(
                DataType::Int8,
                ReduceOp::Sum,
                &[p as *const u8],
                &[],
                1,
                one
            )
            .is_err());
            assert!(reduce_copy_with_shape(
                DataType::Int8,
                ReduceOp::Sum,
                &[p as *const u8],
                &[p],
                1,
                LaunchShape { grid: 0, block: 1 }
            )
            .is_err());
            assert!(divide_with_shape(DataType::Int8, p, 1, 0, one).is_err());
            assert!(
                divide_with_shape(DataType::Int8, p, 1, 2, LaunchShape { grid: 1, block: 0 })
                    .is_err()
            );
        }
    }
}
