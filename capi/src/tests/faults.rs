//! Fault tolerance through the C ABI: after one of 8 rank processes is
//! killed in the middle of `snclAllReduce`s the survivors report it and
//! `snclCommShrink` to 7 ranks (20 trials, as tests/fault_tolerance.rs
//! does through the Rust API, with the same kit); `snclCommAbort` from
//! another thread ends a stuck `snclAllReduce` within 100 ms; bad shrink
//! arguments are refused.

use std::ffi::{c_int, c_void, CStr};
use std::time::{Duration, Instant};

use super::fault_kit::*;
use crate::*;

const FLOAT: c_int = snclDataType_t::snclFloat32 as c_int;
const SUM: c_int = snclRedOp_t::snclSum as c_int;

fn c_ok(r: snclResult_t, what: &str) -> Result<(), String> {
    if r == snclResult_t::snclSuccess {
        return Ok(());
    }
    // SAFETY: NULL asks for this thread's last error.
    let msg = unsafe { CStr::from_ptr(snclGetLastError(std::ptr::null_mut())) };
    Err(format!("{what}: {r:?}: {}", msg.to_string_lossy()))
}

/// Child side (C ABI): the same through the extern functions, the failed
/// rank passed in (as an application that learnt it elsewhere would).
#[test]
fn child_shrink_capi() {
    if mode().as_deref() != Some("shrink-capi") {
        return;
    }
    let n: c_int = std::env::var("SNCL_WORLD_SIZE").unwrap().parse().unwrap();
    let r: c_int = std::env::var("SNCL_RANK").unwrap().parse().unwrap();
    // SAFETY: every pointer passed below is to live local storage, and
    // buffers are sized for the counts given.
    unsafe {
        let mut id = std::mem::zeroed::<snclUniqueId>();
        c_ok(snclGetUniqueId(&mut id), "snclGetUniqueId").unwrap();
        let mut comm: snclComm_t = std::ptr::null_mut();
        c_ok(snclCommInitRank(&mut comm, n, id, r), "snclCommInitRank").unwrap();
        let mut v = vec![1f32; 1 << 14];
        let p = v.as_mut_ptr() as *mut c_void;
        let mut i = 0u64;
        let start = Instant::now();
        let err = loop {
            let res = snclAllReduce(p, p, v.len(), FLOAT, SUM, comm, std::ptr::null_mut());
            if let Err(e) = c_ok(res, "snclAllReduce") {
                break e;
            }
            i += 1;
            if i == 1 {
                eprintln!("READY rank {r}");
            }
            v.fill(1.0);
            assert!(start.elapsed() < Duration::from_secs(30), "no failure");
        };
        eprintln!("SNCL-ERROR rank {r} after {i} operations: {err}");
        let mut async_err: snclResultRaw = 0;
        c_ok(snclCommGetAsyncError(comm, &mut async_err), "GetAsyncError").unwrap();
        assert_ne!(async_err, 0, "rank {r}: no async error after the failure");
        let mut excl = [victim() as c_int];
        let mut newcomm: snclComm_t = std::ptr::null_mut();
        let res = snclCommShrink(
            comm,
            excl.as_mut_ptr(),
            1,
            &mut newcomm,
            std::ptr::null_mut(),
            SNCL_SHRINK_ABORT,
        );
        c_ok(res, "snclCommShrink").unwrap();
        let (mut nn, mut nr) = (0, 0);
        c_ok(snclCommCount(newcomm, &mut nn), "count").unwrap();
        c_ok(snclCommUserRank(newcomm, &mut nr), "rank").unwrap();
        check_shrunk(r as usize, nr as usize, nn as usize, |buf| {
            let p = buf.as_mut_ptr() as *mut c_void;
            let res = snclAllReduce(p, p, buf.len(), FLOAT, SUM, newcomm, std::ptr::null_mut());
            c_ok(res, "snclAllReduce on the shrunk communicator")
        });
        c_ok(snclCommDestroy(newcomm), "destroy new").unwrap();
        c_ok(snclCommAbort(comm), "abort parent").unwrap();
    }
}

#[test]
fn killed_rank_then_shrink_capi_twenty_trials() {
    kill_and_shrink("tests::faults::child_shrink_capi", "shrink-capi", 20);
}

