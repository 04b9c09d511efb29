//! The `extern "C"` functions of `sncl.h`.

use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use super::comm::{CommShared, PreMul, Scalar, Ticket};
use super::error::{self, guard, CError};
use super::exec::{self, CollOp, Item};
use super::stream::{self, StreamShared};
use super::types::*;
use super::uid;
use crate::{Collective, Communicator, Config, DataType, RawOp, ReduceOp, UniqueId, VCounts};

type R<T = ()> = Result<T, CError>;

const OK: snclResult_t = snclResult_t::snclSuccess;

// ---------------------------------------------------------------------
// Argument checks.

/// The communicator behind a handle.
///
/// # Safety
/// `comm` is NULL or a handle from this library not yet destroyed.
unsafe fn comm_arg(comm: snclComm_t) -> R<Arc<CommShared>> {
    if comm.is_null() {
        return Err(CError::invalid("comm is NULL"));
    }
    // SAFETY: per the contract above, a non-NULL `comm` points to a live
    // snclComm made by Box::into_raw.
    Ok(unsafe { &*comm }.shared.clone())
}

/// The stream behind a handle (None for NULL).
///
/// # Safety
/// `stream` is NULL or a handle from `snclStreamCreate` not yet destroyed.
unsafe fn stream_arg(stream: snclStream_t) -> Option<Arc<StreamShared>> {
    // SAFETY: per the contract above.
    (!stream.is_null()).then(|| unsafe { &*stream }.shared.clone())
}

fn dtype_arg(d: snclDataTypeRaw) -> R<DataType> {
    match d {
        0..=9 => Ok(DataType::from_u8(d as u8).expect("0..=9 are data types")),
        10 | 11 => Err(CError::invalid(format!(
            "datatype {d} (8-bit float) is not supported yet"
        ))),
        _ => Err(CError::invalid(format!(
            "unknown datatype {d}; expected a snclDataType_t from snclInt8 (0) to snclBfloat16 (9)"
        ))),
    }
}

fn op_arg(comm: &CommShared, op: snclRedOpRaw, dtype: DataType) -> R<(ReduceOp, Option<PreMul>)> {
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

fn rank_arg(what: &str, r: c_int, n: usize) -> R<usize> {
    usize::try_from(r)
        .ok()
        .filter(|&r| r < n)
        .ok_or_else(|| CError::invalid(format!("{what} {r} is out of range for {n} ranks")))
}

/// A rank count: at least 1 and at most [`comm_core::MAX_RANKS`], checked
/// before anything is allocated for the ranks.
fn world_arg(what: &str, n: c_int) -> R<usize> {
    let max = comm_core::MAX_RANKS;
    match usize::try_from(n) {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        Ok(n) if n > max => Err(CError::invalid(format!(
            "{what} {n} exceeds the limit of {max} ranks per communicator"
        ))),
        _ => Err(CError::invalid(format!("{what} {n} must be at least 1"))),
    }
}

/// Checks that `count × mult` elements of `dtype` are addressable.
fn span(what: &str, count: usize, mult: usize, dtype: DataType) -> R<usize> {
    count
        .checked_mul(mult)
        .filter(|e| {
            e.checked_mul(dtype.size())
                .is_some_and(|b| b <= isize::MAX as usize)
        })
        .ok_or_else(|| CError::invalid(format!("{what} of {count} × {mult} elements is too large")))
}

/// Copies `n` counts from a C array.
///
/// # Safety
/// `p` is NULL or points to `n` readable `size_t`s.
unsafe fn counts_arg(what: &str, p: *const usize, n: usize) -> R<Vec<usize>> {
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
unsafe fn write_handle(out: *mut snclComm_t, shared: Arc<CommShared>) {
    let h = Box::into_raw(Box::new(snclComm { shared }));
    // SAFETY: per the contract above.
    unsafe { out.write(h) };
}

/// What a `snclConfig_t` asks for.
struct Opts {
    blocking: Option<bool>,
    timeout: Option<Duration>,
}

/// Reads a config (NULL: defaults).
///
/// # Safety
/// `cfg` is NULL or points to a `snclConfig_t` of at least its `size` bytes.
unsafe fn config_arg(cfg: *const snclConfig_t) -> R<Opts> {
    let mut o = Opts {
        blocking: None,
        timeout: None,
    };
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
    }
    Ok(o)
}

fn env_config(timeout: Option<Duration>) -> R<Config> {
    let mut c = Config::from_env()?;
    if let Some(t) = timeout {
        c.timeout = t;
    }
    Ok(c)
}

fn spawn(name: &str, job: impl FnOnce() + Send + 'static) -> R {
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

// ---------------------------------------------------------------------
// Version, unique ids, errors.

/// Writes the version code, `SNCL_VERSION_CODE` of the library (major ×
/// 10000 + minor × 100 + patch).
///
/// # Safety
/// `version` points to a writable int.
#[no_mangle]
pub unsafe extern "C" fn snclGetVersion(version: *mut c_int) -> snclResult_t {
    guard(|| {
        if version.is_null() {
            return Err(CError::invalid("version is NULL"));
        }
        // SAFETY: checked non-NULL; the caller provides a writable int.
        unsafe { version.write(SNCL_VERSION_CODE) };
        Ok(OK)
    })
}

/// Creates a unique id for a new communicator; call it on one rank and
/// pass the 128 bytes to every rank (as with `ncclGetUniqueId`).
///
/// Its root, where rank 0's rendezvous store will listen, is `SNCL_ROOT`
/// (`host:port`) when set. Otherwise it is a free port on this host's
/// address: that of interface `SNCL_SOCKET_IFNAME` when set, else the first
/// non-loopback IPv4 address (docker and virtual bridges skipped), else
/// 127.0.0.1; call it on the host where rank 0 will run.
///
/// The secret is random, except when `SNCL_ROOT` and `SNCL_SECRET` (32 hex
/// digits) are both set: then every process computes the same id, so each
/// rank of a launched job may call `snclGetUniqueId` itself instead of
/// receiving rank 0's.
///
/// # Safety
/// `uniqueId` points to a writable `snclUniqueId`.
#[no_mangle]
pub unsafe extern "C" fn snclGetUniqueId(uniqueId: *mut snclUniqueId) -> snclResult_t {
    guard(|| {
        if uniqueId.is_null() {
            return Err(CError::invalid("uniqueId is NULL"));
        }
        let b = uid::new_unique_id()?.to_bytes();
        let id = snclUniqueId {
            internal: b.map(|x| x as c_char),
        };
        // SAFETY: checked non-NULL; the caller provides writable storage.
        unsafe { uniqueId.write(id) };
        Ok(OK)
    })
}

/// A static description of a result code.
#[no_mangle]
pub extern "C" fn snclGetErrorString(result: snclResultRaw) -> *const c_char {
    error::error_string(result).as_ptr()
}

/// The full text of the last error: `comm`'s last failure when `comm` is
/// not NULL and has one, else this thread's. The string stays valid until
/// this thread calls `snclGetLastError` again. Empty when there was none.
///
/// # Safety
/// `comm` is NULL or a live communicator handle.
#[no_mangle]
pub unsafe extern "C" fn snclGetLastError(comm: snclComm_t) -> *const c_char {
    let r = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: forwarded from the caller.
        let from_comm = unsafe { comm_arg(comm) }.ok().and_then(|c| c.last_error());
        let msg = from_comm.or_else(error::thread_last).unwrap_or_default();
        error::returned_c_str(&msg)
    }));
    r.unwrap_or_else(|_| c"internal error while reading the last error".as_ptr())
}

