//! Round trips, error bounds, top-k selection, corrupt input and error
//! feedback, through the public API only.

use compress::{Codec, CompressError, ErrorFeedback};
use proptest::prelude::*;

/// Gradient-like data: finite values spanning a range of magnitudes, with
/// some exact zeros and runs of zeros.
fn grad_vec(max_len: usize) -> impl Strategy<Value = Vec<f32>> {
    (
        prop::collection::vec(
            prop_oneof![
                6 => -1.0f32..1.0,
                1 => -1e-6f32..1e-6,
                1 => -100.0f32..100.0,
                1 => Just(0.0f32),
            ],
            0..max_len,
        ),
        -30i32..30,
        prop::option::of((0usize..max_len, 0usize..600)),
    )
        .prop_map(|(mut v, e, zeros)| {
            let s = 2f32.powi(e);
            for x in &mut v {
                *x *= s;
            }
            if let Some((start, len)) = zeros {
                let start = start.min(v.len());
                let end = (start + len).min(v.len());
                v[start..end].fill(0.0);
            }
            v
        })
}

fn dense_codecs() -> Vec<Codec> {
    [
        "fp16",
        "bf16",
        "int8",
        "int8:512",
        "int8:64",
        "int8:37",
        "int8-sr",
        "int8-sr:100",
        "mxfp8",
        "mxfp8-e5m2",
        "mxfp4",
    ]
    .iter()
    .map(|s| Codec::parse(s).unwrap())
    .collect()
}

fn all_codecs() -> Vec<Codec> {
    let mut v = dense_codecs();
    for s in ["topk:0.01", "topk-exact:0.01", "topk:0.2", "topk-exact:0.5"] {
        v.push(Codec::parse(s).unwrap());
    }
    v
}

