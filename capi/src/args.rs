//! Argument checks shared by the `extern "C"` functions.

use std::ffi::{c_char, c_int, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use super::comm::{snclComm, snclComm_t, CommShared, PreMul};
use super::error::CError;
use super::types::*;
use sncl_rs::{
    Algorithm, CollConfig, Collective, Config, ConfigFromEnv, DataType, Protocol, ReduceOp,
};

pub(super) type R<T = ()> = Result<T, CError>;

pub(super) const OK: snclResult_t = snclResult_t::snclSuccess;

/// The communicator behind a handle.
///
/// # Safety
/// `comm` is NULL or a handle from this library not yet destroyed.
pub(super) unsafe fn comm_arg(comm: snclComm_t) -> R<Arc<CommShared>> {
    if comm.is_null() {
        return Err(CError::invalid("comm is NULL"));
    }
    // SAFETY: per the contract above, a non-NULL `comm` points to a live
    // snclComm made by Box::into_raw.
    Ok(unsafe { &*comm }.shared.clone())
}

pub(super) fn dtype_arg(d: snclDataTypeRaw) -> R<DataType> {
    u8::try_from(d)
        .ok()
        .and_then(DataType::from_u8)
        .ok_or_else(|| {
            CError::invalid(format!(
                "unknown datatype {d}; expected a snclDataType_t from snclInt8 (0) to \
                 snclFloat8e5m2 (11)"
            ))
        })
}

pub(super) fn op_arg(
    comm: &CommShared,
    op: snclRedOpRaw,
    dtype: DataType,
) -> R<(ReduceOp, Option<PreMul>)> {
    match op {
        0..=4 => Ok((
            ReduceOp::from_u8(op as u8).expect("0..=4 are operators"),
            None,
        )),
        _ => match comm.redop(op) {
            Some(p) if p.dtype == dtype => Ok((ReduceOp::Sum, Some(p))),
            Some(p) => Err(CError::invalid(format!(
                "operator {op} was created for datatype {}, used with {}",
                p.dtype.name(),
                dtype.name()
            ))),
            None => Err(CError::invalid(format!(
                "unknown reduction operator {op}; expected snclSum..snclAvg (0-4) or one made by \
                 snclRedOpCreatePreMulSum on this communicator"
            ))),
        },
    }
}

pub(super) fn rank_arg(what: &str, r: c_int, n: usize) -> R<usize> {
    usize::try_from(r)
        .ok()
        .filter(|&r| r < n)
        .ok_or_else(|| CError::invalid(format!("{what} {r} is out of range for {n} ranks")))
}

/// A rank count: at least 1 and at most [`comm_core::MAX_RANKS`], checked
/// before anything is allocated for the ranks.
pub(super) fn world_arg(what: &str, n: c_int) -> R<usize> {
    let max = comm_core::MAX_RANKS;
    match usize::try_from(n) {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        Ok(n) if n > max => Err(CError::invalid(format!(
            "{what} {n} exceeds the limit of {max} ranks per communicator"
        ))),
        _ => Err(CError::invalid(format!("{what} {n} must be at least 1"))),
    }
}

/// Checks that `count × mult` elements of `dtype` are at most
/// `comm_core::shape::MAX_MESSAGE_BYTES`.
pub(super) fn span(what: &str, count: usize, mult: usize, dtype: DataType) -> R<usize> {
    count
        .checked_mul(mult)
        .filter(|e| {
            e.checked_mul(dtype.size())
                .is_some_and(|b| b <= comm_core::shape::MAX_MESSAGE_BYTES)
        })
        .ok_or_else(|| {
            CError::invalid(format!(
                "{what} of {count} × {mult} elements is too large: one operation moves at most {} bytes per buffer",
                comm_core::shape::MAX_MESSAGE_BYTES
            ))
        })
}

/// Copies `n` counts from a C array.
///
/// # Safety
/// `p` is NULL or points to `n` readable `size_t`s.
pub(super) unsafe fn counts_arg(what: &str, p: *const usize, n: usize) -> R<Vec<usize>> {
    if p.is_null() {
        return Err(CError::invalid(format!("{what} is NULL")));
    }
    // SAFETY: per the contract above.
    Ok(unsafe { std::slice::from_raw_parts(p, n) }.to_vec())
}

/// Writes a new handle.
///
/// # Safety
/// `out` points to writable storage for a handle.
pub(super) unsafe fn write_handle(out: *mut snclComm_t, shared: Arc<CommShared>) {
    let h = Box::into_raw(Box::new(snclComm { shared }));
    // SAFETY: per the contract above.
    unsafe { out.write(h) };
}

/// What a `snclConfig_t` asks for.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Opts {
    pub(super) blocking: Option<bool>,
    pub(super) timeout: Option<Duration>,
    pub(super) deterministic: Option<bool>,
}

impl Opts {
    /// Applies the fields that configure a communicator to `c`.
    pub(super) fn apply(&self, c: &mut Config) {
        if let Some(t) = self.timeout {
            c.timeout = t;
        }
        if let Some(d) = self.deterministic {
            c.deterministic = d;
        }
    }
}

