//! Device collectives on the emulated device (`device` feature `emu`):
//! collectives × dtypes (f32, f16, bf16, i32, u8) × ops (sum, max, avg,
//! band where valid) × 1..4 thread ranks × counts 0, 1, 7, 2000 (more than
//! one chunk), over shared memory and TCP, plus 1000003 elements for a few
//! cases. Each device result is copied back and compared bit for bit with
//! the same collective run by the same communicators on host buffers (the
//! host path is checked against independent references in
//! threads_matrix.rs; the device kernels are specified bit-identical to the
//! CPU's). The caller's stream is never synchronised between the input's
//! upload, the collective and the download: only the stream semantics
//! (event wait + flag wait) order them.
//!
//! `SNCL_TEST_FULL_MATRIX=1` runs the full matrix instead of this covering
//! subset: every dtype × every op it supports × 1..4 ranks × counts 0, 1,
//! 7, 2000 and 1000003, threads over shm and TCP, and processes
//! (commbench, every collective, dtype and op) over shm and TCP.
//!
//! Also: the hierarchical all-reduce on device buffers (4 ranks as two
//! "nodes", shm and TCP); a fault injected on one rank's device fails the
//! operation on every rank with an error naming that rank (and, on the
//! faulted rank, its device), never a hang; the safe typed forms; argument
//! errors.

mod device_kit;

use device_kit::{all_reduce_with_fault_on_rank_1, bind_rank, run_all, test_backend, Case, Rank};

use std::sync::Arc;
use std::time::Duration;

use comm_core::config::TransportChoice;
use sncl::device::{self, DeviceBuffer, StreamHandle};
use sncl::{Collective, Communicator, Config, DataType, MemoryStore, ReduceOp, Store};

/// Whether `SNCL_TEST_FULL_MATRIX=1` asks for the full matrix.
fn full_matrix() -> bool {
    std::env::var("SNCL_TEST_FULL_MATRIX").is_ok_and(|v| v == "1")
}

fn dtypes() -> &'static [DataType] {
    if full_matrix() {
        &DataType::ALL
    } else {
        &DTYPES
    }
}

fn ops() -> &'static [ReduceOp] {
    if full_matrix() {
        &ReduceOp::ALL
    } else {
        &OPS
    }
}

const DTYPES: [DataType; 6] = [
    DataType::Float32,
    DataType::Float16,
    DataType::Bfloat16,
    DataType::Int32,
    DataType::Uint8,
    DataType::Float8e4m3,
];
const OPS: [ReduceOp; 4] = [
    ReduceOp::Sum,
    ReduceOp::Max,
    ReduceOp::Avg,
    ReduceOp::BitAnd,
];
const COLLS: [Collective; 5] = [
    Collective::AllReduce,
    Collective::ReduceScatter,
    Collective::AllGather,
    Collective::Broadcast,
    Collective::Reduce,
];

fn config(transport: TransportChoice) -> Config {
    Config {
        timeout: Duration::from_secs(30),
        chunk_bytes: 4096,
        shm: sncl::ShmSettings {
            slot_bytes: 4096,
            ..Default::default()
        },
        tcp: sncl::TcpSettings {
            piece_bytes: 4096,
            ..Default::default()
        },
        transport,
        ..Default::default()
    }
}

fn cases(n: usize, counts: &[usize]) -> Vec<Case> {
    let mut v = Vec::new();
    for &count in counts {
        for &dtype in dtypes() {
            for coll in COLLS {
                let reducing = matches!(
                    coll,
                    Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce
                );
                let ops: &[ReduceOp] = if reducing { ops() } else { &OPS[..1] };
                for &op in ops {
                    if reducing && kernels::check_supported(dtype, op).is_err() {
                        continue;
                    }
                    let root = (count + n - 1) % n;
                    v.push(Case {
                        coll,
                        dtype,
                        op,
                        root,
                        count,
                    });
                }
            }
        }
    }
    v
}

