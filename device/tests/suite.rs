//! The device test suite, written once against `Arc<dyn Device>`.
//!
//! The backend comes from `SNCL_TEST_DEVICE`: `emu` (the default; run with
//! `cargo test -p device --features emu`) or `cuda` (on a GPU machine; the
//! tests skip, saying why, where no CUDA device can be opened). Checks that
//! only the emulator can make (bad pointers it can see, fault injection)
//! run on `emu` only. Every wait has a deadline.

mod common;

use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{assert_same, data, deadline, Ctx, Flag, Rng};
use device::{Backend, DeviceError, DevicePtr, IpcHandle};
use kernels::{DataType, ReduceOp};

#[test]
fn alloc_free_and_zero_size() {
    let Some(ctx) = Ctx::new() else { return };
    let dev = &ctx.dev;
    let sizes = [0, 0, 1, 15, 16, 4097, 1 << 20];
    let ptrs: Vec<DevicePtr> = sizes
        .iter()
        .map(|&b| dev.alloc(b).expect("alloc"))
        .collect();
    for (i, (&a, &sa)) in ptrs.iter().zip(&sizes).enumerate() {
        for (&b, &sb) in ptrs[i + 1..].iter().zip(&sizes[i + 1..]) {
            assert_ne!(a, b, "two allocations share an address");
            let apart = a.0 + sa.max(1) as u64 <= b.0 || b.0 + sb.max(1) as u64 <= a.0;
            assert!(apart, "{a:?} ({sa} bytes) overlaps {b:?} ({sb} bytes)");
        }
    }
    for &p in &ptrs {
        // SAFETY: from alloc above, freed once, no work enqueued on it.
        unsafe { dev.free(p) }.expect("free");
    }
    let pinned: Vec<_> = [0, 1, 100, 4096]
        .iter()
        .map(|&b| (dev.alloc_pinned(b).expect("alloc_pinned"), b))
        .collect();
    for &(p, _) in &pinned {
        assert_eq!(
            p.as_ptr() as usize % 16,
            0,
            "pinned memory is not 16-byte aligned"
        );
    }
    for &(p, b) in &pinned {
        // SAFETY: from alloc_pinned with this length, freed once.
        unsafe { dev.free_pinned(p, b) }.expect("free_pinned");
    }
    if ctx.is_emu() {
        // SAFETY: the emulator detects these misuses and answers errors.
        unsafe {
            let p = dev.alloc(8).unwrap();
            assert!(dev.free(p.add(1)).is_err(), "freeing an interior address");
            dev.free(p).unwrap();
            let e = dev.free(p).expect_err("double free");
            assert!(
                matches!(e, DeviceError::InvalidArgument { call: "free", .. }),
                "{e}"
            );
            let h = dev.alloc_pinned(32).unwrap();
            assert!(
                dev.free_pinned(h, 16).is_err(),
                "free_pinned with a wrong length"
            );
            dev.free_pinned(h, 32).unwrap();
        }
        for huge in [usize::MAX, (1 << 36) + 1] {
            let e = dev.alloc(huge).expect_err("a huge alloc");
            assert!(
                matches!(e, DeviceError::OutOfMemory { .. }),
                "{huge} bytes: {e}"
            );
        }
    }
}

#[test]
fn round_trip_h2d_d2d_d2h_with_odd_sizes_and_offsets() {
    let Some(ctx) = Ctx::new() else { return };
    let mut rng = Rng::new(1);
    for bytes in [0, 1, 3, 4095, 65537, (1 << 20) + 13] {
        for (off_a, off_b) in [(0, 0), (1, 7), (7, 3)] {
            let a = ctx.buffer(bytes + 16);
            let b = ctx.buffer(bytes + 16);
            let want = rng.bytes(bytes);
            ctx.upload(a.ptr().add(off_a), &want);
            // SAFETY: both ranges lie inside their buffers (bytes + 16).
            unsafe {
                ctx.dev
                    .copy_d2d_async(b.ptr().add(off_b), a.ptr().add(off_a), bytes, ctx.stream)
                    .expect("copy_d2d_async");
            }
            let got = ctx.download(b.ptr().add(off_b), bytes);
            assert!(
                got == want,
                "{bytes} bytes at offsets {off_a}/{off_b} changed"
            );
        }
    }
}

