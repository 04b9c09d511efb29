//! The per-rank frame's asymmetric cases: slow nodes, degraded links, the
//! critical path, and the 65,664-rank job of issue 34.

use super::*;
use crate::model::{Slowdown, Tier};

fn cluster(nodes: usize, rpn: usize) -> Cluster {
    Cluster::per_rank_test(nodes, rpn)
}

fn hier(bytes: usize, frame: Frame, aggregate: Option<bool>) -> Request {
    Request {
        frame,
        aggregate,
        ..Request::new(Collective::AllReduce, Some(Algorithm::Hier), bytes)
    }
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs())
}

#[test]
fn aggregated_runs_match_step_by_step_with_a_slow_node_and_name_it() {
    let cases = [
        Slowdown::straggler(3, 2.0),
        Slowdown::degraded_link(3, 4.0),
        Slowdown {
            compute: 3.0,
            ..Slowdown::straggler(3, 1.0)
        },
        // Mixed transports: node 3's NICs on TCP, or its ranks on host
        // shared memory, where the others have RDMA and NVLink.
        Slowdown::other_transport(
            3,
            &cluster(8, 16),
            None,
            Some(Tier {
                bytes_per_s: 12.5e9,
                latency_us: 30.0,
            }),
        )
        .unwrap(),
        Slowdown::other_transport(
            3,
            &cluster(8, 16),
            Some(Tier {
                bytes_per_s: 25e9,
                latency_us: 5.0,
            }),
            None,
        )
        .unwrap(),
    ];
    let quiet = simulate(&cluster(8, 16), &hier(256 << 20, Frame::PerRank, None)).unwrap();
    for slow in cases {
        let mut cl = cluster(8, 16);
        cl.slowdowns.push(slow);
        let step = simulate(&cl, &hier(256 << 20, Frame::PerRank, Some(false))).unwrap();
        let agg = simulate(&cl, &hier(256 << 20, Frame::PerRank, Some(true))).unwrap();
        assert!(
            step.time_us > quiet.time_us * 1.05,
            "{slow:?} slows nothing"
        );
        assert!(
            close(step.time_us, agg.time_us, 0.005),
            "{slow:?}: step by step {} us, aggregated {} us",
            step.time_us,
            agg.time_us
        );
        assert!(close(step.wait_mean_us, agg.wait_mean_us, 0.02), "{slow:?}");
        for p in [&step, &agg] {
            let path = p.critical.as_ref().expect("per-rank runs record the path");
            // The path is contiguous: its stretches add up to the time.
            assert!(
                close(path.total_us(), p.time_us, 1e-6),
                "{slow:?}: path {} us, time {} us",
                path.total_us(),
                p.time_us
            );
            let b = path.bottleneck(&cl).unwrap();
            assert_eq!(b.node.0, 3, "{slow:?}: bottleneck {b:?}");
            assert!(b.node.1 > 0.5 * b.path_us, "{slow:?}: {b:?}");
        }
    }
}

#[test]
fn a_mildly_degraded_link_is_the_paths_link_and_charged_to_its_node() {
    let mut cl = cluster(8, 16);
    cl.slowdowns.push(Slowdown::degraded_link(6, 1.3));
    let p = simulate(&cl, &hier(256 << 20, Frame::PerRank, None)).unwrap();
    let b = p.critical.unwrap().bottleneck(&cl).unwrap();
    // The receiving node's own work after the link also lies on the path
    // (its reductions and all-gather), so the node with the most path time
    // may be the receiver; the link is the degraded one, charged to node 6
    // and not to the receiver.
    assert!(b.per_node_us[6] > 0.4 * b.path_us, "{b:?}");
    let ((from, to, inter), _) = b.link;
    assert!(inter && cl.node_of(from as usize) == 6 && cl.node_of(to as usize) != 6);
}

#[test]
fn the_symmetric_frame_refuses_a_slow_node_and_auto_runs_per_rank() {
    let mut cl = cluster(8, 16);
    cl.slowdowns.push(Slowdown::straggler(2, 2.0));
    let e = simulate(&cl, &hier(64 << 20, Frame::Symmetric, None)).unwrap_err();
    assert!(e.to_string().contains("no slow node"), "{e}");
    let p = simulate(&cl, &hier(64 << 20, Frame::Auto, None)).unwrap();
    assert!(!p.symmetric && p.critical.is_some());
    for bad in [
        Slowdown::straggler(8, 2.0),
        Slowdown::straggler(1, 0.5),
        Slowdown::degraded_link(1, f64::NAN),
    ] {
        let mut cl = cluster(8, 16);
        cl.slowdowns.push(bad);
        let e = simulate(&cl, &hier(64 << 20, Frame::Auto, None)).unwrap_err();
        assert!(e.to_string().contains("slowdown of node"), "{bad:?}: {e}");
    }
}