/// Operations larger than the device staging run in segments (the
/// staging is allocated once, at bind): with 64 KiB of staging, counts of
/// several segments per block, strided sides (reduce_scatter, all_gather,
/// alltoall, gather, scatter) and in-place ones match the host path on
/// every rank, over shared memory and TCP.
#[test]
fn segments_match_the_host_path() {
    for (transport, n) in [(TransportChoice::Auto, 3), (TransportChoice::Tcp, 2)] {
        let cfg = Config {
            device: comm_core::config::DeviceSettings {
                staging_bytes: 64 << 10,
                ..Default::default()
            },
            ..config(transport)
        };
        let ranks = bind(Communicator::init_threads(n, cfg).expect("init"));
        let mut cases = Vec::new();
        // f32 blocks of 12000 elements: 3 segments at n = 3 (5461 per
        // block), 2 at n = 2; all_reduce's 40001 elements: 3 segments.
        for (dtype, count) in [
            (DataType::Float32, 12000),
            (DataType::Float32, 40001),
            (DataType::Bfloat16, 9999),
        ] {
            for coll in Collective::UNIFORM {
                for op in [ReduceOp::Sum, ReduceOp::Avg] {
                    let reducing = matches!(
                        coll,
                        Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce
                    );
                    if !reducing && op != ReduceOp::Sum {
                        continue;
                    }
                    cases.push(Case {
                        coll,
                        dtype,
                        op,
                        root: n - 1,
                        count,
                    });
                }
            }
        }
        assert_all_ok(&format!("{transport:?} n={n}"), run_all(&ranks, &cases));
        let stats = ranks[0].comm.stats();
        eprintln!(
            "{transport:?} n={n}: {} segmented cases ok; {stats:?}",
            cases.len()
        );
    }
}

/// A device collective's buffers are checked before anything is enqueued:
/// host memory, another device's memory, a freed allocation and one too
/// short for the count are each an `InvalidArgument` naming the buffer,
/// and a good call still runs after them.
#[test]
fn bad_device_buffers_are_refused_before_anything_is_enqueued() {
    let r = bind(Communicator::init_threads(1, config(TransportChoice::Auto)).expect("init"))
        .pop()
        .expect("one rank");
    let run = |send: u64, recv: u64, count: usize| {
        // SAFETY: refused before anything runs, or run on live buffers
        // (the last call) and waited for.
        unsafe {
            r.comm.all_reduce_device_raw(
                device::DevicePtr(send),
                device::DevicePtr(recv),
                count,
                DataType::Float32,
                ReduceOp::Sum,
                r.stream,
            )
        }
        .and_then(|w| w.wait())
    };
    let good = r.send.ptr().0;
    let refused = |send: u64, recv: u64, count: usize, what: &str, why: &str| {
        let e = run(send, recv, count).expect_err(why).to_string();
        assert!(
            e.contains(what) && e.contains("invalid argument"),
            "{why}: {e}"
        );
        eprintln!("{why}: {e}");
    };
    let host = vec![0f32; 64];
    refused(
        host.as_ptr() as u64,
        good,
        64,
        "send buffer",
        "host memory as the send buffer",
    );
    refused(
        good,
        host.as_ptr() as u64,
        64,
        "receive buffer",
        "host memory as the receive buffer",
    );
    let freed = {
        let b = DeviceBuffer::new(&r.dev, 256).expect("alloc");
        b.ptr().0
    };
    refused(freed, good, 64, "send buffer", "a freed allocation");
    let short = DeviceBuffer::new(&r.dev, 16).expect("alloc");
    refused(
        short.ptr().0,
        good,
        8,
        "send buffer",
        "16 bytes for 8 floats",
    );
    refused(
        good,
        short.ptr().add(8).0,
        4,
        "receive buffer",
        "8 bytes left for 4 floats",
    );
    match device::open(test_backend(), 1) {
        Ok(other) => {
            let theirs = DeviceBuffer::new(&other, 256).expect("alloc");
            refused(
                good,
                theirs.ptr().0,
                64,
                "receive buffer",
                "another device's memory",
            );
        }
        Err(e) => eprintln!("no second device ({e}): another device's memory not tried"),
    }
    run(good, good, 64).expect("good buffers still run");
}

