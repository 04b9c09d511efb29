//! The emulated device's kernels, with the signature of the `.cu` kernels
//! compiled for the host.
//!
//! TEMPORARY: this version folds with the CPU `kernels` crate; it is replaced
//! at merge by the `.cu` sources compiled for the host (`-DSNCL_HOST_EMU`).
//! Both give results bit-identical to successive `kernels::reduce_into`
//! calls (left-to-right fold, rounding after every step).

use kernels::{DataType, ReduceOp};

/// Elements per step: the accumulator of one step stays in cache, and a
/// destination equal to a source is only written after the step has read it.
const CHUNK_BYTES: usize = 64 * 1024;

/// `dsts[j][i] = srcs[0][i] op srcs[1][i] op ...` for `i < count`.
///
/// # Safety
/// `op` supports `dtype`; 1 to 8 sources and destinations; every pointer is
/// valid for `count` elements of `dtype`; a destination either equals a
/// source or overlaps no source and no other destination; nothing else
/// accesses these ranges during the call.
pub(crate) unsafe fn reduce_copy(
    dtype: DataType,
    op: ReduceOp,
    srcs: &[*const u8],
    dsts: &[*mut u8],
    count: usize,
) {
    let size = dtype.size();
    let total = count * size;
    if total == 0 || srcs.is_empty() {
        return;
    }
    let chunk = CHUNK_BYTES / size * size;
    let mut acc = vec![0u8; chunk.min(total)];
    let mut tmp = vec![0u8; chunk.min(total)];
    let mut at = 0;
    while at < total {
        let n = chunk.min(total - at);
        let acc = &mut acc[..n];
        {
            // SAFETY: the caller guarantees each source is valid for `total`
            // bytes and that nothing writes them during this read phase (a
            // destination equal to a source is written only below).
            let src = |k: usize| unsafe { std::slice::from_raw_parts(srcs[k].add(at), n) };
            if srcs.len() == 1 {
                kernels::copy(acc, src(0));
            } else {
                kernels::reduce_into(dtype, op, acc, src(0), src(1));
                for k in 2..srcs.len() {
                    let tmp = &mut tmp[..n];
                    kernels::reduce_into(dtype, op, tmp, acc, src(k));
                    acc.copy_from_slice(tmp);
                }
            }
        }
        for &dst in dsts {
            // SAFETY: each destination is valid for `total` bytes and no
            // source slice of this step is alive any more.
            let dst = unsafe { std::slice::from_raw_parts_mut(dst.add(at), n) };
            kernels::copy(dst, acc);
        }
        at += n;
    }
}

/// `data[i] /= divisor` for `i < count` (integers truncate).
///
/// # Safety
/// `data` is valid for `count` elements of `dtype`, accessed by nothing
/// else during the call; `divisor` is not zero.
pub(crate) unsafe fn divide(dtype: DataType, data: *mut u8, count: usize, divisor: usize) {
    let total = count * dtype.size();
    if total == 0 {
        return;
    }
    // SAFETY: the caller guarantees `data` is valid for `total` bytes and
    // exclusively ours during the call.
    let buf = unsafe { std::slice::from_raw_parts_mut(data, total) };
    kernels::divide(dtype, buf, divisor);
}
