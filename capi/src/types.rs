//! The C-visible types and constants of `sncl.h`.

use std::ffi::{c_char, c_int, c_uint};

/// Major version of the NCCL API sncl mirrors (`SNCL_VERSION_CODE` =
/// major × 10000 + minor × 100 + patch, as NCCL computes it since 2.9).
/// It is NCCL's, not sncl's own (`SNCL_RELEASE` in sncl.h), so that a port
/// that renamed `NCCL_VERSION_CODE >= NCCL_VERSION(2, 19, 0)` keeps the
/// branch its code was written for: sncl has the API of NCCL 2.27
/// (windows, shrink, scalable init, registration, fp8 types), without the
/// later one-sided and grow calls.
pub const SNCL_MAJOR: c_int = 2;
/// Minor version of the NCCL API sncl mirrors.
pub const SNCL_MINOR: c_int = 27;
/// Patch version of the NCCL API sncl mirrors.
pub const SNCL_PATCH: c_int = 3;
/// The version code `snclGetVersion` reports: `SNCL_VERSION(SNCL_MAJOR,
/// SNCL_MINOR, SNCL_PATCH)`, the NCCL version whose API sncl mirrors.
pub const SNCL_VERSION_CODE: c_int = 22703;
/// Size of `snclUniqueId`, the same as `NCCL_UNIQUE_ID_BYTES`.
pub const SNCL_UNIQUE_ID_BYTES: usize = 128;

/// The `color` of `snclCommSplit` for a rank that joins no new
/// communicator (it gets `NULL`).
pub const SNCL_SPLIT_NOCOLOR: c_int = -1;

/// The `magic` field of an initialized `snclConfig_t`.
pub const SNCL_API_MAGIC: c_uint = 0xcafe_beef;

/// Result of every call. Values equal NCCL's `ncclResult_t`;
/// `snclGetErrorString` names them and `snclGetLastError` explains the last
/// failure in full.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum snclResult_t {
    /// Success.
    snclSuccess = 0,
    /// A device (CUDA) call failed. Not produced while buffers are host memory.
    snclUnhandledCudaError = 1,
    /// An operating-system call failed (sockets, shared memory, threads).
    snclSystemError = 2,
    /// A bug in sncl (including a caught panic); please report it.
    snclInternalError = 3,
    /// An argument is invalid: a NULL pointer, an unknown data type or
    /// operator, a rank or root out of range, a bad unique id or config.
    snclInvalidArgument = 4,
    /// The call is not allowed now: `snclGroupEnd` without
    /// `snclGroupStart`, mismatched collectives across ranks, use of an
    /// aborted communicator.
    snclInvalidUsage = 5,
    /// A peer failed, exited or aborted, or the network broke.
    snclRemoteError = 6,
    /// A non-blocking call has not completed yet (non-blocking
    /// communicators and `snclStreamQuery`).
    snclInProgress = 7,
    /// A peer made no progress within the communicator's timeout.
    snclTimeout = 8,
    /// The number of result codes.
    snclNumResults = 9,
}

/// Built-in reduction operators, values equal to NCCL's `ncclRedOp_t`.
/// `snclRedOpCreatePreMulSum` returns further values, from `snclNumOps` up.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum snclRedOp_t {
    /// Sum (integers wrap).
    snclSum = 0,
    /// Product (integers wrap).
    snclProd = 1,
    /// Maximum.
    snclMax = 2,
    /// Minimum.
    snclMin = 3,
    /// Sum divided by the number of ranks (integers: truncating division).
    snclAvg = 4,
    /// The number of built-in operators, and the first value of a custom one.
    snclNumOps = 5,
    /// The largest valid operator value (keeps the enum int-sized).
    snclMaxRedOp = 0x7fff_ffff,
}