// ---------------------------------------------------------------------
// Communicators.

fn init_job(shared: &CommShared, id: UniqueId, rank: usize, nranks: usize, cfg: Config) -> R {
    let _ = shared.route.set(id.root);
    let r = Communicator::init_rank_with_config(&id, rank, nranks, cfg).map_err(CError::from);
    let out = r.as_ref().map(|_| ()).map_err(Clone::clone);
    shared.finish(r);
    out
}

/// Creates this rank's communicator (NCCL's `ncclCommInitRankConfig`):
/// `nranks` ranks, all calling with the same `commId`, each with its own
/// `rank`. Rank 0 serves the rendezvous store at the id's root.
///
/// Blocking (the default): returns when every rank has joined, or with the
/// error. Non-blocking (`config->blocking = 0`): writes the handle and
/// returns `snclInProgress` at once; poll `snclCommGetAsyncError` until it
/// reports `snclSuccess` (operations issued before then wait for it).
/// Inside `snclGroupStart` / `snclGroupEnd` the handle is written at once
/// and the communicator is created by `snclGroupEnd`, together with the
/// group's other communicators (so one thread may create several ranks).
/// `config` may be NULL; settings not given come from `SNCL_*` variables.
///
/// # Safety
/// `comm` points to writable storage for a handle; `config` is NULL or an
/// initialized `snclConfig_t`.
#[no_mangle]
pub unsafe extern "C" fn snclCommInitRankConfig(
    comm: *mut snclComm_t,
    nranks: c_int,
    commId: snclUniqueId,
    rank: c_int,
    config: *mut snclConfig_t,
) -> snclResult_t {
    guard(|| {
        if comm.is_null() {
            return Err(CError::invalid("comm is NULL"));
        }
        let n = world_arg("nranks", nranks)?;
        let r = rank_arg("rank", rank, n)?;
        let bytes = commId.internal.map(|x| x as u8);
        let id = UniqueId::from_bytes(&bytes)?;
        // SAFETY: forwarded from the caller.
        let opts = unsafe { config_arg(config) }?;
        let cfg = env_config(opts.timeout)?;
        let blocking = opts.blocking.unwrap_or(true);
        let shared = CommShared::pending(blocking);
        if !blocking {
            // SAFETY: checked non-NULL; the caller provides storage.
            unsafe { write_handle(comm, shared.clone()) };
            spawn("sncl-init", move || {
                let _ = init_job(&shared, id, r, n, cfg);
            })?;
            return Ok(snclResult_t::snclInProgress);
        }
        if exec::in_group() {
            // SAFETY: as above.
            unsafe { write_handle(comm, shared.clone()) };
            shared.defer_to_group_end();
            exec::defer(Box::new(move || init_job(&shared, id, r, n, cfg)));
            return Ok(OK);
        }
        // SAFETY: as above.
        unsafe { comm.write(std::ptr::null_mut()) };
        init_job(&shared, id, r, n, cfg)?;
        // SAFETY: as above.
        unsafe { write_handle(comm, shared) };
        Ok(OK)
    })
}

/// Creates this rank's communicator with the default configuration (NCCL's
/// `ncclCommInitRank`); see `snclCommInitRankConfig`.
///
/// # Safety
/// `comm` points to writable storage for a handle.
#[no_mangle]
pub unsafe extern "C" fn snclCommInitRank(
    comm: *mut snclComm_t,
    nranks: c_int,
    commId: snclUniqueId,
    rank: c_int,
) -> snclResult_t {
    // SAFETY: forwarded from the caller.
    unsafe { snclCommInitRankConfig(comm, nranks, commId, rank, std::ptr::null_mut()) }
}

