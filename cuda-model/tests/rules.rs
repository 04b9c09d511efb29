//! The model's rules, one test (at least) each: every test fails when its
//! rule is taken out of the model (docs/CUDA-MODEL.md lists which test
//! guards which rule). Tests that end their process, or need settings of
//! their own, run themselves again in a child process.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;

#[test]
fn calls_without_a_current_context_fail() {
    setup();
    std::thread::spawn(|| {
        let mut p = 0u64;
        // SAFETY: a live out-pointer; no context is current on this thread.
        let r = unsafe { cuMemAlloc_v2(&mut p, 64) };
        assert_eq!(r, CUDA_ERROR_INVALID_CONTEXT);
        let mut s = std::ptr::null_mut();
        // SAFETY: as above.
        let r = unsafe { cuStreamCreate(&mut s, 0) };
        assert_eq!(r, CUDA_ERROR_INVALID_CONTEXT);
        // Push / pop: the pushed context is current until popped.
        let mut ctx = std::ptr::null_mut();
        // SAFETY: live out-pointers; the context came from the driver.
        unsafe {
            ok("retain", cuDevicePrimaryCtxRetain(&mut ctx, 0));
            ok("push", cuCtxPushCurrent_v2(ctx));
            ok("alloc with a pushed context", cuMemAlloc_v2(&mut p, 64));
            let mut popped = std::ptr::null_mut();
            ok("pop", cuCtxPopCurrent_v2(&mut popped));
            assert_eq!(popped, ctx);
            assert_eq!(cuMemAlloc_v2(&mut p, 64), CUDA_ERROR_INVALID_CONTEXT);
            assert_eq!(cuCtxPopCurrent_v2(&mut popped), CUDA_ERROR_INVALID_CONTEXT);
        }
    })
    .join()
    .expect("thread");
}

#[test]
fn a_released_primary_context_is_destroyed() {
    if !is_child("a_released_primary_context_is_destroyed") {
        let (o, _) = run_child("a_released_primary_context_is_destroyed", &[]);
        assert!(o.status.success(), "{}", stderr(&o));
        return;
    }
    let ctx = setup();
    let _ = ctx;
    let mut p = 0u64;
    // SAFETY: live out-pointers; device 0 exists.
    unsafe {
        ok("release", cuDevicePrimaryCtxRelease_v2(0));
        assert_eq!(cuMemAlloc_v2(&mut p, 64), CUDA_ERROR_CONTEXT_IS_DESTROYED);
        assert_eq!(cuDevicePrimaryCtxRelease_v2(0), CUDA_ERROR_INVALID_CONTEXT);
    }
}

#[test]
fn a_stream_runs_its_work_in_order() {
    setup();
    let s = stream(true);
    let (gate, gate_d) = host_word();
    let (after, after_d) = host_word();
    park(s, gate_d, 1);
    // SAFETY: a mapped host word.
    ok("write", unsafe {
        cuStreamWriteValue32_v2(s, after_d, 7, 0)
    });
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        after.load(Ordering::SeqCst),
        0,
        "ran before the wait ahead of it"
    );
    gate.store(1, Ordering::SeqCst);
    assert!(eventually(Duration::from_secs(5), || after
        .load(Ordering::SeqCst)
        == 7));
}

#[test]
fn the_legacy_stream_waits_for_blocking_streams_only() {
    setup();
    for non_blocking in [false, true] {
        let s = stream(non_blocking);
        let (gate, gate_d) = host_word();
        let (done, done_d) = host_word();
        park(s, gate_d, 1);
        // SAFETY: a mapped host word; stream 0 is the legacy stream.
        ok("legacy write", unsafe {
            cuStreamWriteValue32_v2(std::ptr::null_mut(), done_d, 1, 0)
        });
        let ran = eventually(Duration::from_millis(300), || {
            done.load(Ordering::SeqCst) == 1
        });
        assert_eq!(
            ran,
            non_blocking,
            "legacy-stream work behind a parked {} stream",
            if non_blocking {
                "non-blocking"
            } else {
                "blocking"
            }
        );
        gate.store(1, Ordering::SeqCst);
        assert!(eventually(Duration::from_secs(5), || done
            .load(Ordering::SeqCst)
            == 1));
    }
}

