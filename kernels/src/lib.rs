//! CPU kernels for sncl: element-wise reductions over byte slices for every
//! [`DataType`] × [`ReduceOp`], and the copy used to move data in and out of
//! transport slots.
//!
//! Buffers are byte slices whose length is a multiple of the element size;
//! they need not be aligned. f16 and bf16 are widened to f32 for each
//! reduction step and rounded to nearest even once. Integer sum and product
//! wrap. Results are deterministic: the same inputs always give the same bits.

mod dtype;
pub mod scalar;

pub use dtype::{DataType, ReduceOp};

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
        lens.iter().all(|&l| l == n) && n % dtype.size() == 0,
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
    scalar::reduce_into(dtype, op, dst, a, b)
}

/// `acc[i] = acc[i] op src[i]`. `Avg` reduces as a sum.
///
/// # Panics
/// When the slices differ in length or are not a whole number of elements.
pub fn reduce_inplace(dtype: DataType, op: ReduceOp, acc: &mut [u8], src: &[u8]) {
    check_lengths(dtype, &[acc.len(), src.len()]);
    scalar::reduce_inplace(dtype, op, acc, src)
}

/// `buf[i] /= n` (the final step of `Avg`; integers truncate).
pub fn divide(dtype: DataType, buf: &mut [u8], n: usize) {
    check_lengths(dtype, &[buf.len()]);
    scalar::divide(dtype, buf, n)
}

/// Copies `src` into `dst` (equal lengths).
pub fn copy(dst: &mut [u8], src: &[u8]) {
    dst.copy_from_slice(src);
}
