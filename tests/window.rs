//! Windows (`Communicator::alloc_window`): all-reduces over window memory
//! run directly (each rank reads its peers' inputs in shared memory) and
//! give the same results as the usual path; anything the ranks do not all
//! agree on takes the usual path; bad sizes are clear errors.

mod rank_kit;

use std::time::{Duration, Instant};

use half::bf16;
use rank_kit::{is_child, spawn_job};
use sncl::{Communicator, Config, ReduceOp};

fn comms(n: usize) -> Vec<Communicator> {
    let cfg = Config {
        timeout: Duration::from_secs(30),
        ..Config::default()
    };
    Communicator::init_threads(n, cfg).expect("init_threads")
}

fn on_ranks<R: Send>(comms: &[Communicator], f: impl Fn(&Communicator) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(|| f(c))).collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank panicked"))
            .collect()
    })
}

/// Rank r's input element i (exact in f32 sums of up to 4 ranks).
fn input(r: usize, i: usize) -> f32 {
    ((i * 7 + r * 13) % 1000) as f32 * 0.25 - 100.0
}

fn window_bytes(c: &Communicator) -> u64 {
    c.stats()
        .by_transport
        .iter()
        .find(|(k, _, _)| k == "window")
        .map_or(0, |t| t.1)
}

#[test]
fn direct_all_reduce_matches_the_usual_path_out_of_place_and_in_place() {
    for n in [2, 3, 4] {
        let cs = comms(n);
        // Odd counts: slices that end mid cache line, and one short of
        // the direct threshold (usual path).
        for count in [65_536 + 7, 200_003, 65_535] {
            let got = on_ranks(&cs, |c| {
                let r = c.rank();
                let mut w = c.alloc_window::<f32>(2 * count).unwrap();
                for i in 0..count {
                    w[i] = input(r, i);
                }
                let before = window_bytes(c);
                {
                    let (send, recv) = w.split_at_mut(count);
                    c.all_reduce(send, recv, ReduceOp::Sum).unwrap();
                }
                let out_of_place = w[count..].to_vec();
                let direct = window_bytes(c) > before;
                // In place, on the first half.
                c.all_reduce_in_place(&mut w[..count], ReduceOp::Sum)
                    .unwrap();
                let in_place = w[..count].to_vec();
                // The same through plain memory.
                let plain: Vec<f32> = (0..count).map(|i| input(r, i)).collect();
                let mut usual = vec![0f32; count];
                c.all_reduce(&plain, &mut usual, ReduceOp::Sum).unwrap();
                (out_of_place, in_place, usual, direct)
            });
            for (r, (oop, inp, usual, direct)) in got.iter().enumerate() {
                let big = count * 4 >= 256 * 1024;
                assert_eq!(
                    *direct, big,
                    "n={n} count={count} rank {r}: direct path used?"
                );
                for i in 0..count {
                    let want: f32 = (0..n).map(|q| input(q, i)).sum();
                    assert_eq!(
                        oop[i], want,
                        "n={n} count={count} rank {r} out of place [{i}]"
                    );
                    assert_eq!(inp[i], want, "n={n} count={count} rank {r} in place [{i}]");
                    assert_eq!(usual[i], want, "n={n} count={count} rank {r} usual [{i}]");
                }
            }
        }
    }
}

#[test]
fn direct_all_reduce_covers_ops_and_types() {
    let n = 3;
    let cs = comms(n);
    let count = 200_001;
    for op in [ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod, ReduceOp::Avg] {
        let got = on_ranks(&cs, |c| {
            let r = c.rank();
            let mut w = c.alloc_window::<bf16>(2 * count).unwrap();
            for i in 0..count {
                w[i] = bf16::from_f32(((i + r) % 5) as f32 + 1.0);
            }
            let before = window_bytes(c);
            let (send, recv) = w.split_at_mut(count);
            c.all_reduce(send, &mut *recv, op).unwrap();
            assert!(window_bytes(c) > before, "{op:?}: the direct path ran");
            let plain: Vec<bf16> = (0..count)
                .map(|i| bf16::from_f32(((i + r) % 5) as f32 + 1.0))
                .collect();
            let mut usual = vec![bf16::ZERO; count];
            c.all_reduce(&plain, &mut usual, op).unwrap();
            (recv.to_vec(), usual)
        });
        for (r, (direct, usual)) in got.iter().enumerate() {
            assert_eq!(direct, usual, "{op:?} rank {r}: direct vs usual path");
        }
    }
}

