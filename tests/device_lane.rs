//! The kernel path's lane in rounds (`src/device/window/lane.rs`): an
//! all-reduce larger than the lane goes through it in rounds of the lane's
//! elements inside one launch (the staged direct kernel,
//! `kernels/cuda/sncl_direct.cu`), one-shot or two-shot by the planner's
//! crossover, out of place and in place, from buffers that are not 16-byte
//! aligned and counts that are not whole packs, rounds or slices. Every
//! result is checked element by element against the sum computed here
//! (small integers: exact in any order of the sum).

mod device_kit;

use std::time::{Duration, Instant};

use device_kit::{bind_rank, Rank};
use sncl::device;
use sncl::{Collective, Communicator, Config, DataType, DeviceOp, ReduceOp};

/// A communicator of `n` thread ranks on emulated devices whose lane holds
/// `lane` bytes.
fn ranks(n: usize, lane: usize) -> Vec<Rank> {
    let _ = device::open(device::Backend::Emu, 0);
    let cfg = Config {
        timeout: Duration::from_secs(60),
        device: comm_core::config::DeviceSettings {
            lane_bytes: lane,
            ..Default::default()
        },
        ..Config::default()
    };
    Communicator::init_threads(n, cfg)
        .expect("init")
        .into_iter()
        .map(bind_rank)
        .collect()
}

/// Element `i` of rank `r`'s input.
fn value(r: usize, i: usize) -> f32 {
    ((r * 5 + i * 3) % 17) as f32 - 8.0
}

/// Runs an f32 all-reduce (`op`) of `count` elements on every rank, the
/// input at byte `offset` of the send buffer (or of the receive buffer, in
/// place) and the output at `offset` of the receive buffer; checks every
/// element on every rank.
fn check(ranks: &[Rank], count: usize, offset: usize, in_place: bool, op: ReduceOp) {
    let c = Other {
        coll: Collective::AllReduce,
        op,
        count,
        root: 0,
        offset,
        in_place,
        max_ctas: 0,
        tag: 0,
    };
    check_other(ranks, c);
}

/// Rounds of a 16 KiB lane (4096 f32, 4 blocks of the emulated device's
/// launches): counts below, at and above a round, several rounds with a
/// short last one, from aligned and misaligned buffers, out of place and
/// in place, on 2, 3 and 4 ranks; every one of them on the kernel path.
#[test]
fn all_reduces_go_through_the_lane_in_rounds() {
    for n in [2, 3, 4] {
        let ranks = ranks(n, 16 << 10);
        let mut runs = 0;
        for count in [1, 5, 4095, 4096, 4097, 12_299, 40_007] {
            for (offset, in_place) in [(0, false), (4, false), (12, true), (0, true)] {
                check(&ranks, count, offset, in_place, ReduceOp::Sum);
                runs += 1;
            }
        }
        check(&ranks, 3001, 8, false, ReduceOp::Max);
        check(&ranks, 3001, 4, true, ReduceOp::Avg);
        runs += 2;
        let counts = ranks[0].comm.direct_all_reduces();
        assert_eq!(
            counts.kernel_path, runs,
            "n={n}: every all-reduce on the lane"
        );
    }
}

/// Large all-reduces take the lane too, two-shot above the planner's
/// crossover: 4 MiB of f32 through the default lane, and 1 MiB through a
/// 64 KiB lane (16 rounds), on 2 ranks.
#[test]
fn large_all_reduces_run_two_shot_rounds() {
    for lane in [
        comm_core::config::DeviceSettings::default().lane_bytes,
        64 << 10,
    ] {
        let ranks = ranks(2, lane);
        check(&ranks, (1 << 20) + 3, 4, false, ReduceOp::Sum);
        check(&ranks, 1 << 18, 0, true, ReduceOp::Sum);
        let counts = ranks[0].comm.direct_all_reduces();
        assert_eq!(counts.kernel_path, 2, "lane {lane}");
        assert!(counts.kernel_path_two_shot >= 1, "lane {lane}: {counts:?}");
    }
}

/// One case of the other collectives on the lane.
#[derive(Clone, Copy, Debug)]
struct Other {
    coll: Collective,
    /// The fold (all-reduce; the others fold with sum).
    op: ReduceOp,
    count: usize,
    root: usize,
    /// Byte offset of every buffer (4: not 16-byte aligned).
    offset: usize,
    in_place: bool,
    /// The call's `CollConfig::max_ctas` (0: sncl's grid).
    max_ctas: u32,
    /// The call's tag (0: none).
    tag: u64,
}

