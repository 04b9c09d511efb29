//! The `extern "C"` collectives of `sncl.h`.

use std::ffi::{c_char, c_int, c_void};

use comm_core::shape::OpShape;

use super::args::*;
use super::comm::{snclComm_t, CommShared, PreMul};
use super::error::{guard, CError};
use super::exec::{self, CollOp, Compress, Item};
use super::feedback::{feedback_arg, snclErrorFeedback_t};
use super::types::*;
use sncl_rs::{Collective, Communicator, DataType, RawOp, ReduceOp, VCounts};

/// Validates and issues an operation built by `f`.
///
/// # Safety
/// `comm` and `stream` are NULL or live handles.
pub(super) unsafe fn issue(
    comm: snclComm_t,
    stream: snclStream_t,
    f: impl FnOnce(&Communicator, &CommShared) -> R<Item>,
) -> snclResult_t {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let shared = unsafe { comm_arg(comm) }?;
        // SAFETY: forwarded from the caller.
        let stream = unsafe { super::devmem::stream_arg(stream) };
        let r = (|| {
            let c = shared.get()?;
            let item = f(c, &shared)?;
            super::devcoll::issue(&shared, c, stream, item)
        })();
        if let Err(e) = &r {
            shared.record(e);
        }
        r.map(|_| OK)
    })
}

pub(super) fn coll(raw: RawOp, premul: Option<PreMul>, input_elems: usize) -> R<Item> {
    Ok(Item::Coll(CollOp {
        raw,
        premul,
        input_elems,
        compress: None,
    }))
}

pub(super) fn raw(
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

/// One of the plain collectives: one count, an optional reduction operator
/// and an optional root (all but the V variants, compression and barrier).
pub(super) struct Plain {
    kind: Collective,
    count: usize,
    datatype: snclDataTypeRaw,
    op: Option<snclRedOpRaw>,
    root: Option<c_int>,
    /// The call's `snclCollConfig_t` (NULL: none).
    config: *const snclCollConfig_t,
}

impl Plain {
    pub(super) fn new(kind: Collective, count: usize, datatype: snclDataTypeRaw) -> Plain {
        Plain {
            kind,
            count,
            datatype,
            op: None,
            root: None,
            config: std::ptr::null(),
        }
    }

    /// The call's settings (`snclAllReduceConfig`, ...).
    pub(super) fn config(self, config: *const snclCollConfig_t) -> Plain {
        Plain { config, ..self }
    }

    pub(super) fn op(self, op: snclRedOpRaw) -> Plain {
        Plain {
            op: Some(op),
            ..self
        }
    }

    pub(super) fn root(self, root: c_int) -> Plain {
        Plain {
            root: Some(root),
            ..self
        }
    }

    /// Checks the datatype, then the operator (when it takes one), then
    /// the [`OpShape`] (root range, addressable extents), and issues the
    /// collective. Its input is the shape's send extent on this rank.
    ///
    /// # Safety
    /// As `snclAllReduce`; `config` is NULL or an initialized
    /// `snclCollConfig_t`.
    pub(super) unsafe fn issue(
        self,
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        comm: snclComm_t,
        stream: snclStream_t,
    ) -> snclResult_t {
        // SAFETY: forwarded from the caller.
        unsafe {
            issue(comm, stream, |c, s| {
                let dt = dtype_arg(self.datatype)?;
                let (rop, pm) = match self.op {
                    Some(op) => {
                        let (rop, pm) = op_arg(s, op, dt)?;
                        (Some(rop), pm)
                    }
                    None => (None, None),
                };
                let root = (self.root)
                    .map(|r| rank_arg("root", r, c.size()))
                    .transpose()?;
                // The one shape: root range, addressable extents, and the
                // input a premultiplied sum scales.
                let shape =
                    OpShape::new(self.kind, dt, self.count, c.size()).with_root(root.unwrap_or(0));
                shape.check().map_err(|e| CError::invalid(e.to_string()))?;
                let mut r = raw(self.kind, dt, self.count, sendbuff, recvbuff);
                if let Some(rop) = rop {
                    r.op = rop;
                }
                // `config` is NULL or an initialized snclCollConfig_t (the
                // caller's contract, inside this block's unsafe).
                r.config = coll_config_arg(self.config, self.kind)?.or_tag(r.config.tag);
                r.root = shape.root;
                coll(r, pm, shape.send_elems(c.rank()))
            })
        }
    }
}

/// All-reduce: `recvbuff[i]` = `op` over all ranks of `sendbuff[i]`, for
/// `count` elements. In place when `sendbuff == recvbuff`.
///
/// Every operation takes host buffers or device buffers (of one device,
/// found per pointer; not mixed): device buffers run on `stream`, a CUDA
/// stream or NULL (the default stream), and the call returns once the
/// operation is queued there; host buffers run on a host stream of
/// `snclStreamCreate`, or before the call returns with NULL. See
/// `snclStream_t`.
///
/// # Safety
/// The buffers hold `count` elements and stay valid until the operation
/// completes (host buffers with a NULL stream: when this returns; else
/// when the stream reaches it). `comm` and `stream` are live handles
/// (stream may be NULL).
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
    let plain = Plain::new(Collective::AllReduce, count, datatype).op(op);
    // SAFETY: forwarded from the caller.
    unsafe { plain.issue(sendbuff, recvbuff, comm, stream) }
}