/// Creates `ndev` communicators of one clique in this process, rank i in
/// `comm[i]` (NCCL's `ncclCommInitAll`). `devlist` is ignored (host memory)
/// and may be NULL. Drive the ranks from one thread with groups, or from a
/// thread each.
///
/// # Safety
/// `comm` points to `ndev` writable handles.
#[no_mangle]
pub unsafe extern "C" fn snclCommInitAll(
    comm: *mut snclComm_t,
    ndev: c_int,
    devlist: *const c_int,
) -> snclResult_t {
    let _ = devlist;
    guard(|| {
        if comm.is_null() {
            return Err(CError::invalid("comm is NULL"));
        }
        let n = world_arg("ndev", ndev)?;
        let comms = Communicator::init_threads(n, env_config(None)?)?;
        for (i, c) in comms.into_iter().enumerate() {
            // SAFETY: the caller provides `ndev` handles at `comm`.
            unsafe { write_handle(comm.add(i), CommShared::ready(c, true, None)) };
        }
        Ok(OK)
    })
}

fn split_job(
    mut ticket: Ticket,
    color: c_int,
    key: c_int,
    child: Option<Arc<CommShared>>,
    timeout: Option<Duration>,
) -> R {
    let parent_shared = ticket.comm().clone();
    let exchanged = (|| -> R<Option<(UniqueId, usize, usize, Config)>> {
        let parent = parent_shared.get()?;
        ticket.wait_turn();
        let (n, me) = (parent.size(), parent.rank());
        let mut all = vec![0i64; 2 * n];
        parent.all_gather(&[i64::from(color), i64::from(key)], &mut all)?;
        let mut members: Vec<usize> = (0..n)
            .filter(|&r| color != SNCL_SPLIT_NOCOLOR && all[2 * r] == i64::from(color))
            .collect();
        members.sort_by_key(|&r| (all[2 * r + 1], r));
        let leader = members.first().copied();
        // The leader (new rank 0) makes the id; everyone learns its leader's.
        let made =
            (leader == Some(me)).then(|| uid::split_unique_id(parent_shared.route.get().copied()));
        let mine = match &made {
            Some(Ok(id)) => id.to_bytes(),
            _ => [0u8; 128],
        };
        let mut ids = vec![0u8; 128 * n];
        parent.all_gather(&mine, &mut ids)?;
        drop(ticket);
        if let Some(Err(e)) = made {
            return Err(e);
        }
        let Some(leader) = leader else {
            return Ok(None);
        };
        let bytes: [u8; 128] = ids[128 * leader..128 * (leader + 1)]
            .try_into()
            .expect("128 bytes");
        let id = UniqueId::from_bytes(&bytes).map_err(|_| {
            CError::new(
                snclResult_t::snclRemoteError,
                format!("snclCommSplit: rank {leader} of the parent could not create the new communicator's id"),
            )
        })?;
        let newrank = members.iter().position(|&r| r == me).expect("a member");
        let mut cfg = parent.config().clone();
        if let Some(t) = timeout {
            cfg.timeout = t;
        }
        Ok(Some((id, newrank, members.len(), cfg)))
    })();
    match (exchanged, child) {
        (Ok(Some((id, r, n, cfg))), Some(child)) => init_job(&child, id, r, n, cfg),
        (Ok(_), _) => Ok(()),
        (Err(e), child) => {
            parent_shared.record(&e);
            if let Some(c) = child {
                c.finish(Err(e.clone()));
            }
            Err(e)
        }
    }
}

/// Splits `comm` (NCCL's `ncclCommSplit`): every rank of `comm` calls it;
/// ranks with the same `color` form a new communicator, ranked by `key`
/// (then by their rank in `comm`). A rank passing `SNCL_SPLIT_NOCOLOR`
/// joins none and gets `NULL`. `config` NULL inherits `comm`'s settings.
/// Blocking, non-blocking and group behaviour are those of
/// `snclCommInitRankConfig`. The new communicator's rank 0 serves its
/// rendezvous store on the address of `SNCL_SOCKET_IFNAME` if set, else on
/// its address towards `comm`'s root.
///
/// # Safety
/// `comm` is a live handle; `newcomm` points to writable storage for a
/// handle; `config` is NULL or an initialized `snclConfig_t`.
#[no_mangle]
pub unsafe extern "C" fn snclCommSplit(
    comm: snclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut snclComm_t,
    config: *mut snclConfig_t,
) -> snclResult_t {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let parent = unsafe { comm_arg(comm) }?;
        if newcomm.is_null() {
            return Err(CError::invalid("newcomm is NULL"));
        }
        if color < 0 && color != SNCL_SPLIT_NOCOLOR {
            return Err(CError::invalid(format!(
                "color {color} must be non-negative or SNCL_SPLIT_NOCOLOR"
            )));
        }
        // SAFETY: forwarded from the caller.
        let opts = unsafe { config_arg(config) }?;
        let blocking = opts.blocking.unwrap_or(parent.blocking);
        let child = (color != SNCL_SPLIT_NOCOLOR).then(|| CommShared::pending(blocking));
        let write = |c: Option<&Arc<CommShared>>| match c {
            // SAFETY: checked non-NULL; the caller provides storage.
            Some(c) => unsafe { write_handle(newcomm, c.clone()) },
            // SAFETY: as above.
            None => unsafe { newcomm.write(std::ptr::null_mut()) },
        };
        let ticket = parent.ticket();
        let timeout = opts.timeout;
        if !blocking {
            write(child.as_ref());
            let c = child.clone();
            spawn("sncl-split", move || {
                let _ = split_job(ticket, color, key, c, timeout);
            })?;
            return Ok(if child.is_some() {
                snclResult_t::snclInProgress
            } else {
                OK
            });
        }
        if exec::in_group() {
            write(child.as_ref());
            if let Some(c) = &child {
                c.defer_to_group_end();
            }
            exec::defer(Box::new(move || {
                split_job(ticket, color, key, child, timeout)
            }));
            return Ok(OK);
        }
        write(None);
        split_job(ticket, color, key, child.clone(), timeout)?;
        write(child.as_ref());
        Ok(OK)
    })
}