#[test]
fn value_wait_orders_its_stream_and_leaves_others_running() {
    let Some(ctx) = Ctx::new() else { return };
    let waiter = ctx.other_stream();
    let free_runner = ctx.other_stream();
    let flag = Flag::new(&ctx.dev);
    let mut rng = Rng::new(2);
    let want = rng.bytes(4096);
    let buf = ctx.buffer(4096);
    let mut out = vec![0u8; 4096];
    let ev = ctx.dev.create_event().unwrap();
    // SAFETY: `want` and `out` outlive the stream's work (synchronised
    // below before they are read or dropped); the flag words are pinned.
    unsafe {
        let (d, s) = (&ctx.dev, ctx.stream);
        d.copy_h2d_async(buf.ptr(), want.as_ptr(), 4096, s).unwrap();
        d.stream_wait_u32(s, flag.addr(0), 2).unwrap();
        d.copy_d2h_async(out.as_mut_ptr(), buf.ptr(), 4096, s)
            .unwrap();
        d.stream_write_u32(s, flag.addr(1), 7).unwrap();
        d.record_event(ev, s).unwrap();
        // Another stream waits for the event, then writes word 2.
        d.stream_wait_event(waiter.stream, ev).unwrap();
        d.stream_write_u32(waiter.stream, flag.addr(2), 9).unwrap();
    }
    // A third stream is not held up by the blocked one.
    let other = free_runner.buffer(64);
    free_runner.upload(other.ptr(), &[5; 64]);
    assert_eq!(free_runner.download(other.ptr(), 64), vec![5; 64]);

    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !ctx.dev.event_done(ev).unwrap(),
        "the event completed past a blocked wait"
    );
    assert_eq!(
        flag.word(1).load(Ordering::Acquire),
        0,
        "the stream ran past its wait"
    );
    assert_eq!(
        flag.word(2).load(Ordering::Acquire),
        0,
        "the event wait did not hold"
    );
    flag.word(0).store(1, Ordering::Release); // not yet enough (waits for >= 2)
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        flag.word(1).load(Ordering::Acquire),
        0,
        "a wait for >= 2 passed at 1"
    );

    flag.word(0).store(2, Ordering::Release);
    ctx.sync();
    waiter.sync();
    assert!(out == want, "the copy after the wait saw other data");
    assert_eq!(flag.word(1).load(Ordering::Acquire), 7);
    assert_eq!(flag.word(2).load(Ordering::Acquire), 9);
    assert!(ctx.dev.event_done(ev).unwrap());
    // SAFETY: created above, not used afterwards.
    unsafe { ctx.dev.destroy_event(ev) }.unwrap();
}

#[test]
fn events_complete_and_time_a_held_stream() {
    let Some(ctx) = Ctx::new() else { return };
    let flag = Flag::new(&ctx.dev);
    let (start, end, never) = (
        ctx.dev.create_event().unwrap(),
        ctx.dev.create_event().unwrap(),
        ctx.dev.create_event().unwrap(),
    );
    assert!(
        ctx.dev.event_done(never).unwrap(),
        "an unrecorded event is done"
    );
    assert!(ctx.dev.event_elapsed_ms(never, never).is_err());
    ctx.dev.record_event(start, ctx.stream).unwrap();
    // SAFETY: the flag is pinned and outlives the stream's work.
    unsafe { ctx.dev.stream_wait_u32(ctx.stream, flag.addr(0), 1) }.unwrap();
    ctx.dev.record_event(end, ctx.stream).unwrap();
    std::thread::sleep(Duration::from_millis(60));
    assert!(!ctx.dev.event_done(end).unwrap());
    assert!(
        ctx.dev.event_elapsed_ms(start, end).is_err(),
        "timing an unfinished event"
    );
    flag.word(0).store(1, Ordering::Release);
    ctx.sync();
    assert!(ctx.dev.event_done(start).unwrap() && ctx.dev.event_done(end).unwrap());
    let ms = ctx.dev.event_elapsed_ms(start, end).unwrap();
    assert!(
        (40.0..30_000.0).contains(&ms),
        "elapsed {ms} ms, expected about 60"
    );
    for e in [start, end, never] {
        // SAFETY: created above, destroyed once.
        unsafe { ctx.dev.destroy_event(e) }.unwrap();
    }
}