/// `snclCommAbort` from another thread ends a stuck `snclAllReduce` within
/// 100 ms (20 trials); the peer's operations then fail naming rank 0 and
/// `snclCommGetAsyncError` reports it.
#[test]
fn capi_abort_unblocks_a_stuck_all_reduce() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut worst = Duration::ZERO;
    for trial in 0..20 {
        // SAFETY: handles come from snclCommInitAll and are released once;
        // buffers are live locals sized for the counts passed.
        unsafe {
            let mut comms: [snclComm_t; 2] = [std::ptr::null_mut(); 2];
            c_ok(
                snclCommInitAll(comms.as_mut_ptr(), 2, std::ptr::null()),
                "InitAll",
            )
            .unwrap();
            let c0 = comms[0] as usize;
            // A call entering while the handle is released is a
            // use-after-free (as in NCCL): abort only once it is inside.
            let entered = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let flag = entered.clone();
            let ((res, t, end), stall) = with_stall_probe(|| {
                let h = std::thread::spawn(move || {
                    flag.store(true, std::sync::atomic::Ordering::SeqCst);
                    let mut v = vec![1f32; 4096];
                    let p = v.as_mut_ptr() as *mut c_void;
                    let c0 = c0 as snclComm_t;
                    let r = snclAllReduce(p, p, v.len(), FLOAT, SUM, c0, std::ptr::null_mut());
                    (r, Instant::now())
                });
                while !entered.load(std::sync::atomic::Ordering::SeqCst) {
                    std::thread::yield_now();
                }
                std::thread::sleep(Duration::from_millis(30));
                let t = Instant::now();
                c_ok(snclCommAbort(comms[0]), "snclCommAbort").unwrap();
                let (r, end) = h.join().expect("rank 0");
                (r, t, end)
            });
            let took = end.saturating_duration_since(t);
            assert_ne!(
                res,
                snclResult_t::snclSuccess,
                "trial {trial}: stuck op succeeded"
            );
            assert!(
                took < ABORT_LIMIT + stall,
                "trial {trial}: snclAllReduce returned {took:?} after snclCommAbort \
                 (scheduler stall {stall:?})"
            );
            worst = worst.max(took);
            let mut v = vec![0f32; 4096];
            let p = v.as_mut_ptr() as *mut c_void;
            let failed = (0..2).find_map(|_| {
                c_ok(
                    snclAllReduce(p, p, v.len(), FLOAT, SUM, comms[1], std::ptr::null_mut()),
                    "peer snclAllReduce",
                )
                .err()
            });
            let e = failed.unwrap_or_else(|| panic!("trial {trial}: the peer never failed"));
            assert!(names_rank(&e, 0), "trial {trial}: {e}");
            let mut ae: snclResultRaw = 0;
            c_ok(snclCommGetAsyncError(comms[1], &mut ae), "GetAsyncError").unwrap();
            assert_ne!(ae, 0, "trial {trial}: no async error on the peer");
            c_ok(snclCommDestroy(comms[1]), "destroy").unwrap();
        }
    }
    eprintln!("abort latency (C ABI, threads, 20 trials): max {worst:?}");
}

#[test]
fn capi_shrink_rejects_bad_arguments() {
    // SAFETY: handles come from snclCommInitAll; pointers are live locals.
    unsafe {
        let mut comms: [snclComm_t; 2] = [std::ptr::null_mut(); 2];
        c_ok(
            snclCommInitAll(comms.as_mut_ptr(), 2, std::ptr::null()),
            "InitAll",
        )
        .unwrap();
        let mut out: snclComm_t = std::ptr::null_mut();
        let mut list = [1 as c_int];
        let bad = snclResult_t::snclInvalidArgument;
        let flags = 7;
        assert_eq!(
            snclCommShrink(
                comms[0],
                list.as_mut_ptr(),
                1,
                &mut out,
                std::ptr::null_mut(),
                flags
            ),
            bad
        );
        assert_eq!(
            snclCommShrink(
                comms[0],
                std::ptr::null_mut(),
                1,
                &mut out,
                std::ptr::null_mut(),
                0
            ),
            bad
        );
        assert_eq!(
            snclCommShrink(
                comms[0],
                list.as_mut_ptr(),
                -1,
                &mut out,
                std::ptr::null_mut(),
                0
            ),
            bad
        );
        let mut neg = [-3 as c_int];
        assert_eq!(
            snclCommShrink(
                comms[0],
                neg.as_mut_ptr(),
                1,
                &mut out,
                std::ptr::null_mut(),
                0
            ),
            bad
        );
        assert_eq!(
            snclCommShrink(
                comms[0],
                list.as_mut_ptr(),
                1,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0
            ),
            bad
        );
        let mut me = [0 as c_int];
        let r = snclCommShrink(
            comms[0],
            me.as_mut_ptr(),
            1,
            &mut out,
            std::ptr::null_mut(),
            0,
        );
        assert_ne!(r, snclResult_t::snclSuccess, "excluding itself must fail");
        for c in comms {
            c_ok(snclCommDestroy(c), "destroy").unwrap();
        }
    }
}
