//! Point-to-point groups on device memory (`src/device/p2p.rs`): ring
//! shifts, an all-to-all written as sends and receives (PyTorch's
//! `all_to_all` over `isend` / `irecv`), several transfers to one peer of
//! different types, copies to self, empty transfers, transfers many times
//! the staging (cut into segments), and the errors: a send to self without
//! its receive, a NULL or host buffer, sizes that do not match (an error on
//! both ranks, not a hang). Every byte is checked.

mod device_kit;

use std::time::{Duration, Instant};

use comm_core::config::TransportChoice;
use device_kit::{bind_rank, Rank};
use sncl::device::{self, DevicePtr, DeviceSlice, DeviceSliceMut};
use sncl::{Communicator, Config, DataType, DeviceTransfer, Error};

/// `n` thread ranks on emulated devices (or `SNCL_TEST_DEVICE`'s) with
/// `staging` bytes of device staging per buffer.
fn ranks(n: usize, staging: usize) -> Vec<Rank> {
    ranks_over(n, staging, TransportChoice::Auto)
}

/// As [`ranks`], over `transport` (TCP: every piece staged through pinned
/// host memory, 4 KiB pieces).
fn ranks_over(n: usize, staging: usize, transport: TransportChoice) -> Vec<Rank> {
    let _ = device::open(device::Backend::Emu, 0);
    let cfg = Config {
        timeout: Duration::from_secs(30),
        device: comm_core::config::DeviceSettings {
            staging_bytes: staging,
            ..Default::default()
        },
        tcp: sncl::TcpSettings {
            piece_bytes: 4096,
            ..Default::default()
        },
        transport,
        ..Config::default()
    };
    Communicator::init_threads(n, cfg)
        .expect("init")
        .into_iter()
        .map(bind_rank)
        .collect()
}

/// Byte `i` of what rank `from` sends to rank `to` in transfer `k`.
fn byte(from: usize, to: usize, k: usize, i: usize) -> u8 {
    (from * 41 + to * 13 + k * 7 + i * 3 + i / 251) as u8
}

/// One transfer of a test group: (peer, is_send, dtype, count) and where
/// it lies in the rank's send or receive buffer (byte offset).
#[derive(Clone, Copy, Debug)]
struct Planned {
    peer: usize,
    is_send: bool,
    dtype: DataType,
    count: usize,
    at: usize,
}