/// The kernel path (`SNCL_DEVICE_LANE_BYTES`): where every pair of thread
/// ranks goes device to device (an emulated device open before init, so
/// nvlink is offered), small all-reduces run as kernels on the callers'
/// streams, in rounds of the lane where they are larger than it
/// (tests/device_lane.rs has the rounds' edges); they give the host path's
/// results (small integers: every order of the sum is exact), fp8 stays
/// host-driven, and with the setting at 0 nothing takes the kernel path.
#[test]
fn all_reduces_take_the_kernel_path() {
    let _ = device::open(device::Backend::Emu, 0);
    for (lane, n) in [(256 << 10, 3), (0, 2)] {
        let cfg = Config {
            device: comm_core::config::DeviceSettings {
                lane_bytes: lane,
                ..Default::default()
            },
            ..config(TransportChoice::Auto)
        };
        let ranks = bind(Communicator::init_threads(n, cfg).expect("init"));
        let mut cases = Vec::new();
        for (dtype, count) in [
            (DataType::Float32, 1),
            (DataType::Float32, 2000),
            (DataType::Bfloat16, 777),
            (DataType::Float32, 100_000),
            (DataType::Float8e4m3, 64),
        ] {
            for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
                if kernels::check_supported(dtype, op).is_ok() {
                    cases.push(Case {
                        coll: Collective::AllReduce,
                        dtype,
                        op,
                        root: 0,
                        count,
                    });
                }
            }
        }
        assert_all_ok(&format!("lane {lane} n={n}"), run_all(&ranks, &cases));
        let ran = ranks[0].comm.direct_all_reduces().kernel_path;
        // f32 × 1, × 2000 and × 100,000 (two rounds) and bf16 × 777, with
        // 3 ops each: 12.
        let want = if lane == 0 { 0 } else { 12 };
        assert_eq!(ran, want, "lane {lane}: kernel-path all-reduces");
    }
}

/// Kernel-path all-reduces on two streams run in issue order: with rank
/// 0's first stream held back (a value wait the test releases later), an
/// all-reduce issued on it and then one on a second stream both give their
/// own sums on every rank (unordered, rank 0's second would meet rank 1's
/// first, and overwrite the lane buffer its first has not read yet).
#[test]
fn kernel_path_orders_all_reduces_across_streams() {
    if test_backend() != device::Backend::Emu {
        eprintln!("skipped: the stream gate is a pinned word of the emulated device's");
        return;
    }
    let _ = device::open(device::Backend::Emu, 0);
    let ranks = bind(Communicator::init_threads(2, config(TransportChoice::Auto)).expect("init"));
    let count = 1000;
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .map(|r| {
                s.spawn(move || -> Result<(), String> {
                    let dev = &r.dev;
                    let other = dev.create_stream().map_err(|e| e.to_string())?;
                    let gate = device::PinnedBuffer::new(dev, 64).map_err(|e| e.to_string())?;
                    let word = gate.as_ptr() as *mut u32;
                    // Rank 0's first stream only: the ranks then reach
                    // the two all-reduces in different orders on their
                    // devices, which the lane must not pair up wrongly.
                    // SAFETY: 64 pinned bytes owned by `gate`, which
                    // outlives every use of the stream below.
                    unsafe {
                        word.write_volatile(u32::from(r.comm.rank() != 0));
                        dev.stream_wait_u32(r.stream, word, 1)
                    }
                    .map_err(|e| e.to_string())?;
                    let (a, b) = (r.send.ptr(), r.recv.ptr());
                    let fill = |p: device::DevicePtr, v: f32, s: StreamHandle| {
                        let host = vec![v; count];
                        // SAFETY: `host` lives until the stream is synced
                        // (the copy is staged at once on the emulated
                        // device for a pageable source).
                        unsafe { dev.copy_h2d_async(p, host.as_ptr().cast(), count * 4, s) }
                            .and_then(|()| {
                                dev.synchronize(
                                    s,
                                    std::time::Instant::now() + Duration::from_secs(30),
                                )
                            })
                            .map_err(|e| e.to_string())
                    };
                    fill(b.add(4 * count), 10.0, other)?;
                    // A on the held stream (its input written after the
                    // gate, by the stream itself: filled now, read later).
                    fill(a, 1.0, other)?;
                    let run = |p: device::DevicePtr, s: StreamHandle| {
                        // SAFETY: both ranges live until the waits below.
                        unsafe {
                            r.comm.all_reduce_device_raw(
                                p,
                                p,
                                count,
                                DataType::Float32,
                                ReduceOp::Sum,
                                s,
                            )
                        }
                        .map_err(|e| e.to_string())
                    };
                    let wa = run(a, r.stream)?;
                    let wb = run(b.add(4 * count), other)?;
                    std::thread::sleep(Duration::from_millis(100));
                    // SAFETY: as above; the device only reads the word.
                    unsafe { std::sync::atomic::AtomicU32::from_ptr(word) }
                        .store(1, std::sync::atomic::Ordering::Release);
                    wa.wait().map_err(|e| e.to_string())?;
                    wb.wait().map_err(|e| e.to_string())?;
                    let got = |p: device::DevicePtr| -> Result<Vec<f32>, String> {
                        let mut out = vec![0f32; count];
                        // SAFETY: `out` lives until the synchronize.
                        unsafe { dev.copy_d2h_async(out.as_mut_ptr().cast(), p, count * 4, other) }
                            .and_then(|()| {
                                dev.synchronize(
                                    other,
                                    std::time::Instant::now() + Duration::from_secs(30),
                                )
                            })
                            .map_err(|e| e.to_string())?;
                        Ok(out)
                    };
                    let (ga, gb) = (got(a)?, got(b.add(4 * count))?);
                    if ga.iter().any(|&x| x != 2.0) || gb.iter().any(|&x| x != 20.0) {
                        return Err(format!(
                            "rank {}: first all-reduce gave {}, second {} (expected 2 and 20)",
                            r.comm.rank(),
                            ga[0],
                            gb[0]
                        ));
                    }
                    assert_eq!(r.comm.direct_all_reduces().kernel_path, 2);
                    Ok(())
                })
            })
            .collect();
        hs.into_iter()
            .filter_map(|h| h.join().expect("no panic").err())
            .collect()
    });
    assert!(errs.is_empty(), "{}", errs.join("\n"));
}

