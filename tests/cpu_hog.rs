//! Bounded busy-polling: a 2-rank 1 MiB all-reduce with busy threads
//! competing for the cores stays within 2× of its time without them.
//!
//! A measurement, not a regression test: on a loaded machine (CI, shared
//! builders) "without them" is not quiet, so it is ignored by default. Run
//! it on an otherwise idle machine:
//!
//! ```sh
//! cargo test --profile test --test cpu_hog -- --ignored --nocapture --test-threads=1
//! ```
//!
//! The hog is one busy thread per two cores (one on a 2-core machine), so
//! at least one rank shares its core with it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use comm_core::config::TransportChoice;
use sncl::{Communicator, Config, ReduceOp};

const COUNT: usize = 1 << 18; // 1 MiB of f32
const ITERS: usize = 200;

/// Median time of one all-reduce over `ITERS` (after a warm-up).
fn median_all_reduce(comms: &[Communicator]) -> Duration {
    let times: Vec<Vec<Duration>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let send = vec![1.0f32; COUNT];
                    let mut recv = vec![0.0f32; COUNT];
                    for _ in 0..10 {
                        c.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
                    }
                    (0..ITERS)
                        .map(|_| {
                            let t = Instant::now();
                            c.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
                            t.elapsed()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Per iteration the slower rank, then the median.
    let mut per_iter: Vec<Duration> = (0..ITERS)
        .map(|i| times.iter().map(|t| t[i]).max().unwrap())
        .collect();
    per_iter.sort();
    per_iter[ITERS / 2]
}

fn measure(transport: TransportChoice) -> (Duration, Duration) {
    let cfg = Config {
        transport,
        ..Config::default()
    };
    let comms = Communicator::init_threads(2, cfg).unwrap();
    let quiet = median_all_reduce(&comms);
    let stop = AtomicBool::new(false);
    let hogs = std::thread::available_parallelism()
        .map(|c| c.get() / 2)
        .unwrap_or(1)
        .max(1);
    let hogged = std::thread::scope(|s| {
        for _ in 0..hogs {
            s.spawn(|| {
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            });
        }
        let t = median_all_reduce(&comms);
        stop.store(true, Ordering::Relaxed);
        t
    });
    (quiet, hogged)
}

#[test]
#[ignore = "a measurement that needs an otherwise idle machine; scripts/test.sh --long"]
fn one_mib_all_reduce_with_a_cpu_hog_stays_within_twice_its_quiet_time() {
    for transport in [TransportChoice::Tcp, TransportChoice::Auto] {
        let (quiet, hogged) = measure(transport);
        let ratio = hogged.as_secs_f64() / quiet.as_secs_f64();
        eprintln!("{transport:?}: quiet {quiet:?}, with hog {hogged:?}, ratio {ratio:.2}");
        assert!(
            ratio <= 2.0,
            "{transport:?}: with a CPU hog the 1 MiB all-reduce took {hogged:?}, {ratio:.2}x its quiet {quiet:?}"
        );
    }
}