/// Waits until every operation issued on `comm` so far has completed (and,
/// for a non-blocking communicator, its creation). The handle stays valid;
/// release it with `snclCommDestroy`. NULL is a no-op that succeeds (as in
/// NCCL).
///
/// # Safety
/// `comm` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn snclCommFinalize(comm: snclComm_t) -> snclResult_t {
    guard(|| {
        if comm.is_null() {
            return Ok(OK);
        }
        // SAFETY: forwarded from the caller.
        let shared = unsafe { comm_arg(comm) }?;
        let _ = shared.get();
        shared.ticket().wait_turn();
        Ok(OK)
    })
}

/// Releases `comm` after its issued operations have completed (an implicit
/// `snclCommFinalize`). Local: peers are not waited for. NULL is a no-op
/// that succeeds (as in NCCL), so cleanup paths may destroy handles that
/// were never created.
///
/// # Safety
/// `comm` is NULL or a live handle; it is invalid afterwards.
#[no_mangle]
pub unsafe extern "C" fn snclCommDestroy(comm: snclComm_t) -> snclResult_t {
    guard(|| {
        if comm.is_null() {
            return Ok(OK);
        }
        // SAFETY: a live handle made by Box::into_raw, released once.
        let b = unsafe { Box::from_raw(comm) };
        let _ = b.shared.get();
        b.shared.ticket().wait_turn();
        drop(b);
        Ok(OK)
    })
}

/// Aborts `comm` and releases it: operations in flight or queued on it
/// fail, peers see the abort instead of waiting for their timeout. NULL is
/// a no-op that succeeds (as in NCCL).
///
/// # Safety
/// `comm` is NULL or a live handle; it is invalid afterwards.
#[no_mangle]
pub unsafe extern "C" fn snclCommAbort(comm: snclComm_t) -> snclResult_t {
    guard(|| {
        if comm.is_null() {
            return Ok(OK);
        }
        // SAFETY: a live handle made by Box::into_raw, released once.
        let b = unsafe { Box::from_raw(comm) };
        if b.shared.async_code() != snclResult_t::snclInProgress {
            if let Ok(c) = b.shared.get() {
                c.abort();
            }
        }
        drop(b);
        Ok(OK)
    })
}

/// Writes `comm`'s state: `snclInProgress` while a non-blocking creation
/// runs, `snclSuccess` when usable, else the error that broke it.
///
/// # Safety
/// `comm` is a live handle; `asyncError` points to a writable result.
#[no_mangle]
pub unsafe extern "C" fn snclCommGetAsyncError(
    comm: snclComm_t,
    asyncError: *mut snclResultRaw,
) -> snclResult_t {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let shared = unsafe { comm_arg(comm) }?;
        if asyncError.is_null() {
            return Err(CError::invalid("asyncError is NULL"));
        }
        // SAFETY: checked non-NULL; the caller provides storage.
        unsafe { asyncError.write(shared.async_code() as c_int) };
        Ok(OK)
    })
}

/// Writes the number of ranks of `comm`.
///
/// # Safety
/// `comm` is a live handle; `count` points to a writable int.
#[no_mangle]
pub unsafe extern "C" fn snclCommCount(comm: snclComm_t, count: *mut c_int) -> snclResult_t {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let shared = unsafe { comm_arg(comm) }?;
        if count.is_null() {
            return Err(CError::invalid("count is NULL"));
        }
        let n = shared.get()?.size() as c_int;
        // SAFETY: checked non-NULL; the caller provides storage.
        unsafe { count.write(n) };
        Ok(OK)
    })
}

/// Writes this rank's rank in `comm`.
///
/// # Safety
/// `comm` is a live handle; `rank` points to a writable int.
#[no_mangle]
pub unsafe extern "C" fn snclCommUserRank(comm: snclComm_t, rank: *mut c_int) -> snclResult_t {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let shared = unsafe { comm_arg(comm) }?;
        if rank.is_null() {
            return Err(CError::invalid("rank is NULL"));
        }
        let r = shared.get()?.rank() as c_int;
        // SAFETY: checked non-NULL; the caller provides storage.
        unsafe { rank.write(r) };
        Ok(OK)
    })
}

/// Creates a reduction operator for collectives on `comm` with `datatype`:
/// each rank's input is multiplied by `*scalar` (one element of
/// `datatype`), then summed. `snclScalarHostImmediate` copies the scalar
/// now; `snclScalarDevice` reads it each time a collective runs. Writes the
/// operator to `*op`; release it with `snclRedOpDestroy`.
///
/// # Safety
/// `op` is writable; `scalar` points to one element of `datatype` (with
/// `snclScalarDevice`, for as long as the operator is used); `comm` is a
/// live handle.
#[no_mangle]
pub unsafe extern "C" fn snclRedOpCreatePreMulSum(
    op: *mut snclRedOpRaw,
    scalar: *mut c_void,
    datatype: snclDataTypeRaw,
    residence: snclScalarResidenceRaw,
    comm: snclComm_t,
) -> snclResult_t {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let shared = unsafe { comm_arg(comm) }?;
        if op.is_null() || scalar.is_null() {
            return Err(CError::invalid("op or scalar is NULL"));
        }
        let dtype = dtype_arg(datatype)?;
        let scalar = match residence {
            0 => Scalar::Pointer(scalar as usize),
            1 => {
                let mut b = [0u8; 8];
                // SAFETY: the caller provides one element of `dtype` at
                // `scalar` (at most 8 bytes).
                unsafe {
                    std::ptr::copy_nonoverlapping(scalar as *const u8, b.as_mut_ptr(), dtype.size())
                };
                Scalar::Immediate(b)
            }
            r => {
                return Err(CError::invalid(format!(
                    "unknown scalar residence {r}; expected snclScalarDevice (0) or \
                     snclScalarHostImmediate (1)"
                )))
            }
        };
        let v = shared.add_redop(PreMul { dtype, scalar })?;
        // SAFETY: checked non-NULL; the caller provides storage.
        unsafe { op.write(v) };
        Ok(OK)
    })
}