#[test]
fn buffers_outside_windows_or_at_different_offsets_take_the_usual_path() {
    let n = 2;
    let cs = comms(n);
    let count = 131_072;
    let got = on_ranks(&cs, |c| {
        let r = c.rank();
        let mut w = c.alloc_window::<f32>(3 * count).unwrap();
        for i in 0..count {
            w[i] = input(r, i);
            w[count + i] = input(r, i);
        }
        let before = window_bytes(c);
        // Rank 1 passes its input at another offset: not symmetric.
        let (a, b) = w.split_at_mut(2 * count);
        let send = if r == 0 { &a[..count] } else { &a[count..] };
        c.all_reduce(send, &mut b[..count], ReduceOp::Sum).unwrap();
        let asym = (b[..count].to_vec(), window_bytes(c) > before);
        // Only rank 0 in a window.
        let plain: Vec<f32> = (0..count).map(|i| input(r, i)).collect();
        let mut out = vec![0f32; count];
        if r == 0 {
            c.all_reduce(&a[..count], &mut out, ReduceOp::Sum).unwrap();
        } else {
            c.all_reduce(&plain, &mut out, ReduceOp::Sum).unwrap();
        }
        (asym, out, window_bytes(c) > before)
    });
    for (r, ((asym, asym_direct), mixed, any_direct)) in got.iter().enumerate() {
        assert!(
            !asym_direct && !any_direct,
            "rank {r}: no direct path expected"
        );
        for i in 0..count {
            let want = input(0, i) + input(1, i);
            assert_eq!(asym[i], want, "rank {r} asymmetric [{i}]");
            assert_eq!(mixed[i], want, "rank {r} mixed [{i}]");
        }
    }
}

#[test]
fn other_collectives_still_work_and_mismatches_still_fail() {
    let n = 2;
    let cs = comms(n);
    let got = on_ranks(&cs, |c| {
        let r = c.rank();
        let _w = c.alloc_window::<f32>(1024).unwrap();
        let mut g = vec![0f32; 2 * 300_000];
        c.all_gather(&vec![r as f32; 300_000], &mut g).unwrap();
        c.barrier().unwrap();
        g
    });
    for g in &got {
        assert!(g[..300_000].iter().all(|&x| x == 0.0) && g[300_000..].iter().all(|&x| x == 1.0));
    }
    // Ranks that disagree on the collective: still an error on both, not
    // a hang (the offers differ, so the usual path reports the mismatch).
    let cs = comms(2);
    let got = on_ranks(&cs, |c| {
        let _w = c.alloc_window::<f32>(1024).unwrap();
        let mut v = vec![1f32; 1000];
        if c.rank() == 0 {
            c.all_reduce_in_place(&mut v, ReduceOp::Sum).map(|_| ())
        } else {
            c.broadcast(&mut v, 0)
        }
    });
    for (r, res) in got.iter().enumerate() {
        let e = res.as_ref().expect_err("mismatched collectives must fail");
        assert!(
            e.to_string().contains("mismatch") || e.to_string().contains("aborted"),
            "rank {r}: {e}"
        );
    }
}

#[test]
fn window_sizes_must_agree() {
    let cs = comms(2);
    let got = on_ranks(&cs, |c| c.alloc_window::<f32>(1000 + c.rank()).map(|_| ()));
    // Every rank fails; the one that saw the other's region names the cause
    // (the other may find the region already removed).
    assert!(
        got.iter().all(|r| r.is_err()),
        "different sizes must fail on every rank"
    );
    assert!(
        got.iter().any(|r| r
            .as_ref()
            .is_err_and(|e| e.to_string().contains("same length"))),
        "{got:?}"
    );
    let cs = comms(1);
    assert!(cs[0].alloc_window::<f32>(0).is_err());
    let mut w = cs[0].alloc_window::<u8>(10).unwrap();
    w[9] = 1;
    assert_eq!(w.len(), 10);
}

/// Child side: direct all-reduces over windows in a loop until an error
/// (exit 2, printing it) or 60 s.
#[test]
#[ignore = "a child process's entry point, run by its parent test"]
fn child_window_loop() {
    if !is_child() {
        return;
    }
    let c = Communicator::from_env().unwrap_or_else(|e| panic!("init failed: {e}"));
    let r = c.rank();
    let count = 1 << 17;
    let mut w = c.alloc_window::<f32>(2 * count).unwrap();
    w[..count].fill(1.0);
    let start = Instant::now();
    let mut i = 0u64;
    while start.elapsed() < Duration::from_secs(60) {
        let (send, recv) = w.split_at_mut(count);
        if let Err(e) = c.all_reduce(send, &mut *recv, ReduceOp::Sum) {
            eprintln!("SNCL-ERROR rank {r} after {i} operations: {e}");
            std::process::exit(2);
        }
        assert!(
            recv.iter().all(|&x| x == c.size() as f32),
            "rank {r}: wrong sum"
        );
        i += 1;
        if i == 1 {
            let s = c.stats();
            eprintln!("READY rank {r} window bytes {}", window_bytes(&c));
            assert!(s.by_transport.iter().any(|t| t.0 == "window"), "{s:?}");
        }
    }
    eprintln!("NO-ERROR rank {r} after {i} operations");
}