/// Reads a config (NULL: defaults).
///
/// # Safety
/// `cfg` is NULL or points to a `snclConfig_t` of at least its `size` bytes.
pub(super) unsafe fn config_arg(cfg: *const snclConfig_t) -> R<Opts> {
    let mut o = Opts::default();
    if cfg.is_null() {
        return Ok(o);
    }
    // SAFETY: per the contract above, the fields up to `size` are readable;
    // each is read on its own, so a shorter (older) struct is never read
    // past its end.
    unsafe {
        let size = std::ptr::addr_of!((*cfg).size).read();
        let magic = std::ptr::addr_of!((*cfg).magic).read();
        if magic != SNCL_API_MAGIC || size < std::mem::offset_of!(snclConfig_t, cgaClusterSize) {
            return Err(CError::invalid(
                "the snclConfig_t is not initialized; declare it as \
                 snclConfig_t config = SNCL_CONFIG_INITIALIZER;",
            ));
        }
        let blocking = std::ptr::addr_of!((*cfg).blocking).read();
        if blocking != c_int::MIN {
            o.blocking = Some(blocking != 0);
        }
        let end = std::mem::offset_of!(snclConfig_t, timeoutMs) + std::mem::size_of::<c_int>();
        if size >= end {
            let t = std::ptr::addr_of!((*cfg).timeoutMs).read();
            if t != c_int::MIN {
                if t <= 0 {
                    return Err(CError::invalid(format!(
                        "config timeoutMs is {t}; give a positive number of milliseconds"
                    )));
                }
                o.timeout = Some(Duration::from_millis(t as u64));
            }
        }
        let end = std::mem::offset_of!(snclConfig_t, deterministic) + std::mem::size_of::<c_int>();
        if size >= end {
            let d = std::ptr::addr_of!((*cfg).deterministic).read();
            match d {
                c_int::MIN => {}
                0 | 1 => o.deterministic = Some(d == 1),
                other => {
                    return Err(CError::invalid(format!(
                        "config deterministic is {other}; give 0 or 1"
                    )))
                }
            }
        }
    }
    Ok(o)
}

/// The environment's configuration with what `opts` sets on top.
pub(super) fn env_config(opts: &Opts) -> R<Config> {
    let mut c = Config::from_env()?;
    opts.apply(&mut c);
    Ok(c)
}

pub(super) fn spawn(name: &str, job: impl FnOnce() + Send + 'static) -> R {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let _ = catch_unwind(AssertUnwindSafe(job));
        })
        .map(|_| ())
        .map_err(|e| {
            CError::new(
                snclResult_t::snclSystemError,
                format!("starting a thread: {e}"),
            )
        })
}

/// A NUL-terminated string field of a config, trimmed; `None` for NULL.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn text(p: *const c_char, what: &str) -> R<Option<String>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: per the contract above.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map(|s| Some(s.trim().to_string()))
        .map_err(|_| CError::invalid(format!("snclCollConfig_t {what} is not UTF-8")))
}

/// Reads a call's settings for collective `coll` (NULL: none).
///
/// # Safety
/// `cfg` is NULL or points to a `snclCollConfig_t` of at least its `size`
/// bytes whose strings are NUL-terminated.
pub(super) unsafe fn coll_config_arg(
    cfg: *const snclCollConfig_t,
    coll: Collective,
) -> R<CollConfig> {
    let mut c = CollConfig::default();
    if cfg.is_null() {
        return Ok(c);
    }
    // SAFETY: per the contract above; every field is read on its own.
    unsafe {
        let size = std::ptr::addr_of!((*cfg).size).read();
        let magic = std::ptr::addr_of!((*cfg).magic).read();
        if magic != SNCL_API_MAGIC || size < std::mem::size_of::<snclCollConfig_t>() {
            return Err(CError::invalid(
                "the snclCollConfig_t is not initialized; declare it as \
                 snclCollConfig_t config = SNCL_COLL_CONFIG_INITIALIZER;",
            ));
        }
        if let Some(name) = text(std::ptr::addr_of!((*cfg).algorithm).read(), "algorithm")? {
            c.algorithm = Some(
                Algorithm::parse_for(coll, &name)
                    .map_err(|e| CError::invalid(format!("snclCollConfig_t algorithm: {e}")))?,
            );
        }
        if let Some(name) = text(std::ptr::addr_of!((*cfg).protocol).read(), "protocol")? {
            c.protocol = Some(Protocol::from_name(&name).ok_or_else(|| {
                CError::invalid(format!(
                    "snclCollConfig_t protocol {name:?}: expected Simple, LL or LL128"
                ))
            })?);
        }
        c.chunk_bytes = std::ptr::addr_of!((*cfg).chunkBytes).read();
        c.tag = std::ptr::addr_of!((*cfg).userTag).read();
        let max_ctas = std::ptr::addr_of!((*cfg).maxCTAs).read();
        c.max_ctas = u32::try_from(max_ctas).map_err(|_| {
            CError::invalid(format!(
                "snclCollConfig_t maxCTAs {max_ctas}: expected 0 (sncl's grid) or a positive count"
            ))
        })?;
    }
    Ok(c)
}
