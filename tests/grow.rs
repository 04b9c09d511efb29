//! Growing a communicator (issue 34, item 1) with ranks as threads: the
//! members keep their ranks, new ranks join with rank 0's grow id, the
//! grown communicator reduces like a fresh one; and every bad grow (a
//! member's rank, another size, a wrong secret, one rank joined twice, a
//! grow that adds nobody) is a clear error, not a hang. The process test
//! (kill, shrink, grow, continue) is in tests/fault_tolerance.rs.

use std::time::{Duration, Instant};

use sncl::{Communicator, Config, ReduceOp, UniqueId};

fn config() -> Config {
    Config {
        timeout: Duration::from_secs(5),
        ..Config::default()
    }
}

/// `n` ranks as threads of one job, created through a unique id (a grow
/// needs the standby stores that a rendezvous starts).
fn job(n: usize) -> Vec<Communicator> {
    job_with(n, config())
}

/// As [`job`], every rank with `cfg`.
fn job_with(n: usize, cfg: Config) -> Vec<Communicator> {
    let id = Communicator::unique_id("127.0.0.1:0".parse().unwrap()).unwrap();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let cfg = cfg.clone();
                s.spawn(move || Communicator::init_rank_with_config(&id, r, n, cfg))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap().expect("init"))
            .collect()
    })
}

/// Rank `r`'s input: values whose sum depends on the order of additions
/// in f32, so equal results mean the same reduction order.
fn input(r: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|k| ((r * 7919 + k * 104_729) % 1000) as f32 * 0.001 + 1e-3 / (1 + r) as f32)
        .collect()
}

fn all_reduce(c: &Communicator, len: usize) -> Vec<f32> {
    let mut v = input(c.rank(), len);
    c.all_reduce_in_place(&mut v, ReduceOp::Sum)
        .unwrap_or_else(|e| panic!("rank {}: {e}", c.rank()));
    v
}