/// The CPU reference: successive `reduce_into` calls, left to right.
fn fold(dtype: DataType, op: ReduceOp, srcs: &[&[u8]]) -> Vec<u8> {
    let mut acc = srcs[0].to_vec();
    for s in &srcs[1..] {
        let mut next = vec![0u8; acc.len()];
        kernels::scalar::reduce_into(dtype, op, &mut next, &acc, s);
        acc = next;
    }
    acc
}

const N: usize = 1_000_003;
const GUARD: usize = 8;

#[test]
fn reduce_copy_matches_the_cpu_fold_for_every_kernel() {
    let Some(ctx) = Ctx::new() else { return };
    let mut rng = Rng::new(3);
    let mut pairs = 0;
    for dtype in DataType::ALL {
        let size = dtype.size();
        let ops: Vec<ReduceOp> = kernels::cuda::reduce_copy_kernels()
            .filter(|&(d, _, _)| d == dtype)
            .map(|(_, op, _)| op)
            .collect();
        let host: Vec<Vec<u8>> = (0..3).map(|_| data(dtype, N, &mut rng)).collect();
        let srcs: Vec<_> = host
            .iter()
            .map(|h| {
                let b = ctx.buffer(h.len());
                ctx.upload(b.ptr(), h);
                b
            })
            .collect();
        let dsts = [
            ctx.buffer((N + GUARD) * size),
            ctx.buffer((N + GUARD) * size),
        ];
        let scratch = ctx.buffer(N * size);
        let sentinel = vec![0xa5u8; GUARD * size];
        let mut out = vec![0u8; (N + GUARD) * size];
        for op in ops {
            pairs += 1;
            for nsrcs in 1..=3 {
                let views: Vec<&[u8]> = host[..nsrcs].iter().map(|h| &h[..]).collect();
                let want = fold(dtype, op, &views);
                let sp: Vec<DevicePtr> = srcs[..nsrcs].iter().map(|b| b.ptr()).collect();
                for ndsts in 1..=2 {
                    let dp: Vec<DevicePtr> = dsts[..ndsts].iter().map(|b| b.ptr()).collect();
                    for count in [0, 1, 7, N] {
                        for &d in &dp {
                            ctx.upload(d.add(count * size), &sentinel);
                        }
                        // SAFETY: every range holds at least `count` elements.
                        unsafe { ctx.dev.reduce_copy(ctx.stream, dtype, op, &sp, &dp, count) }
                            .unwrap_or_else(|e| panic!("{dtype:?} {op:?}: {e}"));
                        for (j, &d) in dp.iter().enumerate() {
                            let out = &mut out[..(count + GUARD) * size];
                            ctx.download_into(out, d);
                            let what = format!(
                                "{dtype:?} {op:?} {nsrcs} src(s) -> dst {j} of {ndsts}, {count} el."
                            );
                            let (got, guard) = out.split_at(count * size);
                            assert_same(dtype, got, &want[..count * size], &what);
                            assert!(guard == &sentinel[..], "{what}: wrote past the count");
                        }
                    }
                }
                // In place: the first and the last source is also a destination.
                let mut places = vec![0, nsrcs - 1];
                places.dedup();
                for pos in places {
                    for count in [7, N] {
                        let bytes = count * size;
                        let mut sp = sp.clone();
                        // SAFETY: both ranges hold `bytes`; synchronised below.
                        unsafe {
                            ctx.dev
                                .copy_d2d_async(scratch.ptr(), sp[pos], bytes, ctx.stream)
                                .unwrap();
                        }
                        sp[pos] = scratch.ptr();
                        let dp = [scratch.ptr(), dsts[0].ptr()];
                        // SAFETY: as above; dst 0 equals source `pos` exactly.
                        unsafe { ctx.dev.reduce_copy(ctx.stream, dtype, op, &sp, &dp, count) }
                            .unwrap();
                        for (j, &d) in dp.iter().enumerate() {
                            ctx.download_into(&mut out[..bytes], d);
                            let what = format!(
                                "{dtype:?} {op:?} {nsrcs} src(s), in place at {pos}, dst {j}, \
                                 {count} el."
                            );
                            assert_same(dtype, &out[..bytes], &want[..bytes], &what);
                        }
                    }
                }
            }
        }
    }
    assert_eq!(
        pairs, 78,
        "every (dtype, op) of reduce_copy_kernels, avg included"
    );
}