/// Fails with the first 20 of `errs` (cases that failed on some rank).
fn assert_all_ok(what: &str, errs: Vec<String>) {
    assert!(
        errs.is_empty(),
        "{what}: {} failure(s):\n{}",
        errs.len(),
        errs[..errs.len().min(20)].join("\n")
    );
}

fn bind(comms: Vec<Communicator>) -> Vec<Rank> {
    comms.into_iter().map(bind_rank).collect()
}

fn matrix(transport: TransportChoice, ns: &[usize]) {
    for &n in ns {
        let ranks = bind(Communicator::init_threads(n, config(transport)).expect("init"));
        let cases = cases(n, &[0, 1, 7, 2000]);
        assert_all_ok(&format!("{transport:?} n={n}"), run_all(&ranks, &cases));
        eprintln!(
            "{transport:?} n={n}: {} cases ok on every rank",
            cases.len()
        );
    }
}

#[test]
fn matrix_shm_1_to_4_ranks() {
    matrix(TransportChoice::Auto, &[1, 2, 3, 4]);
}

#[test]
fn matrix_tcp_2_and_3_ranks() {
    if full_matrix() {
        matrix(TransportChoice::Tcp, &[1, 2, 3, 4]);
    } else {
        matrix(TransportChoice::Tcp, &[2, 3]);
    }
}

fn large_config(transport: TransportChoice) -> Config {
    Config {
        transport,
        timeout: Duration::from_secs(60),
        ..Default::default()
    }
}