fn mag_sorted_desc(v: impl Iterator<Item = f32>) -> Vec<f32> {
    let mut m: Vec<f32> = v.map(f32::abs).collect();
    m.sort_by(|a, b| b.total_cmp(a));
    m
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn dense_round_trip_within_bound(v in grad_vec(3000)) {
        for c in dense_codecs() {
            let mut enc = Vec::new();
            c.encode(&v, &mut enc);
            prop_assert_eq!(enc.len(), c.max_encoded_len(v.len()), "{}", c);
            let mut out = vec![f32::NAN; v.len()];
            c.decode(&enc, v.len(), &mut out).unwrap();
            let bound = c.error_bound(&v);
            for (i, (&x, &y)) in v.iter().zip(&out).enumerate() {
                prop_assert!((x - y).abs() <= bound, "{} [{}]: {} -> {} (bound {})", c, i, x, y, bound);
            }
            // decode_add adds exactly the decoded values.
            let mut acc: Vec<f32> = (0..v.len()).map(|i| i as f32 * 0.5).collect();
            let expect: Vec<f32> = acc.iter().zip(&out).map(|(a, d)| a + d).collect();
            c.decode_add(&enc, v.len(), &mut acc).unwrap();
            prop_assert_eq!(acc, expect);
        }
    }

    #[test]
    fn int8_zero_blocks_decode_to_exact_zero(v in grad_vec(2000), block in 1usize..300, sr in any::<bool>()) {
        let c = Codec::Int8 { block, stochastic: sr };
        let mut enc = Vec::new();
        c.encode(&v, &mut enc);
        let mut out = vec![1.0f32; v.len()];
        c.decode(&enc, v.len(), &mut out).unwrap();
        for (b, (src, dec)) in v.chunks(block).zip(out.chunks(block)).enumerate() {
            if src.iter().all(|&x| x == 0.0) {
                prop_assert!(dec.iter().all(|&x| x == 0.0), "block {} not zero", b);
                let s = &enc[b * (block + 4)..b * (block + 4) + 4];
                prop_assert_eq!(s, &[0u8; 4][..]);
            }
        }
    }

    #[test]
    fn topk_exact_keeps_the_k_largest(v in grad_vec(3000), ratio in 0.001f64..1.0) {
        let c = Codec::TopK { ratio, sampled: false };
        let n = v.len();
        let k = c.topk_k(n).unwrap();
        let mut enc = Vec::new();
        c.encode(&v, &mut enc);
        prop_assert_eq!(enc.len(), 4 + 8 * k);
        prop_assert_eq!(enc.len(), c.max_encoded_len(n));
        let mut out = vec![f32::NAN; n];
        c.decode(&enc, n, &mut out).unwrap();
        // Kept values are exact; the multiset of kept magnitudes is the k
        // largest.
        let kept: Vec<usize> = decode_indices(&enc);
        prop_assert_eq!(kept.len(), k);
        prop_assert!(kept.windows(2).all(|w| w[0] < w[1]));
        for &i in &kept {
            prop_assert_eq!(out[i].to_bits(), v[i].to_bits());
        }
        let want = mag_sorted_desc(v.iter().copied());
        let got = mag_sorted_desc(kept.iter().map(|&i| v[i]));
        prop_assert_eq!(&got[..], &want[..k]);
        check_dropped(&c, &v, &out, &kept)?;
    }

    #[test]
    fn topk_sampled_keeps_about_k(v in grad_vec(20_000), ratio in 0.001f64..0.5) {
        let c = Codec::TopK { ratio, sampled: true };
        let n = v.len();
        let k = c.topk_k(n).unwrap();
        let mut enc = Vec::new();
        c.encode(&v, &mut enc);
        prop_assert!(enc.len() <= c.max_encoded_len(n));
        let kept = decode_indices(&enc);
        prop_assert!(kept.len() >= k.div_ceil(2) && kept.len() <= 2 * k, "kept {} for k {}", kept.len(), k);
        prop_assert!(kept.windows(2).all(|w| w[0] < w[1]));
        let mut out = vec![f32::NAN; n];
        c.decode(&enc, n, &mut out).unwrap();
        for &i in &kept {
            prop_assert_eq!(out[i].to_bits(), v[i].to_bits());
        }
        check_dropped(&c, &v, &out, &kept)?;
    }

    /// Any truncation or extension is an error; any other corruption is an
    /// error or a successful decode, never a panic; on error the output is
    /// untouched.
    #[test]
    fn corrupt_input_never_panics(
        v in grad_vec(600),
        cut in 1usize..64,
        extra in 1usize..9,
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
    ) {
        for c in all_codecs() {
            let n = v.len();
            let mut enc = Vec::new();
            c.encode(&v, &mut enc);
            let mut out = vec![3.0f32; n];
            if !enc.is_empty() {
                let t = &enc[..enc.len().saturating_sub(cut)];
                prop_assert!(c.decode(t, n, &mut out).is_err(), "{} truncated", c);
                prop_assert!(out.iter().all(|&x| x == 3.0));
            }
            let mut longer = enc.clone();
            longer.extend(std::iter::repeat_n(0u8, extra));
            prop_assert!(c.decode(&longer, n, &mut out).is_err(), "{} extended", c);
            prop_assert!(c.decode_add(&longer, n, &mut out).is_err());
            prop_assert!(out.iter().all(|&x| x == 3.0));
            // Wrong n or wrong output length.
            prop_assert!(c.decode(&enc, n + 1, &mut out).is_err());
            prop_assert!(n == 0 || c.decode(&enc, n, &mut out[..n - 1]).is_err());
            if !enc.is_empty() {
                let mut bad = enc.clone();
                for (i, b) in &flips {
                    let i = i.index(bad.len());
                    bad[i] ^= b | 1;
                }
                let mut o = vec![3.0f32; n];
                if c.decode(&bad, n, &mut o).is_err() {
                    prop_assert!(o.iter().all(|&x| x == 3.0));
                }
                let mut o = vec![3.0f32; n];
                if c.decode_add(&bad, n, &mut o).is_err() {
                    prop_assert!(o.iter().all(|&x| x == 3.0));
                }
            }
        }
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300), n in 0usize..100) {
        for c in all_codecs() {
            let mut out = vec![0.0f32; n];
            let _ = c.decode(&bytes, n, &mut out);
            let _ = c.decode_add(&bytes, n, &mut out);
        }
    }
}

/// Every dropped element decodes to 0 and is no larger than every kept
/// one; `error_bound` is the largest dropped magnitude.
fn check_dropped(c: &Codec, v: &[f32], out: &[f32], kept: &[usize]) -> Result<(), TestCaseError> {
    let mut is_kept = vec![false; v.len()];
    for &i in kept {
        is_kept[i] = true;
    }
    let min_kept = kept
        .iter()
        .map(|&i| v[i].abs())
        .fold(f32::INFINITY, f32::min);
    let mut max_dropped = 0.0f32;
    for i in 0..v.len() {
        if !is_kept[i] {
            prop_assert_eq!(out[i], 0.0);
            max_dropped = max_dropped.max(v[i].abs());
        }
    }
    prop_assert!(max_dropped <= min_kept);
    prop_assert_eq!(c.error_bound(v), max_dropped);
    Ok(())
}