/// Runs `call` on another thread while stream `s` is parked; checks it
/// does not return until the stream is released.
fn blocks_until_released(what: &str, call: impl FnOnce() -> CUresult + Send + 'static) {
    let s = stream(true);
    let (gate, gate_d) = host_word();
    park(s, gate_d, 1);
    let ctx = {
        let mut c = std::ptr::null_mut();
        // SAFETY: a live out-pointer.
        ok("current", unsafe { cuCtxGetCurrent(&mut c) });
        c as usize
    };
    let t = std::thread::spawn(move || {
        // SAFETY: the context is live.
        ok("set current", unsafe { cuCtxSetCurrent(ctx as *mut _) });
        call()
    });
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !t.is_finished(),
        "{what} returned while a stream of the device was parked"
    );
    gate.store(1, Ordering::SeqCst);
    assert_eq!(t.join().expect("thread"), CUDA_SUCCESS, "{what}");
}

#[test]
fn allocation_and_free_synchronise_the_device() {
    setup();
    blocks_until_released("cuMemAlloc", || {
        let mut p = 0u64;
        // SAFETY: a live out-pointer.
        unsafe { cuMemAlloc_v2(&mut p, 4096) }
    });
    let p = alloc(4096) as usize;
    // SAFETY: `p` came from cuMemAlloc and is freed once.
    blocks_until_released("cuMemFree", move || unsafe { cuMemFree_v2(p as u64) });
    blocks_until_released("cuMemHostAlloc", || {
        let mut p = std::ptr::null_mut();
        // SAFETY: a live out-pointer.
        unsafe { cuMemHostAlloc(&mut p, 64, 2) }
    });
    let mut pinned = std::ptr::null_mut();
    // SAFETY: a live out-pointer.
    ok("cuMemHostAlloc", unsafe {
        cuMemHostAlloc(&mut pinned, 64, 0)
    });
    let pinned = pinned as usize;
    // SAFETY: from cuMemHostAlloc, freed once.
    blocks_until_released("cuMemFreeHost", move || unsafe {
        cuMemFreeHost(pinned as *mut _)
    });
    let page = Box::leak(vec![0u8; 8192].into_boxed_slice()).as_mut_ptr() as usize;
    // SAFETY: 8 KiB of live memory, registered once then unregistered once.
    blocks_until_released("cuMemHostRegister", move || unsafe {
        cuMemHostRegister_v2(page as *mut _, 8192, 0)
    });
    // SAFETY: as above.
    blocks_until_released("cuMemHostUnregister", move || unsafe {
        cuMemHostUnregister(page as *mut _)
    });
    // SAFETY: no arguments.
    blocks_until_released("cuCtxSynchronize", || unsafe { cuCtxSynchronize() });
}

#[test]
fn lazy_loading_synchronises_at_the_first_function_lookup() {
    setup();
    let image = ptx(&["sncl_divide_float"]);
    let s = stream(true);
    let (gate, gate_d) = host_word();
    park(s, gate_d, 1);
    let mut m = std::ptr::null_mut();
    // Lazy: loading the module itself does not wait for the device.
    // SAFETY: a NUL-terminated PTX text.
    ok("load", unsafe {
        cuModuleLoadData(&mut m, image.as_ptr().cast())
    });
    gate.store(1, Ordering::SeqCst);
    let m = m as usize;
    // SAFETY: a module handle and a NUL-terminated name.
    blocks_until_released("cuModuleGetFunction (first)", move || unsafe {
        let mut f = std::ptr::null_mut();
        cuModuleGetFunction(&mut f, m as *mut _, c"sncl_divide_float".as_ptr())
    });
    let mut f = std::ptr::null_mut();
    // A name the image lacks.
    // SAFETY: as above.
    let r = unsafe { cuModuleGetFunction(&mut f, m as *mut _, c"sncl_divide_half".as_ptr()) };
    assert_eq!(r, CUDA_ERROR_NOT_FOUND);
}

