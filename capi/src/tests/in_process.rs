//! In-process checks through the C functions, of what a multi-process C
//! program cannot easily reach: one thread driving every rank, groups of
//! inits, non-blocking init, errors reaching a stream, sends to the rank
//! itself, tagged messages. (The C programs: tests/c_abi.rs.)

use std::ffi::{c_int, c_void, CStr};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::rank_kit::free_port;
use crate::*;
#[test]
fn version_is_the_mirrored_nccl_api() {
    assert_eq!(
        (SNCL_MAJOR, SNCL_MINOR),
        (2, 27),
        "the NCCL API sncl mirrors"
    );
    assert_eq!(
        SNCL_VERSION_CODE,
        SNCL_MAJOR * 10000 + SNCL_MINOR * 100 + SNCL_PATCH
    );
    let mut got = 0;
    // SAFETY: a valid out-pointer.
    let r = unsafe { snclGetVersion(&mut got) };
    assert_eq!(r, snclResult_t::snclSuccess);
    assert_eq!(got, SNCL_VERSION_CODE);
}

use snclResult_t::*;

pub(super) fn ok(r: snclResult_t) {
    if r != snclSuccess {
        // SAFETY: NULL asks for this thread's last error.
        let msg = unsafe { CStr::from_ptr(snclGetLastError(std::ptr::null_mut())) };
        panic!("{r:?}: {}", msg.to_string_lossy());
    }
}

pub(super) fn id_at(root: SocketAddr) -> snclUniqueId {
    let b = sncl::UniqueId::new(root).unwrap().to_bytes();
    snclUniqueId {
        internal: b.map(|x| x as std::ffi::c_char),
    }
}

fn sum_of_ranks(n: usize) -> f32 {
    (n * (n - 1) / 2) as f32
}

const FLOAT: c_int = snclDataType_t::snclFloat32 as c_int;
const SUM: c_int = snclRedOp_t::snclSum as c_int;

/// All-reduces each rank's number on every communicator from this thread,
/// in one group; checks the sums.
///
/// # Safety
/// `comms` are live handles of one communicator, in rank order.
pub(super) unsafe fn grouped_all_reduce(comms: &[snclComm_t]) {
    let n = comms.len();
    let mut bufs: Vec<Vec<f32>> = (0..n).map(|r| vec![r as f32; 1000]).collect();
    ok(snclGroupStart());
    for (c, b) in comms.iter().zip(&mut bufs) {
        let p = b.as_mut_ptr() as *mut c_void;
        // SAFETY: the buffers outlive the group, which completes at GroupEnd.
        ok(unsafe { snclAllReduce(p, p, b.len(), FLOAT, SUM, *c, std::ptr::null_mut()) });
    }
    ok(snclGroupEnd());
    for b in &bufs {
        assert!(b.iter().all(|&x| x == sum_of_ranks(n)), "{:?}", &b[..4]);
    }
}

#[test]
fn one_thread_drives_every_rank() {
    let n = 4;
    let mut comms = vec![std::ptr::null_mut(); n];
    // SAFETY: `comms` has room for n handles; devlist may be NULL.
    unsafe {
        ok(snclCommInitAll(
            comms.as_mut_ptr(),
            n as c_int,
            std::ptr::null(),
        ));
        grouped_all_reduce(&comms);
        // A ring exchange from one thread, one group.
        let send: Vec<Vec<u64>> = (0..n).map(|r| vec![r as u64 * 7; 333]).collect();
        let mut recv = vec![vec![0u64; 333]; n];
        ok(snclGroupStart());
        for r in 0..n {
            let c = comms[r];
            let t = snclDataType_t::snclUint64 as c_int;
            ok(snclSend(
                send[r].as_ptr() as *const c_void,
                333,
                t,
                ((r + 1) % n) as c_int,
                c,
                std::ptr::null_mut(),
            ));
            ok(snclRecv(
                recv[r].as_mut_ptr() as *mut c_void,
                333,
                t,
                ((r + n - 1) % n) as c_int,
                c,
                std::ptr::null_mut(),
            ));
        }
        ok(snclGroupEnd());
        for (r, got) in recv.iter().enumerate() {
            assert!(got.iter().all(|&x| x == ((r + n - 1) % n) as u64 * 7));
        }
        // Every rank holds a FIFO per peer, counted by purpose and by
        // residence alike.
        for &c in &comms {
            let mut st = snclMemStats_t::default();
            ok(snclCommMemStats(c, &mut st));
            assert_eq!(st.connectedPeers, n as c_int - 1, "{st:?}");
            let by_residence = st.hostBytes + st.pinnedBytes + st.sharedBytes + st.deviceBytes;
            let by_purpose = st.fifoBytes
                + st.stagingBytes
                + st.registrationCacheBytes
                + st.scratchBytes
                + st.windowBytes
                + st.flightRecorderBytes
                + st.deviceStagingBytes;
            assert!(st.fifoBytes > 0 && by_residence == by_purpose, "{st:?}");
        }
        // Split in a group: even and odd ranks.
        let mut subs = vec![std::ptr::null_mut(); n];
        ok(snclGroupStart());
        for r in 0..n {
            ok(snclCommSplit(
                comms[r],
                (r % 2) as c_int,
                r as c_int,
                &mut subs[r],
                std::ptr::null_mut(),
            ));
        }
        ok(snclGroupEnd());
        let evens: Vec<_> = (0..n).step_by(2).map(|r| subs[r]).collect();
        grouped_all_reduce(&evens);
        for c in subs.into_iter().chain(comms) {
            ok(snclCommDestroy(c));
        }
    }
}