/// Runs `plan(rank)` on every rank: uploads every send's bytes, runs the
/// group on the rank's stream, downloads the receive buffer and checks
/// every receive's bytes (the k-th receive from a peer holds the peer's
/// k-th send to this rank).
fn run_groups(ranks: &[Rank], plan: &(dyn Fn(usize) -> Vec<Planned> + Sync)) {
    std::thread::scope(|s| {
        for r in ranks {
            s.spawn(move || {
                let me = r.comm.rank();
                let mine = plan(me);
                // The k-th send from `from` to `to`.
                let nth = |transfers: &[Planned], peer: usize, is_send: bool, j: usize| {
                    transfers[..j]
                        .iter()
                        .filter(|t| t.peer == peer && t.is_send == is_send)
                        .count()
                };
                let end = |is_send: bool| {
                    mine.iter()
                        .filter(|t| t.is_send == is_send)
                        .map(|t| t.at + t.count * t.dtype.size())
                        .max()
                        .unwrap_or(0)
                };
                let mut out = vec![0u8; end(true)];
                for (j, t) in mine.iter().enumerate().filter(|(_, t)| t.is_send) {
                    let k = nth(&mine, t.peer, true, j);
                    for i in 0..t.count * t.dtype.size() {
                        out[t.at + i] = byte(me, t.peer, k, i);
                    }
                }
                let fill = vec![0xeeu8; end(false)];
                let transfers: Vec<DeviceTransfer> = mine
                    .iter()
                    .map(|t| {
                        let buf = if t.is_send { &r.send } else { &r.recv };
                        DeviceTransfer {
                            peer: t.peer,
                            is_send: t.is_send,
                            ptr: buf.ptr().add(t.at),
                            count: t.count,
                            dtype: t.dtype,
                        }
                    })
                    .collect();
                let mut got = vec![0u8; fill.len()];
                // SAFETY: the host vectors outlive the synchronisation
                // below; the device ranges are the rank's case buffers.
                unsafe {
                    r.dev
                        .copy_h2d_async(r.send.ptr(), out.as_ptr(), out.len(), r.stream)
                        .unwrap();
                    r.dev
                        .copy_h2d_async(r.recv.ptr(), fill.as_ptr(), fill.len(), r.stream)
                        .unwrap();
                }
                // SAFETY: the buffers live until after `wait`.
                let work = unsafe { r.comm.send_recv_device_raw(&transfers, r.stream) }
                    .unwrap_or_else(|e| panic!("rank {me}: enqueue: {e}"));
                // SAFETY: as above.
                unsafe {
                    r.dev
                        .copy_d2h_async(got.as_mut_ptr(), r.recv.ptr(), got.len(), r.stream)
                        .unwrap();
                }
                let deadline = Instant::now() + Duration::from_secs(60);
                r.dev.synchronize(r.stream, deadline).unwrap();
                work.wait()
                    .unwrap_or_else(|e| panic!("rank {me}: group: {e}"));
                for (j, t) in mine.iter().enumerate().filter(|(_, t)| !t.is_send) {
                    let k = nth(&mine, t.peer, false, j);
                    for i in 0..t.count * t.dtype.size() {
                        let want = byte(t.peer, me, k, i);
                        assert_eq!(
                            got[t.at + i],
                            want,
                            "rank {me}: byte {i} of receive {j} ({k}th from {}, {t:?})",
                            t.peer
                        );
                    }
                }
            });
        }
    });
}

/// Lays the transfers out one after the other in their buffers (256-byte
/// aligned, plus `skew` bytes to test unaligned device addresses).
fn laid_out(transfers: &[(usize, bool, DataType, usize)], skew: usize) -> Vec<Planned> {
    let (mut send_at, mut recv_at) = (skew, skew);
    transfers
        .iter()
        .map(|&(peer, is_send, dtype, count)| {
            let at = if is_send { &mut send_at } else { &mut recv_at };
            let t = Planned {
                peer,
                is_send,
                dtype,
                count,
                at: *at,
            };
            *at += (count * dtype.size()).div_ceil(256) * 256 + skew;
            t
        })
        .collect()
}

/// Ring shifts at sizes from nothing to many times the 64 KiB staging
/// (segments), on 2, 3 and 4 ranks, from aligned and unaligned addresses.
#[test]
fn ring_shifts_of_every_size() {
    for n in [2, 3, 4] {
        let ranks = ranks(n, 64 << 10);
        for count in [0usize, 1, 1001, 16_384, 100_003] {
            for skew in [0, 4] {
                let plan = move |r: usize| {
                    laid_out(
                        &[
                            ((r + 1) % n, true, DataType::Float32, count),
                            ((r + n - 1) % n, false, DataType::Float32, count),
                        ],
                        skew,
                    )
                };
                run_groups(&ranks, &plan);
            }
        }
        let stats = ranks[0].comm.stats();
        let groups = stats
            .ops_by_collective
            .iter()
            .find(|(name, _)| name == "sendrecv")
            .map_or(0, |(_, ops)| *ops);
        assert_eq!(groups, 10, "n={n}: {:?}", stats.ops_by_collective);
    }
}

