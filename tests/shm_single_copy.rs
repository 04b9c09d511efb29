//! Single-copy shared memory (cross-memory attach): every collective over
//! shm with single copy on (lending from 4 KiB pieces, and the default
//! threshold) and forced off, on 2 and 4 ranks as processes; a mixed job
//! where one rank turns it off; a sender that, lending, waits for its
//! reader; a reader killed while a sender waits on it; a bad setting.
//!
//! Ranks are children re-executing this binary (see `rank_kit::launch`);
//! each child reads its job from `SNCL_TEST_JOB`.

mod rank_kit;

use std::time::{Duration, Instant};

use rank_kit::*;
use sncl::{Communicator, ReduceOp};

const JOB_ENV: &str = "SNCL_TEST_JOB";
const CMA_ENV: &str = "SNCL_SHM_CMA";
const CMA_MIN_ENV: &str = "SNCL_SHM_CMA_MIN_BYTES";
/// How long the reader keeps the root waiting in `sender_waits_for_reader`.
const READER_DELAY: Duration = Duration::from_millis(2000);

/// Every collective of the kit (barrier aside), by name, with a type and an
/// operator that the type supports.
fn cases() -> Vec<(&'static str, &'static str, ReduceOp)> {
    COLLS
        .iter()
        .filter(|c| **c != "barrier")
        .enumerate()
        .map(|(i, c)| {
            let dtype = ["f32", "i32", "f64", "u8", "bf16"][i % 5];
            (*c, dtype, ReduceOp::Sum)
        })
        .chain([
            ("all_reduce", "f32", ReduceOp::Max),
            ("all_reduce", "i64", ReduceOp::BitXor),
            ("all_reduce", "f16", ReduceOp::Avg),
        ])
        .collect()
}

/// Child side: does nothing unless started by a parent below.
#[test]
#[ignore = "a child process's entry point, run by its parent test"]
fn child_rank() {
    if !is_child() {
        return;
    }
    let job = std::env::var(JOB_ENV).expect(JOB_ENV);
    let c = match Communicator::from_env() {
        Ok(c) => c,
        Err(e) => {
            println!("init failed: {e}");
            std::process::exit(3);
        }
    };
    match job.as_str() {
        "collectives" => collectives(&c),
        "sender_waits" => sender_waits(&c),
        "reader_killed" => reader_killed(&c),
        other => panic!("unknown job {other}"),
    }
}

fn collectives(c: &Communicator) {
    let mut k = Rk::new(c, "cma");
    let mut done = 0;
    'outer: for count in [0usize, 7, 5003, 100_003, 1 << 19] {
        for (coll, dtype, op) in cases() {
            if run_case(&mut k, coll, dtype, op, count).is_err() {
                break 'outer;
            }
            done += 1;
        }
    }
    if k.errs.is_empty() {
        if let Err(e) = c.barrier() {
            k.errs.push(format!("final barrier: {e}"));
        }
    }
    if !k.errs.is_empty() {
        panic!(
            "rank {} failed after {done} case(s):\n{}",
            c.rank(),
            k.errs.join("\n")
        );
    }
    println!("rank {} ran {done} case(s)", c.rank());
}

/// Rank 0 broadcasts 1 MiB (it fits the slots) to rank 1, which joins late.
/// The root prints how long its call took: with single copy it cannot
/// return before the reader read what it lent.
fn sender_waits(c: &Communicator) {
    let mut b = vec![0u8; 1 << 20];
    c.barrier().expect("barrier");
    if c.rank() == 0 {
        b.iter_mut().enumerate().for_each(|(i, x)| *x = i as u8);
        let t = Instant::now();
        c.broadcast(&mut b, 0).expect("broadcast");
        println!("root-ms {}", t.elapsed().as_millis());
    } else {
        std::thread::sleep(READER_DELAY);
        c.broadcast(&mut b, 0).expect("broadcast");
        assert!(b.iter().enumerate().all(|(i, x)| *x == i as u8));
    }
    c.barrier().expect("barrier");
}