fn decode_indices(enc: &[u8]) -> Vec<usize> {
    let k = u32::from_le_bytes(enc[..4].try_into().unwrap()) as usize;
    enc[4..4 + 4 * k]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()) as usize)
        .collect()
}

/// Deterministic roughly normal data.
fn normalish(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..n)
        .map(|_| (next() + next() + next() + next() - 2.0) * 1e-3)
        .collect()
}

#[test]
fn topk_sampled_is_close_to_k_on_gradients() {
    let v = normalish(1 << 20, 7);
    for ratio in [0.001, 0.01, 0.1] {
        let c = Codec::TopK {
            ratio,
            sampled: true,
        };
        let k = c.topk_k(v.len()).unwrap();
        let mut enc = Vec::new();
        c.encode(&v, &mut enc);
        let got = decode_indices(&enc).len();
        let err = (got as f64 - k as f64).abs() / k as f64;
        assert!(err < 0.1, "ratio {ratio}: kept {got} for k {k}");
    }
}

#[test]
fn topk_decode_rejects_bad_indices() {
    let c = Codec::parse("topk-exact:0.5").unwrap();
    let enc = |k: u32, idx: &[u32]| {
        let mut e = k.to_le_bytes().to_vec();
        for i in idx {
            e.extend(i.to_le_bytes());
        }
        for _ in idx {
            e.extend(1.0f32.to_le_bytes());
        }
        e
    };
    let mut out = vec![0.0f32; 4];
    assert!(c.decode(&enc(2, &[0, 3]), 4, &mut out).is_ok());
    assert_eq!(out, [1.0, 0.0, 0.0, 1.0]);
    assert!(matches!(
        c.decode(&enc(2, &[0, 4]), 4, &mut out),
        Err(CompressError::Corrupt(_))
    ));
    assert!(matches!(
        c.decode(&enc(2, &[2, 2]), 4, &mut out),
        Err(CompressError::Corrupt(_))
    ));
    assert!(matches!(
        c.decode(&enc(2, &[3, 1]), 4, &mut out),
        Err(CompressError::Corrupt(_))
    ));
    assert!(matches!(
        c.decode(&enc(5, &[0, 1, 2, 3, 3]), 4, &mut out),
        Err(CompressError::Corrupt(_))
    ));
    assert!(c.decode(&[1, 2, 3], 4, &mut out).is_err());
    let mut huge = u32::MAX.to_le_bytes().to_vec();
    huge.extend([0u8; 8]);
    assert!(c.decode(&huge, 4, &mut out).is_err());
    // The failures left the first result alone; decode_add scatters.
    assert_eq!(out, [1.0, 0.0, 0.0, 1.0]);
    c.decode_add(&enc(1, &[1]), 4, &mut out).unwrap();
    assert_eq!(out, [1.0, 1.0, 0.0, 1.0]);
}

#[test]
fn non_finite_blocks_decode_to_nan() {
    let mut v = vec![0.5f32; 600];
    v[300] = f32::INFINITY;
    let c = Codec::parse("int8").unwrap();
    let mut enc = Vec::new();
    c.encode(&v, &mut enc);
    let mut out = vec![0.0f32; 600];
    c.decode(&enc, 600, &mut out).unwrap();
    assert!(out[..256].iter().all(|&x| x == 0.5));
    assert!(out[256..512].iter().all(|x| x.is_nan()));
    assert!(out[512..].iter().all(|&x| x == 0.5));
    assert_eq!(c.error_bound(&v), f32::INFINITY);
}

#[test]
fn stochastic_rounding_is_unbiased() {
    // 0.3 of a quantisation step: nearest rounding always gives 0, while
    // stochastic rounding averages to the true value over calls.
    let mut v = vec![0.3f32; 4096];
    v[0] = 127.0;
    let c = Codec::parse("int8-sr:4096").unwrap();
    let mut sum = vec![0.0f64; v.len()];
    let mut enc = Vec::new();
    let mut out = vec![0.0f32; v.len()];
    let calls = 50;
    for step in 0..calls {
        c.encode_seeded(&v, step, &mut enc);
        c.decode(&enc, v.len(), &mut out).unwrap();
        for (s, &o) in sum.iter_mut().zip(&out) {
            *s += f64::from(o);
        }
    }
    let mean = sum[1..].iter().sum::<f64>() / (calls as usize * (v.len() - 1)) as f64;
    assert!((mean - 0.3).abs() < 0.01, "mean {mean}");
}

