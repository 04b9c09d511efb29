//! The device layer's errors: each says which call, on which device, and
//! what was expected.

/// Why a device call failed.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// No CUDA driver library could be loaded.
    #[error("CUDA is missing: no driver library (libcuda.so) could be loaded ({detail})")]
    NoDriver {
        /// What was tried.
        detail: String,
    },
    /// The driver loaded but the requested device does not exist.
    #[error("no CUDA device {ordinal}: the driver reports {count} device(s)")]
    NoDevice {
        /// The requested ordinal.
        ordinal: usize,
        /// How many devices exist.
        count: usize,
    },
    /// NVRTC (the run-time compiler) could not be loaded.
    #[error("NVRTC is missing: no libnvrtc could be loaded ({detail})")]
    NoNvrtc {
        /// What was tried.
        detail: String,
    },
    /// The driver is older than what sncl needs.
    #[error("the CUDA driver is too old: version {found}, sncl needs {needed} or newer")]
    DriverTooOld {
        /// The driver's version (e.g. 12020 for 12.2).
        found: i32,
        /// The oldest version sncl supports.
        needed: i32,
    },
    /// A driver or runtime call failed.
    #[error("device {ordinal}: {call} failed: {detail}")]
    Call {
        /// The device ordinal.
        ordinal: usize,
        /// The call ("cuMemAlloc", "cuStreamWaitValue32", ...).
        call: &'static str,
        /// The driver's error name and text.
        detail: String,
    },
    /// A kernel did not compile; carries the NVRTC log.
    #[error("compiling {what} for {arch} failed:\n{log}")]
    Compile {
        /// What was compiled.
        what: String,
        /// The target ("sm_90", "compute_80", "host").
        arch: String,
        /// The compiler's log.
        log: String,
    },
    /// Device memory ran out.
    #[error("device {ordinal}: out of memory allocating {bytes} bytes")]
    OutOfMemory {
        /// The device ordinal.
        ordinal: usize,
        /// The request.
        bytes: usize,
    },
    /// A wait passed its deadline.
    #[error("device {ordinal}: {what} did not complete within {ms} ms")]
    Timeout {
        /// The device ordinal.
        ordinal: usize,
        /// What was waited for.
        what: String,
        /// The deadline, in milliseconds from the start of the wait.
        ms: u64,
    },
    /// The device faulted (on `emu`: an injected fault).
    #[error("device {ordinal} faulted: {detail}")]
    Fault {
        /// The device ordinal.
        ordinal: usize,
        /// What happened.
        detail: String,
    },
    /// An argument was out of range (a count too large, too many sources, a
    /// dtype/op pair without a kernel, a handle not from this device).
    #[error("device {ordinal}: invalid argument to {call}: {detail}")]
    InvalidArgument {
        /// The device ordinal.
        ordinal: usize,
        /// The call.
        call: &'static str,
        /// What was wrong and what was expected.
        detail: String,
    },
    /// The operation is not supported here (stream capture, fault injection
    /// on CUDA, `emu` without the feature).
    #[error("{what} is not supported: {why}")]
    Unsupported {
        /// What was asked.
        what: String,
        /// Why not.
        why: String,
    },
}
