//! A schedule's size does not grow with the count: the largest operation
//! ([`MAX_MESSAGE_BYTES`]) at the smallest chunk (`SNCL_CHUNK_BYTES` = 64)
//! plans at most [`MAX_PIPELINE_CHUNKS`] pieces per buffer, so every
//! algorithm builds its schedule in bounded steps, memory and time.

use std::time::{Duration, Instant};

use comm_core::algo::{self, Params};
use comm_core::config::MIN_CHUNK_BYTES;
use comm_core::shape::MAX_MESSAGE_BYTES;
use comm_core::topo::Topology;
use comm_core::tune::{self, LinkCost, Shape, MAX_PIPELINE_CHUNKS};
use comm_core::wire::Collective;

#[test]
fn the_largest_operation_plans_a_bounded_schedule() {
    let n = 8;
    let link = LinkCost::TCP;
    for coll in [
        Collective::AllReduce,
        Collective::Broadcast,
        Collective::Reduce,
    ] {
        for row in algo::rows(coll) {
            let plan = tune::choose(
                coll,
                Some(row.algo),
                &Shape::flat(n, link),
                MAX_MESSAGE_BYTES,
                1,
                MIN_CHUNK_BYTES,
            )
            .expect("a plan");
            assert!(
                MAX_MESSAGE_BYTES.div_ceil(plan.chunk_elems) <= MAX_PIPELINE_CHUNKS,
                "{coll:?} {:?}: chunk {} elements",
                row.algo,
                plan.chunk_elems
            );
            let t = Instant::now();
            let p = Params {
                nranks: n,
                rank: 1,
                count: MAX_MESSAGE_BYTES,
                root: 0,
                chunk: plan.chunk_elems,
            };
            let Some(s) = algo::build(coll, row.algo, &p, &Topology::single_node(n)) else {
                continue;
            };
            let took = t.elapsed();
            eprintln!(
                "{coll:?} {:?}: {} steps in {took:?}",
                row.algo,
                s.steps.len()
            );
            assert!(
                s.steps.len() <= 4 * n * MAX_PIPELINE_CHUNKS,
                "{coll:?} {:?}: {} steps",
                row.algo,
                s.steps.len()
            );
            assert!(
                took < Duration::from_secs(5),
                "{coll:?} {:?}: {took:?}",
                row.algo
            );
        }
    }
}