/// Compressed all-reduce (sncl extension): as `snclAllReduce`, but the
/// data crosses nodes encoded with `codec` (between all ranks when they
/// share one node or nodes hold different numbers of ranks; the
/// hierarchical scope of `Communicator::all_reduce_compressed`), a spec
/// string such as `"int8"`,
/// `"int8:<block>"`, `"fp16"`, `"bf16"`, `"mxfp8"`, `"mxfp4"` or
/// `"topk:0.01"` (lossy: see the codec's error bound). Host buffers
/// (device buffers: the Rust API's `all_reduce_compressed` on a device view).
/// Float32 only (`snclFloat32`); `op` is `snclSum`
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
        snclAllReduceCompressedFeedback(
            sendbuff,
            recvbuff,
            count,
            datatype,
            op,
            codec,
            std::ptr::null_mut(),
            comm,
            stream,
        )
    }
}

/// `snclAllReduceCompressed` with error feedback (sncl extension):
/// `feedback` (from `snclErrorFeedbackCreate`; NULL: none) is added to this
/// rank's data before encoding, and keeps what the encoding dropped for the
/// next call, so that over many steps nothing is lost (as
/// `Communicator::all_reduce_compressed` with an `ErrorFeedback`). Use one
/// handle per tensor (per DDP bucket), by one operation at a time; its
/// length follows the tensor's (a new length starts it over).
///
/// # Safety
/// As `snclAllReduceCompressed`; `feedback` is NULL or a handle (a stale
/// one is `snclInvalidArgument`).
#[no_mangle]
pub unsafe extern "C" fn snclAllReduceCompressedFeedback(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: snclDataTypeRaw,
    op: snclRedOpRaw,
    codec: *const c_char,
    feedback: snclErrorFeedback_t,
    comm: snclComm_t,
    stream: snclStream_t,
) -> snclResult_t {
    // SAFETY: forwarded from the caller.
    unsafe {
        issue(comm, stream, |c, _| {
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
            let codec = sncl_rs::Codec::parse(spec)
                .map_err(|e| CError::invalid(format!("codec {spec:?}: {e}")))?;
            let feedback = feedback_arg(feedback)?;
            OpShape::new(Collective::AllReduce, dt, count, c.size())
                .check()
                .map_err(|e| CError::invalid(e.to_string()))?;
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
                compress: Some(Box::new(Compress { codec, feedback })),
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
    let plain = Plain::new(Collective::Broadcast, count, datatype).root(root);
    // SAFETY: forwarded from the caller.
    unsafe { plain.issue(sendbuff, recvbuff, comm, stream) }
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
    let plain = Plain::new(Collective::Reduce, count, datatype)
        .op(op)
        .root(root);
    // SAFETY: forwarded from the caller.
    unsafe { plain.issue(sendbuff, recvbuff, comm, stream) }
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
    let plain = Plain::new(Collective::AllGather, sendcount, datatype);
    // SAFETY: forwarded from the caller.
    unsafe { plain.issue(sendbuff, recvbuff, comm, stream) }
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
    let plain = Plain::new(Collective::ReduceScatter, recvcount, datatype).op(op);
    // SAFETY: forwarded from the caller.
    unsafe { plain.issue(sendbuff, recvbuff, comm, stream) }
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
    let plain = Plain::new(Collective::AllToAll, count, datatype);
    // SAFETY: forwarded from the caller.
    unsafe { plain.issue(sendbuff, recvbuff, comm, stream) }
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
    let plain = Plain::new(Collective::Gather, count, datatype).root(root);
    // SAFETY: forwarded from the caller.
    unsafe { plain.issue(sendbuff, recvbuff, comm, stream) }
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
    let plain = Plain::new(Collective::Scatter, count, datatype).root(root);
    // SAFETY: forwarded from the caller.
    unsafe { plain.issue(sendbuff, recvbuff, comm, stream) }
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
        r.v = Some(Box::new(VCounts {
            send_counts: vec![],
            send_displs: vec![],
            recv_counts: counts,
            recv_displs: displs,
        }));
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
        r.v = Some(Box::new(v));
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
