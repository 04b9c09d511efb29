use super::*;
use crate::model::Tier;

fn cluster(nodes: usize, rpn: usize) -> Cluster {
    Cluster::new(
        nodes,
        rpn,
        Tier {
            bytes_per_s: 900e9,
            latency_us: 1.0,
        },
        Tier {
            bytes_per_s: 50e9,
            latency_us: 5.0,
        },
    )
}

fn training(dp: usize, tp: usize, pp: usize) -> Training {
    Training {
        params: 1e9,
        layers: 8,
        hidden: 1024,
        seq: 1024,
        micro_batch: 1,
        global_batch: 4 * dp,
        grad_bytes: 2,
        act_bytes: 2,
        dp,
        tp,
        pp,
        ep: 1,
        experts: 1,
        top_k: 1,
        capacity_factor: 1.0,
        sequence_parallel: false,
        recompute: false,
        zero: 0,
        step_compute_ms: 1000.0,
        price_per_hour: 2.0,
        steps: 10.0,
        dp_bucket_bytes: 25e6,
        overlap: Vec::new(),
        dp_compress: None,
    }
}

fn dim(c: &StepCost, d: Dim) -> &DimCost {
    c.dims
        .iter()
        .find(|x| x.dim == d)
        .expect("dimension present")
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

#[test]
fn dp_and_zero_volumes_match_hand_calculation() {
    let cl = cluster(2, 4);
    let map = Mapping::parse("dp:inter").unwrap();
    let mut t = training(8, 1, 1);
    let g = 1e9 * 2.0;
    let dp = 2.0 * 7.0 / 8.0 * g;
    let c0 = step_cost(&t, &map, &cl).unwrap();
    assert!(close(dim(&c0, Dim::Dp).bytes_per_rank, dp));
    for z in [1, 2] {
        t.zero = z;
        let c = step_cost(&t, &map, &cl).unwrap();
        assert!(close(dim(&c, Dim::Dp).bytes_per_rank, dp), "zero {z}");
    }
    t.zero = 3;
    let c3 = step_cost(&t, &map, &cl).unwrap();
    assert!(close(dim(&c3, Dim::Dp).bytes_per_rank, 1.5 * dp));
    assert!(dim(&c3, Dim::Dp).time_ms > dim(&c0, Dim::Dp).time_ms);
    // Per-tier split adds up, and the JSON-level numbers are sane.
    let d = dim(&c0, Dim::Dp);
    assert!(close(d.intra_bytes + d.inter_bytes, d.bytes_per_rank));
    assert!(c0.utilisation > 0.0 && c0.utilisation <= 1.0);
    assert!(c0.waiting_cost_per_step >= 0.0);
}

#[test]
fn tp_volumes_match_megatron() {
    let cl = cluster(2, 8);
    let map = Mapping::parse("tp:intra,dp:inter").unwrap();
    let mut t = training(2, 8, 1);
    let a = 1024.0 * 1024.0 * 2.0; // seq x micro-batch x hidden x 2 bytes
    let per_ar = 2.0 * 7.0 / 8.0 * a;
    let layers_mb = 8.0 * 4.0; // layers per stage x micro-batches
    let c = step_cost(&t, &map, &cl).unwrap();
    assert!(close(
        dim(&c, Dim::Tp).bytes_per_rank,
        4.0 * layers_mb * per_ar
    ));
    assert_eq!(dim(&c, Dim::Tp).ops, 4.0 * layers_mb);
    t.recompute = true;
    let c = step_cost(&t, &map, &cl).unwrap();
    assert!(close(
        dim(&c, Dim::Tp).bytes_per_rank,
        6.0 * layers_mb * per_ar
    ));
    t.sequence_parallel = true;
    let s = step_cost(&t, &map, &cl).unwrap();
    assert!(close(
        dim(&s, Dim::Tp).bytes_per_rank,
        6.0 * layers_mb * per_ar
    ));
    assert_eq!(dim(&s, Dim::Tp).collective, "reduce_scatter+all_gather");
    // TP inside the node never crosses it.
    assert_eq!(dim(&c, Dim::Tp).inter_bytes, 0.0);
    assert!(close(dim(&c, Dim::Tp).exposed_ms, dim(&c, Dim::Tp).time_ms));
}

#[test]
fn pp_bubble_and_overrides() {
    let cl = cluster(2, 4);
    let map = Mapping::parse("pp:intra,dp:inter").unwrap();
    let mut t = training(2, 1, 4);
    let c = step_cost(&t, &map, &cl).unwrap();
    assert!(close(c.bubble_ms, 1000.0 * 3.0 / 4.0));
    assert!(c.exposed_ms >= c.bubble_ms);
    t.overlap = vec![(Dim::Dp, 1.0)];
    let c2 = step_cost(&t, &map, &cl).unwrap();
    assert_eq!(dim(&c2, Dim::Dp).exposed_ms, 0.0);
}

#[test]
fn bad_configurations_are_errors() {
    let cl = cluster(2, 4);
    let map = Mapping::parse("dp:inter").unwrap();
    assert!(step_cost(&training(4, 1, 1), &map, &cl).is_err());
    assert!(Mapping::parse("tp:sideways").is_err());
    assert!(Mapping::parse("xp:intra").is_err());
    assert!(Mapping::parse("tp:intra,tp:inter").is_err());
    let mut t = training(8, 1, 1);
    t.global_batch = 7;
    assert!(step_cost(&t, &map, &cl).is_err());
}

#[test]
fn worked_example_recommends_tp_inside_the_supernode() {
    let cl = cluster(171, 384);
    let t = Training {
        params: 70e9,
        layers: 80,
        hidden: 8192,
        seq: 4096,
        micro_batch: 1,
        global_batch: 2052,
        dp: 2052,
        tp: 8,
        pp: 4,
        step_compute_ms: 2000.0,
        price_per_hour: 2.5,
        ..training(2052, 8, 4)
    };
    let inside = Mapping::parse("tp:intra,pp:intra,dp:inter").unwrap();
    let across = Mapping::parse("pp:intra,dp:intra,tp:inter").unwrap();
    let (ranked, reason) = compare(&t, &[across, inside.clone()], &cl).unwrap();
    for r in &ranked {
        eprintln!(
            "{} exposed {} bubble {}",
            r.mapping, r.exposed_ms, r.bubble_ms
        );
        for d in &r.dims {
            eprintln!(
                "  {:?} m {} g {} {} ops {} time {} exp {} algo {}",
                d.dim, d.per_node, d.nodes, d.collective, d.ops, d.time_ms, d.exposed_ms, d.algo
            );
        }
    }
    assert_eq!(ranked[0].mapping, inside.text(), "{reason}");
    assert!(reason.starts_with("recommend tp:intra"), "{reason}");
}

/// `commbench plan --compress`: the DP all-reduce on a slow tier costs about
/// the codec's share of its cross-node bytes (mxfp8 of bf16: 8.25 / 16),
/// the other dimensions nothing more; ZeRO > 0 is refused.
#[test]
fn a_compressed_dp_all_reduce_moves_the_codecs_share_across_nodes() {
    let cl = cluster(4, 8);
    let map = Mapping::parse("tp:intra,dp:inter").unwrap();
    let plain = training(4, 8, 1);
    let mx = Training {
        dp_compress: Some(8.25 / 16.0),
        ..training(4, 8, 1)
    };
    let a = step_cost(&plain, &map, &cl).unwrap();
    let b = step_cost(&mx, &map, &cl).unwrap();
    let (da, db) = (dim(&a, Dim::Dp), dim(&b, Dim::Dp));
    let share = db.inter_bytes / da.inter_bytes;
    assert!(
        (share - 8.25 / 16.0).abs() < 0.02,
        "cross-node bytes {share:.3} of uncompressed"
    );
    assert!(
        db.time_ms < da.time_ms,
        "{} vs {} ms",
        db.time_ms,
        da.time_ms
    );
    assert!(db.algo.contains("compressed"), "{}", db.algo);
    assert_eq!(dim(&a, Dim::Tp).time_ms, dim(&b, Dim::Tp).time_ms);
    let zero1 = Training { zero: 1, ..mx };
    assert!(step_cost(&zero1, &map, &cl).is_err());
}
