//! Round-robin numbering in the per-rank frame: programs derived from
//! rank 0's by rotating the ring or the (node, local index) grid, checked
//! against every rank's built program, and the time of a job whose ring
//! and `hier` are physically the node-major job's.

use super::*;
use crate::model::Slowdown;

fn cluster(nodes: usize, rpn: usize, placement: Placement) -> Cluster {
    let mut cl = Cluster::per_rank_test(nodes, rpn);
    cl.placement = placement;
    cl
}

fn req(coll: Collective, algo: Algorithm, bytes: usize) -> Request {
    Request {
        frame: Frame::PerRank,
        ..Request::new(coll, Some(algo), bytes)
    }
}

/// Every rank's derived program is its built one (step by step and
/// merged), for rings and `hier` of the three collectives, on odd shapes
/// and an uneven count.
#[test]
fn round_robin_programs_are_rotations_of_rank_zero_for_every_rank() {
    for (nodes, rpn) in [(5, 6), (3, 7), (6, 4)] {
        let cl = cluster(nodes, rpn, Placement::RoundRobin);
        for (coll, algo) in [
            (Collective::AllReduce, Algorithm::Ring),
            (Collective::AllReduce, Algorithm::FlatRing),
            (Collective::AllReduce, Algorithm::Hier),
            (Collective::AllGather, Algorithm::Ring),
            (Collective::AllGather, Algorithm::Hier),
            (Collective::ReduceScatter, Algorithm::Ring),
            (Collective::ReduceScatter, Algorithm::Hier),
        ] {
            // Merged (runs of steps within 2 %) with uneven parts; rings
            // also step by step (runs of exactly equal steps) with parts of
            // equal size (`hier`'s exact runs need not rotate: its spot
            // checks then build every rank).
            let even = 4 * cl.nranks() * 8192;
            let mut cases = vec![(SYMMETRIC_MERGE_TOLERANCE, 1_000_036)];
            if algo != Algorithm::Hier {
                cases.push((-1.0, even));
            }
            for (tolerance, bytes) in cases {
                let r = Request {
                    chunk_bytes: 4 << 10,
                    ..req(coll, algo, bytes)
                };
                let (a, chunk, count) = planned(&cl, &r).unwrap();
                assert_eq!(a, algo);
                let ex = Exec {
                    cl: &cl,
                    req: &r,
                    algo: a,
                    chunk,
                    symmetric: false,
                    entities: cl.nranks(),
                };
                let what = format!("{nodes}x{rpn} {} {} {tolerance}", coll.name(), a.name());
                let rot = ex
                    .rotated(count, tolerance)
                    .unwrap()
                    .unwrap_or_else(|| panic!("{what}: no rotation"));
                for (k, derived) in rot.iter().enumerate() {
                    let built = crate::program::Program::from_schedule(
                        &ex.build(k, count).unwrap(),
                        4,
                        tolerance,
                    );
                    assert!(alike(derived, &built, 4.0), "{what}: rank {k}");
                }
            }
        }
    }
}

/// A derivation that does not hold is refused. Step by step with uneven
/// parts (141 and 142 elements), exactly equal steps form runs that do not
/// rotate (rank 0's sizes 142…142 141…141 are two runs, a later rank's
/// three): the schedules rotate but the programs do not, and `rotated`
/// says so (every rank is then built). And `hier`'s programs moved as a
/// flat ring's would be (peers + r) differ from the built ones.
#[test]
fn the_spot_checks_catch_a_wrong_rotation() {
    let cl = cluster(5, 6, Placement::RoundRobin);
    let r = Request {
        chunk_bytes: 4 << 10,
        ..req(Collective::AllReduce, Algorithm::Ring, 1_000_036)
    };
    let (a, chunk, count) = planned(&cl, &r).unwrap();
    let ex = Exec {
        cl: &cl,
        req: &r,
        algo: a,
        chunk,
        symmetric: false,
        entities: cl.nranks(),
    };
    assert!(ex.rotated(count, -1.0).unwrap().is_none());
    assert!(ex
        .rotated(count, SYMMETRIC_MERGE_TOLERANCE)
        .unwrap()
        .is_some());
    let r = req(Collective::AllReduce, Algorithm::Hier, 1 << 20);
    let (a, chunk, count) = planned(&cl, &r).unwrap();
    let ex = Exec {
        cl: &cl,
        req: &r,
        algo: a,
        chunk,
        symmetric: false,
        entities: cl.nranks(),
    };
    let p0 = crate::program::Program::from_schedule(&ex.build(0, count).unwrap(), 4, -1.0);
    let built = crate::program::Program::from_schedule(&ex.build(7, count).unwrap(), 4, -1.0);
    assert!(!alike(&derive::shifted(&p0, 7, 30), &built, 4.0));
}

/// Round-robin `ring` and `hier` are the node-major job with the ranks
/// renamed (the ring runs node by node either way): at 32 x 384 = 12,288
/// ranks, above what was built rank by rank, the per-rank frame predicts
/// the node-major time, and a straggler is still named.
#[test]
fn round_robin_ring_and_hier_at_12288_ranks_match_node_major() {
    for algo in [Algorithm::Ring, Algorithm::Hier] {
        let r = req(Collective::AllReduce, algo, 1 << 30);
        let t = std::time::Instant::now();
        let rr = simulate(&cluster(32, 384, Placement::RoundRobin), &r).unwrap();
        let rr_s = t.elapsed().as_secs_f64();
        let nm = simulate(&cluster(32, 384, Placement::NodeMajor), &r).unwrap();
        eprintln!(
            "{}: round-robin {:.1} us in {rr_s:.1} s, node-major {:.1} us",
            algo.name(),
            rr.time_us,
            nm.time_us
        );
        assert!(!rr.symmetric && rr.wait_us.len() == 12_288);
        assert!(
            (rr.time_us - nm.time_us).abs() <= 1e-6 * nm.time_us,
            "{}: round-robin {} us, node-major {} us",
            algo.name(),
            rr.time_us,
            nm.time_us
        );
        assert!((rr.cross_share() - nm.cross_share()).abs() < 1e-9);
    }
    let mut slow = cluster(32, 384, Placement::RoundRobin);
    slow.slowdowns.push(Slowdown::straggler(7, 2.0));
    let p = simulate(&slow, &req(Collective::AllReduce, Algorithm::Hier, 1 << 30)).unwrap();
    let b = p.critical.as_ref().unwrap().bottleneck(&slow).unwrap();
    assert_eq!(b.node.0, 7, "{b:?}");
}