/// Releases an operator made by `snclRedOpCreatePreMulSum` on `comm`. It
/// may be released as soon as the last call using it has returned.
///
/// # Safety
/// `comm` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn snclRedOpDestroy(op: snclRedOpRaw, comm: snclComm_t) -> snclResult_t {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let shared = unsafe { comm_arg(comm) }?;
        if (0..5).contains(&op) {
            return Err(CError::invalid(format!(
                "operator {op} is built in and cannot be destroyed"
            )));
        }
        if !shared.remove_redop(op) {
            return Err(CError::invalid(format!(
                "operator {op} was not created on this communicator (or is destroyed)"
            )));
        }
        Ok(OK)
    })
}

// ---------------------------------------------------------------------
// Operations.

/// Validates and issues an operation built by `f`.
///
/// # Safety
/// `comm` and `stream` are NULL or live handles.
unsafe fn issue(
    comm: snclComm_t,
    stream: snclStream_t,
    f: impl FnOnce(&Communicator, &CommShared) -> R<Item>,
) -> snclResult_t {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let shared = unsafe { comm_arg(comm) }?;
        // SAFETY: forwarded from the caller.
        let stream = unsafe { stream_arg(stream) };
        let r = (|| {
            let c = shared.get()?;
            let item = f(c, &shared)?;
            exec::issue(shared.clone(), stream, item)
        })();
        if let Err(e) = &r {
            shared.record(e);
        }
        r.map(|_| OK)
    })
}

fn coll(raw: RawOp, premul: Option<PreMul>, input_elems: usize) -> R<Item> {
    Ok(Item::Coll(CollOp {
        raw,
        premul,
        input_elems,
        codec: None,
    }))
}

fn raw(
    coll: Collective,
    dtype: DataType,
    count: usize,
    send: *const c_void,
    recv: *mut c_void,
) -> RawOp {
    let mut r = RawOp::new(coll, dtype, count);
    r.send = send as *const u8;
    r.recv = recv as *mut u8;
    r
}

/// All-reduce: `recvbuff[i]` = `op` over all ranks of `sendbuff[i]`, for
/// `count` elements. In place when `sendbuff == recvbuff`.
///
/// # Safety
/// The buffers hold `count` elements and stay valid until the operation
/// completes (when this returns for a NULL stream; else when the stream
/// reaches it). `comm` and `stream` are live handles (stream may be NULL).
#[no_mangle]
pub unsafe extern "C" fn snclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: snclDataTypeRaw,
    op: snclRedOpRaw,
    comm: snclComm_t,
    stream: snclStream_t,
) -> snclResult_t {
    // SAFETY: forwarded from the caller.
    unsafe {
        issue(comm, stream, |_, s| {
            let dt = dtype_arg(datatype)?;
            let (rop, pm) = op_arg(s, op, dt)?;
            span("count", count, 1, dt)?;
            let mut r = raw(Collective::AllReduce, dt, count, sendbuff, recvbuff);
            r.op = rop;
            coll(r, pm, count)
        })
    }
}

/// Compressed all-reduce (sncl extension): as `snclAllReduce`, but the
/// data crosses nodes encoded with `codec` (between all ranks when they
/// share one node or nodes hold different numbers of ranks; the
/// hierarchical scope of `Communicator::all_reduce_compressed`), a spec
/// string such as `"int8"`,
/// `"int8:<block>"`, `"fp16"`, `"bf16"` or `"topk:0.01"` (lossy: see the
/// codec's error bound). Float32 only (`snclFloat32`); `op` is `snclSum`
/// or `snclAvg`. Every rank passes the same codec. In place when
/// `sendbuff == recvbuff` (otherwise sendbuff is copied into recvbuff,
/// which is then reduced in place). Not allowed inside a group
/// (`snclInvalidUsage`).
///
/// # Safety
/// As `snclAllReduce`; `codec` is a NUL-terminated string (read before the
/// call returns); recvbuff is aligned for float.
#[no_mangle]
pub unsafe extern "C" fn snclAllReduceCompressed(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: snclDataTypeRaw,
    op: snclRedOpRaw,
    codec: *const c_char,
    comm: snclComm_t,
    stream: snclStream_t,
) -> snclResult_t {
    // SAFETY: forwarded from the caller.
    unsafe {
        issue(comm, stream, |_, _| {
            if exec::in_group() {
                return Err(CError::usage(
                    "snclAllReduceCompressed cannot be used inside a group",
                ));
            }
            let dt = dtype_arg(datatype)?;
            if dt != DataType::Float32 {
                return Err(CError::invalid(format!(
                    "snclAllReduceCompressed supports snclFloat32 only, not {}",
                    dt.name()
                )));
            }
            let rop = match op {
                0 => ReduceOp::Sum,
                4 => ReduceOp::Avg,
                _ => {
                    return Err(CError::invalid(format!(
                        "operator {op} is not supported with compression; expected snclSum (0) \
                         or snclAvg (4)"
                    )))
                }
            };
            if codec.is_null() {
                return Err(CError::invalid("codec is NULL"));
            }
            // SAFETY: the caller passes a NUL-terminated string.
            let spec = std::ffi::CStr::from_ptr(codec);
            let spec = spec
                .to_str()
                .map_err(|_| CError::invalid("codec is not UTF-8"))?;
            let codec = crate::Codec::parse(spec)
                .map_err(|e| CError::invalid(format!("codec {spec:?}: {e}")))?;
            span("count", count, 1, dt)?;
            if count > 0 && (sendbuff.is_null() || recvbuff.is_null()) {
                return Err(CError::invalid("sendbuff or recvbuff is NULL"));
            }
            if !(recvbuff as usize).is_multiple_of(std::mem::align_of::<f32>()) {
                return Err(CError::invalid("recvbuff is not aligned for float"));
            }
            let mut r = raw(Collective::AllReduce, dt, count, sendbuff, recvbuff);
            r.op = rop;
            Ok(Item::Coll(CollOp {
                raw: r,
                premul: None,
                input_elems: count,
                codec: Some(codec),
            }))
        })
    }
}

