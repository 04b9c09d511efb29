//! `ibv_advise_mr(3)` (issue 36, risk 8: prefetching on-demand
//! registrations). It is an inline function of verbs.h, not an exported
//! symbol: it finds the provider's `advise_mr` in the `struct
//! verbs_context` that ends with the `struct ibv_context` (`verbs_get_ctx`:
//! `abi_compat == UINTPTR_MAX` marks one; `verbs_get_ctx_op`: the op is
//! there where the context's `sz` covers it and the pointer is set), and
//! answers EOPNOTSUPP otherwise. This module does the same. The
//! `verbs_context` "grows up" (new ops go at its start), so the distance
//! from an op to the `ibv_context` is fixed once the op exists.

use std::ffi::{c_int, c_void};

use super::ffi;

/// Pointer-sized fields from `verbs_context.advise_mr` up to
/// `verbs_context.context` (advise_mr, alloc_null_mr, ... close_xrcd,
/// _ABI_placeholder3, sz: rdma-core's libibverbs/verbs.h).
const ADVISE_MR_BEFORE_CONTEXT: usize = 39;

/// `enum ibv_advise_mr_advice`: `IBV_ADVISE_MR_ADVICE_PREFETCH`.
pub(super) const ADVICE_PREFETCH: u32 = 0;

/// `verbs_context.advise_mr`.
pub(super) type AdviseMr = unsafe extern "C" fn(*mut c_void, u32, u32, *mut ffi::Sge, u32) -> c_int;

/// The provider's `advise_mr` for the open context `ctx`, where it has one.
///
/// # Safety
/// `ctx` is an open context returned by `ibv_open_device`.
pub(super) unsafe fn advise_mr_op(ctx: *mut ffi::Context) -> Option<AdviseMr> {
    // SAFETY: `ctx` points at a live `struct ibv_context`; only this field
    // is read.
    if unsafe { std::ptr::addr_of!((*ctx).abi_compat).read() } as usize != usize::MAX {
        return None;
    }
    let word = std::mem::size_of::<usize>();
    let base = ctx.cast::<u8>();
    // SAFETY: an extended context is the last field of its `verbs_context`,
    // whose `sz` (a size_t) lies immediately before it.
    let sz = unsafe { base.sub(word).cast::<usize>().read() };
    // verbs_get_ctx_op: sizeof(verbs_context) - offsetof(op).
    if sz < ADVISE_MR_BEFORE_CONTEXT * word + std::mem::size_of::<ffi::Context>() {
        return None;
    }
    // SAFETY: `sz` says the verbs_context reaches back to `advise_mr`, a
    // nullable function pointer (Option<fn> has its layout).
    unsafe {
        base.sub(ADVISE_MR_BEFORE_CONTEXT * word)
            .cast::<Option<AdviseMr>>()
            .read()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_context_layout_matches_verbs_h() {
        // struct ibv_context on LP64 Linux: device, 32 ops, three ints
        // (padded), a pthread mutex, abi_compat.
        let mutex = std::mem::size_of::<libc::pthread_mutex_t>();
        assert_eq!(
            std::mem::size_of::<ffi::Context>(),
            8 + 32 * 8 + 16 + mutex + 8
        );
        assert_eq!(
            std::mem::offset_of!(ffi::Context, abi_compat),
            8 + 32 * 8 + 16 + mutex
        );
    }

    #[test]
    fn a_context_that_is_not_extended_has_no_advise_mr() {
        let mut ctx = std::mem::MaybeUninit::<ffi::Context>::zeroed();
        // SAFETY: only abi_compat is read (null: not the extended marker),
        // so nothing before the context is.
        assert!(unsafe { advise_mr_op(ctx.as_mut_ptr()) }.is_none());
    }
}