#[test]
fn eager_loading_synchronises_in_module_load() {
    if !is_child("eager_loading_synchronises_in_module_load") {
        let (o, _) = run_child(
            "eager_loading_synchronises_in_module_load",
            &[("CUDA_MODULE_LOADING", "EAGER")],
        );
        assert!(o.status.success(), "{}", stderr(&o));
        return;
    }
    setup();
    let image = ptx(&["sncl_divide_float"]);
    let p = image.as_ptr() as usize;
    // SAFETY: a NUL-terminated PTX text alive for the test.
    blocks_until_released("cuModuleLoadData (eager)", move || unsafe {
        let mut m = std::ptr::null_mut();
        cuModuleLoadData(&mut m, p as *const _)
    });
}

#[test]
fn wait_value_geq_is_cyclic() {
    use cuda_model::memops::{passes32, passes64, Test};
    assert!(passes32(Test::Geq, 5, 5));
    assert!(passes32(Test::Geq, 6, 5));
    // u32::MAX is "before" 5 in cyclic order: not released.
    assert!(!passes32(Test::Geq, u32::MAX, 5));
    // Across the wrap: 3 is after 0xFFFF_FFF0.
    assert!(passes32(Test::Geq, 3, 0xFFFF_FFF0));
    assert!(!passes32(Test::Geq, 0x8000_0005, 5));
    assert!(passes64(Test::Geq, 1, u64::MAX));
    assert!(passes32(Test::Eq, 4, 4) && !passes32(Test::Eq, 4, 5));
    assert!(passes32(Test::And, 0b110, 0b010) && !passes32(Test::And, 0b100, 0b010));
    assert!(passes32(Test::Nor, 0, 0) && !passes32(Test::Nor, u32::MAX, 0));
    // On a stream: released with u32::MAX, a wait for 5 stays parked.
    setup();
    let s = stream(true);
    let (w, d) = host_word();
    park(s, d, 5);
    w.store(u32::MAX, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(100));
    assert!(!idle(s), "GEQ 5 passed with the word at u32::MAX");
    w.store(5, Ordering::SeqCst);
    assert!(eventually(Duration::from_secs(5), || idle(s)));
}

#[test]
fn a_free_while_a_stream_is_parked_is_a_deadlock() {
    const NAME: &str = "a_free_while_a_stream_is_parked_is_a_deadlock";
    if !is_child(NAME) {
        let (o, took) = run_child(NAME, &[("CUDA_MODEL_DEADLOCK_S", "1")]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(86), "{err}");
        assert!(err.contains("cuda-model: deadlock"), "{err}");
        assert!(err.contains("cuMemFree"), "{err}");
        assert!(err.contains("GEQ 1"), "{err}");
        assert!(took < Duration::from_secs(20), "{took:?}");
        return;
    }
    setup();
    let p = alloc(4096);
    let s = stream(true);
    let (w, d) = host_word();
    park(s, d, 1);
    // The thread that would release the wait frees first: on a GPU this
    // never returns.
    // SAFETY: `p` came from cuMemAlloc.
    let _ = unsafe { cuMemFree_v2(p) };
    w.store(1, Ordering::SeqCst);
    panic!("cuMemFree returned while the stream was parked");
}

#[test]
fn no_progress_while_work_waits_is_a_stall() {
    const NAME: &str = "no_progress_while_work_waits_is_a_stall";
    if !is_child(NAME) {
        let (o, _) = run_child(NAME, &[("CUDA_MODEL_STALL_S", "1")]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(86), "{err}");
        assert!(err.contains("cuda-model: stall"), "{err}");
        assert!(err.contains("device memory"), "{err}");
        return;
    }
    setup();
    let flag = alloc(64);
    let s = stream(true);
    // A wait on device memory nothing will write (a kernel would, on a GPU).
    // SAFETY: a device word the model knows.
    ok("wait", unsafe { cuStreamWaitValue32_v2(s, flag, 1, 0) });
    // SAFETY: a stream handle.
    let _ = unsafe { cuStreamSynchronize(s) };
    panic!("synchronize returned");
}