/// Broadcast: `count` elements of `sendbuff` on `root` land in `recvbuff`
/// on every rank (`sendbuff` is only read on the root). In place when
/// `sendbuff == recvbuff`.
///
/// # Safety
/// As `snclAllReduce`.
#[no_mangle]
pub unsafe extern "C" fn snclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: snclDataTypeRaw,
    root: c_int,
    comm: snclComm_t,
    stream: snclStream_t,
) -> snclResult_t {
    // SAFETY: forwarded from the caller.
    unsafe {
        issue(comm, stream, |c, _| {
            let dt = dtype_arg(datatype)?;
            let root = rank_arg("root", root, c.size())?;
            span("count", count, 1, dt)?;
            let mut r = raw(Collective::Broadcast, dt, count, sendbuff, recvbuff);
            r.root = root;
            coll(r, None, count)
        })
    }
}

/// In-place broadcast of `buff` from `root` (NCCL's legacy `ncclBcast`).
///
/// # Safety
/// As `snclAllReduce`.
#[no_mangle]
pub unsafe extern "C" fn snclBcast(
    buff: *mut c_void,
    count: usize,
    datatype: snclDataTypeRaw,
    root: c_int,
    comm: snclComm_t,
    stream: snclStream_t,
) -> snclResult_t {
    // SAFETY: forwarded from the caller.
    unsafe { snclBroadcast(buff, buff, count, datatype, root, comm, stream) }
}

/// Reduce: the root's `recvbuff` receives `op` over all ranks of
/// `sendbuff` (`count` elements; `recvbuff` may be NULL elsewhere). In
/// place when `sendbuff == recvbuff`.
///
/// # Safety
/// As `snclAllReduce`.
#[no_mangle]
pub unsafe extern "C" fn snclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: snclDataTypeRaw,
    op: snclRedOpRaw,
    root: c_int,
    comm: snclComm_t,
    stream: snclStream_t,
) -> snclResult_t {
    // SAFETY: forwarded from the caller.
    unsafe {
        issue(comm, stream, |c, s| {
            let dt = dtype_arg(datatype)?;
            let (rop, pm) = op_arg(s, op, dt)?;
            let root = rank_arg("root", root, c.size())?;
            span("count", count, 1, dt)?;
            let mut r = raw(Collective::Reduce, dt, count, sendbuff, recvbuff);
            r.op = rop;
            r.root = root;
            coll(r, pm, count)
        })
    }
}

/// All-gather: rank i's `sendcount` elements land at `recvbuff + i *
/// sendcount` on every rank. In place when `sendbuff == recvbuff + rank *
/// sendcount`.
///
/// # Safety
/// As `snclAllReduce`; `recvbuff` holds `nranks * sendcount` elements.
#[no_mangle]
pub unsafe extern "C" fn snclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: snclDataTypeRaw,
    comm: snclComm_t,
    stream: snclStream_t,
) -> snclResult_t {
    // SAFETY: forwarded from the caller.
    unsafe {
        issue(comm, stream, |c, _| {
            let dt = dtype_arg(datatype)?;
            span("sendcount", sendcount, c.size(), dt)?;
            coll(
                raw(Collective::AllGather, dt, sendcount, sendbuff, recvbuff),
                None,
                sendcount,
            )
        })
    }
}

/// Reduce-scatter: `sendbuff` holds `nranks` blocks of `recvcount`
/// elements; rank i's `recvbuff` receives block i reduced with `op` over
/// all ranks. In place when `recvbuff == sendbuff + rank * recvcount`.
///
/// # Safety
/// As `snclAllReduce`; `sendbuff` holds `nranks * recvcount` elements.
#[no_mangle]
pub unsafe extern "C" fn snclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: snclDataTypeRaw,
    op: snclRedOpRaw,
    comm: snclComm_t,
    stream: snclStream_t,
) -> snclResult_t {
    // SAFETY: forwarded from the caller.
    unsafe {
        issue(comm, stream, |c, s| {
            let dt = dtype_arg(datatype)?;
            let (rop, pm) = op_arg(s, op, dt)?;
            let total = span("recvcount", recvcount, c.size(), dt)?;
            let mut r = raw(Collective::ReduceScatter, dt, recvcount, sendbuff, recvbuff);
            r.op = rop;
            coll(r, pm, total)
        })
    }
}