#[test]
fn processes_run_direct_and_a_killed_peer_is_named() {
    if is_child() {
        return;
    }
    let env = [("SNCL_TIMEOUT_MS", "5000".to_string())];
    let mut ranks = spawn_job("child_window_loop", 3, &env);
    let ready = Instant::now() + Duration::from_secs(30);
    for r in ranks.iter_mut() {
        assert!(
            r.wait_line("READY", ready),
            "rank {} never got going:\n{}",
            r.rank,
            r.output.lock().unwrap()
        );
    }
    std::thread::sleep(Duration::from_millis(100));
    ranks[1].child.kill().expect("SIGKILL");
    let killed = Instant::now();
    // Reap it: a zombie still answers kill(pid, 0) as alive.
    let _ = ranks[1].child.wait();
    for r in ranks.iter_mut().filter(|r| r.rank != 1) {
        let deadline = killed + Duration::from_secs(7);
        let reported = r.wait_line("SNCL-ERROR", deadline);
        while !r.poll() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let text = r.output.lock().unwrap().clone();
        let Some((status, _)) = r.exit else {
            let _ = r.child.kill();
            panic!(
                "rank {}: still running 7 s after rank 1 was killed:\n{text}",
                r.rank
            );
        };
        assert!(
            reported && status.code() == Some(2),
            "rank {}: {status}\n{text}",
            r.rank
        );
        let line = text
            .lines()
            .find(|l| l.contains("SNCL-ERROR"))
            .unwrap_or(&text);
        assert!(
            line.contains("rank 1"),
            "rank {}: the error names rank 1: {line}",
            r.rank
        );
        eprintln!(
            "rank {} failed {:?} after the kill: {line}",
            r.rank,
            killed.elapsed()
        );
    }
}

#[test]
fn a_rank_with_nothing_to_exchange_still_offers() {
    // alltoallv where rank 1 sends and receives nothing: its schedule is
    // empty, yet ranks 0 and 2 wait for every rank's offer. Rank 1 then
    // sends a point-to-point message (sequence 0, no offer) to rank 0,
    // which receives it after its alltoallv: without rank 1's offer both
    // would wait until the deadline.
    let n = 3;
    let cs = comms(n);
    let start = Instant::now();
    let got = on_ranks(&cs, |c| {
        let r = c.rank();
        let _w = c.alloc_window::<f32>(1024).unwrap();
        let count = |a: usize, b: usize| if a == 1 || b == 1 { 0 } else { 1000 };
        let send_counts: Vec<usize> = (0..n).map(|p| count(r, p)).collect();
        let recv_counts: Vec<usize> = (0..n).map(|p| count(p, r)).collect();
        let displs = |v: &[usize]| {
            v.iter()
                .scan(0, |a, &x| {
                    let d = *a;
                    *a += x;
                    Some(d)
                })
                .collect::<Vec<_>>()
        };
        let (sd, rd) = (displs(&send_counts), displs(&recv_counts));
        let send = vec![r as f32; send_counts.iter().sum()];
        let mut recv = vec![0f32; recv_counts.iter().sum()];
        c.alltoallv(&send, &send_counts, &sd, &mut recv, &recv_counts, &rd)
            .unwrap();
        match r {
            1 => c.send(&[7f32; 16], 0).unwrap(),
            0 => {
                let mut m = [0f32; 16];
                c.recv(&mut m, 1).unwrap();
                assert_eq!(m, [7f32; 16]);
            }
            _ => {}
        }
        recv
    });
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "took {:?}",
        start.elapsed()
    );
    // Ranks 0 and 2 receive 1000 elements from rank 0, then 1000 from rank 2.
    for r in [0, 2] {
        assert_eq!(got[r].len(), 2000, "rank {r}");
        assert!(got[r][..1000].iter().all(|&x| x == 0.0), "rank {r}");
        assert!(got[r][1000..].iter().all(|&x| x == 2.0), "rank {r}");
    }
    assert!(got[1].is_empty());
}