#[test]
fn compressed_all_reduce() {
    let n = 4;
    let mut comms = vec![std::ptr::null_mut(); n];
    // SAFETY: `comms` has room for n handles; devlist may be NULL.
    unsafe {
        ok(snclCommInitAll(
            comms.as_mut_ptr(),
            n as c_int,
            std::ptr::null(),
        ))
    };
    let avg = snclRedOp_t::snclAvg as c_int;
    let len = 3000;
    // One thread per rank: each call blocks until every rank has joined.
    let handles: Vec<usize> = comms.iter().map(|&c| c as usize).collect();
    std::thread::scope(|s| {
        for (r, &h) in handles.iter().enumerate() {
            s.spawn(move || {
                let c = h as snclComm_t;
                let x: Vec<f32> = (0..len)
                    .map(|i| (i as f32 / len as f32) * (r + 1) as f32)
                    .collect();
                for (codec, op) in [(c"int8", SUM), (c"fp16", avg), (c"topk:0.5", SUM)] {
                    let mut out = vec![0f32; len];
                    // SAFETY: both buffers hold `len` floats; NULL stream.
                    ok(unsafe {
                        snclAllReduceCompressed(
                            x.as_ptr() as *const c_void,
                            out.as_mut_ptr() as *mut c_void,
                            len,
                            FLOAT,
                            op,
                            codec.as_ptr(),
                            c,
                            std::ptr::null_mut(),
                        )
                    });
                    let scale = if op == SUM { 10.0 } else { 2.5 }; // Σ (r+1) over 4 ranks
                    let worst = (0..len)
                        .map(|i| (out[i] - (i as f32 / len as f32) * scale).abs())
                        .fold(0f32, f32::max);
                    let tol = if codec == c"topk:0.5" {
                        scale
                    } else {
                        0.05 * scale
                    };
                    assert!(worst <= tol, "{codec:?}: off by {worst}");
                }
            });
        }
    });
    let c = comms[0];
    let mut b = vec![1f32; 8];
    let p = b.as_mut_ptr() as *mut c_void;
    let null = std::ptr::null_mut();
    // SAFETY: every pointer is valid or deliberately NULL; each call is
    // rejected before it runs.
    unsafe {
        let max = snclRedOp_t::snclMax as c_int;
        let dbl = snclDataType_t::snclFloat64 as c_int;
        let call = |dt, op, codec: *const std::ffi::c_char| {
            snclAllReduceCompressed(p, p, 2, dt, op, codec, c, null)
        };
        assert_eq!(call(dbl, SUM, c"int8".as_ptr()), snclInvalidArgument);
        assert_eq!(call(FLOAT, max, c"int8".as_ptr()), snclInvalidArgument);
        assert_eq!(call(FLOAT, SUM, c"int9".as_ptr()), snclInvalidArgument);
        assert_eq!(call(FLOAT, SUM, std::ptr::null()), snclInvalidArgument);
        ok(snclGroupStart());
        assert_eq!(call(FLOAT, SUM, c"int8".as_ptr()), snclInvalidUsage);
        ok(snclGroupEnd());
        for c in comms {
            ok(snclCommDestroy(c));
        }
    }
}

