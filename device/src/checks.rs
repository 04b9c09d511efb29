//! Argument checks every backend makes before it enqueues a kernel, so
//! both answer bad input with the same error.

use kernels::{DataType, ReduceOp};

use crate::{DeviceError, Result, MAX_REDUCE_ARGS};

/// Checks a [`crate::Device::reduce_copy`]: 1 to [`MAX_REDUCE_ARGS`]
/// sources and destinations, and an op defined for the dtype. Returns the
/// kernel's name.
pub(crate) fn reduce_copy_args(
    ordinal: usize,
    sources: usize,
    destinations: usize,
    dtype: DataType,
    op: ReduceOp,
) -> Result<String> {
    let invalid = |detail: String| DeviceError::InvalidArgument {
        ordinal,
        call: "reduce_copy",
        detail,
    };
    for (what, n) in [("sources", sources), ("destinations", destinations)] {
        if !(1..=MAX_REDUCE_ARGS).contains(&n) {
            return Err(invalid(format!(
                "{n} {what}; expected 1 to {MAX_REDUCE_ARGS}"
            )));
        }
    }
    kernels::cuda::reduce_copy_kernel(dtype, op).ok_or_else(|| {
        invalid(format!(
            "reduction {} is not defined for {} (no kernel)",
            op.name(),
            dtype.name()
        ))
    })
}

/// Checks a [`crate::Device::divide`]'s divisor (at least 1).
pub(crate) fn divisor(ordinal: usize, divisor: usize) -> Result<()> {
    if divisor == 0 {
        return Err(DeviceError::InvalidArgument {
            ordinal,
            call: "divide",
            detail: "divisor 0; expected at least 1".into(),
        });
    }
    Ok(())
}
