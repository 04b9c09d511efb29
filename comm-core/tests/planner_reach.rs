//! What the planner must do whatever its cost formulas say, over a grid of
//! collectives, layouts, tiers, sizes, element sizes and chunks: unforced
//! plans exist for every case, a forced algorithm is run as forced (or
//! refused where it cannot run), the `Config` form answers as the explicit
//! one, and the grid reaches every automatic choice the table offers.
//!
//! Whether a choice is the *fastest* is not a question for formulas: the
//! measured oracle (commbench/tests/planner_oracle.rs, `scripts/sweep-planner.py
//! --quick`) times every algorithm against the default on this machine.
//! (This file replaces a test that compared the planner with a frozen copy
//! of its own earlier formulas, issue 35 item 5.)

use comm_core::algo::Algorithm;
use comm_core::config::Config;
use comm_core::tune::{self, LinkCost, Shape};
use comm_core::wire::Collective;

const ALGOS: [Algorithm; 6] = Algorithm::ALL;

/// Tier pairs: the built-in ones, a slow and a fast network, a latency-bound
/// one, and an inter tier faster than intra.
fn tiers() -> Vec<(LinkCost, LinkCost)> {
    let lc = |alpha_us: f64, bytes_per_us: f64| LinkCost {
        alpha_us,
        bytes_per_us,
    };
    vec![
        (LinkCost::SHM, LinkCost::TCP),
        (LinkCost::TCP, LinkCost::TCP),
        (LinkCost::SHM, lc(50.0, 120.0)),
        (LinkCost::SHM, lc(5.0, 25_000.0)),
        (lc(0.3, 50_000.0), lc(200.0, 12.5)),
        (lc(20.0, 100.0), lc(1.0, 10_000.0)),
    ]
}

/// (ranks, nodes, most ranks on one node) as `Inner::new` derives them from a
/// topology: one node, nodes of equal size, uneven nodes, one rank per node.
fn layouts() -> Vec<(usize, usize, usize)> {
    let mut v = Vec::new();
    for n in [1usize, 2, 3, 4, 5, 7, 8, 16, 17, 64, 1024] {
        v.push((n, 1, n));
        v.push((n, n, 1));
        for per in [2usize, 4, 8] {
            if n > per {
                v.push((n, n.div_ceil(per), per));
            }
        }
        if n >= 6 {
            // Uneven: one big node and singletons.
            v.push((n, n - 3, 4));
        }
    }
    v
}

fn sizes() -> Vec<usize> {
    let mut v = vec![0, 1, 3, 7, 100, 1000, 4095, 4097, 65_537, 1_000_003];
    v.extend((0..=32).step_by(2).map(|s| 1usize << s));
    v
}

fn shapes() -> Vec<Shape> {
    let mut v = Vec::new();
    for (nranks, nnodes, max_local) in layouts() {
        for (intra, inter) in tiers() {
            v.push(Shape {
                nranks,
                nnodes,
                max_local,
                intra,
                inter,
            });
        }
    }
    v
}

#[test]
fn plans_exist_forcing_is_obeyed_and_every_choice_is_reachable() {
    let mut chosen = std::collections::HashSet::new();
    let mut checked = 0usize;
    for coll in Collective::ALL.into_iter().filter(|c| c.is_scheduled()) {
        for sh in shapes() {
            for chunk_bytes in [64usize, 256 << 10, 1 << 30] {
                for elem_size in [1usize, 4, 8] {
                    for bytes in sizes() {
                        let bytes = bytes / elem_size * elem_size;
                        let what = format!(
                            "{} shape={sh:?} bytes={bytes} elem={elem_size} chunk={chunk_bytes}",
                            coll.name()
                        );
                        let auto = tune::choose(coll, None, &sh, bytes, elem_size, chunk_bytes)
                            .unwrap_or_else(|e| panic!("no unforced plan: {what}: {e}"));
                        assert!(auto.chunk_elems >= 1, "{what}: chunk {}", auto.chunk_elems);
                        chosen.insert((coll, auto.algo));
                        for forced in ALGOS {
                            if let Ok(p) =
                                tune::choose(coll, Some(forced), &sh, bytes, elem_size, chunk_bytes)
                            {
                                assert_eq!(p.algo, forced, "forced {forced:?}: {what}");
                            }
                        }
                        checked += 1;
                    }
                }
            }
        }
    }
    eprintln!("{checked} cases planned");
    for (coll, algo) in [
        (Collective::AllReduce, Algorithm::Ring),
        (Collective::AllReduce, Algorithm::Rd),
        (Collective::AllReduce, Algorithm::Hier),
        (Collective::ReduceScatter, Algorithm::Ring),
        (Collective::ReduceScatter, Algorithm::Hier),
        (Collective::AllGather, Algorithm::Ring),
        (Collective::AllGather, Algorithm::Hier),
        (Collective::Broadcast, Algorithm::Tree),
        (Collective::Broadcast, Algorithm::Ring),
        (Collective::Broadcast, Algorithm::Hier),
        (Collective::Reduce, Algorithm::Tree),
        (Collective::Reduce, Algorithm::Ring),
        (Collective::Reduce, Algorithm::Hier),
    ] {
        assert!(
            chosen.contains(&(coll, algo)),
            "the grid never makes the planner pick {} for {}",
            algo.name(),
            coll.name()
        );
    }
}

/// The `Config` form gives the same answers as the explicit one.
#[test]
fn config_form_matches_the_explicit_form() {
    let sh = Shape {
        nranks: 8,
        nnodes: 4,
        max_local: 2,
        intra: LinkCost::SHM,
        inter: LinkCost {
            alpha_us: 50.0,
            bytes_per_us: 120.0,
        },
    };
    for coll in Collective::ALL.into_iter().filter(|c| c.is_scheduled()) {
        for forced in std::iter::once(None).chain(ALGOS.map(Some)) {
            for bytes in [8usize, 1 << 16, 64 << 20] {
                let cfg = Config {
                    algo: forced.map(|a| vec![(coll, a)]).unwrap_or_default(),
                    chunk_bytes: 4096,
                    ..Config::default()
                };
                let explicit = tune::choose(coll, forced, &sh, bytes, 4, 4096)
                    .map(|p| (p.algo, p.chunk_elems))
                    .map_err(|_| ());
                let configured = tune::plan(&cfg, coll, &sh, bytes, 4)
                    .map(|p| (p.algo, p.chunk_elems))
                    .map_err(|_| ());
                assert_eq!(
                    explicit,
                    configured,
                    "{} forced={forced:?} bytes={bytes}",
                    coll.name()
                );
            }
        }
    }
}