#[test]
fn large_counts_over_shm_and_tcp() {
    let count = 1_000_003;
    if full_matrix() {
        for transport in [TransportChoice::Auto, TransportChoice::Tcp] {
            for n in 1..=4 {
                let comms = Communicator::init_threads(n, large_config(transport));
                let ranks = bind(comms.expect("init"));
                let cases = cases(n, &[count]);
                let errs = run_all(&ranks, &cases);
                assert!(errs.is_empty(), "{transport:?} n={n}: {}", errs.join("\n"));
                eprintln!("{transport:?} n={n}: {} cases of {count} ok", cases.len());
            }
        }
        return;
    }
    for transport in [TransportChoice::Auto, TransportChoice::Tcp] {
        let ranks = bind(Communicator::init_threads(3, large_config(transport)).expect("init"));
        let cases = [
            (Collective::AllReduce, DataType::Float32, ReduceOp::Sum),
            (Collective::AllReduce, DataType::Bfloat16, ReduceOp::Avg),
            (Collective::ReduceScatter, DataType::Int32, ReduceOp::Max),
            (Collective::AllGather, DataType::Uint8, ReduceOp::Sum),
            (Collective::Broadcast, DataType::Float16, ReduceOp::Sum),
        ]
        .map(|(coll, dtype, op)| Case {
            coll,
            dtype,
            op,
            root: 1,
            count,
        });
        let errs = run_all(&ranks, &cases);
        assert!(errs.is_empty(), "{transport:?}: {}", errs.join("\n"));
    }
}

#[test]
fn a_device_fault_fails_the_operation_on_every_rank() {
    if test_backend() != device::Backend::Emu {
        eprintln!(
            "skipped: faults are injected through the emulated device only (the cuda backend \
             answers inject_fault with Unsupported)"
        );
        return;
    }
    let ranks = bind(Communicator::init_threads(3, config(TransportChoice::Auto)).expect("init"));
    let count = 5000;
    let results = all_reduce_with_fault_on_rank_1(&ranks, count, "injected by the test");
    for (rank, r) in results.iter().enumerate() {
        let e = r.as_ref().expect_err("every rank fails");
        eprintln!("rank {rank}: {e}");
        assert!(
            e.contains("rank 1"),
            "rank {rank}'s error does not name rank 1: {e}"
        );
        if rank == 1 {
            assert!(
                e.contains("emu device 1"),
                "the faulted rank names its device: {e}"
            );
            assert!(
                e.contains("rank 1: all_reduce") && e.contains("injected by the test"),
                "the faulted rank names the operation and the device error: {e}"
            );
        }
    }
}