/// Ring shifts and a group with two transfers each way between every pair
/// over TCP (device data staged through pinned host memory in 4 KiB
/// pieces), 3 ranks, up to many segments of the 64 KiB staging.
#[test]
fn groups_over_tcp() {
    let n = 3;
    let ranks = ranks_over(n, 64 << 10, TransportChoice::Tcp);
    for count in [0usize, 1001, 100_003] {
        let plan = move |r: usize| {
            laid_out(
                &[
                    ((r + 1) % n, true, DataType::Float32, count),
                    ((r + n - 1) % n, false, DataType::Float32, count),
                ],
                4,
            )
        };
        run_groups(&ranks, &plan);
    }
    let plan = move |r: usize| {
        let mut t = Vec::new();
        for p in (0..n).filter(|&p| p != r) {
            t.push((p, true, DataType::Int64, 3000 + 1000 * r));
            t.push((p, false, DataType::Int64, 3000 + 1000 * p));
            t.push((p, true, DataType::Uint8, 70_001));
            t.push((p, false, DataType::Uint8, 70_001));
        }
        laid_out(&t, 0)
    };
    run_groups(&ranks, &plan);
}

/// An all-to-all as sends and receives, with a copy to self, several
/// transfers to one peer of different types (one empty), and blocks of
/// unequal sizes per pair; 3 ranks through 64 KiB of staging (up to
/// 91,000 bytes per transfer: several segments).
#[test]
fn all_to_all_groups_with_copies_to_self_and_mixed_types() {
    let n = 3;
    let ranks = ranks(n, 64 << 10);
    // Bytes rank `a` sends rank `b` in its first transfer to it.
    let size = |a: usize, b: usize| 1000 + 30_000 * ((a + 2 * b) % 4);
    let plan = move |r: usize| {
        let mut t = Vec::new();
        for p in 0..n {
            t.push((p, true, DataType::Uint8, size(r, p)));
            t.push((p, true, DataType::Float16, 0));
            t.push((p, true, DataType::Float64, 777));
        }
        for p in (0..n).rev() {
            t.push((p, false, DataType::Int8, size(p, r)));
            t.push((p, false, DataType::Bfloat16, 0));
            // The same bytes as the peer's f64 send, as u32.
            t.push((p, false, DataType::Uint32, 777 * 2));
        }
        laid_out(&t, 0)
    };
    run_groups(&ranks, &plan);
}

fn assert_invalid<T>(r: sncl::Result<T>, needle: &str) {
    match r {
        Err(Error::InvalidArgument { op, detail, .. }) => {
            assert!(detail.contains(needle), "{op}: {detail:?} lacks {needle:?}");
        }
        Err(other) => panic!("want InvalidArgument, got {other:?}"),
        Ok(_) => panic!("want InvalidArgument ({needle}), got a queued group"),
    }
}

