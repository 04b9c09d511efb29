//! `snclGetSetting`: C and C++ callers (the PyTorch backend) read settings
//! through libsncl, from the environment or else the settings file.

use std::ffi::{c_char, c_int, CStr};

use crate::{snclGetSetting, snclResult_t};

fn get(name: &CStr, size: usize) -> (snclResult_t, String, c_int) {
    let mut buf = vec![b'x' as c_char; size.max(1)];
    let mut set: c_int = -1;
    // SAFETY: `name` is NUL-terminated, `buf` has `size` bytes (or is
    // unused when size is 0), `set` is a writable int.
    let r = unsafe { snclGetSetting(name.as_ptr(), buf.as_mut_ptr(), size, &mut set) };
    let text = if r == snclResult_t::snclSuccess {
        // SAFETY: on success the buffer holds a NUL-terminated string.
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    } else {
        String::new()
    };
    (r, text, set)
}

/// One test: it changes this process's environment.
#[test]
fn get_setting_reads_environment_then_file() {
    let dir = std::env::temp_dir().join(format!("sncl-getsetting-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("sncl.conf");
    std::fs::write(&conf, "SNCL_TORCH_INLINE=0\nSNCL_TIMEOUT_MS = 1234\n").unwrap();
    std::env::set_var("SNCL_CONF_FILE", &conf);
    std::env::remove_var("SNCL_TORCH_INLINE");
    std::env::remove_var("SNCL_NODE_ID");
    std::env::set_var("SNCL_TIMEOUT_MS", "5678");

    assert_eq!(
        get(c"SNCL_TORCH_INLINE", 16),
        (snclResult_t::snclSuccess, "0".into(), 1)
    );
    // The environment wins over the file.
    assert_eq!(
        get(c"SNCL_TIMEOUT_MS", 16),
        (snclResult_t::snclSuccess, "5678".into(), 1)
    );
    assert_eq!(
        get(c"SNCL_NODE_ID", 16),
        (snclResult_t::snclSuccess, String::new(), 0)
    );
    // Too small for the value and its NUL, no room at all, unknown names.
    assert_eq!(
        get(c"SNCL_TIMEOUT_MS", 4).0,
        snclResult_t::snclInvalidArgument
    );
    assert_eq!(
        get(c"SNCL_TIMEOUT_MS", 0).0,
        snclResult_t::snclInvalidArgument
    );
    assert_eq!(
        get(c"SNCL_NO_SUCH", 16).0,
        snclResult_t::snclInvalidArgument
    );
    assert_eq!(get(c"HOME", 16).0, snclResult_t::snclInvalidArgument);
    // An unknown name in the file is an error for every setting.
    std::fs::write(&conf, "SNCL_NO_SUCH=1\n").unwrap();
    assert_eq!(
        get(c"SNCL_TORCH_INLINE", 16).0,
        snclResult_t::snclInvalidArgument
    );
    std::env::remove_var("SNCL_CONF_FILE");
    std::env::remove_var("SNCL_TIMEOUT_MS");
    let _ = std::fs::remove_dir_all(&dir);
}
