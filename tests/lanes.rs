//! The smallest all-reduces over lanes (src/comm/lane.rs): they take the
//! lanes where every peer shares memory and nothing forces an algorithm,
//! agree bit for bit, interleave with every other collective (a rank may
//! run ahead into the next operation), and a mismatch — with another small
//! all-reduce or with an operation on the ordinary path — fails fast on
//! both ranks instead of waiting for the deadline.

mod rank_kit;

use std::time::Duration;

use comm_core::algo::Algorithm;
use rank_kit::*;
use sncl::{Collective, Config, Error, ReduceOp};

fn config(timeout_ms: u64) -> Config {
    Config {
        timeout: Duration::from_millis(timeout_ms),
        ..Config::default()
    }
}

#[test]
fn small_all_reduces_take_the_lanes_agree_and_interleave_with_other_collectives() {
    for n in [2, 3, 5] {
        let comms = init(n, config(20_000));
        let results = within(Duration::from_secs(120), "lanes", move || {
            timed_on_ranks(&comms, |r, c| -> Result<Vec<u64>, String> {
                let mut bits = Vec::new();
                for i in 0..400usize {
                    // f32 sums whose value depends on the fold order: every
                    // rank must still get the same bits.
                    let count = 1 + i % 8;
                    let mine: Vec<f32> = (0..count)
                        .map(|k| 1.0 / (1 + r * 7 + k + i) as f32)
                        .collect();
                    let mut out = vec![0f32; count];
                    c.all_reduce(&mine, &mut out, ReduceOp::Sum)
                        .map_err(|e| format!("rank {r} op {i}: {e}"))?;
                    if i == 0 && last_algorithm(c) != "one-shot" {
                        return Err(format!("rank {r}: took {}", last_algorithm(c)));
                    }
                    let want: f32 = (0..n).map(|q| 1.0 / (1 + q * 7 + i) as f32).sum();
                    if (out[0] - want).abs() > 1e-5 * want.abs() {
                        return Err(format!("rank {r} op {i}: {} != {want}", out[0]));
                    }
                    bits.extend(out.iter().map(|x| u64::from(x.to_bits())));
                    // Integers, max and average, in place.
                    let mut v = [r as i64 * 3 - 2, i as i64];
                    c.all_reduce_in_place(&mut v[..], ReduceOp::Max)
                        .map_err(|e| format!("rank {r} op {i} max: {e}"))?;
                    if v != [(n as i64 - 1) * 3 - 2, i as i64] {
                        return Err(format!("rank {r} op {i}: max {v:?}"));
                    }
                    let mut a = [(r * 2) as f64; 4];
                    c.all_reduce_in_place(&mut a[..], ReduceOp::Avg)
                        .map_err(|e| format!("rank {r} op {i} avg: {e}"))?;
                    if a[3] != (n - 1) as f64 {
                        return Err(format!("rank {r} op {i}: avg {a:?}"));
                    }
                    // Operations on the ordinary path in between; the root
                    // of a broadcast may run ahead into the next all-reduce.
                    if i % 5 == 0 {
                        let mut b = vec![r as u32; 3];
                        c.broadcast(&mut b, i % n)
                            .map_err(|e| format!("rank {r} op {i} broadcast: {e}"))?;
                        if b != vec![(i % n) as u32; 3] {
                            return Err(format!("rank {r} op {i}: broadcast {b:?}"));
                        }
                    }
                    if i % 7 == 0 {
                        let mut big = vec![1u8; 4096];
                        c.all_reduce_in_place(&mut big, ReduceOp::Sum)
                            .map_err(|e| format!("rank {r} op {i} 4 KiB: {e}"))?;
                        if big.iter().any(|&x| x != n as u8) {
                            return Err(format!("rank {r} op {i}: 4 KiB all-reduce wrong"));
                        }
                    }
                }
                Ok(bits)
            })
        });
        let mut all = Vec::new();
        for (res, _) in results {
            all.push(res.unwrap_or_else(|e| panic!("{n} ranks: {e}")));
        }
        assert!(
            all.windows(2).all(|w| w[0] == w[1]),
            "{n} ranks: the ranks' results differ in their bits"
        );
    }
}