/// Bad groups are refused before anything is queued; sizes that do not
/// match fail on both ranks within the timeout; the communicator's other
/// ranks are not left waiting.
#[test]
fn bad_groups_are_errors_not_hangs() {
    let ranks = ranks(2, 64 << 10);
    let r0 = &ranks[0];
    let f32s = DataType::Float32;
    let one = |t: DeviceTransfer| {
        // SAFETY: refused before anything is queued (or, for a valid one,
        // the buffers are the rank's case buffers, alive throughout).
        unsafe { r0.comm.send_recv_device_raw(&[t], r0.stream) }
    };
    assert_invalid(
        one(DeviceTransfer::send(r0.send.ptr(), 4, f32s, 0)),
        "receive(s) from itself",
    );
    assert_invalid(one(DeviceTransfer::send(DevicePtr(0), 4, f32s, 1)), "NULL");
    let host = [0f32; 16];
    assert_invalid(
        one(DeviceTransfer::send(
            DevicePtr(host.as_ptr() as u64),
            16,
            f32s,
            1,
        )),
        "transfer 0",
    );
    assert_invalid(
        one(DeviceTransfer::recv(r0.recv.ptr(), 4, f32s, 2)),
        "out of range",
    );
    // 100 floats against 99: both ranks fail, naming the other.
    let started = Instant::now();
    let outcomes: Vec<sncl::Result<()>> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .map(|r| {
                s.spawn(move || {
                    let me = r.comm.rank();
                    let count = if me == 0 { 100 } else { 99 };
                    let peer = 1 - me;
                    let t = [
                        DeviceTransfer::send(r.send.ptr(), count, f32s, peer),
                        DeviceTransfer::recv(r.recv.ptr(), count, f32s, peer),
                    ];
                    // SAFETY: the case buffers outlive `wait`.
                    let w = unsafe { r.comm.send_recv_device_raw(&t, r.stream) }?;
                    let r2 = w.wait();
                    let _ = r
                        .dev
                        .synchronize(r.stream, Instant::now() + Duration::from_secs(40));
                    r2
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("no panic"))
            .collect()
    });
    let texts: Vec<String> = outcomes
        .iter()
        .map(|o| o.as_ref().expect_err("mismatched sizes fail").to_string())
        .collect();
    assert!(
        texts.iter().any(|t| t.contains("bytes")),
        "one rank names the sizes: {texts:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(35),
        "failed within the timeout: {:?}",
        started.elapsed()
    );
}

/// The typed API: `Communicator::group` takes device views as it takes
/// host slices (a ring shift of f64 and a copy to self, checked), and
/// refuses a group that mixes host and device buffers or streams.
#[test]
fn typed_groups_take_device_views() {
    let ranks = ranks(3, 64 << 10);
    let n = ranks.len();
    std::thread::scope(|s| {
        for r in &ranks {
            s.spawn(move || {
                let me = r.comm.rank();
                let count = 50_001;
                let mine: Vec<f64> = (0..count).map(|i| (me * 1_000_000 + i) as f64).collect();
                let bytes = count * 8;
                // SAFETY: the host vector outlives the synchronisation.
                unsafe {
                    r.dev
                        .copy_h2d_async(r.send.ptr(), mine.as_ptr() as *const u8, bytes, r.stream)
                        .unwrap();
                }
                let send = DeviceSlice::<f64>::new(&r.send, r.stream);
                // SAFETY: the receive buffer is the rank's own, used only on
                // its stream here; the views live within this scope.
                let (ring, to_self) = unsafe {
                    (
                        DeviceSliceMut::<f64>::from_raw(
                            r.dev.clone(),
                            r.recv.ptr(),
                            count,
                            r.stream,
                        ),
                        DeviceSliceMut::<f64>::from_raw(
                            r.dev.clone(),
                            r.recv.ptr().add(bytes),
                            count,
                            r.stream,
                        ),
                    )
                };
                r.comm
                    .group(|g| {
                        g.send(send.slice(0..count), (me + 1) % n);
                        g.send(send.slice(0..count), me);
                        g.recv(ring, (me + n - 1) % n);
                        g.recv(to_self, me);
                    })
                    .unwrap_or_else(|e| panic!("rank {me}: {e}"));
                let mut got = vec![0f64; 2 * count];
                // SAFETY: `got` outlives the synchronisation.
                unsafe {
                    r.dev
                        .copy_d2h_async(
                            got.as_mut_ptr() as *mut u8,
                            r.recv.ptr(),
                            2 * bytes,
                            r.stream,
                        )
                        .unwrap();
                }
                r.dev
                    .synchronize(r.stream, Instant::now() + Duration::from_secs(30))
                    .unwrap();
                let left = (me + n - 1) % n;
                for i in 0..count {
                    assert_eq!(
                        got[i],
                        (left * 1_000_000 + i) as f64,
                        "rank {me} ring [{i}]"
                    );
                    assert_eq!(got[count + i], mine[i], "rank {me} self [{i}]");
                }
            });
        }
    });
    let r = &ranks[0];
    let host = vec![0f32; 8];
    let mixed = r.comm.group(|g| {
        g.send(DeviceSlice::<f32>::new(&r.send, r.stream), 1);
        g.send(&host, 2);
    });
    assert_invalid(mixed, "mixed");
    let other = r.dev.create_stream().expect("stream");
    let streams = r.comm.group(|g| {
        g.send(DeviceSlice::<f32>::new(&r.send, r.stream), 1);
        g.send(DeviceSlice::<f32>::new(&r.send, other), 2);
    });
    assert_invalid(streams, "one stream");
}

/// all_gatherv and alltoallv on device views (the typed calls, as on host
/// slices): uneven blocks, empty ones, gaps between them, 3 ranks through
/// 64 KiB of staging; an alltoallv whose buffers overlap is refused.
#[test]
fn variable_count_collectives_on_device_views() {
    let ranks = ranks(3, 64 << 10);
    let n = ranks.len();
    let value = |r: usize, i: usize| (r * 100_000 + i) as i32;
    std::thread::scope(|s| {
        for r in &ranks {
            s.spawn(move || {
                let me = r.comm.rank();
                let sync = || {
                    r.dev
                        .synchronize(r.stream, Instant::now() + Duration::from_secs(30))
                        .unwrap()
                };
                // all_gatherv: rank q sends 7000 * q + 5 elements; blocks
                // land 11 elements apart.
                let counts: Vec<usize> = (0..n).map(|q| 7000 * q + 5).collect();
                let displs: Vec<usize> = counts
                    .iter()
                    .scan(0, |at, c| {
                        let d = *at + 11;
                        *at = d + c;
                        Some(d)
                    })
                    .collect();
                let total = displs[n - 1] + counts[n - 1];
                let mine: Vec<i32> = (0..counts[me]).map(|i| value(me, i)).collect();
                // SAFETY: `mine` outlives the synchronisation.
                unsafe {
                    r.dev
                        .copy_h2d_async(
                            r.send.ptr(),
                            mine.as_ptr().cast(),
                            mine.len() * 4,
                            r.stream,
                        )
                        .unwrap();
                }
                let send = DeviceSlice::<i32>::new(&r.send, r.stream).slice(0..counts[me]);
                // SAFETY: the rank's own receive buffer, on its stream only.
                let recv = unsafe {
                    DeviceSliceMut::<i32>::from_raw(r.dev.clone(), r.recv.ptr(), total, r.stream)
                };
                r.comm
                    .all_gatherv(send, recv, &counts, &displs)
                    .unwrap_or_else(|e| panic!("rank {me}: all_gatherv: {e}"));
                let mut got = vec![0i32; total];
                // SAFETY: `got` outlives the synchronisation.
                unsafe {
                    r.dev
                        .copy_d2h_async(got.as_mut_ptr().cast(), r.recv.ptr(), total * 4, r.stream)
                        .unwrap();
                }
                sync();
                for q in 0..n {
                    for i in 0..counts[q] {
                        assert_eq!(
                            got[displs[q] + i],
                            value(q, i),
                            "rank {me} gatherv {q} [{i}]"
                        );
                    }
                }
                // alltoallv: rank a sends rank b (a + 2b) % 3 * 9000 elements.
                let size = |a: usize, b: usize| (a + 2 * b) % 3 * 9000;
                let sc: Vec<usize> = (0..n).map(|q| size(me, q)).collect();
                let rc: Vec<usize> = (0..n).map(|q| size(q, me)).collect();
                let offsets = |c: &[usize]| -> Vec<usize> {
                    c.iter()
                        .scan(0, |at, c| {
                            let d = *at;
                            *at += c;
                            Some(d)
                        })
                        .collect()
                };
                let (sd, rd) = (offsets(&sc), offsets(&rc));
                let (st, rt) = (sc.iter().sum::<usize>(), rc.iter().sum::<usize>());
                let out: Vec<i32> = (0..st).map(|i| value(me, i)).collect();
                // SAFETY: `out` outlives the synchronisation.
                unsafe {
                    r.dev
                        .copy_h2d_async(r.send.ptr(), out.as_ptr().cast(), st * 4, r.stream)
                        .unwrap();
                }
                let send = DeviceSlice::<i32>::new(&r.send, r.stream).slice(0..st.max(1));
                // SAFETY: as above.
                let recv = unsafe {
                    DeviceSliceMut::<i32>::from_raw(
                        r.dev.clone(),
                        r.recv.ptr(),
                        rt.max(1),
                        r.stream,
                    )
                };
                r.comm
                    .alltoallv(send, &sc, &sd, recv, &rc, &rd)
                    .unwrap_or_else(|e| panic!("rank {me}: alltoallv: {e}"));
                let mut got = vec![0i32; rt];
                // SAFETY: as above.
                unsafe {
                    r.dev
                        .copy_d2h_async(got.as_mut_ptr().cast(), r.recv.ptr(), rt * 4, r.stream)
                        .unwrap();
                }
                sync();
                for q in 0..n {
                    // Rank q's block for this rank starts at its send
                    // displacement for this rank.
                    let their_sd: usize = (0..me).map(|b| size(q, b)).sum();
                    for i in 0..rc[q] {
                        assert_eq!(
                            got[rd[q] + i],
                            value(q, their_sd + i),
                            "rank {me} alltoallv {q} [{i}]"
                        );
                    }
                }
            });
        }
    });
    let r = &ranks[0];
    let v = sncl::VCounts {
        send_counts: vec![100; 3],
        send_displs: vec![0, 100, 200],
        recv_counts: vec![100; 3],
        recv_displs: vec![0, 100, 200],
    };
    let buffers = (r.recv.ptr(), r.recv.ptr().add(400));
    // SAFETY: refused before anything is queued.
    let overlapping = unsafe {
        r.comm.enqueue_device_v(
            (sncl::Collective::AllToAllV, DataType::Float32),
            buffers,
            v,
            r.stream,
        )
    };
    assert_invalid(overlapping, "overlap");
}

/// A device fault on rank 1 in the middle of ring shifts: every rank's
/// group fails within the timeout naming rank 1 (its direct peers by the
/// fault, the others by the abort), no rank hangs, and every caller's
/// stream is released (it synchronises).
#[test]
fn a_device_fault_fails_the_group_on_every_rank() {
    if device_kit::test_backend() != device::Backend::Emu {
        eprintln!(
            "skipped: faults are injected through the emulated device only (the cuda backend \
             answers inject_fault with Unsupported)"
        );
        return;
    }
    let ranks = ranks(3, 64 << 10);
    let n = ranks.len();
    let started = Instant::now();
    let outcomes: Vec<Result<(), String>> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .map(|r| {
                s.spawn(move || -> Result<(), String> {
                    let me = r.comm.rank();
                    let ring = [
                        DeviceTransfer::send(
                            r.send.ptr(),
                            100_000,
                            DataType::Float32,
                            (me + 1) % n,
                        ),
                        DeviceTransfer::recv(
                            r.recv.ptr(),
                            100_000,
                            DataType::Float32,
                            (me + n - 1) % n,
                        ),
                    ];
                    for round in 0..4 {
                        if round == 2 && me == 1 {
                            r.dev
                                .inject_fault("injected by the test")
                                .map_err(|e| e.to_string())?;
                        }
                        // SAFETY: the case buffers outlive the wait.
                        let w = unsafe { r.comm.send_recv_device_raw(&ring, r.stream) }
                            .map_err(|e| format!("round {round}: {e}"))?;
                        w.wait().map_err(|e| format!("round {round}: {e}"))?;
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("no panic"))
            .collect()
    });
    for (rank, o) in outcomes.iter().enumerate() {
        let e = o.as_ref().expect_err("every rank fails");
        assert!(
            e.contains("round 2"),
            "rank {rank} failed in the faulted round: {e}"
        );
        assert!(
            e.contains("rank 1"),
            "rank {rank}'s error names rank 1: {e}"
        );
        if rank == 1 {
            assert!(
                e.contains("injected by the test"),
                "rank 1 names the fault: {e}"
            );
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "failed within the timeout: {:?}",
        started.elapsed()
    );
    // The healthy ranks' streams were released: they synchronise.
    for r in [&ranks[0], &ranks[2]] {
        r.dev
            .synchronize(r.stream, Instant::now() + Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("rank {}: the stream stayed parked: {e}", r.comm.rank()));
    }
}
