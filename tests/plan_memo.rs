//! The memoised plan end to end (issue 8 "no slowdown"): operations on
//! real communicators run exactly the algorithm the planner chooses afresh
//! (`Communicator::algorithm_for`) on the first and on every later
//! operation of a shape, and a forced algorithm takes effect on the next
//! operation of a shape already memoised. What ran is read back from the
//! flight recorder. (The memo against a fresh plan and schedule over a
//! wider sweep: `comm::plan::tests` in the library.)

mod rank_kit;

use std::time::Duration;

use rank_kit::flight_ops as ran;
use sncl::{Collective, Communicator, Config, DataType, ReduceOp};

fn comms(n: usize) -> Vec<Communicator> {
    let cfg = Config {
        timeout: Duration::from_secs(30),
        ..Config::default()
    };
    Communicator::init_threads(n, cfg).expect("init")
}

/// Counts around the planner's crossovers on 4 ranks (rd / ring / tree).
const COUNTS: [usize; 12] = [
    1,
    2,
    3,
    64,
    1000,
    4096,
    16_384,
    65_536,
    65_537,
    262_144,
    1 << 20,
    3 << 20,
];

#[test]
fn every_operation_runs_the_planners_fresh_choice() {
    let n = 4;
    std::thread::scope(|s| {
        for c in comms(n) {
            s.spawn(move || {
                let mut want = Vec::new();
                for &count in &COUNTS {
                    // Twice: the first plans, the second hits the memo.
                    for _ in 0..2 {
                        let send = vec![1.0f32; count];
                        let mut recv = vec![0.0f32; count];
                        c.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
                        assert!(recv.iter().all(|&x| x == n as f32), "{count}");
                        let algo = c
                            .algorithm_for(Collective::AllReduce, DataType::Float32, count)
                            .unwrap();
                        want.push(("all_reduce".to_string(), count, algo.to_string()));
                        // The same count of a wider type is another shape.
                        let send = vec![1.0f64; count];
                        let mut recv = vec![0.0f64; count];
                        c.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
                        assert!(recv.iter().all(|&x| x == n as f64), "{count}");
                        let algo = c
                            .algorithm_for(Collective::AllReduce, DataType::Float64, count)
                            .unwrap();
                        want.push(("all_reduce".to_string(), count, algo.to_string()));
                        let mut buf = vec![c.rank() as u32; count];
                        c.broadcast(&mut buf, 2).unwrap();
                        assert!(buf.iter().all(|&x| x == 2), "{count}");
                        let algo = c
                            .algorithm_for(Collective::Broadcast, DataType::Uint32, count)
                            .unwrap();
                        want.push(("broadcast".to_string(), count, algo.to_string()));
                    }
                }
                let got = ran(&c);
                assert_eq!(got, want, "rank {}", c.rank());
                // The sweep crosses at least one crossover of each.
                let algos = |op: &str| {
                    let mut a: Vec<&str> = want
                        .iter()
                        .filter(|w| w.0 == op)
                        .map(|w| w.2.as_str())
                        .collect();
                    a.dedup();
                    a.len()
                };
                assert!(algos("all_reduce") > 1, "{want:?}");
                assert!(algos("broadcast") > 1, "{want:?}");
            });
        }
    });
}

#[test]
fn forcing_takes_effect_on_a_memoised_shape() {
    std::thread::scope(|s| {
        for c in comms(2) {
            s.spawn(move || {
                let send = [1.0f32; 8];
                let mut recv = [0.0f32; 8];
                let mut run = |c: &Communicator| {
                    c.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
                    assert_eq!(recv, [2.0; 8]);
                    ran(c).last().expect("an entry").2.clone()
                };
                let default = c
                    .algorithm_for(Collective::AllReduce, DataType::Float32, 8)
                    .unwrap();
                assert_ne!(default, "ring", "pick another algorithm to force");
                assert_eq!(run(&c), default);
                assert_eq!(run(&c), default);
                c.force_algorithm(Collective::AllReduce, Some("ring"))
                    .unwrap();
                assert_eq!(run(&c), "ring");
                assert_eq!(run(&c), "ring");
                c.force_algorithm(Collective::AllReduce, None).unwrap();
                assert_eq!(run(&c), default);
            });
        }
    });
}