/// Error feedback through the C ABI: with top-k 10 % over 40 steps of the
/// same data, the outputs summed over the steps come close to 40 x the
/// exact sum with feedback (what one step drops is sent later: only the
/// last steps' residual is missing) and stay far from it without (top-k
/// alone sends under a fifth of this data's mass); stale handles are
/// refused.
#[test]
fn compressed_all_reduce_with_error_feedback() {
    let n = 2;
    let mut comms = vec![std::ptr::null_mut(); n];
    // SAFETY: `comms` has room for n handles; devlist may be NULL.
    unsafe {
        ok(snclCommInitAll(
            comms.as_mut_ptr(),
            n as c_int,
            std::ptr::null(),
        ))
    };
    let len = 1000;
    let steps = 40;
    let handles: Vec<usize> = comms.iter().map(|&c| c as usize).collect();
    let errors: Vec<(f32, f32)> = std::thread::scope(|s| {
        let hs: Vec<_> = handles
            .iter()
            .map(|&h| {
                s.spawn(move || {
                    let c = h as snclComm_t;
                    let x: Vec<f32> = (0..len).map(|i| 1.0 + (i % 7) as f32).collect();
                    let exact: Vec<f32> = x.iter().map(|v| v * n as f32 * steps as f32).collect();
                    let run = |with_feedback: bool| -> f32 {
                        let mut fb: snclErrorFeedback_t = std::ptr::null_mut();
                        if with_feedback {
                            // SAFETY: a valid out-pointer.
                            ok(unsafe { snclErrorFeedbackCreate(&mut fb) });
                        }
                        let mut total = vec![0f32; len];
                        for _ in 0..steps {
                            let mut out = vec![0f32; len];
                            // SAFETY: both buffers hold `len` floats; a live
                            // handle or NULL; NULL stream.
                            ok(unsafe {
                                snclAllReduceCompressedFeedback(
                                    x.as_ptr() as *const c_void,
                                    out.as_mut_ptr() as *mut c_void,
                                    len,
                                    FLOAT,
                                    SUM,
                                    c"topk:0.1".as_ptr(),
                                    fb,
                                    c,
                                    std::ptr::null_mut(),
                                )
                            });
                            total.iter_mut().zip(&out).for_each(|(t, o)| *t += o);
                        }
                        // SAFETY: the handle (or NULL) is destroyed once.
                        ok(unsafe { snclErrorFeedbackDestroy(fb) });
                        let missing: f32 = exact.iter().zip(&total).map(|(e, t)| e - t).sum();
                        missing / exact.iter().sum::<f32>()
                    };
                    (run(true), run(false))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (with, without) in errors {
        eprintln!("missing: {with:.3} with feedback, {without:.3} without");
        assert!(with < 0.2, "with feedback {with:.3} of the sum is missing");
        assert!(
            without > 0.5,
            "without feedback only {without:.3} is missing"
        );
    }
    // SAFETY: every pointer is valid or deliberately stale; each call is
    // refused before it runs.
    unsafe {
        let mut fb: snclErrorFeedback_t = std::ptr::null_mut();
        ok(snclErrorFeedbackCreate(&mut fb));
        ok(snclErrorFeedbackDestroy(fb));
        assert_eq!(snclErrorFeedbackDestroy(fb), snclInvalidArgument);
        let mut b = vec![1f32; 4];
        let p = b.as_mut_ptr() as *mut c_void;
        let code = snclAllReduceCompressedFeedback(
            p,
            p,
            4,
            FLOAT,
            SUM,
            c"int8".as_ptr(),
            fb,
            comms[0],
            std::ptr::null_mut(),
        );
        assert_eq!(code, snclInvalidArgument);
        assert!(CStr::from_ptr(snclGetLastError(std::ptr::null_mut()))
            .to_string_lossy()
            .contains("not live"));
        assert_eq!(
            snclErrorFeedbackCreate(std::ptr::null_mut()),
            snclInvalidArgument
        );
        for c in comms {
            ok(snclCommDestroy(c));
        }
    }
}

#[test]
fn inits_in_a_group_and_non_blocking() {
    let n = 3;
    // Blocking inits inside a group: created together at GroupEnd.
    let id = id_at(SocketAddr::from(([127, 0, 0, 1], free_port())));
    let mut comms = vec![std::ptr::null_mut(); n];
    // SAFETY: valid out-pointers; every handle is destroyed once.
    unsafe {
        ok(snclGroupStart());
        for (r, c) in comms.iter_mut().enumerate() {
            ok(snclCommInitRank(c, n as c_int, id, r as c_int));
        }
        ok(snclGroupEnd());
        grouped_all_reduce(&comms);
        for c in comms {
            ok(snclCommDestroy(c));
        }
    }
    // A communicator created by a group cannot be used before its end.
    let id = id_at(SocketAddr::from(([127, 0, 0, 1], free_port())));
    let mut c = std::ptr::null_mut();
    let mut count = 0;
    // SAFETY: valid out-pointers; the handle is destroyed once.
    unsafe {
        ok(snclGroupStart());
        ok(snclCommInitRank(&mut c, 1, id, 0));
        assert_eq!(snclCommCount(c, &mut count), snclInvalidUsage);
        ok(snclGroupEnd());
        ok(snclCommCount(c, &mut count));
        assert_eq!(count, 1);
        // A single rank holds no peer buffers; its flight recorder is
        // allocated as operations come.
        let mut st = snclMemStats_t::default();
        ok(snclCommMemStats(c, &mut st));
        assert_eq!(
            (st.connectedPeers, st.fifoBytes, st.sharedBytes),
            (0, 0, 0),
            "{st:?}"
        );
        assert_eq!(
            snclCommMemStats(c, std::ptr::null_mut()),
            snclInvalidArgument
        );
        ok(snclCommDestroy(c));
    }
    // Non-blocking inits from one thread: in progress, then polled.
    let id = id_at(SocketAddr::from(([127, 0, 0, 1], free_port())));
    let mut comms = vec![std::ptr::null_mut(); n];
    // SAFETY: all-zero bytes are a valid snclConfig_t (integers, NULLs).
    let mut cfg = unsafe { std::mem::zeroed::<snclConfig_t>() };
    cfg.size = std::mem::size_of::<snclConfig_t>();
    cfg.magic = SNCL_API_MAGIC;
    cfg.version = SNCL_VERSION_CODE as u32;
    cfg.blocking = 0;
    cfg.timeoutMs = 30_000;
    // SAFETY: valid out-pointers and config; every handle is destroyed once.
    unsafe {
        for (r, c) in comms.iter_mut().enumerate() {
            let res = snclCommInitRankConfig(c, n as c_int, id, r as c_int, &mut cfg);
            assert!(res == snclInProgress || res == snclSuccess, "{res:?}");
        }
        for &c in &comms {
            let mut state = snclInProgress as c_int;
            let deadline = Instant::now() + Duration::from_secs(30);
            while state == snclInProgress as c_int {
                ok(snclCommGetAsyncError(c, &mut state));
                assert!(Instant::now() < deadline, "init still in progress");
                std::thread::sleep(Duration::from_millis(5));
            }
            assert_eq!(state, snclSuccess as c_int);
        }
        grouped_all_reduce(&comms);
        for c in comms {
            ok(snclCommDestroy(c));
        }
    }
}

/// `snclConfig_t::deterministic` (a sncl extension) reaches the
/// communicator and its split children; values other than 0, 1 and
/// `SNCL_CONFIG_UNDEF_INT` are refused, naming the field.
#[test]
fn the_deterministic_config_field() {
    let n = 3;
    let id = id_at(SocketAddr::from(([127, 0, 0, 1], free_port())));
    let mut comms = vec![std::ptr::null_mut(); n];
    // SAFETY: all-zero bytes are a valid snclConfig_t (integers, NULLs).
    let mut cfg = unsafe { std::mem::zeroed::<snclConfig_t>() };
    cfg.size = std::mem::size_of::<snclConfig_t>();
    cfg.magic = SNCL_API_MAGIC;
    cfg.version = SNCL_VERSION_CODE as u32;
    cfg.blocking = 1;
    cfg.timeoutMs = 30_000;
    cfg.deterministic = 1;
    let deterministic = |c: snclComm_t| {
        // SAFETY: a live handle from a successful init.
        let shared = unsafe { &(*c).shared };
        shared.get().expect("initialized").config().deterministic
    };
    // SAFETY: valid out-pointers and config; every handle is destroyed once.
    unsafe {
        ok(snclGroupStart());
        for (r, c) in comms.iter_mut().enumerate() {
            ok(snclCommInitRankConfig(
                c, n as c_int, id, r as c_int, &mut cfg,
            ));
        }
        ok(snclGroupEnd());
        assert!(comms.iter().all(|&c| deterministic(c)));
        grouped_all_reduce(&comms);
        let mut subs = vec![std::ptr::null_mut(); n];
        ok(snclGroupStart());
        for r in 0..n {
            ok(snclCommSplit(
                comms[r],
                0,
                r as c_int,
                &mut subs[r],
                std::ptr::null_mut(),
            ));
        }
        ok(snclGroupEnd());
        assert!(subs.iter().all(|&c| deterministic(c)));
        for c in subs.into_iter().chain(comms) {
            ok(snclCommDestroy(c));
        }
        cfg.deterministic = 2;
        let mut c = std::ptr::null_mut();
        assert_eq!(
            snclCommInitRankConfig(&mut c, 1, id, 0, &mut cfg),
            snclInvalidArgument
        );
        let last = CStr::from_ptr(snclGetLastError(std::ptr::null_mut())).to_string_lossy();
        assert!(last.contains("deterministic is 2"), "{last}");
    }
}

#[test]
fn bad_arguments_are_reported() {
    let last = || {
        // SAFETY: NULL asks for this thread's last error.
        unsafe { CStr::from_ptr(snclGetLastError(std::ptr::null_mut())) }
            .to_string_lossy()
            .into_owned()
    };
    // SAFETY: every pointer is valid or deliberately NULL.
    unsafe {
        let mut c = std::ptr::null_mut();
        let mut bad = id_at(SocketAddr::from(([127, 0, 0, 1], 1)));
        bad.internal[40] ^= 1;
        assert_eq!(snclCommInitRank(&mut c, 2, bad, 0), snclInvalidArgument);
        assert!(last().contains("checksum"), "{}", last());
        assert!(c.is_null());
        let id = id_at(SocketAddr::from(([127, 0, 0, 1], 1)));
        assert_eq!(snclCommInitRank(&mut c, 2, id, 2), snclInvalidArgument);
        assert!(last().contains("out of range"), "{}", last());
        assert_eq!(
            snclCommInitRank(std::ptr::null_mut(), 2, id, 0),
            snclInvalidArgument
        );
        let mut cfg = std::mem::zeroed::<snclConfig_t>();
        assert_eq!(
            snclCommInitRankConfig(&mut c, 2, id, 0, &mut cfg),
            snclInvalidArgument
        );
        assert!(last().contains("SNCL_CONFIG_INITIALIZER"), "{}", last());
        assert_eq!(snclGroupEnd(), snclInvalidUsage);
        // (snclStreamSynchronize(NULL) waits for the current device's
        // default stream, a sncl extension.)
        assert_eq!(snclStreamQuery(std::ptr::null_mut()), snclInvalidArgument);
        // NULL handles are no-ops that succeed, as in NCCL.
        assert_eq!(snclCommDestroy(std::ptr::null_mut()), snclSuccess);
        assert_eq!(snclCommAbort(std::ptr::null_mut()), snclSuccess);
        assert_eq!(snclCommFinalize(std::ptr::null_mut()), snclSuccess);
        let s = |r: c_int| CStr::from_ptr(snclGetErrorString(r)).to_str().unwrap();
        assert_eq!(s(0), "no error");
        assert!(s(6).contains("remote"));
        assert_eq!(s(-3), "unknown result code");
    }
}

/// Resident memory of this process, in bytes.
fn resident_bytes() -> usize {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<usize>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// A count whose buffer exceeds the largest message (512 GiB) is an
/// argument error at once, before any schedule is planned (an int8
/// all-reduce of 2^44 elements used to build its schedule in memory
/// proportional to the count until the process aborted).
#[test]
fn huge_counts_are_refused_before_anything_is_planned() {
    let int8 = snclDataType_t::snclInt8 as c_int;
    let mut comm = std::ptr::null_mut();
    let mut buf = [0u8; 64];
    let p = buf.as_mut_ptr().cast::<c_void>();
    // SAFETY: handle storage for one communicator; a live 64-byte buffer
    // the refused calls never touch.
    unsafe {
        ok(snclCommInitAll(&mut comm, 1, std::ptr::null()));
        for log2 in [40u32, 44, 62] {
            let count = 1usize << log2;
            let (before, t) = (resident_bytes(), Instant::now());
            let r = snclAllReduce(p, p, count, int8, SUM, comm, std::ptr::null_mut());
            assert_eq!(r, snclInvalidArgument, "count 2^{log2}");
            let msg = CStr::from_ptr(snclGetLastError(comm))
                .to_string_lossy()
                .into_owned();
            assert!(
                msg.contains(&count.to_string())
                    && msg.contains(&comm_core::shape::MAX_MESSAGE_BYTES.to_string()),
                "{msg}"
            );
            assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
            let grew = resident_bytes().saturating_sub(before);
            assert!(
                grew < 10 << 20,
                "count 2^{log2}: resident memory grew {grew} bytes"
            );
        }
        ok(snclCommDestroy(comm));
    }
}

/// A huge rank count is an argument error before anything is allocated
/// for the ranks (it used to abort the process in setup). Rank 0 with a
/// reachable root gets as far as setup without the check.
#[test]
fn huge_rank_counts_are_rejected() {
    let last = || {
        // SAFETY: NULL asks for this thread's last error.
        unsafe { CStr::from_ptr(snclGetLastError(std::ptr::null_mut())) }
            .to_string_lossy()
            .into_owned()
    };
    let limit = comm_core::MAX_RANKS;
    // SAFETY: valid handle storage; ids by value.
    unsafe {
        for n in [c_int::MAX, (limit + 1) as c_int] {
            let id = id_at(SocketAddr::from(([127, 0, 0, 1], free_port())));
            let mut c = std::ptr::null_mut();
            let t = Instant::now();
            assert_eq!(snclCommInitRank(&mut c, n, id, 0), snclInvalidArgument);
            assert!(c.is_null());
            let msg = last();
            assert!(
                msg.contains(&n.to_string()) && msg.contains(&limit.to_string()),
                "{msg}"
            );
            assert_eq!(
                snclCommInitRankConfig(&mut c, n, id, 1, std::ptr::null_mut()),
                snclInvalidArgument
            );
            assert_eq!(
                snclCommInitAll(&mut c, n, std::ptr::null()),
                snclInvalidArgument
            );
            assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        }
    }
    // The Rust API checks at setup, whatever the store.
    let store = std::sync::Arc::new(sncl::MemoryStore::new().for_rank(0));
    match sncl::Communicator::init_with_store(store, 0, 1 << 40, 7, sncl::Config::default()) {
        Err(sncl::Error::InvalidArgument { detail, .. }) => {
            assert!(detail.contains(&limit.to_string()), "{detail}")
        }
        other => panic!("want InvalidArgument, got {other:?}"),
    }
}

#[test]
fn stream_reports_a_peer_abort() {
    let mut comms = vec![std::ptr::null_mut(); 2];
    // SAFETY: valid handles and buffers; each handle is released once.
    unsafe {
        ok(snclCommInitAll(comms.as_mut_ptr(), 2, std::ptr::null()));
        grouped_all_reduce(&comms);
        let mut st = std::ptr::null_mut();
        ok(snclStreamCreate(&mut st));
        ok(snclCommAbort(comms[1]));
        let mut buf = vec![1.0f32; 64];
        let p = buf.as_mut_ptr() as *mut c_void;
        // Queued fine; fails when it runs, which synchronize reports.
        ok(snclAllReduce(p, p, 64, FLOAT, SUM, comms[0], st));
        let r = snclStreamSynchronize(st);
        assert_eq!(r, snclRemoteError);
        let msg = CStr::from_ptr(snclGetLastError(comms[0]))
            .to_string_lossy()
            .into_owned();
        assert!(!msg.is_empty());
        let mut state = 0;
        ok(snclCommGetAsyncError(comms[0], &mut state));
        assert_eq!(state, snclRemoteError as c_int, "{msg}");
        ok(snclStreamDestroy(st));
        ok(snclCommDestroy(comms[0]));
    }
}

/// sncl extension: tagged sends and receives from any source through the
/// C functions, one thread per rank: ranks 1..3 each send 40 messages with
/// tags 0..3 to rank 0, which receives them tag by tag from
/// `SNCL_ANY_SOURCE` (checking `*source` against the payload) and then one
/// from a named peer; misuse (bad peers, NULL buffers, a stream, a group)
/// is reported. (Timeouts: tests/tagged.rs.)
#[test]
fn tagged_and_any_source() {
    let n = 4;
    let mut comms = vec![std::ptr::null_mut(); n];
    // SAFETY: `comms` has room for n handles; devlist may be NULL.
    unsafe {
        ok(snclCommInitAll(
            comms.as_mut_ptr(),
            n as c_int,
            std::ptr::null(),
        ))
    };
    let int32 = snclDataType_t::snclInt32 as c_int;
    let null: snclStream_t = std::ptr::null_mut();
    let no_src: *mut c_int = std::ptr::null_mut();
    let per = 40;
    let handles: Vec<usize> = comms.iter().map(|&c| c as usize).collect();
    std::thread::scope(|s| {
        for (r, &h) in handles.iter().enumerate() {
            s.spawn(move || {
                let c = h as snclComm_t;
                let null: snclStream_t = std::ptr::null_mut();
                if r > 0 {
                    for i in 0..per {
                        let tag = (i % 4) as c_int;
                        let msg = [r as i32, tag, i as i32];
                        // SAFETY: 3 ints; NULL stream.
                        ok(unsafe {
                            snclSendTagged(msg.as_ptr() as *const c_void, 3, int32, 0, tag, c, null)
                        });
                    }
                    return;
                }
                let mut seen = std::collections::HashSet::new();
                for round in 0..(n - 1) * per {
                    let tag = (3 - round % 4) as c_int;
                    let mut got = [0i32; 3];
                    let mut src: c_int = -7;
                    // SAFETY: 3 ints and a writable int; NULL stream.
                    ok(unsafe {
                        snclRecvTagged(
                            got.as_mut_ptr() as *mut c_void,
                            3,
                            int32,
                            SNCL_ANY_SOURCE,
                            tag,
                            c,
                            null,
                            &mut src,
                        )
                    });
                    assert_eq!(got[0], src, "source does not match the payload");
                    assert_eq!(
                        got[1], tag,
                        "a message with tag {} matched tag {tag}",
                        got[1]
                    );
                    assert!(seen.insert((got[0], got[2])), "{got:?} received twice");
                }
                assert_eq!(seen.len(), (n - 1) * per);
            });
        }
    });
    let c0 = comms[0];
    let mut b = [0i32; 2];
    let p = b.as_mut_ptr() as *mut c_void;
    // SAFETY: every pointer is valid or deliberately NULL / bogus; calls
    // that must fail are rejected before they run, the last one times out.
    unsafe {
        // Named peer, and a send to self received from any source.
        ok(snclSendTagged(p, 2, int32, 0, 11, c0, null));
        let mut src = -1;
        ok(snclRecvTagged(
            p,
            2,
            int32,
            SNCL_ANY_SOURCE,
            11,
            c0,
            null,
            &mut src,
        ));
        assert_eq!(src, 0);
        assert_eq!(
            snclSendTagged(p, 2, int32, 4, 0, c0, null),
            snclInvalidArgument
        );
        assert_eq!(
            snclRecvTagged(p, 2, int32, -2, 0, c0, null, no_src),
            snclInvalidArgument
        );
        assert_eq!(
            snclRecvTagged(std::ptr::null_mut(), 2, int32, 1, 0, c0, null, no_src),
            snclInvalidArgument
        );
        let mut stream: snclStream_t = std::ptr::null_mut();
        ok(snclStreamCreate(&mut stream));
        assert_eq!(
            snclSendTagged(p, 2, int32, 1, 0, c0, stream),
            snclInvalidUsage
        );
        ok(snclStreamDestroy(stream));
        ok(snclGroupStart());
        assert_eq!(
            snclRecvTagged(p, 2, int32, 1, 0, c0, null, no_src),
            snclInvalidUsage
        );
        ok(snclGroupEnd());
    }
    // SAFETY: live handles.
    unsafe {
        for c in comms {
            ok(snclCommDestroy(c));
        }
    }
}

#[test]
fn c_abi_send_recv_to_self() {
    let mut comm = std::ptr::null_mut();
    let t = snclDataType_t::snclFloat32 as c_int;
    // SAFETY: valid handle storage and buffers that outlive every call.
    unsafe {
        assert_eq!(
            snclCommInitAll(&mut comm, 1, std::ptr::null()),
            snclResult_t::snclSuccess
        );
        let out: Vec<f32> = (0..100).map(|i| i as f32).collect();
        let mut got = vec![0f32; 100];
        assert_eq!(snclGroupStart(), snclResult_t::snclSuccess);
        let s = snclSend(
            out.as_ptr() as *const c_void,
            100,
            t,
            0,
            comm,
            std::ptr::null_mut(),
        );
        let r = snclRecv(
            got.as_mut_ptr() as *mut c_void,
            100,
            t,
            0,
            comm,
            std::ptr::null_mut(),
        );
        assert_eq!(
            (s, r),
            (snclResult_t::snclSuccess, snclResult_t::snclSuccess)
        );
        assert_eq!(snclGroupEnd(), snclResult_t::snclSuccess);
        assert_eq!(got, out);
        // Outside a group a send to self has no partner: an argument error
        // that leaves the communicator usable.
        assert_eq!(
            snclSend(
                out.as_ptr() as *const c_void,
                100,
                t,
                0,
                comm,
                std::ptr::null_mut()
            ),
            snclResult_t::snclInvalidArgument
        );
        let mut state = -1;
        assert_eq!(
            snclCommGetAsyncError(comm, &mut state),
            snclResult_t::snclSuccess
        );
        assert_eq!(state, snclResult_t::snclSuccess as c_int);
        assert_eq!(snclCommDestroy(comm), snclResult_t::snclSuccess);
    }
}

/// `snclCommInitRankScalable` (NCCL's several-root init) on sncl's one
/// root: every rank passes the same ids, the first is the rendezvous, and
/// every id is checked; bad counts and NULL are refused.
#[test]
fn init_rank_scalable_uses_the_first_id() {
    let n = 3;
    let ids = [
        id_at(SocketAddr::from(([127, 0, 0, 1], free_port()))),
        id_at(SocketAddr::from(([127, 0, 0, 1], free_port()))),
    ];
    let comms: Vec<usize> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let mut ids = ids;
                s.spawn(move || {
                    let mut c = std::ptr::null_mut();
                    // SAFETY: valid out-pointer and two ids.
                    ok(unsafe {
                        snclCommInitRankScalable(
                            &mut c,
                            n as c_int,
                            r as c_int,
                            2,
                            ids.as_mut_ptr(),
                            std::ptr::null_mut(),
                        )
                    });
                    c as usize
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    });
    let comms: Vec<snclComm_t> = comms.into_iter().map(|c| c as snclComm_t).collect();
    // SAFETY: live handles of one communicator, destroyed once.
    unsafe {
        grouped_all_reduce(&comms);
        for c in comms {
            ok(snclCommDestroy(c));
        }
    }
    let mut ids = ids;
    let mut bad = ids[1];
    bad.internal[0] ^= 0x55;
    let mut with_bad = [ids[0], bad];
    let mut c = std::ptr::null_mut();
    // SAFETY: valid out-pointers; nothing is created.
    unsafe {
        for n_id in [0, 4] {
            let r = snclCommInitRankScalable(
                &mut c,
                3,
                0,
                n_id,
                ids.as_mut_ptr(),
                std::ptr::null_mut(),
            );
            assert_eq!(r, snclInvalidArgument, "nId {n_id}");
        }
        let r =
            snclCommInitRankScalable(&mut c, 3, 0, 1, std::ptr::null_mut(), std::ptr::null_mut());
        assert_eq!(r, snclInvalidArgument);
        let r =
            snclCommInitRankScalable(&mut c, 3, 0, 2, with_bad.as_mut_ptr(), std::ptr::null_mut());
        assert_eq!(r, snclInvalidArgument, "a corrupt second id");
    }
}
