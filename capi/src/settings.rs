//! `snclGetSetting`: the settings of sncl's table, for C and C++ callers
//! (the PyTorch backend) that must not read the environment themselves.

use std::ffi::{c_char, c_int, CStr};

use comm_core::settings::{lookup, Environment};
use sncl_bootstrap::ReadEnvironment;

use super::error::{guard, CError};
use super::types::snclResult_t;

/// Writes the value of setting `name` (an `SNCL_*` variable declared in
/// sncl's settings table; `commbench --help-env` lists them), as the
/// environment or else the settings file gives it, into `value`: at most
/// `size` bytes including the terminating NUL. `*isSet` becomes 1 when the
/// setting is set (even to an empty value), else 0 and `value` the empty
/// string. An undeclared name, a value that does not fit and an unreadable
/// settings file are `snclInvalidArgument` errors (see `snclGetLastError`).
///
/// # Safety
/// `name` is a NUL-terminated string; `value` points to `size` writable
/// bytes; `isSet` points to a writable int.
#[no_mangle]
pub unsafe extern "C" fn snclGetSetting(
    name: *const c_char,
    value: *mut c_char,
    size: usize,
    isSet: *mut c_int,
) -> snclResult_t {
    guard(|| {
        if name.is_null() || value.is_null() || isSet.is_null() {
            return Err(CError::invalid("name, value and isSet must not be NULL"));
        }
        if size == 0 {
            return Err(CError::invalid("size is 0; value needs room for a NUL"));
        }
        // SAFETY: checked non-NULL; the caller passes a NUL-terminated string.
        let name = unsafe { CStr::from_ptr(name) }
            .to_str()
            .map_err(|_| CError::invalid("the setting name is not UTF-8"))?;
        if lookup(name).is_none() {
            return Err(CError::invalid(format!(
                "{name:?} is not an sncl setting; `commbench --help-env` lists them"
            )));
        }
        let env = Environment::from_process().map_err(CError::from)?;
        let got = env.get(name);
        let text = got.unwrap_or("").as_bytes();
        if text.len() >= size || text.contains(&0) {
            return Err(CError::invalid(format!(
                "the value of {name} ({} bytes) does not fit in {size} bytes with its NUL",
                text.len()
            )));
        }
        // SAFETY: `value` has `size` writable bytes (caller's contract) and
        // text.len() + 1 <= size; `isSet` is a writable int.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), value, text.len());
            value.add(text.len()).write(0);
            isSet.write(c_int::from(got.is_some()));
        }
        Ok(snclResult_t::snclSuccess)
    })
}
