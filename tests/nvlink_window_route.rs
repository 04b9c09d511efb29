//! nvlink version 2 reached from ordinary device all-reduces
//! (`Communicator::all_reduce_device_raw`) on the emulated device, ranks
//! as processes: buffers in device windows at the same offsets on every
//! rank run the direct kernel (`Communicator::direct_all_reduces` counts
//! it), anything else — a rank whose buffer is not in a window, offsets
//! that differ, overlapping input and output — falls back to version 1 on
//! every rank; every result is compared bit for bit with the host
//! all-reduce of the same inputs. Other device collectives in between run
//! as before (they offer too).
//!
//! The test binary runs itself as the ranks (`ROUTE_TEST_ROLE`).

mod device_kit;
mod nvlink_common;

use std::time::{Duration, Instant};

use device_kit::{
    assert_names_dead_peer, input, join_ranks as join, kill_this_process, spawn_ranks,
    spawned_rank, Rank,
};
use nvlink_common::{bind, config};
use sncl::device::{DeviceBuffer, DevicePtr};
use sncl::{Collective, Communicator, DataType, RawOp, ReduceOp};

const ROLE: &str = "ROUTE_TEST_ROLE";
const TIMEOUT: Duration = Duration::from_secs(20);

/// One all-reduce of `count` elements from `send` into `recv` (device
/// addresses) through the queued device path; checks the result against
/// the host all-reduce and whether it ran directly.
fn case(
    r: &Rank,
    (send, recv): (DevicePtr, DevicePtr),
    (dtype, op, count): (DataType, ReduceOp, usize),
    want_direct: bool,
    what: &str,
) -> Result<(), String> {
    let rank = r.comm.rank();
    let what = format!(
        "rank {rank}: {what} ({} {} x{count})",
        dtype.name(),
        op.name()
    );
    let data = input(dtype, rank, count);

    let mut want = vec![0u8; data.len()];
    let mut raw = RawOp::new(Collective::AllReduce, dtype, count);
    raw.op = op;
    raw.send = data.as_ptr();
    raw.recv = want.as_mut_ptr();
    // SAFETY: both vectors cover `count` elements and outlive the call.
    unsafe { r.comm.run_raw(&raw) }.map_err(|e| format!("{what}: host: {e}"))?;
    let junk = vec![0x5au8; data.len()];
    let before = r.comm.direct_all_reduces();
    let deadline = || Instant::now() + Duration::from_secs(60);
    let mut got = vec![0u8; data.len()];
    // SAFETY: the host vectors outlive the synchronisations below; the
    // device ranges hold `count` elements (the caller's layout).
    unsafe {
        r.dev
            .copy_h2d_async(send, data.as_ptr(), data.len(), r.stream)
            .map_err(|e| e.to_string())?;
        if recv != send {
            r.dev
                .copy_h2d_async(recv, junk.as_ptr(), junk.len(), r.stream)
                .map_err(|e| e.to_string())?;
        }
        let w = r
            .comm
            .all_reduce_device_raw(send, recv, count, dtype, op, r.stream)
            .map_err(|e| format!("{what}: enqueue: {e}"))?;
        w.wait().map_err(|e| format!("{what}: {e}"))?;
        r.dev
            .copy_d2h_async(got.as_mut_ptr(), recv, got.len(), r.stream)
            .map_err(|e| e.to_string())?;
    }
    r.dev
        .synchronize(r.stream, deadline())
        .map_err(|e| e.to_string())?;
    if got != want {
        let first = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
        return Err(format!("{what}: differs from the host's at byte {first}"));
    }
    let after = r.comm.direct_all_reduces();
    let ran = (after.one_shot + after.two_shot) - (before.one_shot + before.two_shot);
    if ran != u64::from(want_direct) {
        return Err(format!(
            "{what}: {ran} direct kernels ran, expected {} ({before:?} -> {after:?})",
            u64::from(want_direct)
        ));
    }
    Ok(())
}