#[test]
fn encoding_is_deterministic() {
    let v = normalish(10_000, 11);
    // The next step's gradient: every element changes a little.
    let w: Vec<f32> = v.iter().map(|x| x * 1.001).collect();
    for c in all_codecs() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        c.encode(&v, &mut a);
        c.encode(&v, &mut b);
        assert_eq!(a, b, "{c}");
        c.encode_seeded(&v, 1, &mut a);
        c.encode_seeded(&v, 1, &mut b);
        assert_eq!(a, b, "{c}");
    }
    // Stochastic rounding draws different numbers for another seed or for
    // other data.
    let c = Codec::parse("int8-sr").unwrap();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    c.encode_seeded(&v, 1, &mut a);
    c.encode_seeded(&v, 2, &mut b);
    assert_ne!(a, b);
    c.encode(&v, &mut a);
    c.encode(&w, &mut b);
    let differ = a.iter().zip(&b).filter(|(x, y)| x != y).count();
    assert!(differ > 1000, "{differ}");
}

#[test]
fn error_feedback_conserves_the_sum() {
    let n = 5000;
    for spec in [
        "topk:0.01",
        "topk-exact:0.05",
        "int8",
        "int8-sr:64",
        "bf16",
        "fp16",
        "mxfp8",
        "mxfp4",
    ] {
        let c = Codec::parse(spec).unwrap();
        let mut ef = ErrorFeedback::new(n);
        let mut sum_grad = vec![0.0f64; n];
        let mut sum_sent = vec![0.0f64; n];
        let mut wire = Vec::new();
        let mut dec = vec![0.0f32; n];
        let steps = 60;
        for step in 0..steps {
            let g = normalish(n, 1000 + step);
            for (s, &x) in sum_grad.iter_mut().zip(&g) {
                *s += f64::from(x);
            }
            let mut gc = g.clone();
            ef.encode_with_feedback(&c, &mut gc, &mut wire);
            assert!(wire.len() <= c.max_encoded_len(n));
            c.decode(&wire, n, &mut dec).unwrap();
            for (s, &x) in sum_sent.iter_mut().zip(&dec) {
                *s += f64::from(x);
            }
        }
        let mut worst = 0.0f64;
        for i in 0..n {
            let d = (sum_sent[i] + f64::from(ef.residual()[i]) - sum_grad[i]).abs();
            worst = worst.max(d);
        }
        // Each step loses at most an ulp or two of values around 1e-2.
        assert!(worst < 1e-6, "{spec}: worst {worst}");
        // Top-k with feedback really sends everything eventually: the
        // residual stays bounded.
        let rmax = ef.residual().iter().fold(0.0f32, |m, x| m.max(x.abs()));
        assert!(rmax < 0.5, "{spec}: residual {rmax}");
    }
}

#[test]
fn error_feedback_manual_steps_match() {
    let c = Codec::parse("int8:16").unwrap();
    let g = normalish(100, 3);
    let mut a = ErrorFeedback::new(100);
    let mut b = ErrorFeedback::new(100);
    let mut wa = Vec::new();
    let mut wb = Vec::new();
    for _ in 0..3 {
        let mut ga = g.clone();
        a.encode_with_feedback(&c, &mut ga, &mut wa);
        let mut gb = g.clone();
        b.compensate(&mut gb);
        c.encode(&gb, &mut wb);
        let mut d = vec![0.0; 100];
        c.decode(&wb, 100, &mut d).unwrap();
        b.update(&gb, &d);
        assert_eq!(wa, wb);
        assert_eq!(ga, gb);
        assert_eq!(a.residual(), b.residual());
    }
    a.reset();
    assert!(a.residual().iter().all(|&x| x == 0.0));
}

#[test]
fn empty_tensors() {
    for c in all_codecs() {
        let mut enc = vec![9u8];
        c.encode(&[], &mut enc);
        assert_eq!(enc.len(), c.max_encoded_len(0), "{c}");
        c.decode(&enc, 0, &mut []).unwrap();
        assert_eq!(c.error_bound(&[]), 0.0);
    }
}
