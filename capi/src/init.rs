//! The `extern "C"` functions of `sncl.h` for communicators: creation,
//! split, finalize, destroy, abort, queries and reduction operators.

use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

use super::args::*;
use super::comm::{snclComm_t, CommShared, PreMul, Scalar, Ticket};
use super::error::{guard, CError};
use super::exec;
use super::types::*;
use super::uid;
use sncl_rs::{Communicator, Config, UniqueId};

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
        let id = commId.id()?;
        // SAFETY: forwarded from the caller.
        let opts = unsafe { config_arg(config) }?;
        let cfg = env_config(&opts)?;
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

/// Creates this rank's communicator from `nId` unique ids (NCCL's
/// `ncclCommInitRankScalable`, which spreads its bootstrap over several
/// roots). sncl's bootstrap has one root: every id must be well formed,
/// and the first one is used, so every rank must pass the same first id;
/// otherwise as `snclCommInitRankConfig` (blocking, non-blocking, groups).
///
/// # Safety
/// `newcomm` points to writable storage for a handle; `commIds` points to
/// `nId` ids; `config` is NULL or an initialized `snclConfig_t`.
#[no_mangle]
pub unsafe extern "C" fn snclCommInitRankScalable(
    newcomm: *mut snclComm_t,
    nranks: c_int,
    myrank: c_int,
    nId: c_int,
    commIds: *mut snclUniqueId,
    config: *mut snclConfig_t,
) -> snclResult_t {
    let first = guard(|| {
        if commIds.is_null() {
            return Err(CError::invalid("commIds is NULL"));
        }
        let n = world_arg("nranks", nranks)?;
        if nId < 1 || nId as usize > n {
            return Err(CError::invalid(format!(
                "nId {nId}: expected 1 to nranks ({n}) unique ids"
            )));
        }
        // SAFETY: the caller provides `nId` ids at `commIds`.
        let ids = unsafe { std::slice::from_raw_parts(commIds, nId as usize) };
        for (i, id) in ids.iter().enumerate() {
            id.id()
                .map_err(|e| CError::invalid(format!("commIds[{i}]: {e}")))?;
        }
        Ok(OK)
    });
    if first != OK {
        return first;
    }
    // SAFETY: checked above: at least one id; the rest forwarded.
    unsafe { snclCommInitRankConfig(newcomm, nranks, *commIds, myrank, config) }
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
        let comms = Communicator::init_threads(n, env_config(&Opts::default())?)?;
        for (i, c) in comms.into_iter().enumerate() {
            // SAFETY: the caller provides `ndev` handles at `comm`.
            unsafe { write_handle(comm.add(i), CommShared::ready(c, true, None)) };
        }
        Ok(OK)
    })
}

fn split_job(
    parent_shared: Arc<CommShared>,
    mut ticket: Ticket,
    color: c_int,
    key: c_int,
    child: Option<Arc<CommShared>>,
    opts: Opts,
) -> R {
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
        opts.apply(&mut cfg);
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
        let p = parent.clone();
        if !blocking {
            write(child.as_ref());
            let c = child.clone();
            spawn("sncl-split", move || {
                let _ = split_job(p, ticket, color, key, c, opts);
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
                split_job(p, ticket, color, key, child, opts)
            }));
            return Ok(OK);
        }
        write(None);
        split_job(p, ticket, color, key, child.clone(), opts)?;
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
        shared.settle_device(true);
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
        b.shared.settle_device(true);
        release_registrations(&b.shared, "snclCommDestroy");
        drop(b);
        Ok(OK)
    })
}

/// Releases what `snclCommRegister` registered on a communicator being
/// destroyed (as NCCL does), saying so: a registration never released is
/// usually a missing `snclCommDeregister`.
fn release_registrations(shared: &std::sync::Arc<super::comm::CommShared>, call: &str) {
    let n = super::register::release_all(shared);
    if n > 0 {
        tracing::info!(
            registrations = n,
            "{call} released registrations never deregistered"
        );
    }
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
        release_registrations(&b.shared, "snclCommAbort");
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

/// Dumps this rank's flight recorder of `comm` (its last
/// `SNCL_FLIGHT_RECORDER_ENTRIES` operations, with their tags) as JSON
/// lines into `SNCL_DEBUG_DUMP_DIR` (mode 0600; see
/// `Communicator::dump_flight_recorder`), and writes the file's path,
/// NUL-terminated, into `path` (`pathBytes` bytes). `commbench trace`
/// reads the dumps of all ranks. `snclInvalidArgument` when no dump
/// directory is set or the path does not fit; never waits for an
/// operation.
///
/// # Safety
/// `comm` is a live handle; `path` points to `pathBytes` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn snclCommDumpFlightRecorder(
    comm: snclComm_t,
    path: *mut c_char,
    pathBytes: usize,
) -> snclResult_t {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let shared = unsafe { comm_arg(comm) }?;
        if path.is_null() {
            return Err(CError::invalid("path is NULL"));
        }
        let written = shared.get()?.dump_flight_recorder()?;
        let text = written.to_string_lossy();
        if text.len() >= pathBytes {
            return Err(CError::invalid(format!(
                "the dump's path {text} ({} bytes and a NUL) does not fit in pathBytes {pathBytes}",
                text.len()
            )));
        }
        // SAFETY: checked non-NULL; the caller provides pathBytes bytes,
        // and text.len() + 1 <= pathBytes.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), path.cast::<u8>(), text.len());
            path.add(text.len()).write(0);
        }
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

/// Writes the device `comm`'s device collectives use (NCCL's
/// `ncclCommCuDevice`): the device bound by its first device collective,
/// else the calling thread's current device (`snclSetDevice`'s, else the
/// current CUDA context's, else 0).
///
/// # Safety
/// `comm` is a live handle; `device` points to a writable int.
#[no_mangle]
pub unsafe extern "C" fn snclCommCuDevice(comm: snclComm_t, device: *mut c_int) -> snclResult_t {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let shared = unsafe { comm_arg(comm) }?;
        if device.is_null() {
            return Err(CError::invalid("device is NULL"));
        }
        let ordinal = match shared.get()?.bound_device() {
            Some(d) => d.ordinal(),
            None => super::devmem::current()?,
        };
        // SAFETY: checked non-NULL; the caller provides storage.
        unsafe { device.write(ordinal as c_int) };
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
