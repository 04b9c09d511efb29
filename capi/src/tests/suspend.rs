//! `snclCommSuspend` / `snclCommResume` with ranks as threads: the FIFOs
//! `snclCommMemStats` reports go and come back, an all-reduce while
//! suspended is `snclInvalidArgument` (and the handle stays healthy),
//! bad flags and a resume without a suspend are refused.

use std::ffi::{c_int, c_void};
use std::net::SocketAddr;

use super::in_process::{grouped_all_reduce, id_at, ok};
use super::rank_kit::free_port;
use crate::*;
use snclResult_t::*;

fn stats(c: snclComm_t) -> snclMemStats_t {
    let mut st = snclMemStats_t::default();
    // SAFETY: a live handle and a writable struct.
    ok(unsafe { snclCommMemStats(c, &mut st) });
    st
}

/// Runs `f` on every handle, one thread each.
fn on_each(comms: &[snclComm_t], f: impl Fn(snclComm_t) -> snclResult_t + Sync) {
    let addrs: Vec<usize> = comms.iter().map(|&c| c as usize).collect();
    std::thread::scope(|s| {
        for &c in &addrs {
            let f = &f;
            s.spawn(move || ok(f(c as snclComm_t)));
        }
    });
}

#[test]
fn suspend_releases_the_fifos_and_resume_restores_them() {
    let n = 3;
    let id = id_at(SocketAddr::from(([127, 0, 0, 1], free_port())));
    let mut comms = vec![std::ptr::null_mut(); n];
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                s.spawn(move || {
                    let mut c = std::ptr::null_mut();
                    // SAFETY: a valid out-pointer; NULL config.
                    ok(unsafe {
                        snclCommInitRankConfig(
                            &mut c,
                            n as c_int,
                            id,
                            r as c_int,
                            std::ptr::null_mut(),
                        )
                    });
                    c as usize
                })
            })
            .collect();
        for (slot, h) in comms.iter_mut().zip(hs) {
            *slot = h.join().expect("rank") as snclComm_t;
        }
    });
    // SAFETY: live handles throughout; each destroyed once at the end.
    unsafe {
        grouped_all_reduce(&comms);
        let before = stats(comms[0]);
        assert_eq!(before.connectedPeers, 2, "{before:?}");
        assert!(before.fifoBytes > 0, "{before:?}");
        assert_eq!(snclCommSuspend(comms[0], 0x2), snclInvalidArgument);
        assert_eq!(snclCommResume(comms[0]), snclInvalidArgument);
        on_each(&comms, |c| snclCommSuspend(c, SNCL_SUSPEND_MEM));
        let during = stats(comms[0]);
        assert_eq!(
            (
                during.connectedPeers,
                during.fifoBytes,
                during.releasableBytes
            ),
            (0, 0, 0),
            "{during:?}"
        );
        assert_eq!(during.suspendedBytes, before.releasableBytes, "{during:?}");
        assert!(before.releasableBytes >= before.fifoBytes, "{before:?}");
        let mut v = [1f32; 8];
        let p = v.as_mut_ptr() as *mut c_void;
        let float = snclDataType_t::snclFloat32 as c_int;
        let sum = snclRedOp_t::snclSum as c_int;
        assert_eq!(
            snclAllReduce(p, p, v.len(), float, sum, comms[0], std::ptr::null_mut()),
            snclInvalidArgument
        );
        let mut async_error: c_int = -1;
        ok(snclCommGetAsyncError(comms[0], &mut async_error));
        assert_eq!(
            async_error, snclSuccess as c_int,
            "a refused call leaves the handle healthy"
        );
        on_each(&comms, |c| snclCommResume(c));
        grouped_all_reduce(&comms);
        let after = stats(comms[0]);
        assert_eq!(after.fifoBytes, before.fifoBytes, "{after:?}");
        assert_eq!(after.suspendedBytes, 0, "{after:?}");
        for c in comms {
            ok(snclCommDestroy(c));
        }
    }
}