/// Element types, values equal to NCCL's `ncclDataType_t`. NCCL's aliases
/// `snclChar`, `snclInt`, `snclHalf`, `snclFloat` and `snclDouble` are
/// defined as macros.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum snclDataType_t {
    /// int8_t (alias `snclChar`).
    snclInt8 = 0,
    /// uint8_t.
    snclUint8 = 1,
    /// int32_t (alias `snclInt`).
    snclInt32 = 2,
    /// uint32_t.
    snclUint32 = 3,
    /// int64_t.
    snclInt64 = 4,
    /// uint64_t.
    snclUint64 = 5,
    /// IEEE half precision (alias `snclHalf`).
    snclFloat16 = 6,
    /// float (alias `snclFloat`).
    snclFloat32 = 7,
    /// double (alias `snclDouble`).
    snclFloat64 = 8,
    /// bfloat16.
    snclBfloat16 = 9,
    /// 8-bit float e4m3 (OCP E4M3FN, `__nv_fp8_e4m3`): no infinities, NaN
    /// `S.1111.111`, largest finite ±448. Sum, prod, min, max and avg
    /// compute in float and round to nearest even after every step,
    /// saturating (`__NV_SATFINITE`): results beyond ±448 become ±448.
    snclFloat8e4m3 = 10,
    /// 8-bit float e5m2 (`__nv_fp8_e5m2`): IEEE-like, largest finite
    /// ±57344. Reductions as for e4m3, saturating: results beyond ±57344,
    /// infinities included, become ±57344; NaN stays NaN.
    snclFloat8e5m2 = 11,
    /// The number of data types.
    snclNumTypes = 12,
}

/// Where the scalar of `snclRedOpCreatePreMulSum` lives. Values equal NCCL's
/// `ncclScalarResidence_t`. With host buffers both are host pointers.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum snclScalarResidence_t {
    /// The scalar is read each time a collective using the operator runs
    /// (it must stay valid while the operator is in use).
    snclScalarDevice = 0,
    /// The scalar is copied before `snclRedOpCreatePreMulSum` returns.
    snclScalarHostImmediate = 1,
}

/// `snclResult_t` as an int: how the functions receive it, so that an
/// out-of-range value is reported instead of being undefined behaviour.
/// The header spells it `snclResult_t`.
pub type snclResultRaw = c_int;
/// `snclDataType_t` as an int (spelled `snclDataType_t` in the header).
pub type snclDataTypeRaw = c_int;
/// `snclRedOp_t` as an int (spelled `snclRedOp_t` in the header); custom
/// operators are values beyond the enum's named ones.
pub type snclRedOpRaw = c_int;
/// `snclScalarResidence_t` as an int (spelled `snclScalarResidence_t` in
/// the header).
pub type snclScalarResidenceRaw = c_int;

/// What every rank of a new communicator needs: where rank 0's rendezvous
/// store listens and the job's secret. Made by `snclGetUniqueId` and passed
/// unchanged (128 bytes) to every rank, like `ncclUniqueId`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct snclUniqueId {
    /// The encoded id.
    pub internal: [c_char; SNCL_UNIQUE_ID_BYTES],
}

impl snclUniqueId {
    /// The C form of `id`.
    pub(crate) fn from_id(id: &sncl_rs::UniqueId) -> snclUniqueId {
        snclUniqueId {
            internal: id.to_bytes().map(|x| x as c_char),
        }
    }

    /// The id these bytes encode; anything else is a clear error.
    pub(crate) fn id(&self) -> sncl_rs::Result<sncl_rs::UniqueId> {
        sncl_rs::UniqueId::from_bytes(&self.internal.map(|x| x as u8))
    }
}

