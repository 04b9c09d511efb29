//! The runtime's planner charges local reductions at the topology's
//! `intra.reduce_bandwidth` (as the simulator does): with a slow local
//! reduction it prefers algorithms that reduce fewer bytes per rank.

use sncl::{Collective, Communicator, Config, DataType};

fn choices(reduce_bytes_per_s: Option<f64>) -> Vec<(usize, &'static str)> {
    let mut cfg = Config::default();
    cfg.tiers.cluster.reduce_bytes_per_s = reduce_bytes_per_s;
    let comms = Communicator::init_threads(4, cfg).expect("init");
    let counts: Vec<usize> = (0..24).map(|k| 1usize << k).collect();
    counts
        .iter()
        .map(|&n| {
            let a = comms[0]
                .algorithm_for(Collective::AllReduce, DataType::Float32, n)
                .expect("plan");
            (n, a)
        })
        .collect()
}

#[test]
fn slow_reductions_change_the_choice() {
    let free = choices(None);
    let slow = choices(Some(50e6)); // 50 MB/s
    eprintln!("free {free:?}\nslow {slow:?}");
    // Recursive doubling reduces the whole buffer log2(n) times per rank,
    // the ring (n-1)/n of it: slow reductions move the switch to the ring
    // toward smaller messages, never the other way.
    for ((n, f), (_, s)) in free.iter().zip(&slow) {
        assert!(
            !(*s == "rd" && *f != "rd"),
            "{n} elements: rd only with slow reductions"
        );
    }
    assert!(
        free.iter()
            .zip(&slow)
            .any(|((_, f), (_, s))| *f == "rd" && *s == "ring"),
        "a 50 MB/s local reduction changes no all_reduce choice"
    );
}