/// Rank 0 broadcasts; rank 1 never reads (the parent kills it). The root
/// must fail naming rank 1, long before the communicator's timeout.
fn reader_killed(c: &Communicator) {
    let mut b = vec![1u8; 1 << 20];
    c.barrier().expect("barrier");
    if c.rank() == 0 {
        println!("root-sending");
        let t = Instant::now();
        let r = c.broadcast(&mut b, 0);
        println!(
            "root-result after {} ms: {}",
            t.elapsed().as_millis(),
            match r {
                Ok(()) => "ok".to_string(),
                Err(e) => format!("error: {e}"),
            }
        );
    } else {
        println!("reader-idle");
        std::thread::sleep(Duration::from_secs(120));
    }
}

/// Runs a job; returns every rank's output, failing on a non-zero exit.
fn run(job: &str, n: usize, env: &[(&str, &str)], limit: Duration) -> Vec<String> {
    run_per_rank(job, n, env, &|_| Vec::new(), limit)
}

fn run_per_rank(
    job: &str,
    n: usize,
    env: &[(&str, &str)],
    per_rank: &dyn Fn(usize) -> Vec<(&'static str, String)>,
    limit: Duration,
) -> Vec<String> {
    let mut vars: Vec<(&str, String)> = vec![
        (JOB_ENV, job.to_string()),
        ("SNCL_TRANSPORT", "shm".into()),
        ("SNCL_TIMEOUT_MS", "60000".into()),
    ];
    vars.extend(env.iter().map(|(k, v)| (*k, v.to_string())));
    let mut ranks = spawn_job_per_rank("child_rank", n, &vars, per_rank);
    let clean = wait_all(&mut ranks, Instant::now() + limit);
    let out: Vec<String> = ranks.iter_mut().map(|r| r.text()).collect();
    for (r, rank) in ranks.iter().enumerate() {
        let ok = rank.exit.as_ref().is_some_and(|(s, _)| s.success());
        assert!(
            clean && ok,
            "job {job} n={n} {env:?}: rank {r} did not succeed:\n{}",
            tail(&out[r], 30)
        );
    }
    out
}

fn check_all_ran(out: &[String]) {
    for (r, o) in out.iter().enumerate() {
        assert!(
            o.contains(&format!("rank {r} ran ")),
            "rank {r}:\n{}",
            tail(o, 20)
        );
    }
}

#[test]
fn all_collectives_with_single_copy_from_4k_pieces() {
    for n in [2, 4] {
        let out = run(
            "collectives",
            n,
            &[(CMA_ENV, "1"), (CMA_MIN_ENV, "4096")],
            Duration::from_secs(240),
        );
        check_all_ran(&out);
    }
}

#[test]
fn all_collectives_with_single_copy_at_default_threshold() {
    let out = run(
        "collectives",
        3,
        &[(CMA_ENV, "1")],
        Duration::from_secs(240),
    );
    check_all_ran(&out);
}

#[test]
fn all_collectives_with_single_copy_forced_off() {
    for n in [2, 4] {
        let out = run(
            "collectives",
            n,
            &[(CMA_ENV, "0")],
            Duration::from_secs(240),
        );
        check_all_ran(&out);
    }
}

#[test]
fn mixed_settings_agree_per_direction() {
    // Rank 0 turned off: it neither lends nor accepts lent pieces; the
    // others lend among themselves.
    let out = run_per_rank(
        "collectives",
        3,
        &[(CMA_MIN_ENV, "4096")],
        &|r| vec![(CMA_ENV, if r == 0 { "0" } else { "1" }.to_string())],
        Duration::from_secs(240),
    );
    check_all_ran(&out);
}

fn root_ms(env: &[(&str, &str)]) -> u128 {
    let out = run("sender_waits", 2, env, Duration::from_secs(60));
    let line = out[0]
        .lines()
        .find_map(|l| l.split_once("root-ms ").map(|(_, t)| t))
        .unwrap_or_else(|| panic!("no timing from the root:\n{}", tail(&out[0], 20)));
    line.trim().parse().expect("root-ms")
}

/// The root of a broadcast returns only once its reader has read what it
/// lent; with single copy off, as soon as its pieces are in the slots. The
/// root check (SNCL_CHECK_ROOTS) is off here: it makes every rank of a
/// rooted collective wait for every other at the start, late reader included.
#[test]
fn lending_sender_waits_for_its_reader_and_fallback_does_not() {
    let delay = READER_DELAY.as_millis();
    let no_check = ("SNCL_CHECK_ROOTS", "0");
    let lent = root_ms(&[(CMA_ENV, "1"), (CMA_MIN_ENV, "4096"), no_check]);
    assert!(
        lent >= delay / 2,
        "with single copy the root returned after {lent} ms, before its reader (late by \
         {delay} ms) could have read what it lent: was single copy on?"
    );
    let copied = root_ms(&[(CMA_ENV, "0"), no_check]);
    assert!(
        copied < delay / 2,
        "with single copy off the root's 1 MiB fits the slots, yet it took {copied} ms"
    );
}

#[test]
fn reader_killed_mid_operation_fails_the_sender_promptly() {
    let vars: Vec<(&str, String)> = vec![
        (JOB_ENV, "reader_killed".into()),
        ("SNCL_TRANSPORT", "shm".into()),
        ("SNCL_TIMEOUT_MS", "60000".into()),
        (CMA_ENV, "1".into()),
        (CMA_MIN_ENV, "4096".into()),
    ];
    let mut ranks = spawn_job("child_rank", 2, &vars);
    let deadline = Instant::now() + Duration::from_secs(60);
    assert!(
        ranks[1].wait_line("reader-idle", deadline) && ranks[0].wait_line("root-sending", deadline),
        "the job did not start:\n{}\n{}",
        tail(&ranks[0].text(), 20),
        tail(&ranks[1].text(), 20)
    );
    std::thread::sleep(Duration::from_millis(300));
    let _ = ranks[1].child.kill();
    let _ = ranks[1].child.wait();
    let killed = Instant::now();
    let finished = wait_all(&mut ranks[..1], killed + Duration::from_secs(30));
    let out = ranks[0].text();
    assert!(
        finished,
        "the root hung after its reader was killed:\n{}",
        tail(&out, 20)
    );
    let line = out
        .lines()
        .find(|l| l.contains("root-result"))
        .unwrap_or_else(|| panic!("no result from the root:\n{}", tail(&out, 20)));
    eprintln!("root after its reader was killed: {line}");
    assert!(
        line.contains("error") && line.contains("rank 1"),
        "the root should fail naming rank 1: {line}"
    );
    assert!(
        killed.elapsed() < Duration::from_secs(20),
        "the root took {:?} to notice (timeout 60 s)",
        killed.elapsed()
    );
}

#[test]
fn a_bad_setting_is_a_clear_init_error() {
    let vars: Vec<(&str, String)> = vec![
        (JOB_ENV, "collectives".into()),
        ("SNCL_TRANSPORT", "shm".into()),
        ("SNCL_TIMEOUT_MS", "20000".into()),
        (CMA_ENV, "maybe".into()),
    ];
    let mut ranks = spawn_job("child_rank", 2, &vars);
    assert!(wait_all(
        &mut ranks,
        Instant::now() + Duration::from_secs(60)
    ));
    let out = ranks[0].text();
    assert!(
        out.contains("init failed") && out.contains("SNCL_SHM_CMA=\"maybe\""),
        "{}",
        tail(&out, 20)
    );
}

#[test]
fn all_collectives_under_auto() {
    // `auto` (the default) lends only where reads are fast on this host:
    // whichever it decides, the results are right.
    let out = run(
        "collectives",
        2,
        &[(CMA_ENV, "auto")],
        Duration::from_secs(240),
    );
    check_all_ran(&out);
}

#[test]
fn threads_share_one_process() {
    // Ranks as threads (under the environment's setting, `auto` by
    // default) read their own process's memory where they lend.
    let cfg = sncl::Config {
        transport: comm_core::config::TransportChoice::Shm,
        timeout: Duration::from_secs(60),
        ..Default::default()
    };
    let comms = init(2, cfg);
    let errs = on_ranks(&comms, "cma-threads", |k| {
        for count in [7usize, 100_003, 1 << 19] {
            for (coll, dtype, op) in cases() {
                run_case(k, coll, dtype, op, count)?;
            }
        }
        Ok(())
    });
    assert_clean(errs);
}