#[test]
fn a_forced_algorithm_or_a_large_count_keeps_the_ordinary_path() {
    let comms = init(2, config(20_000));
    let algos = within(Duration::from_secs(60), "forced", move || {
        timed_on_ranks(&comms, |_, c| {
            let mut v = [1f32; 8];
            c.all_reduce_in_place(&mut v[..], ReduceOp::Sum).unwrap();
            let lanes = last_algorithm(c);
            let mut w = [1f32; 9];
            c.all_reduce_in_place(&mut w[..], ReduceOp::Sum).unwrap();
            let nine = last_algorithm(c);
            c.force_algorithm(Collective::AllReduce, Some("ring"))
                .unwrap();
            c.all_reduce_in_place(&mut v[..], ReduceOp::Sum).unwrap();
            let forced = last_algorithm(c);
            c.force_algorithm(Collective::AllReduce, None).unwrap();
            c.all_reduce_in_place(&mut v[..], ReduceOp::Sum).unwrap();
            assert_eq!(v, [8f32; 8]);
            (lanes, nine, forced, last_algorithm(c))
        })
    });
    for ((lanes, nine, forced, released), _) in algos {
        assert_eq!(lanes, "one-shot");
        assert_ne!(nine, "one-shot", "36 bytes is more than a lane carries");
        assert_eq!(forced, "ring");
        assert_eq!(released, "one-shot");
    }
    let forced_cfg = Config {
        algo: vec![(Collective::AllReduce, Algorithm::Rd)],
        ..config(20_000)
    };
    let comms = init(2, forced_cfg);
    for (algo, _) in timed_on_ranks(&comms, |_, c| {
        c.all_reduce_in_place(&mut [1u64; 2][..], ReduceOp::Sum)
            .unwrap();
        last_algorithm(c)
    }) {
        assert_eq!(algo, "rd");
    }
}

/// What each rank of a mismatched pair got, checked: an error on both
/// within `limit` (the timeout is 10 s), a `Mismatch` on at least one,
/// naming both sides where `names` are given.
fn assert_mismatch(what: &str, res: Vec<(sncl::Result<()>, Duration)>, names: [&str; 2]) {
    let limit = Duration::from_secs(4);
    let mut mismatches = 0;
    for (r, (res, took)) in res.iter().enumerate() {
        match res {
            Ok(()) => panic!("{what}: rank {r} succeeded"),
            Err(e) => {
                eprintln!("{what}: rank {r} after {took:?}: {e}");
                assert!(
                    *took < limit,
                    "{what}: rank {r} failed only after {took:?}: {e}"
                );
                if let Error::Mismatch { .. } = e {
                    mismatches += 1;
                    let m = e.to_string();
                    assert!(
                        names.iter().all(|n| m.contains(n)),
                        "{what}: rank {r} does not name {names:?}: {m}"
                    );
                }
            }
        }
    }
    assert!(mismatches > 0, "{what}: no rank reported a Mismatch");
}

#[test]
fn mismatched_small_all_reduces_fail_fast_naming_both() {
    let comms = init(2, config(10_000));
    let res = within(Duration::from_secs(30), "count", move || {
        timed_on_ranks(&comms, |r, c| {
            let mut v = vec![1f32; 2 + r];
            c.all_reduce_in_place(&mut v, ReduceOp::Sum)
        })
    });
    assert_mismatch("2 vs 3 floats", res, ["count=2", "count=3"]);
    let comms = init(2, config(10_000));
    let res = within(Duration::from_secs(30), "op", move || {
        timed_on_ranks(&comms, |r, c| {
            let op = if r == 0 { ReduceOp::Sum } else { ReduceOp::Max };
            c.all_reduce_in_place(&mut [1u8; 4][..], op)
        })
    });
    assert_mismatch("sum vs max", res, ["op=sum", "op=max"]);
}

#[test]
fn a_small_all_reduce_against_another_operation_fails_fast() {
    // Rank 0 in an all-reduce over lanes, rank 1 in a broadcast: as its
    // root (it sends a piece, which rank 0 sees) and as a receiver from
    // rank 0 (without the root check it only waits; it sees rank 0's lane
    // line; with it, it sends its root to rank 0 first).
    for (root, check_roots) in [(1, true), (0, true), (0, false)] {
        let cfg = Config {
            check_roots,
            ..config(10_000)
        };
        let comms = init(2, cfg);
        let res = within(Duration::from_secs(30), "against broadcast", move || {
            timed_on_ranks(&comms, |r, c| {
                let mut v = [1f32; 2];
                if r == 0 {
                    c.all_reduce_in_place(&mut v[..], ReduceOp::Sum)
                } else {
                    c.broadcast(&mut v[..], root)
                }
            })
        });
        assert_mismatch(
            &format!("all_reduce vs broadcast from {root} (root check {check_roots})"),
            res,
            ["all_reduce", "broadcast"],
        );
    }
}