/// The matrix every rank runs in the same order.
fn route(r: &Rank) -> Result<(), String> {
    let (rank, n) = (r.comm.rank(), r.comm.size());
    let big = (1 << 18) + 5;
    let bytes = 2 * big * 4 + 4096;
    let a = r
        .comm
        .alloc_device_window(bytes)
        .map_err(|e| e.to_string())?;
    let b = r
        .comm
        .alloc_device_window(bytes)
        .map_err(|e| e.to_string())?;
    let plain = DeviceBuffer::new(&r.dev, bytes).map_err(|e| e.to_string())?;
    let f32s = |op| (DataType::Float32, op, 0usize);
    for count in [1, 1000, big] {
        let with = |(d, o, _): (DataType, ReduceOp, usize)| (d, o, count);
        // In place at offset 0 and 256: direct.
        for off in [0, 256] {
            let p = a.ptr().add(off);
            case(
                r,
                (p, p),
                with(f32s(ReduceOp::Sum)),
                true,
                "in place in a window",
            )?;
        }
        // Out of place into another window, and within one window.
        case(
            r,
            (a.ptr(), b.ptr().add(64)),
            with(f32s(ReduceOp::Max)),
            true,
            "window to window",
        )?;
        let far = a.ptr().add(count * 4 + 128);
        case(
            r,
            (a.ptr(), far),
            with(f32s(ReduceOp::Sum)),
            true,
            "disjoint in one window",
        )?;
        case(
            r,
            (b.ptr(), b.ptr()),
            with((DataType::Bfloat16, ReduceOp::Avg, 0)),
            true,
            "bf16 avg in a window",
        )?;
        // Rank 0's buffer is not in a window: every rank falls back.
        let p = if rank == 0 { plain.ptr() } else { a.ptr() };
        case(
            r,
            (p, p),
            with(f32s(ReduceOp::Sum)),
            false,
            "rank 0 outside",
        )?;
        // The last rank's output is not in a window.
        let o = if rank == n - 1 { plain.ptr() } else { b.ptr() };
        case(
            r,
            (a.ptr(), o),
            with(f32s(ReduceOp::Sum)),
            false,
            "last output outside",
        )?;
        // Offsets that differ by rank.
        let p = a.ptr().add(64 * rank);
        case(
            r,
            (p, p),
            with(f32s(ReduceOp::Sum)),
            false,
            "offsets differ",
        )?;
        // Bitwise or: no direct kernel.
        case(
            r,
            (a.ptr(), a.ptr()),
            with((DataType::Int32, ReduceOp::BitOr, 0)),
            false,
            "bor",
        )?;
        // Another device collective in between (it offers too).
        // SAFETY: the window holds `count` f32 on every rank; waited for.
        unsafe {
            r.comm
                .broadcast_device_raw(b.ptr(), b.ptr(), count, DataType::Float32, 0, r.stream)
                .and_then(|w| w.wait())
                .map_err(|e| format!("rank {rank}: broadcast: {e}"))?;
        }
    }
    // A zero-count all-reduce in a window offers and runs nothing.
    // SAFETY: nothing is read or written.
    unsafe {
        r.comm
            .all_reduce_device_raw(
                a.ptr(),
                a.ptr(),
                0,
                DataType::Float32,
                ReduceOp::Sum,
                r.stream,
            )
            .and_then(|w| w.wait())
            .map_err(|e| format!("rank {rank}: zero count: {e}"))?;
    }
    // Closing one window (collective) leaves the other usable.
    b.close().map_err(|e| format!("rank {rank}: close: {e}"))?;
    let p = a.ptr();
    case(
        r,
        (p, p),
        (DataType::Float32, ReduceOp::Sum, 999),
        true,
        "after a close",
    )?;
    let c = r.comm.direct_all_reduces();
    eprintln!("rank {rank}/{n}: route ok, {c:?}");
    if c.one_shot == 0 || c.two_shot == 0 {
        return Err(format!("rank {rank}: expected both kernels to run: {c:?}"));
    }
    Ok(())
}

/// One all-reduce in a window completes; in the next, the last rank is
/// SIGKILLed instead of offering: its peers, waiting for its offer, fail
/// within the deadline naming it.
fn death(r: &Rank, timeout: Duration) {
    let (rank, n) = (r.comm.rank(), r.comm.size());
    let count = 10_000;
    let a = r.comm.alloc_device_window(count * 4).expect("window");
    let p = a.ptr();
    let f32sum = (DataType::Float32, ReduceOp::Sum, count);
    case(r, (p, p), f32sum, true, "before the death").unwrap_or_else(|e| panic!("{e}"));
    if rank == n - 1 {
        std::thread::sleep(Duration::from_millis(200));
        kill_this_process();
    }
    let start = Instant::now();
    // SAFETY: the window holds `count` f32; waited for.
    let e = unsafe {
        r.comm
            .all_reduce_device_raw(p, p, count, DataType::Float32, ReduceOp::Sum, r.stream)
            .and_then(|w| w.wait())
    }
    .expect_err("the peer died")
    .to_string();
    let took = start.elapsed();
    assert_names_dead_peer(rank, &e, n - 1, took, timeout);
}

fn child(role: &str) {
    let (rank, n, id) = spawned_rank("ROUTE_TEST");
    let cfg = sncl::Config {
        timeout: TIMEOUT,
        ..config()
    };
    let comm = Communicator::init_rank_with_config(&id, rank, n, cfg).expect("init");
    let r = bind(comm);
    match role {
        "route" => route(&r).unwrap_or_else(|e| panic!("{e}")),
        "death" => death(&r, TIMEOUT),
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn device_all_reduce_in_windows_runs_direct_else_falls_back() {
    if let Ok(role) = std::env::var(ROLE) {
        return child(&role);
    }
    for n in [2, 3] {
        let start = Instant::now();
        let test = "device_all_reduce_in_windows_runs_direct_else_falls_back";
        let results = join(spawn_ranks(n, test, "ROUTE_TEST", &[(ROLE, "route")]));
        for (rank, _, text) in results.iter().filter(|r| !r.1) {
            eprintln!("n={n} rank {rank} failed:\n{text}");
        }
        for (rank, ok, text) in &results {
            assert!(ok, "n={n} rank {rank} failed:\n{text}");
            let line = text.lines().find(|l| l.contains("route ok"));
            let line = line.unwrap_or_else(|| panic!("n={n} rank {rank}:\n{text}"));
            eprintln!("{line}");
        }
        eprintln!("n={n}: every process ok in {:?}", start.elapsed());
    }
}

#[test]
fn peer_killed_before_its_offer_is_named() {
    if let Ok(role) = std::env::var(ROLE) {
        return child(&role);
    }
    let start = Instant::now();
    let test = "peer_killed_before_its_offer_is_named";
    let results = join(spawn_ranks(3, test, "ROUTE_TEST", &[(ROLE, "death")]));
    for (rank, ok, text) in &results {
        if *rank < 2 {
            assert!(ok, "rank {rank} failed:\n{text}");
            let line = text.lines().find(|l| l.contains("failed after"));
            let line = line.unwrap_or_else(|| panic!("rank {rank}:\n{text}"));
            eprintln!("{line}");
        } else {
            assert!(!ok, "rank 2 was killed");
        }
    }
    assert!(start.elapsed() < TIMEOUT + Duration::from_secs(15));
}