/// All-to-all: block j (`count` elements at `sendbuff + j * count`) goes to
/// rank j; block i of `recvbuff` comes from rank i.
///
/// # Safety
/// As `snclAllReduce`; both buffers hold `nranks * count` elements and do
/// not overlap.
#[no_mangle]
pub unsafe extern "C" fn snclAlltoAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: snclDataTypeRaw,
    comm: snclComm_t,
    stream: snclStream_t,
) -> snclResult_t {
    // SAFETY: forwarded from the caller.
    unsafe {
        issue(comm, stream, |c, _| {
            let dt = dtype_arg(datatype)?;
            span("count", count, c.size(), dt)?;
            coll(
                raw(Collective::AllToAll, dt, count, sendbuff, recvbuff),
                None,
                count,
            )
        })
    }
}

/// Gather: rank i's `count` elements land at `recvbuff + i * count` on
/// `root` (`recvbuff` is only used on the root).
///
/// # Safety
/// As `snclAllReduce`; the root's `recvbuff` holds `nranks * count`
/// elements.
#[no_mangle]
pub unsafe extern "C" fn snclGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: snclDataTypeRaw,
    root: c_int,
    comm: snclComm_t,
    stream: snclStream_t,
) -> snclResult_t {
    // SAFETY: forwarded from the caller.
    unsafe {
        issue(comm, stream, |c, _| {
            let dt = dtype_arg(datatype)?;
            let root = rank_arg("root", root, c.size())?;
            span("count", count, c.size(), dt)?;
            let mut r = raw(Collective::Gather, dt, count, sendbuff, recvbuff);
            r.root = root;
            coll(r, None, count)
        })
    }
}

/// Scatter: block i (`count` elements at `sendbuff + i * count`) of the
/// root lands in rank i's `recvbuff` (`sendbuff` is only used on the root).
///
/// # Safety
/// As `snclAllReduce`; the root's `sendbuff` holds `nranks * count`
/// elements.
#[no_mangle]
pub unsafe extern "C" fn snclScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: snclDataTypeRaw,
    root: c_int,
    comm: snclComm_t,
    stream: snclStream_t,
) -> snclResult_t {
    // SAFETY: forwarded from the caller.
    unsafe {
        issue(comm, stream, |c, _| {
            let dt = dtype_arg(datatype)?;
            let root = rank_arg("root", root, c.size())?;
            span("count", count, c.size(), dt)?;
            let mut r = raw(Collective::Scatter, dt, count, sendbuff, recvbuff);
            r.root = root;
            coll(r, None, count)
        })
    }
}

/// All-gather with per-rank counts (sncl extension, MPI's `Allgatherv`):
/// rank i contributes `recvcounts[i]` elements from its `sendbuff`, which
/// land at `recvbuff + displs[i]` on every rank. Both arrays have `nranks`
/// entries, in elements, and are copied before this returns.
///
/// # Safety
/// As `snclAllReduce`; `recvbuff` holds `max(displs[i] + recvcounts[i])`
/// elements and does not overlap `sendbuff`.
#[no_mangle]
pub unsafe extern "C" fn snclAllGatherV(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcounts: *const usize,
    displs: *const usize,
    datatype: snclDataTypeRaw,
    comm: snclComm_t,
    stream: snclStream_t,
) -> snclResult_t {
    let build = |c: &Communicator, _: &CommShared| {
        let dt = dtype_arg(datatype)?;
        let n = c.size();
        // SAFETY: the caller provides `nranks` entries in each array.
        let (counts, displs) = unsafe {
            (
                counts_arg("recvcounts", recvcounts, n)?,
                counts_arg("displs", displs, n)?,
            )
        };
        for (c, d) in counts.iter().zip(&displs) {
            span("recvcounts + displs", c.saturating_add(*d), 1, dt)?;
        }
        let mut r = raw(Collective::AllGatherV, dt, 0, sendbuff, recvbuff);
        r.v = Some(VCounts {
            send_counts: vec![],
            send_displs: vec![],
            recv_counts: counts,
            recv_displs: displs,
        });
        coll(r, None, 0)
    };
    // SAFETY: forwarded from the caller.
    unsafe { issue(comm, stream, build) }
}

/// All-to-all with per-peer counts (sncl extension, MPI's `Alltoallv`):
/// `sendcounts[j]` elements at `sendbuff + sdispls[j]` go to rank j;
/// `recvcounts[i]` elements from rank i land at `recvbuff + rdispls[i]`.
/// Each array has `nranks` entries, in elements, and is copied before this
/// returns.
///
/// # Safety
/// As `snclAllReduce`; the buffers cover their counts and displacements and
/// do not overlap.
#[no_mangle]
pub unsafe extern "C" fn snclAlltoAllV(
    sendbuff: *const c_void,
    sendcounts: *const usize,
    sdispls: *const usize,
    recvbuff: *mut c_void,
    recvcounts: *const usize,
    rdispls: *const usize,
    datatype: snclDataTypeRaw,
    comm: snclComm_t,
    stream: snclStream_t,
) -> snclResult_t {
    let build = |c: &Communicator, _: &CommShared| {
        let dt = dtype_arg(datatype)?;
        let n = c.size();
        // SAFETY: the caller provides `nranks` entries in each array.
        let v = unsafe {
            VCounts {
                send_counts: counts_arg("sendcounts", sendcounts, n)?,
                send_displs: counts_arg("sdispls", sdispls, n)?,
                recv_counts: counts_arg("recvcounts", recvcounts, n)?,
                recv_displs: counts_arg("rdispls", rdispls, n)?,
            }
        };
        for (c, d) in v
            .send_counts
            .iter()
            .zip(&v.send_displs)
            .chain(v.recv_counts.iter().zip(&v.recv_displs))
        {
            span("counts + displacements", c.saturating_add(*d), 1, dt)?;
        }
        let mut r = raw(Collective::AllToAllV, dt, 0, sendbuff, recvbuff);
        r.v = Some(v);
        coll(r, None, 0)
    };
    // SAFETY: forwarded from the caller.
    unsafe { issue(comm, stream, build) }
}