#[test]
fn divide_matches_the_cpu() {
    let Some(ctx) = Ctx::new() else { return };
    let mut rng = Rng::new(4);
    for dtype in DataType::ALL {
        let size = dtype.size();
        let host = data(dtype, N, &mut rng);
        let buf = ctx.buffer(N * size);
        for divisor in [1, 3, 1000] {
            for count in [0, 7, N] {
                ctx.upload(buf.ptr(), &host);
                // SAFETY: the buffer holds N >= count elements.
                unsafe { ctx.dev.divide(ctx.stream, dtype, buf.ptr(), count, divisor) }.unwrap();
                let got = ctx.download(buf.ptr(), N * size);
                let mut want = host.clone();
                kernels::scalar::divide(dtype, &mut want[..count * size], divisor);
                let what = format!("{dtype:?} / {divisor}, {count} elements");
                assert_same(dtype, &got, &want, &what);
            }
        }
    }
}

#[test]
fn invalid_arguments_are_errors() {
    let Some(ctx) = Ctx::new() else { return };
    let (dev, s) = (&ctx.dev, ctx.stream);
    let bufs: Vec<_> = (0..9).map(|_| ctx.buffer(64)).collect();
    let p: Vec<DevicePtr> = bufs.iter().map(|b| b.ptr()).collect();
    let f32s = DataType::Float32;
    let invalid = |r: device::Result<()>, what: &str| match r {
        Err(DeviceError::InvalidArgument { .. }) => {}
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    };
    // SAFETY: every call below is refused before anything is enqueued (the
    // pointers that are used are live 64-byte buffers).
    unsafe {
        invalid(
            dev.reduce_copy(s, f32s, ReduceOp::Sum, &p, &p[..1], 4),
            "9 sources",
        );
        invalid(
            dev.reduce_copy(s, f32s, ReduceOp::Sum, &p[..1], &p, 4),
            "9 destinations",
        );
        invalid(
            dev.reduce_copy(s, f32s, ReduceOp::Sum, &[], &p[..1], 4),
            "no source",
        );
        invalid(
            dev.reduce_copy(s, f32s, ReduceOp::Sum, &p[..1], &[], 4),
            "no destination",
        );
        invalid(
            dev.reduce_copy(s, f32s, ReduceOp::BitAnd, &p[..2], &p[2..3], 4),
            "float band",
        );
        let half = DataType::Float16;
        invalid(
            dev.reduce_copy(s, half, ReduceOp::BitXor, &p[..2], &p[2..3], 4),
            "half bxor",
        );
    }
    if ctx.is_emu() {
        let gone = dev.alloc(64).unwrap();
        // SAFETY: freed once; used below only to check it is refused.
        unsafe { dev.free(gone) }.unwrap();
        let flag = Flag::new(dev);
        let mut host = [0u32; 4];
        let sum = ReduceOp::Sum;
        // SAFETY: the emulator checks every pointer and refuses these
        // before enqueueing anything.
        unsafe {
            let wild = DevicePtr(0x1000);
            invalid(
                dev.reduce_copy(s, f32s, sum, &[wild], &p[..1], 4),
                "wild source",
            );
            invalid(
                dev.reduce_copy(s, f32s, sum, &[gone], &p[..1], 4),
                "freed source",
            );
            invalid(
                dev.reduce_copy(s, f32s, sum, &p[..2], &p[2..3], 17),
                "past the end",
            );
            invalid(
                dev.reduce_copy(s, f32s, sum, &p[..1], &[p[0].add(4)], 4),
                "overlap",
            );
            invalid(
                dev.reduce_copy(s, f32s, sum, &p[..1], &[p[1], p[1]], 4),
                "same dst twice",
            );
            invalid(dev.divide(s, f32s, p[0], 4, 0), "divisor 0");
            invalid(dev.divide(s, f32s, p[0], 17, 2), "divide past the end");
            invalid(
                dev.copy_d2d_async(p[0], p[1].add(1), 64, s),
                "d2d past the end",
            );
            invalid(
                dev.copy_h2d_async(gone, host.as_ptr().cast(), 4, s),
                "h2d to freed",
            );
            invalid(
                dev.stream_wait_u32(s, host.as_mut_ptr(), 1),
                "wait on unpinned memory",
            );
            invalid(
                dev.stream_write_u32(s, flag.addr(0).cast::<u8>().add(1).cast(), 1),
                "unaligned",
            );
            let bogus = device::StreamHandle(u64::MAX);
            invalid(dev.copy_d2d_async(p[0], p[1], 4, bogus), "unknown stream");
            invalid(dev.free(DevicePtr(0x1000)), "free of a wild pointer");
        }
        invalid(
            dev.record_event(device::EventHandle(u64::MAX), s),
            "unknown event",
        );
        let e = dev
            .ipc_export(p[0].add(8))
            .expect_err("export of an interior address");
        assert!(matches!(e, DeviceError::InvalidArgument { .. }), "{e}");
    }
    // Nothing half-enqueued: the stream still works.
    ctx.upload(p[0], &[1; 64]);
    // SAFETY: live 64-byte buffers, 16 f32 each.
    unsafe { dev.reduce_copy(s, f32s, ReduceOp::Max, &p[..2], &p[2..3], 16) }.unwrap();
    ctx.sync();
}