#[test]
fn ipc_handles_name_whole_allocations_and_refuse_their_own_process() {
    setup();
    let base = alloc(1 << 16);
    let mut h = cudarc::driver::sys::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: a live out-pointer; an interior pointer of a live allocation.
    unsafe {
        ok("get", cuIpcGetMemHandle(&mut h, base + 4096));
        let mut p = 0u64;
        assert_eq!(
            cuIpcOpenMemHandle_v2(&mut p, h, 1),
            CUDA_ERROR_INVALID_CONTEXT
        );
        assert_eq!(cuIpcCloseMemHandle(base), CUDA_ERROR_INVALID_VALUE);
    }
    // Another process opens it: the whole allocation, at its base.
    let hex: String = h
        .reserved
        .iter()
        .map(|b| format!("{:02x}", *b as u8))
        .collect();
    let data: Vec<u8> = (0..1u32 << 16).map(|i| (i % 251) as u8).collect();
    // SAFETY: `base` holds 64 KiB; pageable source, synchronous copy.
    let r = unsafe { cuMemcpyHtoD_v2(base, data.as_ptr().cast(), data.len()) };
    ok("fill", r);
    let (o, _) = run_child("ipc_child_opens", &[("IPC_HANDLE", &hex)]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
#[ignore = "the child process of ipc_handles_name_whole_allocations_and_refuse_their_own_process"]
fn ipc_child_opens() {
    if !is_child("ipc_child_opens") {
        return; // run by the test above, in a process of its own
    }
    setup();
    let hex = std::env::var("IPC_HANDLE").expect("handle");
    let mut h = cudarc::driver::sys::CUipcMemHandle { reserved: [0; 64] };
    for (i, b) in h.reserved.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex") as _;
    }
    let mut p = 0u64;
    let mut again = 0u64;
    let mut out = vec![0u8; 1 << 16];
    let (mut base, mut size) = (0u64, 0usize);
    // SAFETY: live out-pointers; the mapping holds 64 KiB.
    unsafe {
        ok("open", cuIpcOpenMemHandle_v2(&mut p, h, 1));
        ok("open again", cuIpcOpenMemHandle_v2(&mut again, h, 1));
        assert_eq!(p, again, "a second open maps the same address");
        ok(
            "range",
            cuMemGetAddressRange_v2(&mut base, &mut size, p + 100),
        );
        assert_eq!(
            (base, size),
            (p, 1 << 16),
            "the whole allocation, at its base"
        );
        ok(
            "read",
            cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), p, out.len()),
        );
        ok("close", cuIpcCloseMemHandle(p));
        ok("close the second open", cuIpcCloseMemHandle(p));
        assert_eq!(
            cuIpcCloseMemHandle(p),
            CUDA_ERROR_INVALID_VALUE,
            "closed twice"
        );
    }
    let want: Vec<u8> = (0..1u32 << 16).map(|i| (i % 251) as u8).collect();
    assert!(
        out == want,
        "the peer's bytes, from the allocation's first byte"
    );
}

#[test]
fn pointer_attributes_describe_known_memory_only() {
    setup();
    let p = alloc(10_000);
    let mut t = 0u32;
    let mut start = 0u64;
    let mut size = 0usize;
    let mut ordinal = -1i32;
    // SAFETY: out-pointers of each attribute's size.
    unsafe {
        ok(
            "type",
            cuPointerGetAttribute((&mut t as *mut u32).cast(), 2, p + 8),
        );
        assert_eq!(t, 2, "device memory");
        ok(
            "start",
            cuPointerGetAttribute((&mut start as *mut u64).cast(), 11, p + 8),
        );
        ok(
            "size",
            cuPointerGetAttribute((&mut size as *mut usize).cast(), 12, p + 8),
        );
        ok(
            "ordinal",
            cuPointerGetAttribute((&mut ordinal as *mut i32).cast(), 9, p),
        );
        assert_eq!((start, size, ordinal), (p, 10_000, 0));
        let local = 5u64;
        let r = cuPointerGetAttribute((&mut t as *mut u32).cast(), 2, &local as *const u64 as u64);
        assert_eq!(
            r, CUDA_ERROR_INVALID_VALUE,
            "pageable host memory is unknown"
        );
        let (mut b, mut n) = (0u64, 0usize);
        let r = cuMemGetAddressRange_v2(&mut b, &mut n, &local as *const u64 as u64);
        assert_eq!(r, CUDA_ERROR_NOT_FOUND);
        assert_eq!(cuMemFree_v2(p + 8), CUDA_ERROR_INVALID_VALUE, "not a base");
        ok("free", cuMemFree_v2(p));
        assert_eq!(cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE, "freed twice");
        let mut z = 0u64;
        assert_eq!(cuMemAlloc_v2(&mut z, 0), CUDA_ERROR_INVALID_VALUE);
    }
}