/// Waits until every rank has reached it (sncl extension).
///
/// # Safety
/// `comm` and `stream` are live handles (stream may be NULL).
#[no_mangle]
pub unsafe extern "C" fn snclBarrier(comm: snclComm_t, stream: snclStream_t) -> snclResult_t {
    // SAFETY: forwarded from the caller.
    unsafe {
        issue(comm, stream, |_, _| {
            coll(RawOp::new(Collective::Barrier, DataType::Uint8, 0), None, 0)
        })
    }
}

fn p2p(
    c: &Communicator,
    peer: c_int,
    count: usize,
    datatype: snclDataTypeRaw,
    ptr: *mut c_void,
    is_send: bool,
) -> R<Item> {
    let dt = dtype_arg(datatype)?;
    let peer = rank_arg("peer", peer, c.size())?;
    let bytes = span("count", count, 1, dt)? * dt.size();
    Ok(Item::P2p {
        peer,
        is_send,
        ptr: ptr as usize,
        bytes,
    })
}

/// Sends `count` elements of `sendbuff` to rank `peer`, which receives them
/// with `snclRecv` (same count and type). Sends and receives that must
/// progress together (a ring exchange) go inside one group. A rank may send
/// to itself within a group that also receives from itself (the k-th send
/// to self feeds the k-th receive from self, same size); a send to self
/// without that receive is `snclInvalidArgument` (in NCCL it would hang).
///
/// # Safety
/// As `snclAllReduce`.
#[no_mangle]
pub unsafe extern "C" fn snclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: snclDataTypeRaw,
    peer: c_int,
    comm: snclComm_t,
    stream: snclStream_t,
) -> snclResult_t {
    // SAFETY: forwarded from the caller.
    unsafe {
        issue(comm, stream, |c, _| {
            p2p(c, peer, count, datatype, sendbuff as *mut c_void, true)
        })
    }
}

/// Receives `count` elements from rank `peer` into `recvbuff`.
///
/// # Safety
/// As `snclAllReduce`.
#[no_mangle]
pub unsafe extern "C" fn snclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: snclDataTypeRaw,
    peer: c_int,
    comm: snclComm_t,
    stream: snclStream_t,
) -> snclResult_t {
    // SAFETY: forwarded from the caller.
    unsafe {
        issue(comm, stream, |c, _| {
            p2p(c, peer, count, datatype, recvbuff, false)
        })
    }
}

/// Starts a group (groups nest): operations issued by this thread until the
/// matching `snclGroupEnd` are collected and run together there, as are
/// communicator creations and splits.
#[no_mangle]
pub extern "C" fn snclGroupStart() -> snclResult_t {
    guard(|| {
        exec::group_start();
        Ok(OK)
    })
}

/// Ends a group. At the outermost level: creates the communicators the
/// group started (concurrently), then runs its operations, per
/// communicator in issue order with all sends and receives progressing
/// together, different communicators concurrently. Operations on a NULL
/// stream have completed when it returns; those on a stream run there.
#[no_mangle]
pub extern "C" fn snclGroupEnd() -> snclResult_t {
    guard(|| exec::group_end().map(|_| OK))
}

// ---------------------------------------------------------------------
// Host streams.

/// Creates a host stream: a thread that runs the operations queued on it in
/// order.
///
/// # Safety
/// `stream` points to writable storage for a handle.
#[no_mangle]
pub unsafe extern "C" fn snclStreamCreate(stream: *mut snclStream_t) -> snclResult_t {
    guard(|| {
        if stream.is_null() {
            return Err(CError::invalid("stream is NULL"));
        }
        let s = Box::into_raw(Box::new(stream::create()?));
        // SAFETY: checked non-NULL; the caller provides storage.
        unsafe { stream.write(s) };
        Ok(OK)
    })
}

/// Waits until every operation queued on `stream` has completed; returns
/// the first error among them since the last synchronization (and
/// `snclGetLastError` explains it).
///
/// # Safety
/// `stream` is a live stream handle.
#[no_mangle]
pub unsafe extern "C" fn snclStreamSynchronize(stream: snclStream_t) -> snclResult_t {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let s = unsafe { stream_arg(stream) }.ok_or_else(|| CError::invalid("stream is NULL"))?;
        s.synchronize().map(|_| OK)
    })
}

/// `snclInProgress` while operations queued on `stream` are still running;
/// otherwise like `snclStreamSynchronize`.
///
/// # Safety
/// `stream` is a live stream handle.
#[no_mangle]
pub unsafe extern "C" fn snclStreamQuery(stream: snclStream_t) -> snclResult_t {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let s = unsafe { stream_arg(stream) }.ok_or_else(|| CError::invalid("stream is NULL"))?;
        s.query()
    })
}

/// Releases `stream` after its queued operations have run; returns the
/// first error among them not yet reported. The handle is invalid
/// afterwards in any case.
///
/// # Safety
/// `stream` is a live stream handle.
#[no_mangle]
pub unsafe extern "C" fn snclStreamDestroy(stream: snclStream_t) -> snclResult_t {
    guard(|| {
        if stream.is_null() {
            return Err(CError::invalid("stream is NULL"));
        }
        // SAFETY: a live handle made by Box::into_raw, released once.
        let s = unsafe { Box::from_raw(stream) };
        stream::destroy(*s).map(|_| OK)
    })
}