/// Communicator configuration for `snclCommInitRankConfig` and
/// `snclCommSplit`: NCCL's `ncclConfig_t` (same fields, same order) plus
/// sncl's `timeoutMs`. Initialize it with `SNCL_CONFIG_INITIALIZER`, then
/// set what you need; fields left at `SNCL_CONFIG_UNDEF_INT` /
/// `SNCL_CONFIG_UNDEF_PTR` keep their defaults. Only `blocking` and
/// `timeoutMs` have an effect on host memory; the device fields are
/// accepted and ignored.
#[repr(C)]
pub struct snclConfig_t {
    /// `sizeof(snclConfig_t)`, set by the initializer.
    pub size: usize,
    /// `SNCL_API_MAGIC`, set by the initializer.
    pub magic: c_uint,
    /// `SNCL_VERSION_CODE`, set by the initializer.
    pub version: c_uint,
    /// 1 (default): init and split return when done. 0: they return
    /// `snclInProgress` at once and finish in the background; poll
    /// `snclCommGetAsyncError` until it reports `snclSuccess`.
    pub blocking: c_int,
    /// Ignored (device setting).
    pub cgaClusterSize: c_int,
    /// Ignored (device setting).
    pub minCTAs: c_int,
    /// Ignored (device setting).
    pub maxCTAs: c_int,
    /// Ignored.
    pub netName: *const c_char,
    /// Ignored.
    pub splitShare: c_int,
    /// Ignored.
    pub trafficClass: c_int,
    /// Ignored.
    pub commName: *const c_char,
    /// Ignored.
    pub collnetEnable: c_int,
    /// Ignored.
    pub CTAPolicy: c_int,
    /// Ignored.
    pub shrinkShare: c_int,
    /// Ignored.
    pub nvlsCTAs: c_int,
    /// Ignored.
    pub nChannelsPerNetPeer: c_int,
    /// Ignored.
    pub nvlinkCentricSched: c_int,
    /// Ignored.
    pub graphUsageMode: c_int,
    /// Ignored.
    pub numRmaCtx: c_int,
    /// Ignored.
    pub maxP2pPeers: c_int,
    /// Ignored.
    pub graphStreamOrdering: c_int,
    /// sncl extension: an operation fails with `snclTimeout` when a peer it
    /// waits on makes no progress for this many milliseconds (also the
    /// deadline of init). Default: `SNCL_TIMEOUT_MS`, else 300000.
    pub timeoutMs: c_int,
    /// sncl extension: 1 makes all-reduce, reduce and reduce-scatter
    /// bitwise reproducible, every element reduced in one canonical order
    /// whatever the algorithm (docs/DETERMINISM.md); 0 lets each algorithm
    /// reduce in its own order. Default: `SNCL_DETERMINISTIC`, else 0. Every
    /// rank must agree.
    pub deterministic: c_int,
}

/// CUDA's stream structure, never defined: `cudaStream_t` and the driver's
/// `CUstream` are both `struct CUstream_st *`, so either converts to a
/// `snclStream_t` without a cast (the header only forward-declares it and
/// needs no CUDA header).
#[repr(C)]
pub struct CUstream_st {
    _opaque: [u8; 0],
}

/// The last argument of every operation, NCCL's `cudaStream_t`. It is one of:
///
/// * `NULL`: for device buffers, the legacy default CUDA stream (on the
///   emulated device, that device's default stream), and the call returns
///   once the operation is queued; for host buffers, the operation runs to
///   completion before the call returns;
/// * a host stream from `snclStreamCreate` (sncl keeps a registry of them):
///   host buffers only; operations queued on one host stream run in order
///   on the stream's own thread, asynchronously to the caller;
/// * any other handle: a CUDA stream (`cudaStream_t`, `CUstream`; on the
///   emulated device, a stream from `snclDeviceStreamCreate`), for device
///   buffers only: the operation runs after the work queued there before
///   it, and later work there runs after it, as with NCCL.
pub type snclStream_t = *mut CUstream_st;

/// Per-call settings of one collective, for `snclAllReduceConfig` and the
/// other `...Config` collectives. Initialize it with
/// `SNCL_COLL_CONFIG_INITIALIZER`, then set what you need; the fields
/// left as initialized change nothing. Every rank passes the same
/// settings for the same call.
#[repr(C)]
pub struct snclCollConfig_t {
    /// `sizeof(snclCollConfig_t)`, set by the initializer.
    pub size: usize,
    /// `SNCL_API_MAGIC`, set by the initializer.
    pub magic: c_uint,
    /// `SNCL_VERSION_CODE`, set by the initializer.
    pub version: c_uint,
    /// The call's algorithm as `SNCL_ALGO` names it (`"ring"`, `"tree"`,
    /// `"hier"`, `"rd"`, `"flat-ring"`, `"pairwise"`; one the collective
    /// implements); NULL: the planner's choice.
    pub algorithm: *const c_char,
    /// The call's protocol as `NCCL_PROTO` names it, device buffers only:
    /// `"Simple"` (what sncl's device path does; LL and LL128 are not
    /// implemented); NULL: sncl's own. Host buffers take none.
    pub protocol: *const c_char,
    /// The call's pipeline chunk in bytes; 0: `SNCL_CHUNK_BYTES`.
    pub chunkBytes: usize,
    /// A tag of the caller's, shown with the operation in the flight
    /// recorder and `commbench trace`; 0: none (`snclTagOfName` makes one
    /// of a name).
    pub userTag: u64,
    /// The most thread blocks (CTAs) the call's device kernel runs with,
    /// as NCCL's `maxCTAs`; 0: sncl's own grid. Device buffers only.
    pub maxCTAs: c_int,
}
