//! sncl's kernels compiled for the host (the `SNCL_HOST_EMU` shim,
//! kernels/cuda/): their C entry points and the family each kernel name
//! belongs to, which says how its parameters are laid out. Modules look
//! the family up when a function is loaded; launches call the entry points.

use std::ffi::{c_char, c_void, CStr};

extern "C" {
    pub(crate) fn sncl_host_reduce_copy_args_size() -> u64;
    pub(crate) fn sncl_host_reduce_copy(
        name: *const c_char,
        args: *const c_void,
        grid: u32,
        block: u32,
    ) -> i32;
    pub(crate) fn sncl_host_divide(
        name: *const c_char,
        data: *mut c_void,
        count: u64,
        divisor: u64,
        grid: u32,
        block: u32,
    ) -> i32;
    pub(crate) fn sncl_host_direct_args_size() -> u64;
    pub(crate) fn sncl_host_direct_block(
        name: *const c_char,
        args: *const c_void,
        grid: u32,
        block: u32,
        b: u32,
    ) -> i32;
    pub(crate) fn sncl_host_codec_args_size() -> u64;
    pub(crate) fn sncl_host_codec(
        name: *const c_char,
        args: *const c_void,
        grid: u32,
        block: u32,
    ) -> i32;
}

/// Which host entry point runs a kernel (by its name's prefix).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `sncl_reduce_copy_*`: one `SnclReduceCopyArgs` by value.
    ReduceCopy,
    /// `sncl_divide_*`: `(void*, u64, u64)`.
    Divide,
    /// `sncl_direct_all_reduce_*`: one `SnclDirectArgs`; blocks wait on
    /// peers' flags, so each runs on a thread of its own.
    Direct,
    /// `sncl_codec_*`: one `SnclCodecArgs`.
    Codec,
}

impl Family {
    /// The family of kernel `name`, if the host build has the kernel.
    pub fn of(name: &CStr) -> Option<Family> {
        let text = name.to_str().ok()?;
        let fam = if text.starts_with("sncl_reduce_copy_") {
            Family::ReduceCopy
        } else if text.starts_with("sncl_divide_") {
            Family::Divide
        } else if text.starts_with("sncl_direct_all_reduce_") {
            Family::Direct
        } else if text.starts_with("sncl_codec_") {
            Family::Codec
        } else {
            return None;
        };
        // A launch with an empty grid only looks the name up (-1: unknown,
        // -2: known, bad shape); nothing runs.
        let probe = [0u8; 512];
        let p = probe.as_ptr().cast::<c_void>();
        // SAFETY: grid 0 makes every entry point return before it reads
        // the arguments past the name lookup; `probe` is large enough for
        // any argument struct in any case.
        let r = unsafe {
            match fam {
                Family::ReduceCopy => sncl_host_reduce_copy(name.as_ptr(), p, 0, 0),
                Family::Divide => sncl_host_divide(name.as_ptr(), std::ptr::null_mut(), 0, 1, 0, 0),
                Family::Direct => sncl_host_direct_block(name.as_ptr(), p, 0, 0, 0),
                Family::Codec => sncl_host_codec(name.as_ptr(), p, 0, 0),
            }
        };
        (r != -1).then_some(fam)
    }

    /// The bytes of each parameter.
    pub(crate) fn param_sizes(self) -> Vec<usize> {
        // SAFETY: the size queries have no arguments and no effects.
        unsafe {
            match self {
                Family::ReduceCopy => vec![sncl_host_reduce_copy_args_size() as usize],
                Family::Divide => vec![8, 8, 8],
                Family::Direct => vec![sncl_host_direct_args_size() as usize],
                Family::Codec => vec![sncl_host_codec_args_size() as usize],
            }
        }
    }
}