/// Runs `c` (f32; `c.op` for an all-reduce, sum where another folds) on every rank with NCCL's extents and
/// in-place conventions and checks every element of every rank's result.
fn check_other(ranks: &[Rank], c: Other) {
    let n = ranks.len();
    let (k, root) = (c.count, c.root);
    let (send_len, recv_len) = match c.coll {
        Collective::AllGather | Collective::Gather => (k, n * k),
        Collective::ReduceScatter | Collective::Scatter => (n * k, k),
        Collective::AllToAll => (n * k, n * k),
        _ => (k, k),
    };
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .map(|r| {
                s.spawn(move || -> Result<(), String> {
                    let (dev, stream, me) = (&r.dev, r.stream, r.comm.rank());
                    let deadline = || Instant::now() + Duration::from_secs(60);
                    let recv = r.recv.ptr().add(c.offset);
                    // NCCL's in place: all-gather sends from its own piece
                    // of the output, reduce-scatter receives into its own
                    // piece of the input, the rest pass one buffer.
                    let (send, recv) = match (c.in_place, c.coll) {
                        (false, _) => (r.send.ptr().add(c.offset), recv),
                        (true, Collective::AllGather | Collective::Gather) => {
                            (recv.add(4 * me * k), recv)
                        }
                        (true, Collective::ReduceScatter | Collective::Scatter) => {
                            (recv, recv.add(4 * me * k))
                        }
                        (true, _) => (recv, recv),
                    };
                    let host: Vec<f32> = (0..send_len).map(|i| value(me, i)).collect();
                    // SAFETY: `host` lives until the synchronize; the
                    // buffers hold CASE_BUFFER_BYTES, more than any extent
                    // here.
                    unsafe { dev.copy_h2d_async(send, host.as_ptr().cast(), send_len * 4, stream) }
                        .and_then(|()| dev.synchronize(stream, deadline()))
                        .map_err(|e| e.to_string())?;
                    let mut op = DeviceOp::new(c.coll, DataType::Float32, k, send, recv, stream);
                    op.root = root;
                    op.op = c.op;
                    op.config.max_ctas = c.max_ctas;
                    op.config.tag = c.tag;
                    // SAFETY: both ranges live until the wait below.
                    let work = unsafe { r.comm.enqueue_device(op) }.map_err(|e| e.to_string())?;
                    work.wait().map_err(|e| e.to_string())?;
                    if matches!(c.coll, Collective::Reduce | Collective::Gather) && me != root {
                        return Ok(());
                    }
                    let mut out = vec![0f32; recv_len];
                    // SAFETY: `out` lives until the synchronize.
                    unsafe {
                        dev.copy_d2h_async(out.as_mut_ptr().cast(), recv, recv_len * 4, stream)
                    }
                    .and_then(|()| dev.synchronize(stream, deadline()))
                    .map_err(|e| e.to_string())?;
                    for (i, got) in out.iter().enumerate() {
                        let want = match c.coll {
                            Collective::AllGather | Collective::Gather => value(i / k, i % k),
                            Collective::AllToAll => value(i / k, me * k + i % k),
                            Collective::Scatter => value(root, me * k + i),
                            Collective::ReduceScatter => (0..n).map(|p| value(p, me * k + i)).sum(),
                            Collective::Broadcast => value(root, i),
                            Collective::AllReduce if c.op == ReduceOp::Max => {
                                (0..n).map(|p| value(p, i)).fold(f32::MIN, f32::max)
                            }
                            Collective::AllReduce if c.op == ReduceOp::Avg => {
                                (0..n).map(|p| value(p, i)).sum::<f32>() / n as f32
                            }
                            _ => (0..n).map(|p| value(p, i)).sum(),
                        };
                        if got.to_bits() != want.to_bits() {
                            return Err(format!(
                                "rank {me}: {c:?}: element {i} is {got}, expected {want}"
                            ));
                        }
                    }
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

/// All-gather, reduce-scatter, broadcast, reduce, all-to-all, gather and
/// scatter through a 16 KiB lane (the round of a collective with pieces,
/// reduce-scatter, all-to-all and scatter, is the lane over the rank count,
/// per piece):
/// one element, a short round, several rounds with a short last one, from
/// aligned and misaligned buffers, out of place and in place, every root,
/// on 2, 3 and 4 ranks; every one of them on the kernel path.
#[test]
fn other_collectives_go_through_the_lane_in_rounds() {
    for n in [2, 3, 4] {
        let ranks = ranks(n, 16 << 10);
        let mut runs = 0;
        for coll in [
            Collective::AllGather,
            Collective::ReduceScatter,
            Collective::Broadcast,
            Collective::Reduce,
            Collective::AllToAll,
            Collective::Gather,
            Collective::Scatter,
        ] {
            for count in [1, 7, 1365, 9001] {
                for (offset, in_place) in [(0, false), (4, false), (4, true)] {
                    if in_place && coll == Collective::AllToAll {
                        continue;
                    }
                    for root in 0..if coll.is_rooted() { n } else { 1 } {
                        let c = Other {
                            coll,
                            op: ReduceOp::Sum,
                            count,
                            root,
                            offset,
                            in_place,
                            max_ctas: 0,
                            tag: 0,
                        };
                        check_other(&ranks, c);
                        runs += 1;
                    }
                }
            }
        }
        let counts = ranks[0].comm.direct_all_reduces();
        assert_eq!(
            counts.kernel_path, runs,
            "n={n}: every collective on the lane"
        );
        // An all-to-all has no in-place form: overlapping buffers are
        // refused before anything is queued (they gave wrong blocks on the
        // host-driven path).
        let r = &ranks[0];
        let mut op = DeviceOp::new(
            Collective::AllToAll,
            DataType::Float32,
            1365,
            r.recv.ptr(),
            r.recv.ptr().add(4 * 1000),
            r.stream,
        );
        op.root = 0;
        // SAFETY: refused before anything is queued.
        match unsafe { r.comm.enqueue_device(op) } {
            Err(sncl::Error::InvalidArgument { detail, .. }) => {
                assert!(detail.contains("overlap"), "{detail}")
            }
            Err(e) => panic!("n={n}: want InvalidArgument, got {e}"),
            Ok(_) => panic!("n={n}: an overlapping all-to-all was queued"),
        }
    }
}

/// Half-precision folds accumulate in f32 and round once: on 3 ranks,
/// 1 + 2^-8 + 2^-8 in bf16 (and 1 + 2^-11 + 2^-11 in f16) is 1 + 2^-7
/// (1 + 2^-10) on the lane, where rounding after each addition in rank
/// order loses both small terms (1 + 2^-8 is a tie that rounds to 1).
/// All-reduce (one-shot and, large, two-shot), reduce-scatter and reduce;
/// whole packs and a tail; every element checked.
#[test]
fn half_precision_folds_accumulate_in_f32() {
    let ranks = ranks(3, 64 << 10);
    for (dtype, small, want) in [
        (DataType::Bfloat16, 0x3b80u16, 0x3f81u16),
        (DataType::Float16, 0x1000u16, 0x3c01u16),
    ] {
        for (coll, count) in [
            (Collective::AllReduce, 4099),
            (Collective::AllReduce, 300_001),
            (Collective::ReduceScatter, 1001),
            (Collective::Reduce, 777),
        ] {
            std::thread::scope(|s| {
                for r in &ranks {
                    s.spawn(move || {
                        let me = r.comm.rank();
                        let send_len = if coll == Collective::ReduceScatter { 3 * count } else { count };
                        let one = if dtype == DataType::Bfloat16 { 0x3f80u16 } else { 0x3c00u16 };
                        let host = vec![if me == 0 { one } else { small }; send_len];
                        let deadline = || Instant::now() + Duration::from_secs(60);
                        // SAFETY: `host` outlives the synchronisation.
                        unsafe {
                            r.dev
                                .copy_h2d_async(r.send.ptr(), host.as_ptr().cast(), send_len * 2, r.stream)
                        }
                        .unwrap();
                        let mut op =
                            DeviceOp::new(coll, dtype, count, r.send.ptr(), r.recv.ptr(), r.stream);
                        op.root = 1;
                        // SAFETY: the buffers outlive the wait.
                        unsafe { r.comm.enqueue_device(op) }.unwrap().wait().unwrap();
                        if coll == Collective::Reduce && me != 1 {
                            return;
                        }
                        let mut out = vec![0u16; count];
                        // SAFETY: `out` outlives the synchronisation.
                        unsafe {
                            r.dev.copy_d2h_async(out.as_mut_ptr().cast(), r.recv.ptr(), count * 2, r.stream)
                        }
                        .unwrap();
                        r.dev.synchronize(r.stream, deadline()).unwrap();
                        if let Some(i) = out.iter().position(|&v| v != want) {
                            panic!(
                                "rank {me} {dtype:?} {coll:?} {count}: element {i} is {:#06x}, expected {want:#06x}",
                                out[i]
                            );
                        }
                    });
                }
            });
        }
    }
    let counts = ranks[0].comm.direct_all_reduces();
    assert_eq!(counts.kernel_path, 8, "every fold on the lane: {counts:?}");
}

/// A call's cap on the kernel's blocks (`CollConfig::max_ctas`, NCCL's
/// `maxCTAs`): all-reduces and an all-gather of several blocks' worth,
/// capped at 1 and 3 blocks, give exact results, and the lane records
/// them with their tag; a host call with the cap is refused. (The grid the
/// cap yields is checked by `blocks_limit`'s unit test: the emulated
/// device gives the same results on any grid.)
#[test]
fn a_capped_call_stays_exact_and_a_host_call_with_a_cap_is_refused() {
    let ranks = ranks(3, 16 << 10);
    for max_ctas in [1, 3] {
        for (coll, count) in [
            (Collective::AllReduce, 3 * 4096 + 77),
            (Collective::AllReduce, 1000),
            (Collective::AllGather, 5000),
        ] {
            check_other(
                &ranks,
                Other {
                    coll,
                    op: ReduceOp::Sum,
                    count,
                    root: 0,
                    offset: 4,
                    in_place: false,
                    max_ctas,
                    tag: sncl::tags::tag_of("capped"),
                },
            );
        }
    }
    // The lane's operations are in the flight recorder, kernel and tag.
    let dump = ranks[0].comm.flight_recorder_json();
    let lane_ops: Vec<serde_json::Value> = dump
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|e: &serde_json::Value| e["algo"].as_str().unwrap_or("").starts_with("lane"))
        .collect();
    assert_eq!(lane_ops.len(), 6, "{dump}");
    assert!(
        lane_ops
            .iter()
            .all(|e| e["tag_name"] == "capped" && e["state"] == "completed"),
        "{dump}"
    );
    assert!(
        lane_ops
            .iter()
            .any(|e| e["op"] == "all_gather" && e["algo"] == "lane"),
        "{dump}"
    );
    let host = Communicator::init_threads(1, Config::default()).expect("init");
    let mut v = [1f32; 8];
    let e = host[0]
        .configured(&sncl::CollConfig {
            max_ctas: 2,
            ..Default::default()
        })
        .all_reduce_in_place(&mut v[..], ReduceOp::Sum)
        .unwrap_err()
        .to_string();
    assert!(e.contains("2 CTAs") && e.contains("host memory"), "{e}");
}

/// Ranks that call different operations on the kernel path (another
/// count, within one round and across rounds, another op, another root)
/// all fail in that operation, naming the mismatch, with their outputs
/// untouched; the lane folded the mismatched counts into a wrong result
/// before, and returned success.
#[test]
fn mismatched_calls_fail_every_rank_before_a_result() {
    type Call = (Collective, ReduceOp, usize, usize);
    let cases: [(&str, Call, Call); 4] = [
        (
            "counts within one round",
            (Collective::AllReduce, ReduceOp::Sum, 100, 0),
            (Collective::AllReduce, ReduceOp::Sum, 60, 0),
        ),
        (
            "counts of different rounds",
            (Collective::AllReduce, ReduceOp::Sum, 100, 0),
            (Collective::AllReduce, ReduceOp::Sum, 5000, 0),
        ),
        (
            "ops",
            (Collective::AllReduce, ReduceOp::Sum, 64, 0),
            (Collective::AllReduce, ReduceOp::Max, 64, 0),
        ),
        (
            "roots",
            (Collective::Broadcast, ReduceOp::Sum, 64, 0),
            (Collective::Broadcast, ReduceOp::Sum, 64, 1),
        ),
    ];
    for (what, first, second) in cases {
        let ranks = ranks(2, 16 << 10);
        let errs: Vec<String> = std::thread::scope(|s| {
            let hs: Vec<_> = ranks
                .iter()
                .map(|r| {
                    s.spawn(move || {
                        let me = r.comm.rank();
                        let (coll, op, count, root) = if me == 0 { first } else { second };
                        let deadline = || Instant::now() + Duration::from_secs(60);
                        let sentinel = vec![-7.0f32; count];
                        // SAFETY: `sentinel` lives until the synchronize;
                        // the buffers hold more than `count` f32.
                        unsafe {
                            r.dev
                                .copy_h2d_async(
                                    r.send.ptr(),
                                    sentinel.as_ptr().cast(),
                                    count * 4,
                                    r.stream,
                                )
                                .and_then(|()| {
                                    r.dev.copy_h2d_async(
                                        r.recv.ptr(),
                                        sentinel.as_ptr().cast(),
                                        count * 4,
                                        r.stream,
                                    )
                                })
                        }
                        .and_then(|()| r.dev.synchronize(r.stream, deadline()))
                        .expect("filling the buffers");
                        let mut dop = DeviceOp::new(
                            coll,
                            DataType::Float32,
                            count,
                            r.send.ptr(),
                            r.recv.ptr(),
                            r.stream,
                        );
                        dop.op = op;
                        dop.root = root;
                        // SAFETY: both buffers live until the wait.
                        let res = unsafe { r.comm.enqueue_device(dop) }.and_then(|w| w.wait());
                        let mut out = vec![0f32; count];
                        // SAFETY: `out` lives until the synchronize.
                        unsafe {
                            r.dev.copy_d2h_async(
                                out.as_mut_ptr().cast(),
                                r.recv.ptr(),
                                count * 4,
                                r.stream,
                            )
                        }
                        .and_then(|()| r.dev.synchronize(r.stream, deadline()))
                        .expect("reading the output");
                        assert!(
                            out.iter().all(|&x| x == -7.0),
                            "{what}: rank {me}'s output was written"
                        );
                        res.expect_err(&format!("{what}: rank {me} succeeded"))
                            .to_string()
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("no panic"))
                .collect()
        });
        for (me, e) in errs.iter().enumerate() {
            assert!(
                e.contains("called different operations")
                    && e.contains("the kernel path stopped before writing a result"),
                "{what}: rank {me}: {e}"
            );
        }
    }
}

/// The smallest all-reduces run the LL kernel (data and flag in one store,
/// no "ready" round, no wait for the peers' reads at the end): between the
/// other kernels of the lane (one-shot, two-shot, an all-gather), at odd
/// counts and offsets, in place, with every op the lane folds; each result
/// exact on every rank.
#[test]
fn small_all_reduces_run_ll_between_the_other_kernels() {
    let ranks = ranks(3, comm_core::config::DeviceSettings::default().lane_bytes);
    let gather = |count| Other {
        coll: Collective::AllGather,
        op: ReduceOp::Sum,
        count,
        root: 0,
        offset: 0,
        in_place: false,
        max_ctas: 0,
        tag: 0,
    };
    let mut small = 0;
    for (count, offset, in_place, op) in [
        (1, 0, false, ReduceOp::Sum),
        (7, 4, false, ReduceOp::Max),
        (1000, 0, true, ReduceOp::Sum),
        (60_000, 0, false, ReduceOp::Sum), // one-shot
        (4097, 12, false, ReduceOp::Avg),
        (1 << 20, 0, false, ReduceOp::Sum), // two-shot
        (33, 0, true, ReduceOp::Max),
        (0, 0, false, ReduceOp::Sum), // an all-gather
        (5, 8, false, ReduceOp::Sum),
        (5, 8, false, ReduceOp::Sum),
    ] {
        if count == 0 {
            check_other(&ranks, gather(300));
            continue;
        }
        check(&ranks, count, offset, in_place, op);
        small += usize::from(count * 4 <= 4 << 10);
    }
    for r in &ranks {
        let counts = r.comm.direct_all_reduces();
        assert_eq!(counts.kernel_path, 10, "rank {}: {counts:?}", r.comm.rank());
        // The planner's crossovers (3 ranks, NVLink's costs) put 4 KiB
        // and below on LL, 4 MiB on two-shot.
        let (ll, two) = (counts.kernel_path_ll, counts.kernel_path_two_shot);
        assert!(
            ll >= small as u64 && ll < 9 && two >= 1,
            "rank {}: {counts:?}",
            r.comm.rank()
        );
    }
}

/// All-reduces of `calls` (floats, `CollConfig::max_ctas`) enqueued back
/// to back on `nranks` ranks (no wait between them), each from its own part
/// of the send buffer into its own part of the receive buffer; every result
/// exact. Returns each rank's LL count.
fn back_to_back(nranks: usize, calls: &[(usize, u32)]) -> Vec<u64> {
    let ranks = ranks(
        nranks,
        comm_core::config::DeviceSettings::default().lane_bytes,
    );
    let total: usize = calls.iter().map(|c| c.0).sum();
    let results: Vec<Result<u64, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .map(|r| {
                s.spawn(move || -> Result<u64, String> {
                    let (dev, stream, me) = (&r.dev, r.stream, r.comm.rank());
                    let deadline = || Instant::now() + Duration::from_secs(60);
                    let host: Vec<f32> = (0..total).map(|i| value(me, i)).collect();
                    // SAFETY: `host` lives until the synchronize; the
                    // buffers hold more than `total` f32.
                    unsafe {
                        dev.copy_h2d_async(
                            r.send.ptr(),
                            host.as_ptr().cast(),
                            host.len() * 4,
                            stream,
                        )
                    }
                    .and_then(|()| dev.synchronize(stream, deadline()))
                    .map_err(|e| e.to_string())?;
                    let mut works = Vec::new();
                    let mut at = 0;
                    for &(count, max_ctas) in calls {
                        let mut op = DeviceOp::new(
                            Collective::AllReduce,
                            DataType::Float32,
                            count,
                            r.send.ptr().add(4 * at),
                            r.recv.ptr().add(4 * at),
                            stream,
                        );
                        op.config.max_ctas = max_ctas;
                        at += count;
                        // SAFETY: both ranges live until the waits below.
                        works
                            .push(unsafe { r.comm.enqueue_device(op) }.map_err(|e| e.to_string())?);
                    }
                    for w in works {
                        w.wait().map_err(|e| e.to_string())?;
                    }
                    let mut out = vec![0f32; total];
                    // SAFETY: `out` lives until the synchronize.
                    unsafe {
                        dev.copy_d2h_async(
                            out.as_mut_ptr().cast(),
                            r.recv.ptr(),
                            out.len() * 4,
                            stream,
                        )
                    }
                    .and_then(|()| dev.synchronize(stream, deadline()))
                    .map_err(|e| e.to_string())?;
                    for (i, got) in out.iter().enumerate() {
                        let want: f32 = (0..nranks).map(|p| value(p, i)).sum();
                        if got.to_bits() != want.to_bits() {
                            return Err(format!(
                                "rank {me}: element {i} is {got}, expected {want}"
                            ));
                        }
                    }
                    Ok(r.comm.direct_all_reduces().kernel_path_ll)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("no panic"))
            .collect()
    });
    let errs: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(errs.is_empty(), "{errs:?}");
    results.into_iter().map(|r| r.unwrap()).collect()
}

/// LL all-reduces enqueued back to back: each writes the LL slots of the
/// one two before it, which its peers may still be reading (an LL kernel
/// does not wait for its peers' reads); every result stays exact.
#[test]
fn back_to_back_ll_all_reduces_reuse_their_slots_safely() {
    let ll = back_to_back(3, &[(100, 0); 24]);
    assert_eq!(ll, vec![24; 3], "LL all-reduces per rank");
}

/// LL calls of one block and of several, between staged calls of other
/// grids, and the same lines sent by one block, then by two (a call capped
/// at one block): each block's epoch (derived from its own counter) then
/// differs from block 0's, in parity too, so where a line lies in the LL
/// region must depend on its block's epoch sequence only (per-block slots;
/// with lines placed by their pack alone, a peer's block 1 took lines block
/// 0 had left with its epoch's flag, or waited for lines overwritten under
/// it).
#[test]
fn ll_calls_of_other_grids_between_staged_ones_stay_exact() {
    // On the emulated device (4 blocks of 256 threads at most): 100 and
    // 7 floats run one block, 2000 two (one where capped), 3000 and 2999
    // three, 8000 four; 60 000 and 300 000 run staged (one-shot,
    // two-shot) with four.
    let mut calls = vec![
        (3000, 0),
        (100, 0),
        (100, 0),
        (3000, 0),
        (7, 0),
        (2999, 0),
        (60_000, 0),
        (3000, 0),
        (100, 0),
        (8000, 0),
        (1, 0),
        (300_000, 0),
        (3000, 0),
    ];
    for _ in 0..12 {
        calls.extend([(2000, 1), (2000, 0)]);
    }
    let ll = back_to_back(2, &calls);
    let small = calls.iter().filter(|c| c.0 <= 8000).count() as u64;
    for (r, got) in ll.iter().enumerate() {
        assert!(
            *got >= small - 2 && *got <= small,
            "rank {r}: {got} LL all-reduces, expected about {small}"
        );
    }
}
