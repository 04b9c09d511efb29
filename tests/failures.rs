//! Failures: a rank dying mid-operation (processes, over shared memory and
//! TCP), mismatched operations, stray and wrong-secret connections to the
//! rendezvous root, an unreachable root, a rank that never shows up, and an
//! application-level abort.
//!
//! A dead peer with ranks as threads cannot be produced (a thread cannot be
//! killed); `Communicator::abort` and a rank that stops calling stand in.

mod rank_kit;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use comm_core::algo::Algorithm;
use comm_core::config::TransportChoice;
use rank_kit::*;
use sncl::{Collective, Communicator, Config, DataType, Error, RawOp, ReduceOp, UniqueId};
use sncl_bootstrap::TcpStore;

// ---------------------------------------------------------------------------
// (a) A rank dies during a long run of all_reduces.

const TIMEOUT_MS: u64 = 3000;
/// The jobs' `SNCL_INIT_TIMEOUT_MS`: rank processes started on a loaded
/// machine arrive seconds apart (launch skew, not the failure under test).
const INIT_TIMEOUT_MS: u64 = 30_000;
const MODE_ENV: &str = "SNCL_TEST_MODE";
const SELF_ABORT_ENV: &str = "SNCL_TEST_SELF_ABORT";
/// Elements of the child loop's all-reduce (default 65,536).
const COUNT_ENV: &str = "SNCL_TEST_COUNT";

/// Child side: all_reduce in a loop until an error (exit 2, printing it) or
/// 60 s (exit 0). With `SNCL_TEST_SELF_ABORT=r`, rank r aborts its own
/// process after 20 operations.
#[test]
#[ignore = "a child process's entry point, run by its parent test"]
fn child_loop() {
    if !is_child() || std::env::var(MODE_ENV).as_deref() != Ok("loop") {
        return;
    }
    let c = Communicator::from_env().unwrap_or_else(|e| panic!("init failed: {e}"));
    let r = c.rank();
    let victim: Option<usize> = std::env::var(SELF_ABORT_ENV)
        .ok()
        .and_then(|v| v.parse().ok());
    let count = std::env::var(COUNT_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1 << 16);
    let mut v = vec![1.0f32; count];
    let start = Instant::now();
    let mut i = 0u64;
    while start.elapsed() < Duration::from_secs(60) {
        if victim == Some(r) && i == 20 {
            eprintln!("rank {r} aborting itself");
            std::process::abort();
        }
        if let Err(e) = c.all_reduce_in_place(&mut v, ReduceOp::Max) {
            eprintln!("SNCL-ERROR rank {r} after {i} operations: {e}");
            std::process::exit(2);
        }
        i += 1;
        if i == 1 {
            eprintln!("READY rank {r}");
        }
    }
    eprintln!("NO-ERROR rank {r} after {i} operations");
}

/// Whether `line` names rank `v` as a peer ("rank 2", "rank(s) [2]", ...).
fn names_rank(line: &str, v: usize) -> bool {
    line.contains(&format!("rank {v}"))
        || line.contains(&format!("[{v}]"))
        || line.contains(&format!("[{v},"))
        || line.contains(&format!(" {v}]"))
        || line.contains(&format!(" {v},"))
}

