//! The device path runs large operations in segments whose staging is
//! allocated once, at device bind: each segment's footprint (the larger of
//! its send and receive extents, in elements) must bound what any
//! algorithm's schedule needs beside the caller's buffers. This test walks
//! every algorithm of every collective the device path runs, over rank
//! counts, node layouts, counts and chunks, and holds each need
//! ([`StagingNeeds`]) to the footprint (the device binding sizes its
//! buffers by it). Deterministic mode's schedules too.

use comm_core::algo::{self, Input, Params};
use comm_core::schedule::StagingNeeds;
use comm_core::topo::Topology;
use comm_core::wire::Collective;

fn footprint(coll: Collective, n: usize, count: usize) -> usize {
    match coll {
        Collective::AllReduce | Collective::Broadcast | Collective::Reduce => count,
        _ => n * count,
    }
}

#[test]
fn every_algorithm_needs_at_most_its_footprint() {
    let mut worst = [0f64; 3];
    let mut checked = 0;
    for coll in Collective::UNIFORM {
        for row in algo::rows(coll) {
            for n in [2usize, 3, 4, 5, 8, 16] {
                let topos = [
                    Topology::single_node(n),
                    Topology::from_node_of((0..n).map(|r| r % 2).collect()),
                    Topology::from_node_of((0..n).map(|r| r / 2).collect()),
                ];
                for topo in &topos {
                    for count in [1usize, 7, 1000] {
                        for chunk in [1usize, 64, count] {
                            for rank in 0..n {
                                let p = Params {
                                    nranks: n,
                                    rank,
                                    count,
                                    root: n / 2,
                                    chunk,
                                };
                                let input = Input {
                                    p,
                                    topo,
                                    blocks: algo::Blocks::Uniform,
                                    check_roots: true,
                                };
                                let built = [
                                    algo::build(coll, row.algo, &p, topo),
                                    algo::build_deterministic(coll, row.algo, &input),
                                ];
                                for (s, deterministic) in built.iter().zip([false, true]) {
                                    let Some(s) = s else { continue };
                                    checked += 1;
                                    let f = footprint(coll, n, count);
                                    let needs: StagingNeeds = s.staging_needs();
                                    let got = [needs.scratch, needs.step_sends, needs.region];
                                    for (i, &g) in got.iter().enumerate() {
                                        worst[i] = worst[i].max(g as f64 / f as f64);
                                        assert!(
                                            g <= f,
                                            "{coll:?} {:?} deterministic={deterministic} n={n} \
                                             rank={rank} count={count} chunk={chunk} nodes={}: \
                                             {needs:?} for a footprint of {f}",
                                            row.algo,
                                            topo.nnodes()
                                        );
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    eprintln!(
        "{checked} schedules; worst ratios to the footprint: scratch {:.2}, step sends {:.2}, \
         region {:.2}",
        worst[0], worst[1], worst[2]
    );
    assert!(checked > 1000, "only {checked} schedules were built");
}
