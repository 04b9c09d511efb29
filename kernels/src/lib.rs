//! CPU kernels for sncl: element-wise reductions over byte slices for every
//! [`DataType`] × [`ReduceOp`], and the copy used to move data in and out of
//! transport slots.
//!
//! Buffers are byte slices whose length is a multiple of the element size;
//! they need not be aligned. f16, bf16 and the fp8 types are widened to f32
//! for each reduction step and rounded to nearest even once (fp8 saturating
//! to its largest finite value, see [`DataType::Float8e4m3`]). Integer sum and product
//! wrap. Results are deterministic: the same inputs always give the same bits.
//!
//! On x86_64 with AVX2 (and F16C for f16) vector kernels are selected once at
//! run time (see [`backend`]); they give bit-identical results to the
//! portable [`scalar`] reference for every non-NaN input. Elsewhere the
//! portable code is used.
//!
//! Large `reduce_into` and `copy` calls (16 MiB and up) write their
//! destination with non-temporal stores, which bypass the cache.

#![warn(missing_docs)]

pub mod cuda;
pub mod cuda_codec;
pub mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(target_arch = "x86_64")]
use x86 as simd;

/// Stand-in for targets without vector kernels: never handles anything.
#[cfg(not(target_arch = "x86_64"))]
mod simd {
    use crate::{DataType, ReduceOp};

    pub(crate) fn backend() -> &'static str {
        "scalar"
    }
    pub(crate) fn reduce_into(_: DataType, _: ReduceOp, _: &mut [u8], _: &[u8], _: &[u8]) -> bool {
        false
    }
    pub(crate) fn reduce_inplace(_: DataType, _: ReduceOp, _: &mut [u8], _: &[u8]) -> bool {
        false
    }
    pub(crate) fn divide(_: DataType, _: &mut [u8], _: usize) -> bool {
        false
    }
    pub(crate) fn copy(_: &mut [u8], _: &[u8]) -> bool {
        false
    }
}

/// The element types and reductions are comm-core's (the kernels serve
/// them; comm-core does not depend on the kernels).
pub use comm_core::{DataType, ReduceOp};
/// The fp8 element types ([`DataType::Float8e4m3`], [`DataType::Float8e5m2`])
/// and their conversions, re-exported so every crate uses the same ones.
pub use float8::{F8E4M3, F8E5M2};

/// Errors of kernel entry points.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KernelError {
    /// The operator is not defined for the type (bitwise ops on floats).
    #[error("reduction {op} is not defined for {dtype}")]
    Unsupported {
        /// The operator.
        op: &'static str,
        /// The type.
        dtype: &'static str,
    },
}

fn check_lengths(dtype: DataType, lens: &[usize]) {
    let n = lens[0];
    assert!(
        lens.iter().all(|&l| l == n) && n.is_multiple_of(dtype.size()),
        "kernel slices must have equal length, a multiple of {} bytes: {lens:?}",
        dtype.size()
    );
}

/// Checks that `op` is defined for `dtype`.
pub fn check_supported(dtype: DataType, op: ReduceOp) -> Result<(), KernelError> {
    if op.supports(dtype) {
        Ok(())
    } else {
        Err(KernelError::Unsupported {
            op: op.name(),
            dtype: dtype.name(),
        })
    }
}

/// `dst[i] = a[i] op b[i]`. `Avg` reduces as a sum; call [`divide`] once at the end.
///
/// # Panics
/// When the slices differ in length or are not a whole number of elements.
pub fn reduce_into(dtype: DataType, op: ReduceOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
    check_lengths(dtype, &[dst.len(), a.len(), b.len()]);
    if !simd::reduce_into(dtype, op, dst, a, b) {
        scalar::reduce_into(dtype, op, dst, a, b)
    }
}

/// `acc[i] = acc[i] op src[i]`. `Avg` reduces as a sum.
///
/// # Panics
/// When the slices differ in length or are not a whole number of elements.
pub fn reduce_inplace(dtype: DataType, op: ReduceOp, acc: &mut [u8], src: &[u8]) {
    check_lengths(dtype, &[acc.len(), src.len()]);
    if !simd::reduce_inplace(dtype, op, acc, src) {
        scalar::reduce_inplace(dtype, op, acc, src)
    }
}

/// `buf[i] /= n` (the final step of `Avg`; integers truncate).
pub fn divide(dtype: DataType, buf: &mut [u8], n: usize) {
    check_lengths(dtype, &[buf.len()]);
    if !simd::divide(dtype, buf, n) {
        scalar::divide(dtype, buf, n)
    }
}

/// Name of the instruction sets the kernels use on this CPU: `"avx2+f16c"`,
/// `"avx2"` (f16 then runs the portable code) or `"scalar"`.
pub fn backend() -> &'static str {
    simd::backend()
}

/// Copies `src` into `dst` (equal lengths).
pub fn copy(dst: &mut [u8], src: &[u8]) {
    if !simd::copy(dst, src) {
        dst.copy_from_slice(src);
    }
}