/// The device forms before the one typed API (deprecated, kept for one
/// release): they still run, and still check their counts against the
/// buffers.
#[test]
#[allow(deprecated)]
fn deprecated_device_forms_and_argument_errors() {
    let ranks = bind(Communicator::init_threads(2, config(TransportChoice::Auto)).expect("init"));
    let count = 1000;
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .map(|r| {
                s.spawn(move || -> Result<(), String> {
                    let rank = r.comm.rank();
                    let host: Vec<f32> = (0..count).map(|i| (i + rank) as f32).collect();
                    // The rank's case buffers (allocated before any rank's
                    // stream waits in a collective), and a short one freed
                    // only after the closing barrier (see `Rank`).
                    let (buf, all) = (&r.send, &r.recv);
                    let small = DeviceBuffer::new(&r.dev, 4).map_err(|e| e.to_string())?;
                    // SAFETY: `host` outlives the synchronisation below.
                    unsafe {
                        r.dev
                            .copy_h2d_async(buf.ptr(), host.as_ptr().cast(), count * 4, r.stream)
                    }
                    .map_err(|e| e.to_string())?;
                    r.comm.scope(|s| -> Result<(), String> {
                        let e = s
                            .all_reduce_device::<f32>(
                                &small,
                                &small,
                                count,
                                ReduceOp::Sum,
                                r.stream,
                            )
                            .err()
                            .ok_or("a too-small buffer is rejected")?;
                        assert!(e.to_string().contains("expected at least"), "{e}");
                        // A count whose bytes overflow is an error, not a panic.
                        let e = s
                            .all_reduce_device::<f32>(
                                buf,
                                all,
                                usize::MAX / 2,
                                ReduceOp::Sum,
                                r.stream,
                            )
                            .err()
                            .ok_or("a huge count is rejected")?;
                        eprintln!("huge count: {e}");
                        let e = s
                            .broadcast_device::<f32>(buf, buf, count, 5, r.stream)
                            .err()
                            .ok_or("a bad root is rejected")?;
                        assert!(e.to_string().contains("root 5"), "{e}");
                        s.all_reduce_device::<f32>(buf, buf, count, ReduceOp::Sum, r.stream)
                            .and_then(|w| w.wait())
                            .map_err(|e| e.to_string())?;
                        s.all_gather_device::<f32>(buf, all, count, r.stream)
                            .and_then(|w| w.wait())
                            .map_err(|e| e.to_string())
                    })?;
                    let mut got = vec![0f32; 2 * count];
                    // SAFETY: `got` outlives the synchronisation.
                    unsafe {
                        r.dev.copy_d2h_async(
                            got.as_mut_ptr().cast(),
                            all.ptr(),
                            2 * count * 4,
                            r.stream,
                        )
                    }
                    .map_err(|e| e.to_string())?;
                    r.dev
                        .synchronize(
                            r.stream,
                            std::time::Instant::now() + Duration::from_secs(30),
                        )
                        .map_err(|e| e.to_string())?;
                    for (i, g) in got.iter().enumerate() {
                        let want = (2 * (i % count) + 1) as f32;
                        if *g != want {
                            return Err(format!(
                                "rank {rank}: element {i} is {g}, expected {want}"
                            ));
                        }
                    }
                    r.comm.barrier().map_err(|e| e.to_string())?;
                    drop(small);
                    Ok(())
                })
            })
            .collect();
        hs.into_iter()
            .filter_map(|h| h.join().expect("no panic").err())
            .collect()
    });
    assert!(errs.is_empty(), "{}", errs.join("\n"));
    // Without a bound device.
    let comms = Communicator::init_threads(1, config(TransportChoice::Auto)).expect("init");
    let dev = device::open(test_backend(), 0).expect("a device");
    let buf = DeviceBuffer::new(&dev, 16).expect("alloc");
    // SAFETY: rejected before anything runs.
    let e = unsafe {
        comms[0].all_reduce_device_raw(
            buf.ptr(),
            buf.ptr(),
            4,
            DataType::Float32,
            ReduceOp::Sum,
            StreamHandle(0),
        )
    }
    .err()
    .expect("no device bound");
    assert!(e.to_string().contains("bind_device"), "{e}");
    comms[0].bind_device(dev.clone()).expect("bind");
    let e = comms[0].bind_device(dev).expect_err("binds once");
    assert!(e.to_string().contains("already bound"), "{e}");
}

/// Runs commbench with `args` on the emulated device and checks that every
/// result matched (commbench checks against the host path).
fn commbench_ok(bin: &std::path::Path, args: &[&str], transport: &str) {
    let out = std::process::Command::new(bin)
        .args(args)
        .args(["--device", "emu"])
        .env("SNCL_TIMEOUT_MS", "30000")
        .env("SNCL_TRANSPORT", transport)
        .output()
        .expect("running commbench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "commbench {args:?} over {transport} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("# device: emu device 0"), "{stdout}");
    assert!(stdout.contains("Out of bounds values : 0 OK"), "{stdout}");
}

/// Ranks as processes: `commbench --device emu --np 3` (each process has
/// its own emulated device; results are checked by commbench against the
/// host path); the full matrix runs every collective, dtype and op on 1..4
/// processes over shm and TCP. Needs the commbench binary of this build
/// (`cargo build -p commbench`); skipped with a note when it is not there.
#[test]
fn processes_via_commbench_device_emu() {
    let exe = std::env::current_exe().expect("test binary path");
    let Some(bin) = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("commbench"))
        .filter(|b| b.exists())
    else {
        eprintln!("skipped: no commbench binary next to the test (build it with cargo build -p commbench)");
        return;
    };
    if !full_matrix() {
        let args = ["all_reduce", "-b", "8", "-e", "64K", "-f", "64", "-n", "2"];
        let more = ["-d", "float,bf16,int32", "-o", "sum,max", "--np", "3"];
        commbench_ok(&bin, &[&args[..], &more[..]].concat(), "auto");
        // The collectives commbench --device refused before stop 28.
        for coll in ["alltoall", "gather", "scatter"] {
            let args = [
                coll, "-b", "8", "-e", "64K", "-f", "64", "-n", "2", "-r", "1",
            ];
            commbench_ok(&bin, &[&args[..], &["--np", "3"][..]].concat(), "auto");
        }
        return;
    }
    let colls = [
        "all_reduce",
        "reduce_scatter",
        "all_gather",
        "broadcast",
        "reduce",
        "alltoall",
        "gather",
        "scatter",
    ];
    for transport in ["auto", "tcp"] {
        for np in ["1", "2", "3", "4"] {
            for coll in colls {
                let args = [coll, "-b", "8", "-e", "4M", "-f", "8", "-n", "1"];
                let more = ["-w", "0", "-d", "all", "-o", "all", "--np", np];
                commbench_ok(&bin, &[&args[..], &more[..]].concat(), transport);
                eprintln!("processes: {coll} on {np} over {transport} ok");
            }
        }
    }
}