/// `transport`: "shm", "tcp", or "lanes" (shm, 2-element all-reduces with
/// the planner free: they take the lanes, src/comm/lane.rs).
fn dead_rank(transport: &str, n: usize, victim: usize, self_abort: bool) {
    let mut env = vec![
        (MODE_ENV, "loop".to_string()),
        ("SNCL_TIMEOUT_MS", TIMEOUT_MS.to_string()),
        ("SNCL_INIT_TIMEOUT_MS", INIT_TIMEOUT_MS.to_string()),
        (
            "SNCL_TRANSPORT",
            if transport == "tcp" { "tcp" } else { "auto" }.to_string(),
        ),
    ];
    if transport == "lanes" {
        env.push((COUNT_ENV, "2".to_string()));
    } else {
        env.push(("SNCL_ALGO", "all_reduce:ring".to_string()));
    }
    if self_abort {
        env.push((SELF_ABORT_ENV, victim.to_string()));
    }
    let what = format!(
        "{transport}: rank {victim} of {n} {}",
        if self_abort {
            "aborts itself"
        } else {
            "killed with SIGKILL"
        }
    );
    let mut ranks = spawn_job("child_loop", n, &env);
    let ready = Instant::now() + Duration::from_secs(30);
    let died_at = if self_abort {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ranks[victim].poll() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        match ranks[victim].exit {
            Some((st, at)) => {
                assert!(!st.success(), "{what}: victim exited with {st}");
                at
            }
            None => {
                wait_all(&mut ranks, Instant::now());
                panic!("{what}: the victim did not abort");
            }
        }
    } else {
        for r in ranks.iter_mut() {
            if !r.wait_line("READY", ready) {
                let rank = r.rank;
                let text = r.text();
                wait_all(&mut ranks, Instant::now());
                panic!("{what}: rank {rank} never got going:\n{}", tail(&text, 20));
            }
        }
        std::thread::sleep(Duration::from_millis(100));
        ranks[victim].child.kill().expect("SIGKILL");
        Instant::now()
    };
    let limit = Duration::from_millis(TIMEOUT_MS) + Duration::from_secs(2);
    let all_exited = wait_all(&mut ranks, died_at + Duration::from_secs(20));
    let mut problems = Vec::new();
    for r in ranks.iter_mut().filter(|r| r.rank != victim) {
        let text = r.text();
        let Some((st, at)) = r.exit else {
            problems.push(format!(
                "rank {}: still running 20 s after the death (killed):\n{}",
                r.rank,
                tail(&text, 10)
            ));
            continue;
        };
        let took = at.saturating_duration_since(died_at);
        let line = text
            .lines()
            .find(|l| l.starts_with("SNCL-ERROR"))
            .unwrap_or("")
            .to_string();
        eprintln!(
            "{what}: rank {} exited with {st} after {took:?}: {line}",
            r.rank
        );
        if st.code() != Some(2) {
            problems.push(format!(
                "rank {}: exit {st}, want an error exit (2):\n{}",
                r.rank,
                tail(&text, 10)
            ));
            continue;
        }
        if took >= limit {
            problems.push(format!(
                "rank {}: took {took:?} after the death, limit {limit:?} (SNCL_TIMEOUT_MS + 2 s)",
                r.rank
            ));
        }
        for (want, ok) in [
            ("the operation (all_reduce)", line.contains("all_reduce")),
            ("its sequence number (seq N)", line.contains("seq ")),
            (
                "the dead peer",
                names_rank(line.splitn(3, ": ").nth(2).unwrap_or(""), victim),
            ),
        ] {
            if !ok {
                problems.push(format!(
                    "rank {}: error does not name {want} (rank {victim} died): {line}",
                    r.rank
                ));
            }
        }
    }
    assert!(
        all_exited || !problems.is_empty(),
        "{what}: not every survivor exited"
    );
    assert!(problems.is_empty(), "{what}:\n{}", problems.join("\n"));
}

#[test]
fn killed_rank_over_shm() {
    if is_child() {
        return;
    }
    dead_rank("shm", 4, 2, false);
}

#[test]
fn killed_rank_in_small_all_reduces_over_lanes() {
    if is_child() {
        return;
    }
    dead_rank("lanes", 3, 1, false);
    dead_rank("lanes", 2, 0, true);
}

#[test]
fn killed_rank_over_tcp() {
    if is_child() {
        return;
    }
    // Rank 0 also serves the rendezvous store: it is not needed any more.
    dead_rank("tcp", 3, 0, false);
}

/// The target: survivors report a killed peer within deadline + 2 s
/// in 20 of 20 trials (10 over shm, 10 over TCP, victims rotating).
#[test]
fn peer_death_twenty_trials() {
    if is_child() {
        return;
    }
    for trial in 0..20 {
        let transport = if trial % 2 == 0 { "shm" } else { "tcp" };
        dead_rank(transport, 3, trial % 3, false);
    }
}

#[test]
fn self_aborting_rank_over_shm() {
    if is_child() {
        return;
    }
    dead_rank("shm", 3, 1, true);
}

#[test]
fn self_aborting_rank_over_tcp() {
    if is_child() {
        return;
    }
    dead_rank("tcp", 4, 3, true);
}

// ---------------------------------------------------------------------------
// (b), (c) Mismatched operations (ranks as threads).