#[test]
fn captures_record_work_and_forbid_unsafe_calls() {
    // A GLOBAL capture refuses unsafe calls of every thread of the process
    // (and is invalidated by them): alone in a child, not beside the
    // other tests.
    let name = "captures_record_work_and_forbid_unsafe_calls";
    if !is_child(name) {
        let (o, _) = run_child(name, &[]);
        assert!(o.status.success(), "{}", stderr(&o));
        return;
    }
    setup();
    let s = stream(true);
    let (w, d) = host_word();
    // SAFETY: handles and mapped words the model knows; live out-pointers.
    unsafe {
        ok("begin", cuStreamBeginCapture_v2(s, 0)); // GLOBAL
        ok("write captured", cuStreamWriteValue32_v2(s, d, 9, 0));
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(w.load(Ordering::SeqCst), 0, "captured work must not run");
        let mut st = 0u32;
        ok("is capturing", cuStreamIsCapturing(s, &mut st));
        assert_eq!(st, 1);
        // An unsafe call in another thread during a GLOBAL capture.
        let ctx = {
            let mut c = std::ptr::null_mut();
            ok("current", cuCtxGetCurrent(&mut c));
            c as usize
        };
        let r = std::thread::spawn(move || {
            ok("set", cuCtxSetCurrent(ctx as *mut _));
            let mut p = 0u64;
            cuMemAlloc_v2(&mut p, 64)
        })
        .join()
        .expect("thread");
        assert_eq!(r, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        let mut g = std::ptr::null_mut();
        assert_eq!(
            cuStreamEndCapture(s, &mut g),
            CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        );
        // A clean capture, replayed twice.
        ok("begin relaxed", cuStreamBeginCapture_v2(s, 2));
        ok("write", cuStreamWriteValue32_v2(s, d, 11, 0));
        let mut p = 0u64;
        ok("alloc during a relaxed capture", cuMemAlloc_v2(&mut p, 64));
        ok("end", cuStreamEndCapture(s, &mut g));
        let mut exec = std::ptr::null_mut();
        ok("instantiate", cuGraphInstantiateWithFlags(&mut exec, g, 0));
        ok("launch", cuGraphLaunch(exec, s));
        ok("sync", cuStreamSynchronize(s));
        assert_eq!(w.load(Ordering::SeqCst), 11);
        // The legacy stream while a blocking stream captures.
        let b = stream(false);
        ok("begin", cuStreamBeginCapture_v2(b, 1));
        let r = cuStreamWriteValue32_v2(std::ptr::null_mut(), d, 1, 0);
        assert_eq!(r, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
        assert_eq!(cuStreamQuery(b), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        assert_eq!(
            cuStreamEndCapture(b, &mut g),
            CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        );
    }
}

#[test]
fn kernels_run_the_host_build_by_name() {
    setup();
    let n = 1000usize;
    let (a, b, c) = (alloc(n * 4), alloc(n * 4), alloc(n * 4));
    let xs: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let ys: Vec<f32> = (0..n).map(|i| 0.5 * i as f32).collect();
    let mut args = [0u8; 144];
    args[..8].copy_from_slice(&a.to_le_bytes());
    args[8..16].copy_from_slice(&b.to_le_bytes());
    args[64..72].copy_from_slice(&c.to_le_bytes());
    args[128..136].copy_from_slice(&(n as u64).to_le_bytes());
    args[136..140].copy_from_slice(&2i32.to_le_bytes());
    args[140..144].copy_from_slice(&1i32.to_le_bytes());
    let image = ptx(&["sncl_reduce_copy_float_sum"]);
    let mut out = vec![0f32; n];
    // SAFETY: buffers of `n` floats; one parameter of 144 bytes.
    unsafe {
        ok("h2d", cuMemcpyHtoD_v2(a, xs.as_ptr().cast(), n * 4));
        ok("h2d", cuMemcpyHtoD_v2(b, ys.as_ptr().cast(), n * 4));
        let (mut m, mut f) = (std::ptr::null_mut(), std::ptr::null_mut());
        ok("load", cuModuleLoadData(&mut m, image.as_ptr().cast()));
        ok(
            "function",
            cuModuleGetFunction(&mut f, m, c"sncl_reduce_copy_float_sum".as_ptr()),
        );
        let mut params = [args.as_mut_ptr().cast::<std::ffi::c_void>()];
        let s = stream(true);
        ok(
            "launch",
            cuLaunchKernel(
                f,
                3,
                1,
                1,
                256,
                1,
                1,
                0,
                s,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            ),
        );
        ok("sync", cuStreamSynchronize(s));
        ok("d2h", cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), c, n * 4));
        // Bad launches: empty grid, too many threads, too large a
        // cooperative grid.
        let bad = cuLaunchKernel(
            f,
            0,
            1,
            1,
            256,
            1,
            1,
            0,
            s,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        );
        assert_eq!(bad, CUDA_ERROR_INVALID_VALUE);
        let bad = cuLaunchKernel(
            f,
            1,
            1,
            1,
            2048,
            1,
            1,
            0,
            s,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        );
        assert_eq!(bad, CUDA_ERROR_INVALID_VALUE);
        let big =
            cuLaunchCooperativeKernel(f, 1_000_000, 1, 1, 256, 1, 1, 0, s, params.as_mut_ptr());
        assert_eq!(big, CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
        ok("unload", cuModuleUnload(m));
        let after = cuLaunchKernel(
            f,
            1,
            1,
            1,
            256,
            1,
            1,
            0,
            s,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        );
        assert_eq!(
            after, CUDA_ERROR_INVALID_HANDLE,
            "a function of an unloaded module"
        );
    }
    for (i, v) in out.iter().enumerate() {
        assert_eq!(*v, 1.5 * i as f32, "element {i}");
    }
}

#[test]
fn kernels_of_two_processes_do_not_overlap_without_mps() {
    const NAME: &str = "kernels_of_two_processes_do_not_overlap_without_mps";
    if is_child(NAME) {
        setup();
        // Hold the device's time slice as a running kernel does, 1.5 s.
        let hold = cuda_model::launch::hold_time_slice(0);
        println!("\nholding the time slice");
        std::thread::sleep(Duration::from_millis(3000));
        drop(hold);
        return;
    }
    for (mps, overlap) in [("0", false), ("1", true)] {
        let exe = std::env::current_exe().expect("exe");
        let mut holder = std::process::Command::new(exe)
            .args([
                NAME,
                "--exact",
                "--nocapture",
                "--test-threads=1",
                "--include-ignored",
            ])
            .env(CHILD, NAME)
            .env("CUDA_MODEL_MPS", mps)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn");
        // Start the timed kernel once the holder holds the slice.
        let mut lines = std::io::BufRead::lines(std::io::BufReader::new(
            holder.stdout.take().expect("piped"),
        ));
        assert!(
            lines.any(|l| l.map(|l| l.contains("holding")).unwrap_or(false)),
            "the holder never took the time slice"
        );
        let (o, took) = run_child("timed_kernel", &[("CUDA_MODEL_MPS", mps)]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(holder.wait().expect("wait").success());
        let text = String::from_utf8_lossy(&o.stdout);
        let ms: u64 = text
            .lines()
            .find_map(|l| l.split("kernel-ms ").nth(1))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no kernel time in {text}"));
        let _ = took;
        if overlap {
            assert!(ms < 600, "MPS on: the kernel waited {ms} ms");
        } else {
            assert!(
                ms >= 600,
                "MPS off: the kernel ran beside another process's ({ms} ms)"
            );
        }
    }
}

#[test]
#[ignore = "the child process of kernels_of_two_processes_do_not_overlap_without_mps"]
fn timed_kernel() {
    if !is_child("timed_kernel") {
        return; // run by the test above
    }
    setup();
    let p = alloc(4096);
    let image = ptx(&["sncl_divide_float"]);
    let start = Instant::now();
    // SAFETY: a 1024-float buffer; the divide kernel's three parameters.
    unsafe {
        let (mut m, mut f) = (std::ptr::null_mut(), std::ptr::null_mut());
        ok("load", cuModuleLoadData(&mut m, image.as_ptr().cast()));
        ok(
            "function",
            cuModuleGetFunction(&mut f, m, c"sncl_divide_float".as_ptr()),
        );
        let (mut ptr, mut n, mut d) = (p, 1024u64, 2u64);
        let mut params = [
            (&mut ptr as *mut u64).cast::<std::ffi::c_void>(),
            (&mut n as *mut u64).cast(),
            (&mut d as *mut u64).cast(),
        ];
        let s = stream(true);
        ok(
            "launch",
            cuLaunchKernel(
                f,
                1,
                1,
                1,
                256,
                1,
                1,
                0,
                s,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            ),
        );
        ok("sync", cuStreamSynchronize(s));
    }
    println!("\nkernel-ms {}", start.elapsed().as_millis());
}

/// A synchronising call made after the word of a parked wait was written,
/// before the stream's worker read it again, does not count against the
/// wait: the device passes the wait and the call returns, on a GPU as
/// here. 200 rounds of release-then-allocate-and-free: the report names no
/// synchronising call while parked (before the model read the word at the
/// call, most rounds did).
#[test]
fn a_call_after_the_release_is_not_made_while_parked() {
    const NAME: &str = "a_call_after_the_release_is_not_made_while_parked";
    if !is_child(NAME) {
        let dir = std::env::temp_dir().join(format!("cm-released-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("report dir");
        let report = dir.join("r-%p.json");
        let (o, _) = run_child(NAME, &[("CUDA_MODEL_REPORT", report.to_str().unwrap())]);
        assert!(o.status.success(), "{}", stderr(&o));
        let mut frees = 0;
        for e in std::fs::read_dir(&dir).expect("reports") {
            let text = std::fs::read_to_string(e.expect("entry").path()).expect("report");
            let v: serde_json::Value = serde_json::from_str(&text).expect("JSON");
            for t in v["threads"].as_array().expect("threads") {
                let parked = &t["synchronising_calls_while_parked"];
                assert!(
                    parked.as_object().is_none_or(|m| m.is_empty()),
                    "calls counted as made while parked: {parked}"
                );
                frees += t["apis"]["cuMemFree"]["calls"].as_u64().unwrap_or(0);
            }
        }
        assert_eq!(frees, 200, "the child's frees are in the report");
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    setup();
    let s = stream(true);
    for _ in 0..200 {
        let (w, d) = host_word();
        park(s, d, 1);
        w.store(1, Ordering::SeqCst);
        let p = alloc(64);
        // SAFETY: `p` came from cuMemAlloc and is freed once.
        ok("cuMemFree", unsafe { cuMemFree_v2(p) });
    }
    assert!(eventually(Duration::from_secs(5), || idle(s)));
}

/// GPUDirect RDMA write flushes (driver API, cuFlushGPUDirectRDMAWrites):
/// the device reports NIC writes unordered with its own work and offers
/// the host-side flush (attributes 118 and 117, as x86 Hopper systems
/// report them), and the flush needs a current context and takes only the
/// current-context target (0) and the owner (100) or all-devices (200)
/// scope.
#[test]
fn gpudirect_flush_needs_a_context_and_its_one_target() {
    setup();
    let attr = |a: i32| {
        let mut v = -1;
        // SAFETY: a live out-pointer.
        ok("attribute", unsafe { cuDeviceGetAttribute(&mut v, a, 0) });
        v
    };
    assert_eq!(
        attr(118),
        0,
        "writes ordering: none (a consumer must flush)"
    );
    assert_eq!(attr(117) & 1, 1, "the host-side flush is offered");
    let before = GPUDIRECT_FLUSHES.load(Ordering::Relaxed);
    ok("owner", cuFlushGPUDirectRDMAWrites(0, 100));
    ok("all devices", cuFlushGPUDirectRDMAWrites(0, 200));
    assert_eq!(cuFlushGPUDirectRDMAWrites(1, 100), CUDA_ERROR_INVALID_VALUE);
    assert_eq!(cuFlushGPUDirectRDMAWrites(0, 150), CUDA_ERROR_INVALID_VALUE);
    assert_eq!(GPUDIRECT_FLUSHES.load(Ordering::Relaxed) - before, 2);
    std::thread::spawn(|| {
        assert_eq!(
            cuFlushGPUDirectRDMAWrites(0, 100),
            CUDA_ERROR_INVALID_CONTEXT,
            "no current context on this thread"
        );
    })
    .join()
    .expect("thread");
}
