//! Per-call settings (`CollConfig`, issue 34 item 2): the call's algorithm
//! and chunk win over the planner's for that call only, the tag reaches the
//! flight recorder and the statistics, and settings that do not apply are
//! the same clear error on every rank before anything is sent.

use sncl::{Algorithm, CollConfig, Collective, Communicator, Config, Protocol, ReduceOp};

fn comms(n: usize) -> Vec<Communicator> {
    Communicator::init_threads(
        n,
        Config {
            chunk_bytes: 4096,
            ..Config::default()
        },
    )
    .unwrap()
}

/// The flight recorder's operations of `c` as (algo, tag), oldest first.
fn recorded(c: &Communicator) -> Vec<(String, u64)> {
    c.flight_recorder_json()
        .lines()
        .skip(1)
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["algo"].as_str().unwrap().to_string(),
                v["tag"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

fn expected_sum(n: usize, count: usize) -> Vec<f32> {
    (0..count)
        .map(|i| (0..n).map(|r| ((i + r) % 7) as f32).sum())
        .collect()
}

#[test]
fn the_calls_algorithm_and_tag_win_for_that_call_only() {
    let n = 4;
    let cs = comms(n);
    std::thread::scope(|s| {
        for c in &cs {
            s.spawn(move || {
                let r = c.rank();
                let count = 10_000;
                let send: Vec<f32> = (0..count).map(|i| ((i + r) % 7) as f32).collect();
                let want = expected_sum(n, count);
                let planner = c
                    .algorithm_for(Collective::AllReduce, sncl::DataType::Float32, count)
                    .unwrap();
                let calls = [
                    CollConfig {
                        algorithm: Some(Algorithm::Tree),
                        ..CollConfig::tagged(7)
                    },
                    CollConfig::default(),
                    CollConfig {
                        algorithm: Some(Algorithm::Rd),
                        chunk_bytes: 256,
                        ..CollConfig::tagged(9)
                    },
                    CollConfig {
                        algorithm: Some(Algorithm::Ring),
                        chunk_bytes: 512,
                        ..CollConfig::tagged(7)
                    },
                    // The planner's chunk-free choice again: the memo must
                    // not hand back the ring of the call before.
                    CollConfig::tagged(0),
                ];
                for cfg in &calls {
                    let mut recv = vec![0f32; count];
                    c.configured(cfg)
                        .all_reduce(&send, &mut recv, ReduceOp::Sum)
                        .unwrap();
                    assert_eq!(recv, want, "rank {r} {cfg:?}");
                }
                // Small enough for the lanes: a call naming its algorithm
                // runs that algorithm instead.
                let mut one = [r as f32];
                c.configured(&CollConfig {
                    algorithm: Some(Algorithm::Ring),
                    ..CollConfig::tagged(3)
                })
                .all_reduce_in_place(&mut one[..], ReduceOp::Sum)
                .unwrap();
                assert_eq!(one[0], (0..n).sum::<usize>() as f32);
                // Non-blocking calls carry their settings too.
                let mut out = vec![0f32; count * n];
                c.scope(|sc| {
                    let w = sc
                        .configured(&CollConfig {
                            algorithm: Some(Algorithm::FlatRing),
                            ..CollConfig::tagged(11)
                        })
                        .all_gather(&send, &mut out)
                        .unwrap();
                    w.wait().unwrap();
                });
                assert_eq!(&out[r * count..(r + 1) * count], &send[..]);

                let got = recorded(c);
                let want: Vec<(String, u64)> = [
                    ("tree", 7),
                    (planner, 0),
                    ("rd", 9),
                    ("ring", 7),
                    (planner, 0),
                    ("ring", 3),
                    ("flat-ring", 11),
                ]
                .iter()
                .map(|(a, t)| (a.to_string(), *t))
                .collect();
                assert_eq!(got, want, "rank {r}");
                let tags: Vec<(u64, u64)> = c
                    .stats()
                    .ops_by_tag
                    .iter()
                    .map(|(t, k, _)| (*t, *k))
                    .collect();
                assert_eq!(tags, [(3, 1), (7, 2), (9, 1), (11, 1)], "rank {r}");
            });
        }
    });
}

#[test]
fn settings_that_do_not_apply_fail_on_every_rank_before_anything_is_sent() {
    let n = 3;
    let cs = comms(n);
    let errors: Vec<Vec<String>> = std::thread::scope(|s| {
        let hs: Vec<_> = cs
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let r = c.rank();
                    let mut errs = Vec::new();
                    let data = vec![r as i32; 6];
                    let mut all = vec![0i32; 6 * n];
                    // gather has no tree.
                    let tree = CollConfig {
                        algorithm: Some(Algorithm::Tree),
                        ..CollConfig::default()
                    };
                    let e = c.configured(&tree).gather(&data, &mut all, 0).unwrap_err();
                    errs.push(e.to_string());
                    // A protocol on host memory.
                    let simple = CollConfig {
                        protocol: Some(Protocol::Simple),
                        ..CollConfig::default()
                    };
                    let mut buf = [1i32; 6];
                    let e = c
                        .configured(&simple)
                        .all_reduce_in_place(&mut buf[..], ReduceOp::Sum)
                        .unwrap_err();
                    errs.push(e.to_string());
                    // Nothing was sent: the communicator goes on alike.
                    c.all_gather(&data, &mut all).unwrap();
                    for q in 0..n {
                        assert!(all[q * 6..(q + 1) * 6].iter().all(|&x| x == q as i32));
                    }
                    errs
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, errs) in errors.iter().enumerate() {
        assert!(
            errs[0].contains(&format!("rank {r}")) && errs[0].contains("gather has no tree"),
            "{errs:?}"
        );
        assert!(errs[1].contains("host memory"), "{errs:?}");
        // The same error on every rank, but for the rank's number.
        let same = |e: &str| e.replace(&format!("rank {r}"), "rank R");
        assert_eq!(same(&errs[0]), errors[0][0].replace("rank 0", "rank R"));
    }
}

/// Ranks that pass different settings for the same call would run
/// different schedules: the settings' digest in the call's fingerprint
/// makes that a mismatch on every rank (within the timeout, not a hang or
/// wrong sums), and the communicator is aborted as for any mismatch.
#[test]
fn ranks_with_different_settings_for_one_call_fail_it_as_mismatched() {
    let n = 3;
    let timeout = std::time::Duration::from_secs(10);
    let cs = Communicator::init_threads(
        n,
        Config {
            chunk_bytes: 4096,
            timeout,
            ..Config::default()
        },
    )
    .unwrap();
    let start = std::time::Instant::now();
    let errors: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = cs
            .iter()
            .map(|c| {
                s.spawn(move || {
                    // Rank 2 alone pipelines in 1 KiB chunks.
                    let cfg = CollConfig {
                        algorithm: Some(Algorithm::Ring),
                        chunk_bytes: if c.rank() == 2 { 1024 } else { 512 },
                        ..CollConfig::default()
                    };
                    let mut buf = vec![1f32; 10_000];
                    c.configured(&cfg)
                        .all_reduce_in_place(&mut buf, ReduceOp::Sum)
                        .expect_err("different settings on rank 2")
                        .to_string()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(start.elapsed() < timeout, "took {:?}", start.elapsed());
    assert!(
        errors
            .iter()
            .any(|e| e.contains("mismatched collective") && e.contains("call settings #")),
        "{errors:#?}"
    );
}

#[test]
fn the_threads_named_tag_marks_calls_without_a_tag_of_their_own() {
    let n = 2;
    let cs = comms(n);
    let backward = sncl::tags::tag_of("backward/bucket 3");
    std::thread::scope(|s| {
        for c in &cs {
            s.spawn(move || {
                let mut v = vec![1f32; 64];
                let previous = sncl::tags::set_thread_tag(backward);
                c.all_reduce_in_place(&mut v[..], ReduceOp::Sum).unwrap();
                // A call's own tag wins; settings without one keep the thread's.
                c.configured(&CollConfig::tagged(5))
                    .all_reduce_in_place(&mut v[..], ReduceOp::Sum)
                    .unwrap();
                c.configured(&CollConfig {
                    algorithm: Some(Algorithm::Ring),
                    ..CollConfig::default()
                })
                .all_reduce_in_place(&mut v[..], ReduceOp::Sum)
                .unwrap();
                c.scope(|sc| {
                    let w = sc.all_reduce_in_place(&mut v[..], ReduceOp::Sum).unwrap();
                    w.wait().unwrap();
                });
                assert_eq!(sncl::tags::set_thread_tag(previous), backward);
                c.all_reduce_in_place(&mut v[..], ReduceOp::Sum).unwrap();
                assert!(v.iter().all(|&x| x == 32.0), "{:?}", &v[..4]);

                let tags: Vec<u64> = recorded(c).iter().map(|(_, t)| *t).collect();
                assert_eq!(
                    tags,
                    [backward, 5, backward, backward, 0],
                    "rank {}",
                    c.rank()
                );
                let names: Vec<Option<String>> = c
                    .flight_recorder_json()
                    .lines()
                    .skip(1)
                    .map(|l| {
                        let v: serde_json::Value = serde_json::from_str(l).unwrap();
                        v["tag_name"].as_str().map(str::to_string)
                    })
                    .collect();
                assert_eq!(names[0].as_deref(), Some("backward/bucket 3"));
                assert_eq!(names[4], None);
            });
        }
    });
}