const CHILD_ENV: &str = "SNCL_DEVICE_SUITE_IPC_CHILD";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn pattern(bytes: usize, mul: usize, add: usize) -> Vec<u8> {
    (0..bytes).map(|i| (i * mul + add) as u8).collect()
}

#[test]
fn ipc_export_then_import_in_a_child_process() {
    let Some(ctx) = Ctx::new() else { return };
    let bytes = 4099;
    let buf = ctx.buffer(bytes);
    ctx.upload(buf.ptr(), &pattern(bytes, 7, 1));
    let handle = ctx.dev.ipc_export(buf.ptr()).expect("ipc_export");
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut child = Command::new(exe)
        .args(["--exact", "ipc_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, format!("{}:{bytes}", hex(&handle.0)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the child");
    let end = deadline();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for the child") {
            break status;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the IPC child did not finish within {:?}", common::WAIT);
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let out = child.wait_with_output().expect("the child's output");
    assert!(
        status.success(),
        "the IPC child failed ({status}):\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        ctx.download(buf.ptr(), bytes) == pattern(bytes, 13, 5),
        "the child's writes are not visible to the exporter"
    );
    if ctx.is_emu() {
        // The emulator also imports in the same process; after free the
        // allocation cannot be opened any more.
        let again = ctx.dev.ipc_import(&handle).expect("same-process import");
        assert_eq!(ctx.download(again, bytes), pattern(bytes, 13, 5));
        assert!(ctx.dev.ipc_export(again).is_err(), "re-exporting an import");
        // SAFETY: from ipc_import above, closed once, no work uses it.
        unsafe { ctx.dev.ipc_close(again) }.unwrap();
        drop(buf);
        let e = ctx.dev.ipc_import(&handle).expect_err("import after free");
        assert!(matches!(e, DeviceError::InvalidArgument { .. }), "{e}");
    }
}

/// The child of `ipc_export_then_import_in_a_child_process` (run with
/// `CHILD_ENV` set): imports, checks, writes, closes. Run directly, it
/// checks that handles that are not exports are refused.
#[test]
fn ipc_child() {
    let Some(ctx) = Ctx::new() else { return };
    let Ok(arg) = std::env::var(CHILD_ENV) else {
        for garbage in [[0u8; 64], [0xff; 64]] {
            assert!(ctx.dev.ipc_import(&IpcHandle(garbage)).is_err());
        }
        return;
    };
    let (h, bytes) = arg.split_once(':').expect("handle:bytes");
    let bytes: usize = bytes.parse().expect("byte count");
    let mut handle = [0u8; 64];
    for (i, b) in handle.iter_mut().enumerate() {
        *b = u8::from_str_radix(&h[2 * i..2 * i + 2], 16).expect("hex handle");
    }
    let ptr = ctx.dev.ipc_import(&IpcHandle(handle)).expect("ipc_import");
    assert!(
        ctx.download(ptr, bytes) == pattern(bytes, 7, 1),
        "the child does not see the exporter's data"
    );
    ctx.upload(ptr, &pattern(bytes, 13, 5));
    // SAFETY: from ipc_import above, closed once, the copies are done.
    unsafe { ctx.dev.ipc_close(ptr) }.expect("ipc_close");
}

#[test]
fn injected_fault_is_reported_sticky_and_never_hangs() {
    let Some(ctx) = Ctx::new() else { return };
    if !ctx.is_emu() {
        let e = ctx
            .dev
            .inject_fault("test")
            .expect_err("inject_fault off emu");
        assert!(matches!(e, DeviceError::Unsupported { .. }), "{e}");
        return;
    }
    let blocked = ctx.other_stream();
    let flag = Flag::new(&ctx.dev);
    let buf = ctx.buffer(64);
    ctx.upload(buf.ptr(), &[7; 64]);
    let mut out = vec![0u8; 64];
    // SAFETY: the flag is pinned and `out` outlives the streams' work (the
    // device drops it once faulted; synchronised below).
    unsafe {
        // A stream that stays blocked on word 0, with work behind the wait.
        ctx.dev
            .stream_wait_u32(blocked.stream, flag.addr(0), 1)
            .unwrap();
        ctx.dev
            .copy_d2h_async(out.as_mut_ptr(), buf.ptr(), 64, blocked.stream)
            .unwrap();
        // Held on word 1 until everything is queued: the fault, then a copy.
        ctx.dev
            .stream_wait_u32(ctx.stream, flag.addr(1), 1)
            .unwrap();
        ctx.dev.inject_fault("boom-1234").unwrap();
        ctx.dev
            .copy_d2h_async(out.as_mut_ptr(), buf.ptr(), 64, ctx.stream)
            .unwrap();
        ctx.dev
            .copy_d2h_async(out.as_mut_ptr(), buf.ptr(), 64, ctx.stream)
            .unwrap();
    }
    flag.word(1).store(1, Ordering::Release);
    let fault = |r: device::Result<()>, what: &str| match r {
        Err(DeviceError::Fault { detail, .. }) if detail.contains("boom-1234") => {}
        other => panic!("{what}: expected the injected fault, got {other:?}"),
    };
    let t = Instant::now();
    fault(
        ctx.dev.synchronize(ctx.stream, t + Duration::from_secs(10)),
        "synchronize",
    );
    fault(
        ctx.dev
            .synchronize(blocked.stream, t + Duration::from_secs(10)),
        "synchronize of a stream blocked on a flag",
    );
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "reporting the fault took {:?}",
        t.elapsed()
    );
    assert_eq!(out, vec![0; 64], "operations queued behind the fault ran");
    fault(ctx.dev.alloc(8).map(drop), "alloc after the fault");
    fault(
        ctx.dev.create_stream().map(drop),
        "create_stream after the fault",
    );
    // SAFETY: the buffer is live; the call is refused.
    fault(
        unsafe { ctx.dev.divide(ctx.stream, DataType::Int32, buf.ptr(), 1, 1) },
        "divide",
    );

    // event_done reports it too, on a fresh device object.
    let dev = device::open(Backend::Emu, 1).unwrap();
    let stream = dev.create_stream().unwrap();
    let ev = dev.create_event().unwrap();
    dev.inject_fault("boom-5678").unwrap();
    dev.record_event(ev, stream).unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    let e = loop {
        match dev.event_done(ev) {
            Err(e) => break e,
            Ok(done) => assert!(!done, "the faulted record completed"),
        }
        assert!(Instant::now() < end, "event_done never reported the fault");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert!(
        matches!(&e, DeviceError::Fault { detail, .. } if detail.contains("boom-5678")),
        "{e}"
    );
}

#[test]
fn synchronize_times_out_on_a_stream_held_by_a_flag() {
    let Some(ctx) = Ctx::new() else { return };
    let flag = Flag::new(&ctx.dev);
    // SAFETY: the flag is pinned and outlives the stream's work.
    unsafe { ctx.dev.stream_wait_u32(ctx.stream, flag.addr(0), 1) }.unwrap();
    let t = Instant::now();
    let e = ctx
        .dev
        .synchronize(ctx.stream, t + Duration::from_millis(200))
        .expect_err("synchronize past an unwritten flag");
    assert!(matches!(e, DeviceError::Timeout { .. }), "{e}");
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(190) && waited < Duration::from_secs(10),
        "the timeout came after {waited:?}, expected 200 ms"
    );
    flag.word(0).store(1, Ordering::Release);
    ctx.sync();
}