/// 4 thread ranks on two "nodes" (ranks 0, 1 and 2, 3; `Config::node_id`
/// as `SNCL_NODE_ID` sets it), over shm inside a node and TCP across
/// (`Auto`), or TCP everywhere.
fn two_nodes(transport: TransportChoice) -> Vec<Communicator> {
    let store = MemoryStore::new();
    let n = 4;
    let comm_id = 0xde71_c000 + u64::from(transport.forced().is_some());
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let store: Arc<dyn Store> = Arc::new(store.for_rank(r));
            let cfg = Config {
                node_id: Some(format!("devnode{}", r / 2)),
                ..config(transport)
            };
            std::thread::spawn(move || Communicator::init_with_store(store, r, n, comm_id, cfg))
        })
        .collect();
    hs.into_iter()
        .map(|h| h.join().expect("init thread").expect("init"))
        .collect()
}

#[test]
fn hier_all_reduce_on_device_buffers_two_nodes() {
    // A process with an emulated device open can run device operations,
    // so same-node pairs get nvlink (opened here so that the choice does
    // not depend on which test of this binary ran first).
    let _ = sncl::device::open(test_backend(), 0);
    for transport in [TransportChoice::Auto, TransportChoice::Tcp] {
        let comms = two_nodes(transport);
        let kinds = comms[0].transports();
        let want = match transport {
            TransportChoice::Auto => ["self", "nvlink", "tcp", "tcp"],
            _ => ["self", "tcp", "tcp", "tcp"],
        };
        assert_eq!(kinds[1..], want[1..], "{transport:?}");
        for c in &comms {
            c.force_algorithm(Collective::AllReduce, Some("hier"))
                .expect("force hier");
        }
        let ranks = bind(comms);
        let cases: Vec<Case> = cases(4, &[0, 1, 7, 2000, 100_003])
            .into_iter()
            .filter(|c| c.coll == Collective::AllReduce)
            .collect();
        let errs = run_all(&ranks, &cases);
        assert!(errs.is_empty(), "{transport:?}: {}", errs.join("\n"));
        // The device operation ran hier: per rank, hier sends
        // 2 (nodes-1)/nodes × count/local elements across nodes (a flat
        // ring in rank order would send 0 or 3/2 × count). Host + device.
        let before: Vec<_> = ranks.iter().map(|r| r.comm.stats()).collect();
        let count = 8192;
        let one = [Case {
            coll: Collective::AllReduce,
            dtype: DataType::Float32,
            op: ReduceOp::Sum,
            root: 0,
            count,
        }];
        let errs = run_all(&ranks, &one);
        assert!(errs.is_empty(), "{transport:?}: {}", errs.join("\n"));
        for (r, b) in ranks.iter().zip(&before) {
            let d = r.comm.stats().since(b);
            let (nodes, local) = (2, 2);
            let hier = (2 * (nodes - 1) * (count / local) / nodes * 4) as u64;
            assert_eq!(d.inter_sent, 2 * hier, "rank {}", r.comm.rank());
        }
        eprintln!(
            "{transport:?}: hier on device buffers: {} cases ok",
            cases.len()
        );
    }
}
