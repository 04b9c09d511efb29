//! Result codes, the last-error text and the panic guard every entry point
//! runs in.

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::types::snclResult_t;
use sncl_rs::Error;

/// An error on its way to C: the code and the full text.
#[derive(Clone, Debug)]
pub(crate) struct CError {
    pub code: snclResult_t,
    pub msg: String,
    /// The failure broke the communicator (sncl aborts it after any error
    /// during an operation, as opposed to a rejected argument).
    pub fatal: bool,
}

impl CError {
    pub fn new(code: snclResult_t, msg: impl Into<String>) -> CError {
        CError {
            code,
            msg: msg.into(),
            fatal: false,
        }
    }

    pub fn invalid(msg: impl Into<String>) -> CError {
        CError::new(snclResult_t::snclInvalidArgument, msg)
    }

    pub fn usage(msg: impl Into<String>) -> CError {
        CError::new(snclResult_t::snclInvalidUsage, msg)
    }

    pub fn internal(msg: impl Into<String>) -> CError {
        CError::new(snclResult_t::snclInternalError, msg)
    }
}

/// The reason `Communicator::abort` records.
const APP_ABORT: &str = "aborted by the application";

/// The result code of a Rust error.
pub(crate) fn code_of(e: &Error) -> snclResult_t {
    use snclResult_t::*;
    match e {
        Error::InvalidArgument { .. } | Error::Config(_) => snclInvalidArgument,
        Error::Timeout { .. } => snclTimeout,
        Error::PeerFailed { .. } | Error::Transport { .. } | Error::Bootstrap { .. } => {
            snclRemoteError
        }
        Error::Mismatch { .. } | Error::CommMismatch { .. } => snclInvalidUsage,
        Error::Aborted { reason, .. } => {
            if reason.as_deref() == Some(APP_ABORT) {
                snclInvalidUsage
            } else {
                snclRemoteError
            }
        }
        Error::Io { .. } => snclSystemError,
        Error::Device { .. } => snclUnhandledCudaError,
    }
}

impl From<Error> for CError {
    fn from(e: Error) -> CError {
        let fatal = !matches!(e, Error::InvalidArgument { .. } | Error::Config(_));
        CError {
            code: code_of(&e),
            msg: e.to_string(),
            fatal,
        }
    }
}

thread_local! {
    /// The last failure on this thread.
    static LAST: RefCell<Option<String>> = const { RefCell::new(None) };
    /// What `snclGetLastError` last returned on this thread (kept alive
    /// until the next call).
    static RETURNED: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `msg` as this thread's last error.
pub(crate) fn set_last(msg: &str) {
    LAST.with(|l| *l.borrow_mut() = Some(msg.to_string()));
}

/// This thread's last error.
pub(crate) fn thread_last() -> Option<String> {
    LAST.with(|l| l.borrow().clone())
}

/// Stores `msg` in a thread-local buffer and returns it as a C string, valid
/// until this thread calls `snclGetLastError` again.
pub(crate) fn returned_c_str(msg: &str) -> *const c_char {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    RETURNED.with(|r| {
        *r.borrow_mut() = c;
        r.borrow().as_ptr()
    })
}

/// The text of a caught panic.
pub(crate) fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    let s = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    format!("internal error (a panic inside sncl, please report it): {s}")
}

/// Runs `f` so that neither a panic nor an error crosses into C: errors
/// become their code (and this thread's last error); a panic becomes
/// `snclInternalError`.
pub(crate) fn guard(f: impl FnOnce() -> Result<snclResult_t, CError>) -> snclResult_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(code)) => code,
        Ok(Err(e)) => {
            set_last(&e.msg);
            e.code
        }
        Err(p) => {
            // A panic inside the panic text's formatting is not worth
            // guarding: the payload is a plain string.
            let msg = panic_text(&*p);
            set_last(&msg);
            snclResult_t::snclInternalError
        }
    }
}

/// Runs `f` (on a worker thread) and turns a panic into an internal error.
pub(crate) fn catch(f: impl FnOnce() -> Result<(), CError>) -> Result<(), CError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(CError::internal(panic_text(&*p))),
    }
}

/// The static text of a result code.
pub(crate) fn error_string(code: i32) -> &'static CStr {
    match code {
        0 => c"no error",
        1 => c"unhandled device error (snclGetLastError has the details)",
        2 => c"unhandled system error (snclGetLastError has the details)",
        3 => c"internal error - please report this issue to the sncl developers",
        4 => c"invalid argument (snclGetLastError has the details)",
        5 => c"invalid usage (snclGetLastError has the details)",
        6 => c"remote process exited or there was a network error",
        7 => c"sncl operation in progress",
        8 => c"Timed out: a peer made no progress within the communicator's timeout (snclGetLastError has the details)",
        _ => c"unknown result code",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_turns_errors_and_panics_into_codes() {
        assert_eq!(
            guard(|| Ok(snclResult_t::snclInProgress)),
            snclResult_t::snclInProgress
        );
        assert_eq!(
            guard(|| Err(CError::invalid("bad thing"))),
            snclResult_t::snclInvalidArgument
        );
        assert_eq!(thread_last().as_deref(), Some("bad thing"));
        let r = guard(|| panic!("boom {}", 7));
        assert_eq!(r, snclResult_t::snclInternalError);
        assert!(thread_last().unwrap().contains("boom 7"));
        assert!(catch(|| panic!("x")).is_err());
        assert_eq!(
            error_string(4).to_str().unwrap().split(' ').next(),
            Some("invalid")
        );
    }

    #[test]
    fn device_errors_are_unhandled_device_errors() {
        let e = Error::Device {
            rank: 1,
            op: "all_reduce",
            seq: Some(2),
            device: "emu device 1 (emulated)".into(),
            what: "a kernel launch".into(),
            detail: "injected fault".into(),
        };
        assert_eq!(code_of(&e), snclResult_t::snclUnhandledCudaError);
        let c = CError::from(e);
        assert!(c.fatal);
        assert!(c.msg.contains("emu device 1"), "{}", c.msg);
    }
}