/// Issue 34's target: 65,664 ranks (171 x 384), hierarchical all-reduce of
/// 1 GiB, every rank's schedule, one straggler node: within 60 s here, the
/// critical path names the straggler, and on the symmetric case the
/// per-rank frame agrees with the symmetric one within 1 %.
#[test]
fn per_rank_frame_at_65664_ranks_names_the_straggler() {
    let cl = cluster(171, 384);
    let t = std::time::Instant::now();
    let per_rank = simulate(&cl, &hier(1 << 30, Frame::PerRank, None)).unwrap();
    let quiet_s = t.elapsed().as_secs_f64();
    let symmetric = simulate(&cl, &hier(1 << 30, Frame::Symmetric, None)).unwrap();
    assert!(!per_rank.symmetric && per_rank.wait_us.len() == 65_664);
    assert!(
        close(per_rank.time_us, symmetric.time_us, 0.01),
        "per-rank {} us, symmetric {} us",
        per_rank.time_us,
        symmetric.time_us
    );
    let mut slow = cl.clone();
    slow.slowdowns.push(Slowdown::straggler(100, 2.0));
    let t = std::time::Instant::now();
    let p = simulate(&slow, &hier(1 << 30, Frame::Auto, None)).unwrap();
    let straggler_s = t.elapsed().as_secs_f64();
    let b = p.critical.as_ref().unwrap().bottleneck(&slow).unwrap();
    eprintln!(
        "65,664 ranks, 1 GiB hier all-reduce, per-rank frame: {quiet_s:.1} s quiet ({:.1} us, \
         symmetric {:.1} us), {straggler_s:.1} s with node 100 at half speed ({:.1} us; \
         critical path: node {} {:.0} %, link {:?})",
        per_rank.time_us,
        symmetric.time_us,
        p.time_us,
        b.node.0,
        100.0 * b.node.1 / b.path_us,
        b.link.0
    );
    assert_eq!(b.node.0, 100, "{:?}", (b.node, b.rank, b.link));
    assert!(p.time_us > per_rank.time_us * 1.05);
    assert!(quiet_s < 60.0 && straggler_s < 60.0);
}

/// Mixed transports: a node on another transport takes its bandwidth as a
/// factor and its latency as an addition to every message of its links;
/// one that beats the cluster's tier is refused.
#[test]
fn a_node_on_another_transport_pays_its_latency_on_every_message() {
    let cl = cluster(8, 16);
    let tcp = Tier {
        bytes_per_s: 12.5e9,
        latency_us: 30.0,
    };
    let s = Slowdown::other_transport(5, &cl, None, Some(tcp)).unwrap();
    assert_eq!((s.intra, s.inter, s.compute), (1.0, 4.0, 1.0));
    assert_eq!((s.intra_extra_us, s.inter_extra_us), (0.0, 25.0));
    let rdma_plus = Tier {
        bytes_per_s: 60e9,
        latency_us: 5.0,
    };
    let e = Slowdown::other_transport(5, &cl, None, Some(rdma_plus)).unwrap_err();
    assert!(e.to_string().contains("beats the cluster's"), "{e}");

    // Latency only (the same bandwidth, 100 us more a message): a small
    // ring all-reduce, whose steps wait on node 5's NIC in turn, takes at
    // least that much longer per step that crosses it.
    let ring = |cl: &Cluster| {
        simulate(
            cl,
            &Request {
                frame: Frame::PerRank,
                ..Request::new(Collective::AllReduce, Some(Algorithm::Ring), 64 << 10)
            },
        )
        .unwrap()
    };
    let quiet = ring(&cl);
    let mut slow_cl = cl.clone();
    let far = Tier {
        bytes_per_s: 50e9,
        latency_us: 105.0,
    };
    slow_cl
        .slowdowns
        .push(Slowdown::other_transport(5, &slow_cl, None, Some(far)).unwrap());
    let slow = ring(&slow_cl);
    // Every one of the ring's 2 (n - 1) steps waits for its slowest
    // message, so at least one 100 us message lies on the path.
    assert!(
        slow.time_us >= quiet.time_us + 100.0,
        "{} us against {} us",
        slow.time_us,
        quiet.time_us
    );
    let b = slow.critical.unwrap().bottleneck(&slow_cl).unwrap();
    assert!(b.per_node_us[5] > 0.0, "{b:?}");
}