fn cfg(algo: Algorithm, transport: TransportChoice, timeout_ms: u64) -> Config {
    Config {
        timeout: Duration::from_millis(timeout_ms),
        algo: vec![
            (Collective::AllReduce, algo),
            (
                Collective::Broadcast,
                if algo == Algorithm::Rd {
                    Algorithm::Tree
                } else {
                    algo
                },
            ),
        ],
        chunk_bytes: 4096,
        shm: sncl::ShmSettings {
            slot_bytes: 4096,
            ..Default::default()
        },
        transport,
        ..Default::default()
    }
}

/// Rank 0 all_reduces 100 elements, rank 1 200: both fail promptly; a
/// rank that received the other's data reports `Error::Mismatch` naming
/// both counts. (With the tree algorithm on 2 ranks, rank 1 only sends
/// before rank 0 notices, so rank 1 can only learn that rank 0 aborted:
/// then it must name rank 0 and the mismatch, and count nobody as failed —
/// a shrink must not drop a healthy rank for a caller's mistake.)
#[test]
fn mismatched_counts_fail_on_both_ranks_naming_both_sides() {
    let mut problems = Vec::new();
    for transport in [TransportChoice::Auto, TransportChoice::Tcp] {
        for algo in [Algorithm::Ring, Algorithm::Tree, Algorithm::Rd] {
            let what = format!("{transport:?}/{algo:?}");
            let comms = init(2, cfg(algo, transport, 10_000));
            let res = timed_on_ranks(&comms, |r, c| {
                let count = if r == 0 { 100 } else { 200 };
                let mut v = vec![1.0f32; count];
                c.all_reduce_in_place(&mut v, ReduceOp::Sum)
            });
            let mut mismatches = 0;
            for (r, (res, took)) in res.iter().enumerate() {
                if *took > Duration::from_secs(5) {
                    problems.push(format!("{what} rank {r}: took {took:?} (deadline 10 s)"));
                }
                match res {
                    Err(e @ Error::Mismatch { peer, .. }) => {
                        mismatches += 1;
                        let m = e.to_string();
                        if *peer != 1 - r || !(m.contains("count=100") && m.contains("count=200")) {
                            problems
                                .push(format!("{what} rank {r}: does not name both sides: {m}"));
                        }
                    }
                    Err(e @ Error::PeerFailed { .. }) if algo == Algorithm::Tree => {
                        eprintln!("{what} rank {r}: {e}");
                        let m = e.to_string();
                        let names_the_peer = m.contains(&format!("peer rank {} aborted", 1 - r));
                        if e.failed_rank().is_some()
                            || !names_the_peer
                            || !m.contains("called different operations")
                        {
                            problems.push(format!(
                                "{what} rank {r}: want the peer's abort for a mismatch, no rank failed: {e}"
                            ));
                        }
                    }
                    other => problems.push(format!(
                        "{what} rank {r}: want Error::Mismatch naming both sides, got {other:?}"
                    )),
                }
            }
            if mismatches == 0 {
                problems.push(format!("{what}: no rank reported Error::Mismatch"));
            }
            // The communicator is aborted now, and says why.
            for c in &comms {
                match c.async_error() {
                    Some(why) => {
                        let mut v = [0f32; 4];
                        match c.all_reduce_in_place(&mut v, ReduceOp::Sum) {
                            Err(Error::Aborted { .. }) => {}
                            other => problems.push(format!(
                                "{what} rank {}: after the mismatch ({why}) an operation gave {other:?}",
                                c.rank()
                            )),
                        }
                    }
                    None => problems.push(format!(
                        "{what} rank {}: no async_error after a mismatch",
                        c.rank()
                    )),
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Different collectives, types or operators at the same point: an error on
/// both ranks (a `Mismatch` on at least one, naming both operations), well
/// before the deadline.
#[test]
fn mismatched_operations_fail_on_both_ranks() {
    type Call = fn(&Communicator) -> sncl::Result<()>;
    let cases: [(&str, Call, Call); 4] = [
        (
            "all_reduce vs broadcast",
            |c| c.all_reduce_in_place(&mut [1.0f32; 64], ReduceOp::Sum),
            |c| c.broadcast(&mut [1.0f32; 64], 0),
        ),
        (
            "f32 vs i32",
            |c| c.all_reduce_in_place(&mut [1.0f32; 64], ReduceOp::Sum),
            |c| c.all_reduce_in_place(&mut [1i32; 64], ReduceOp::Sum),
        ),
        (
            "sum vs max",
            |c| c.all_reduce_in_place(&mut [1u8; 64], ReduceOp::Sum),
            |c| c.all_reduce_in_place(&mut [1u8; 64], ReduceOp::Max),
        ),
        (
            "all_gather vs alltoall",
            |c| c.all_gather(&[1u64; 8], &mut [0u64; 16]),
            |c| c.alltoall(&[1u64; 16], &mut [0u64; 16]),
        ),
    ];
    let mut problems = Vec::new();
    for transport in [TransportChoice::Auto, TransportChoice::Tcp] {
        for (name, a, b) in cases {
            let what = format!("{transport:?} {name}");
            let comms = init(2, cfg(Algorithm::Ring, transport, 8_000));
            let res = timed_on_ranks(&comms, |r, c| if r == 0 { a(c) } else { b(c) });
            let mut mismatches = 0;
            for (r, (res, took)) in res.iter().enumerate() {
                match res {
                    Ok(()) => problems.push(format!("{what} rank {r}: succeeded")),
                    Err(e) => {
                        if matches!(e, Error::Mismatch { .. }) {
                            mismatches += 1;
                        }
                        eprintln!("{what} rank {r} ({took:?}): {e}");
                        if *took > Duration::from_secs(4) {
                            problems.push(format!(
                                "{what} rank {r}: error after {took:?} (timeout 8 s): {e}"
                            ));
                        }
                    }
                }
            }
            if mismatches == 0 {
                problems.push(format!("{what}: no rank reported Error::Mismatch"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Rooted collectives whose ranks disagree on the root fail on every rank
/// in that same operation — never a success, never the timeout — and leave
/// every user buffer as it was: when one rank of three names another root,
/// and when every rank names itself (before, broadcast and scatter returned
/// success with different data on each rank, and reduce and gather waited
/// until the timeout). The ranks that see the other's operation name both
/// roots; the others name the rank whose operation differs. Over shm and
/// TCP, broadcast and reduce with each of their one-node algorithms.
#[test]
fn mismatched_roots_fail_every_rank_in_the_same_operation() {
    const N: usize = 3;
    const COUNT: usize = 50;
    type Roots = fn(usize) -> usize;
    let cases: [(&str, Roots); 2] = [
        ("rank 2 names root 1, the others root 0", |r| {
            usize::from(r == 2)
        }),
        ("every rank names itself the root", |r| r),
    ];
    let colls = [
        (Collective::Broadcast, Algorithm::Tree),
        (Collective::Broadcast, Algorithm::Ring),
        (Collective::Reduce, Algorithm::Tree),
        (Collective::Reduce, Algorithm::Ring),
        (Collective::Gather, Algorithm::Pairwise),
        (Collective::Scatter, Algorithm::Pairwise),
    ];
    let mut failures = Vec::new();
    for transport in [TransportChoice::Shm, TransportChoice::Tcp] {
        for (case, roots) in cases {
            for (coll, algo) in colls {
                let what = format!("{coll:?} ({algo:?}) over {transport:?}, {case}");
                let config = Config {
                    timeout: Duration::from_secs(10),
                    algo: vec![(coll, algo)],
                    transport,
                    ..Default::default()
                };
                let comms = init(N, config);
                let started = Instant::now();
                let results = std::thread::scope(|s| {
                    let hs: Vec<_> = comms
                        .iter()
                        .map(|c| {
                            s.spawn(move || {
                                let r = c.rank();
                                let root = roots(r);
                                let before = 1000 + r as u32;
                                let send = vec![before; COUNT * N];
                                let mut recv = vec![before; COUNT * N];
                                let result = match coll {
                                    Collective::Broadcast => c.broadcast(&mut recv, root),
                                    Collective::Reduce => c.reduce(
                                        &send[..COUNT],
                                        &mut recv[..COUNT],
                                        ReduceOp::Sum,
                                        root,
                                    ),
                                    Collective::Gather => c.gather(&send[..COUNT], &mut recv, root),
                                    _ => c.scatter(&send, &mut recv[..COUNT], root),
                                };
                                let untouched = recv.iter().all(|&x| x == before);
                                (result, untouched)
                            })
                        })
                        .collect();
                    hs.into_iter()
                        .map(|h| h.join().expect("rank"))
                        .collect::<Vec<_>>()
                });
                let took = started.elapsed();
                let mut named_both = false;
                for (r, (result, untouched)) in results.iter().enumerate() {
                    if !untouched {
                        failures.push(format!("{what}: rank {r}'s buffer was written"));
                    }
                    match result {
                        Err(e @ Error::Mismatch { ours, theirs, .. }) => {
                            named_both |= ours.root != theirs.root;
                            if ours.root == theirs.root {
                                failures.push(format!("{what}: rank {r}: {e}"));
                            }
                        }
                        Err(e @ Error::PeerFailed { .. })
                            if e.to_string().contains("called different operations") => {}
                        Err(e) => failures.push(format!("{what}: rank {r}: unexpected error {e}")),
                        Ok(()) => failures.push(format!("{what}: rank {r} returned success")),
                    }
                }
                if !named_both {
                    failures.push(format!("{what}: no rank named both roots: {results:?}"));
                }
                if took > Duration::from_secs(5) {
                    failures.push(format!("{what}: took {took:?} (the timeout is 10 s)"));
                }
            }
        }
    }
    assert_clean(failures);
}

/// After a mismatch every rank's communicator is aborted: the next
/// collective is refused with the first failure, not run on ranks that
/// disagree about what came before.
#[test]
fn after_mismatched_roots_the_communicator_refuses_further_work() {
    let comms = init(3, cfg(Algorithm::Ring, TransportChoice::Auto, 5_000));
    let res = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let r = c.rank();
                    let mut v = vec![r as u32; 50];
                    let first = c.broadcast(&mut v, usize::from(r == 2));
                    let mut w = vec![1u32; 10];
                    let second = c.all_reduce_in_place(&mut w, ReduceOp::Sum);
                    (first.is_err(), second)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank"))
            .collect::<Vec<_>>()
    });
    for (r, (first_failed, second)) in res.iter().enumerate() {
        assert!(first_failed, "rank {r}: the mismatched broadcast succeeded");
        match second {
            Err(Error::Aborted {
                reason: Some(reason),
                ..
            }) => {
                assert!(reason.contains("broadcast"), "rank {r}: {reason}")
            }
            other => panic!("rank {r}: the next all_reduce gave {other:?}"),
        }
    }
}

/// An operation rejected on one rank after its arguments were checked
/// (variable counts missing, found when it is scheduled; a NULL buffer,
/// found after that) takes no sequence number, so the next valid
/// collective still matches the peers' on every rank (before, a call
/// rejected by the scheduler left its rank one ahead, and every later
/// collective failed as mismatched). Ranks as threads, shm.
#[test]
fn a_rejected_operation_does_not_shift_the_sequence_numbers() {
    let cfg = Config {
        timeout: Duration::from_secs(10),
        transport: TransportChoice::Auto,
        ..Default::default()
    };
    let comms = init(3, cfg);
    let rejected = |k: &mut Rk| {
        // all_gatherv without its counts: rejected when it is scheduled.
        let no_counts = RawOp::new(Collective::AllGatherV, DataType::Float32, 0);
        // SAFETY: the operation points to no buffer.
        match unsafe { k.c.run_raw(&no_counts) } {
            Err(Error::InvalidArgument { detail, .. }) if detail.contains("variable counts") => {}
            other => k.push(format!("all_gatherv without counts: {other:?}")),
        }
        // all_reduce of 16 elements with NULL buffers.
        let null = RawOp::new(Collective::AllReduce, DataType::Float32, 16);
        // SAFETY: both buffers are NULL; rejected before any use.
        match unsafe { k.c.run_raw(&null) } {
            Err(Error::InvalidArgument { detail, .. }) if detail.contains("NULL") => {}
            other => k.push(format!("all_reduce with NULL buffers: {other:?}")),
        }
    };
    let errs = on_ranks(&comms, "rejected", |k| {
        // Only rank 0 makes (and has rejected) the calls.
        if k.r == 0 {
            rejected(k);
        }
        t_all_reduce::<f32>(k, ReduceOp::Sum, 16, false)?;
        // Every rank makes them; rank 2 twice.
        rejected(k);
        if k.r == 2 {
            rejected(k);
        }
        t_all_reduce::<u32>(k, ReduceOp::Sum, 1000, true)?;
        t_broadcast::<u64>(k, 8, false)
    });
    assert_clean(errs);
}

// ---------------------------------------------------------------------------
// (d) Stray connections to the root; (e) an unreachable root.

fn loopback_root() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}

#[test]
fn stray_and_wrong_secret_connections_do_not_disturb_init() {
    let id = Communicator::unique_id(loopback_root()).expect("unique id");
    let config = Config {
        timeout: Duration::from_secs(20),
        transport: TransportChoice::Tcp,
        ..Default::default()
    };
    let c0 = config.clone();
    let rank0 = std::thread::spawn(move || Communicator::init_rank_with_config(&id, 0, 2, c0));

    // Wait until the root listens.
    let t = Instant::now();
    let mut garbage = loop {
        match TcpStream::connect(id.root) {
            Ok(s) => break s,
            Err(e) if t.elapsed() < Duration::from_secs(10) => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("the root never listened at {}: {e}", id.root),
        }
    };
    // 1. Garbage instead of the handshake: the root closes the connection.
    garbage
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    // (More than a handshake's worth of bytes, so the root can judge them.)
    let _ = garbage.write_all(
        &[
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".as_slice(),
            &[0x5a; 100],
        ]
        .concat(),
    );
    // 2. A connection that says nothing and stays open.
    let silent = TcpStream::connect(id.root).expect("second connection");
    // 3. The right protocol with a wrong secret, claiming rank 1.
    let mut wrong = id;
    wrong.secret[0] ^= 0x5a;
    let t = Instant::now();
    let err = TcpStore::connect(
        id.root,
        wrong.secret,
        1,
        Instant::now() + Duration::from_secs(5),
    )
    .expect_err("a wrong secret must be refused");
    let msg = err.to_string();
    assert!(
        msg.contains("secret") && t.elapsed() < Duration::from_secs(3),
        "wrong secret: {msg} after {:?}",
        t.elapsed()
    );
    // The garbage connection is closed by the root (EOF or reset), not kept.
    let mut buf = [0u8; 256];
    let mut closed = false;
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(12) {
        match garbage.read(&mut buf) {
            Ok(0) | Err(_) => {
                closed = true;
                break;
            }
            Ok(_) => {}
        }
    }
    assert!(closed, "the root kept a connection that sent garbage");

    // Now the real rank 1: init completes and an all_reduce works.
    let rank1 = std::thread::spawn(move || Communicator::init_rank_with_config(&id, 1, 2, config));
    let comms: Vec<Communicator> = [rank0, rank1]
        .into_iter()
        .map(|h| {
            h.join()
                .expect("init thread")
                .expect("init despite stray connections")
        })
        .collect();
    drop(silent);
    let errs = on_ranks(&comms, "after-stray", |k| {
        t_all_reduce::<f32>(k, ReduceOp::Sum, 1000, false)?;
        t_all_reduce::<i64>(k, ReduceOp::BitXor, 7, true)
    });
    assert_clean(errs);
}

#[test]
fn unreachable_root_fails_fast_naming_the_address() {
    let root = loopback_root(); // nobody listens there
    let id = UniqueId::new(root).expect("unique id");
    let config = Config {
        timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let t = Instant::now();
    let r = within(Duration::from_secs(10), "unreachable root", move || {
        Communicator::init_rank_with_config(&id, 1, 2, config)
    });
    let took = t.elapsed();
    let err = r.expect_err("init against a root nobody listens on");
    let msg = err.to_string();
    eprintln!("after {took:?}: {msg}");
    assert!(took < Duration::from_millis(2500), "took {took:?}: {msg}");
    assert!(
        msg.contains(&root.to_string()),
        "does not name {root}: {msg}"
    );
}

/// Rank 0 of a 2-rank job alone: init fails after the timeout, saying which
/// rank never came.
#[test]
fn missing_rank_fails_init_naming_it() {
    let id = UniqueId::new(loopback_root()).expect("unique id");
    let config = Config {
        timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let t = Instant::now();
    let r = within(Duration::from_secs(10), "missing rank", move || {
        Communicator::init_rank_with_config(&id, 0, 2, config)
    });
    let took = t.elapsed();
    let msg = r.expect_err("init without rank 1").to_string();
    eprintln!("after {took:?}: {msg}");
    assert!(took < Duration::from_millis(3000), "took {took:?}: {msg}");
    assert!(msg.contains('1'), "does not name the missing rank: {msg}");
}

// ---------------------------------------------------------------------------
// Thread-rank stand-ins for a dead peer: abort() and a rank that stalls.

#[test]
fn application_abort_fails_the_peers_promptly() {
    for transport in [TransportChoice::Auto, TransportChoice::Tcp] {
        let comms = init(3, cfg(Algorithm::Ring, transport, 20_000));
        let res = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .map(|c| {
                    s.spawn(move || {
                        let t = Instant::now();
                        if c.rank() == 1 {
                            std::thread::sleep(Duration::from_millis(200));
                            c.abort();
                            let mut v = [0f32; 4];
                            let after = c.all_reduce_in_place(&mut v, ReduceOp::Sum);
                            (after, t.elapsed())
                        } else {
                            let mut v = vec![1f32; 10_000];
                            (c.all_reduce_in_place(&mut v, ReduceOp::Sum), t.elapsed())
                        }
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("rank"))
                .collect::<Vec<_>>()
        });
        for (r, (res, took)) in res.iter().enumerate() {
            let e = match res {
                Err(e) => e.to_string(),
                Ok(()) => panic!("{transport:?} rank {r}: succeeded despite rank 1's abort"),
            };
            eprintln!("{transport:?} rank {r} after {took:?}: {e}");
            if r == 1 {
                assert!(e.contains("aborted"), "{e}");
                assert!(comms[1].async_error().is_some());
            } else {
                assert!(
                    *took < Duration::from_secs(3),
                    "{transport:?} rank {r}: took {took:?} (deadline 20 s): {e}"
                );
                assert!(
                    e.contains("all_reduce") && e.contains("seq") && names_rank(&e, 1),
                    "{transport:?} rank {r}: {e}"
                );
            }
        }
    }
}

#[test]
fn stalled_rank_times_out_naming_it_and_the_late_rank_fails_too() {
    let comms = init(3, cfg(Algorithm::Ring, TransportChoice::Auto, 1000));
    let res = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    if c.rank() == 1 {
                        std::thread::sleep(Duration::from_millis(2500));
                    }
                    let t = Instant::now();
                    let mut v = vec![1f64; 5000];
                    (c.all_reduce_in_place(&mut v, ReduceOp::Sum), t.elapsed())
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank"))
            .collect::<Vec<_>>()
    });
    // Ranks 0 and 2 time out (rank 2 waits on rank 1; rank 0 waits on rank
    // 2, or learns of rank 2's abort); rank 1, arriving late, finds the
    // communicator aborted at once instead of waiting out its own deadline.
    let mut timeouts = 0;
    for (r, (res, took)) in res.iter().enumerate() {
        let e = match res {
            Err(e) => e,
            Ok(()) => panic!("rank {r}: succeeded although rank 1 stalled past the deadline"),
        };
        eprintln!("rank {r} after {took:?}: {e}");
        if let Error::Timeout { waiting_on, .. } = e {
            if waiting_on.contains(&1) {
                timeouts += 1;
            }
        }
        let m = e.to_string();
        let limit = if r == 1 { 1500 } else { 3000 };
        assert!(
            *took < Duration::from_millis(limit),
            "rank {r}: took {took:?} with a 1 s deadline: {m}"
        );
        if r != 1 {
            assert!(m.contains("all_reduce") && m.contains("seq"), "{m}");
        }
    }
    assert!(
        timeouts >= 1,
        "no rank reported Error::Timeout waiting on rank 1"
    );
}

/// When rank 1 stalls, no error anywhere should blame another rank: rank 2
/// times out waiting on rank 1 and aborts; the ranks that learn of that
/// abort must not be told that rank 2 (or rank 0) is the rank that failed.
#[test]
fn stalled_rank_is_the_rank_blamed() {
    let comms = init(3, cfg(Algorithm::Ring, TransportChoice::Auto, 1000));
    let res = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    if c.rank() == 1 {
                        std::thread::sleep(Duration::from_millis(1500));
                    }
                    let mut v = vec![1f64; 5000];
                    c.all_reduce_in_place(&mut v, ReduceOp::Sum)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank"))
            .collect::<Vec<_>>()
    });
    let mut problems = Vec::new();
    for (r, res) in res.iter().enumerate() {
        let Err(e) = res else {
            problems.push(format!("rank {r}: succeeded"));
            continue;
        };
        let blamed = match e {
            Error::Timeout { waiting_on, .. } => waiting_on.clone(),
            e => e.failed_rank().into_iter().collect(),
        };
        let m = e.to_string();
        let wrong = [0, 2]
            .iter()
            .any(|w| blamed.contains(w) || m.contains(&format!("cause: rank {w} failed")));
        if wrong && !(r == 0 && matches!(e, Error::Timeout { .. })) {
            problems.push(format!(
                "rank {r}: blames {blamed:?}, though only rank 1 stalled: {m}"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