/// Grows `members` by one new rank (joining `joiner_delay` after the
/// members call `grow`, with `joiner_config`); every rank of the grown job
/// checks its place and returns its all-reduce of `len` elements.
fn grow_by_one(
    members: &[Communicator],
    len: usize,
    joiner_delay: Duration,
    joiner_config: Config,
) -> Vec<(usize, Vec<f32>)> {
    let id = members[0].grow_unique_id().unwrap();
    let n = members.len() + 1;
    std::thread::scope(|s| {
        let mut hs: Vec<_> = members
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let g = c
                        .grow(n)
                        .unwrap_or_else(|e| panic!("rank {}: grow: {e}", c.rank()));
                    assert_eq!((g.rank(), g.size()), (c.rank(), n));
                    (g.rank(), all_reduce(&g, len))
                })
            })
            .collect();
        hs.push(s.spawn(move || {
            std::thread::sleep(joiner_delay);
            let g = Communicator::join_grow(&id, n - 1, n, joiner_config)
                .unwrap_or_else(|e| panic!("join_grow: {e}"));
            assert_eq!((g.rank(), g.size()), (n - 1, n));
            (n - 1, all_reduce(&g, len))
        }));
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn three_members_and_one_new_rank_reduce_like_a_fresh_four() {
    let len = 10_000;
    let members = job(3);
    let grown = grow_by_one(&members, len, Duration::ZERO, config());
    // The parent still works after its grow.
    std::thread::scope(|s| {
        for c in &members {
            s.spawn(move || all_reduce(c, 16));
        }
    });
    let fresh = job(4);
    let want: Vec<Vec<f32>> = std::thread::scope(|s| {
        let hs: Vec<_> = fresh
            .iter()
            .map(|c| s.spawn(move || all_reduce(c, len)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, got) in &grown {
        let same = got
            .iter()
            .zip(&want[*r])
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "rank {r}: the grown communicator's sums differ from a fresh one's"
        );
    }
    // One grow per communicator: rank 0 handed its standby store over.
    let e = members[0].grow_unique_id().unwrap_err().to_string();
    assert!(e.contains("standby store"), "{e}");
}

/// A grow's ranks fail where the members are waiting for a joiner that
/// never comes; the joiner's error says what was wrong.
fn members_wait_in_vain(members: &[Communicator], nranks: usize) -> Vec<String> {
    std::thread::scope(|s| {
        let hs: Vec<_> = members
            .iter()
            .map(|c| s.spawn(move || c.grow(nranks).map(|_| ()).unwrap_err().to_string()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn bad_grows_are_clear_errors_on_every_rank() {
    let members = job(2);
    let e = members[1].grow_unique_id().unwrap_err().to_string();
    assert!(e.contains("rank 0 coordinates"), "{e}");
    let e = members[0].grow(2).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("adds none"), "{e}");
    let id = members[0].grow_unique_id().unwrap();
    let start = Instant::now();
    let (member_errors, joiner_errors) = std::thread::scope(|s| {
        let members = s.spawn(|| members_wait_in_vain(&members, 3));
        // A member's rank, another size, a wrong secret: each refused
        // before the joiner takes part.
        let joiner = s.spawn(move || {
            let as_member = Communicator::join_grow(&id, 1, 3, config());
            let other_size = Communicator::join_grow(&id, 2, 4, config());
            let forged = UniqueId {
                secret: [7; 16],
                ..id
            };
            let wrong_secret = Communicator::join_grow(&forged, 2, 3, config());
            [as_member, other_size, wrong_secret].map(|r| r.map(|_| ()).unwrap_err().to_string())
        });
        (members.join().unwrap(), joiner.join().unwrap())
    });
    assert!(
        joiner_errors[0].contains("is a member's"),
        "{joiner_errors:?}"
    );
    assert!(
        joiner_errors[1].contains("the members grow to 3"),
        "{joiner_errors:?}"
    );
    assert!(
        joiner_errors[2].contains("cannot reach the grow's store"),
        "{joiner_errors:?}"
    );
    // Nobody joined as rank 2: both members give up within their timeout,
    // naming the rank they waited for.
    for e in &member_errors {
        assert!(e.contains("info/2"), "{member_errors:?}");
    }
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "{:?}",
        start.elapsed()
    );
    // The failed grow left rank 0's standby store with the parent: its
    // recovery (and its grow id) still work, and a second grow of the same
    // members, with a joiner this time, does not meet the first one's
    // records: it reduces like a fresh job of three.
    // Rank 1 comes late: rank 0 and the joiner must not take the first
    // grow's records for its.
    grow_again_with_a_joiner(&members, Some(1));
}

/// A second grow of `members` by one rank, the new one joining with a
/// grow id taken now (`late`: a member that calls it 500 ms after the
/// others): every rank of the grown job reduces like a fresh one.
fn grow_again_with_a_joiner(members: &[Communicator], late: Option<usize>) {
    let id = members[0].grow_unique_id().expect("a second grow id");
    let n = members.len() + 1;
    let len = 4096;
    let grown: Vec<(usize, Vec<f32>)> = std::thread::scope(|s| {
        let mut hs: Vec<_> = members
            .iter()
            .map(|c| {
                s.spawn(move || {
                    if late == Some(c.rank()) {
                        std::thread::sleep(Duration::from_millis(500));
                    }
                    let g = c.grow(n).unwrap_or_else(|e| panic!("second grow: {e}"));
                    (g.rank(), all_reduce(&g, len))
                })
            })
            .collect();
        hs.push(s.spawn(move || {
            let g = Communicator::join_grow(&id, n - 1, n, config())
                .unwrap_or_else(|e| panic!("join the second grow: {e}"));
            (g.rank(), all_reduce(&g, len))
        }));
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let want = all_reduce_of_fresh(n, len);
    for (r, got) in &grown {
        assert!(
            got == &want,
            "rank {r} of the second grow differs from a fresh job"
        );
    }
}

/// An all-reduce of [`input`] on a fresh job of `n` ranks.
fn all_reduce_of_fresh(n: usize, len: usize) -> Vec<f32> {
    let fresh = job(n);
    std::thread::scope(|s| {
        let hs: Vec<_> = fresh
            .iter()
            .map(|c| s.spawn(move || all_reduce(c, len)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    })
    .remove(0)
}

#[test]
fn a_member_growing_to_another_size_than_rank_0_is_told_so() {
    let members = job(2);
    let errors: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = members
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let n = if c.rank() == 0 { 3 } else { 4 };
                    c.grow(n).map(|_| ()).unwrap_err().to_string()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        errors[1].contains("this member grows to 4 ranks, rank 0 to 3"),
        "{errors:?}"
    );
}

#[test]
fn a_new_rank_given_to_two_processes_fails_the_second() {
    let members = job(2);
    let id = members[0].grow_unique_id().unwrap();
    let (sizes, joins) = std::thread::scope(|s| {
        let hs: Vec<_> = members
            .iter()
            .map(|c| s.spawn(move || c.grow(3).map(|g| g.size()).map_err(|e| e.to_string())))
            .collect();
        let joins: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(move || {
                    Communicator::join_grow(&id, 2, 3, config())
                        .map(|g| g.size())
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        (
            hs.into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>(),
            joins
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>(),
        )
    });
    let refused: Vec<&String> = joins.iter().filter_map(|j| j.as_ref().err()).collect();
    assert_eq!(refused.len(), 1, "{joins:?}");
    assert!(
        refused[0].contains("already joined this grow as rank 2"),
        "{joins:?}"
    );
    assert!(
        sizes.iter().all(|s| *s == Ok(3)),
        "the members and the first joiner grow: {sizes:?}"
    );
}

/// A grow whose joiner claimed its rank and then failed (here: one member
/// never came) can be tried again with a replacement joiner: the retry
/// does not meet the first try's claim or records, and the grown job
/// reduces like a fresh one.
#[test]
fn a_failed_grow_can_be_retried_with_a_new_joiner() {
    let members = job(2);
    let id = members[0].grow_unique_id().unwrap();
    std::thread::scope(|s| {
        let first = s.spawn(|| members[0].grow(3).map(|_| ()).unwrap_err().to_string());
        // Member 1 grows to another size: it is told so, and never joins
        // the creation that rank 0 and the joiner (which claimed rank 2)
        // wait in.
        let second = s.spawn(|| members[1].grow(4).map(|_| ()).unwrap_err().to_string());
        let joiner = s.spawn(move || {
            Communicator::join_grow(&id, 2, 3, config())
                .map(|_| ())
                .unwrap_err()
                .to_string()
        });
        let errors = [first, second, joiner].map(|h| h.join().unwrap());
        assert!(errors[1].contains("rank 0 to 3"), "{errors:?}");
    });
    // Every member calls the second grow; a new process takes rank 2.
    grow_again_with_a_joiner(&members, None);
}

/// `n` ranks as threads whose operations time out after `op_ms` and whose
/// creations (grows included) after `init_ms` (0: `op_ms`).
fn job_with_timeouts(n: usize, op_ms: u64, init_ms: u64) -> Vec<Communicator> {
    job_with(
        n,
        Config {
            timeout: Duration::from_millis(op_ms),
            init_timeout: Duration::from_millis(init_ms),
            ..Config::default()
        },
    )
}

/// A grow waits for new processes, which a launcher starts with its skew:
/// it waits as long as a creation does (`SNCL_INIT_TIMEOUT_MS`), not the
/// operation timeout a job sets short to notice failures fast.
#[test]
fn a_joiner_started_late_joins_within_the_init_timeout() {
    let members = job_with_timeouts(2, 300, 20_000);
    // A joiner 1 s late: with the operation timeout alone this failed.
    let joiner = Config {
        timeout: Duration::from_millis(300),
        init_timeout: Duration::from_millis(20_000),
        ..Config::default()
    };
    let grown = grow_by_one(&members, 256, Duration::from_secs(1), joiner);
    let want = all_reduce_of_fresh(3, 256);
    for (r, got) in &grown {
        assert!(
            got == &want,
            "rank {r} of the grow differs from a fresh job"
        );
    }
    // Without an init timeout the operation timeout bounds the grow, and
    // the error names the setting to raise.
    let members = job_with_timeouts(2, 300, 0);
    let t0 = Instant::now();
    for e in members_wait_in_vain(&members, 3) {
        assert!(e.contains("SNCL_INIT_TIMEOUT_MS"), "{e}");
    }
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}
