//! Top-k sparsification: exact and sampled-threshold selection, encoding
//! and validated decoding.
//!
//! Magnitudes are compared as the bits of `|x|` (`x.to_bits() & 0x7fff_ffff`),
//! whose integer order is the order of `|x|` with NaN above infinity.

use crate::CompressError;

/// Magnitude key of `x`.
#[inline]
pub(crate) fn key(x: f32) -> u32 {
    x.to_bits() & 0x7fff_ffff
}

/// `k` for `n` elements: `ceil(ratio · n)` clamped to `1..=n` (0 for
/// `n == 0`). A product within 1e-9 (relative) of an integer counts as that
/// integer, so `0.07 · 100` gives 7, not 8.
pub(crate) fn target_k(ratio: f64, n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let x = ratio * n as f64;
    let r = x.round();
    let k = if (x - r).abs() <= 1e-9 * x.max(1.0) {
        r
    } else {
        x.ceil()
    };
    if k.is_nan() || k < 1.0 {
        1
    } else if k >= n as f64 {
        n
    } else {
        k as usize
    }
}

/// Appends the top-k encoding of `src` to `out`.
pub(crate) fn encode(src: &[f32], ratio: f64, sampled: bool, out: &mut Vec<u8>) {
    assert!(
        u32::try_from(src.len()).is_ok(),
        "top-k indices are u32: at most 2^32 - 1 elements"
    );
    let idx = select(src, ratio, sampled);
    let k = idx.len();
    let start = out.len();
    out.resize(start + 4 + 8 * k, 0);
    let (head, body) = out[start..].split_at_mut(4);
    head.copy_from_slice(&(k as u32).to_le_bytes());
    let (ib, vb) = body.split_at_mut(4 * k);
    for ((di, dv), &i) in ib.chunks_exact_mut(4).zip(vb.chunks_exact_mut(4)).zip(&idx) {
        di.copy_from_slice(&i.to_le_bytes());
        dv.copy_from_slice(&src[i as usize].to_le_bytes());
    }
}

/// The indices (ascending) that `encode` keeps.
pub(crate) fn select(src: &[f32], ratio: f64, sampled: bool) -> Vec<u32> {
    let k = target_k(ratio, src.len());
    if sampled {
        select_sampled(src, k)
    } else {
        select_exact(src, k)
    }
}

/// Exactly the `k` largest magnitudes, ties at the k-th magnitude going to
/// the lowest indices; ascending.
///
/// On large tensors a sampled threshold, set low enough to let through
/// about 1.5 k elements, first narrows the candidates; if at least `k` (and
/// not too many) pass, the k-th largest magnitude is among them and
/// [`cut_to_k`] gives the same result as a selection over the whole tensor.
/// Otherwise [`select_exact_full`] runs.
pub(crate) fn select_exact(src: &[f32], k: usize) -> Vec<u32> {
    let n = src.len();
    if k >= n || k == 0 {
        return select_exact_full(src, k);
    }
    if let Some(t) = sample_threshold(src, k + k / 2) {
        let mut idx = Vec::with_capacity(2 * k);
        let p = collect_ge(src, 0, t, &mut idx, 4 * k + 1);
        if p == n && idx.len() <= 4 * k && idx.len() >= k {
            return cut_to_k(src, &idx, k);
        }
    }
    select_exact_full(src, k)
}

/// [`select_exact`] by `select_nth_unstable` over all magnitudes.
pub(crate) fn select_exact_full(src: &[f32], k: usize) -> Vec<u32> {
    let n = src.len();
    if k >= n {
        return (0..n as u32).collect();
    }
    if k == 0 {
        return Vec::new();
    }
    let mut keys: Vec<u32> = src.iter().map(|&x| key(x)).collect();
    let (_, &mut t, above) = keys.select_nth_unstable(n - k);
    // `above` holds the k - 1 keys ranked above the k-th: those strictly
    // greater than `t` are kept whatever their index.
    let greater = above.iter().filter(|&&x| x > t).count();
    let mut ties = k - greater;
    drop(keys);
    let mut idx = Vec::with_capacity(k);
    for (i, &x) in src.iter().enumerate() {
        let kx = key(x);
        if kx > t {
            idx.push(i as u32);
        } else if kx == t && ties > 0 {
            ties -= 1;
            idx.push(i as u32);
        }
    }
    debug_assert_eq!(idx.len(), k);
    idx
}

/// Cuts ascending `cands` (which hold every element with a key at or above
/// some threshold, and at least `k` of them) to exactly the `k` largest,
/// ties to the lowest indices; ascending.
fn cut_to_k(src: &[f32], cands: &[u32], k: usize) -> Vec<u32> {
    debug_assert!(cands.len() >= k);
    if k == 0 {
        return Vec::new();
    }
    let mut keys: Vec<u32> = cands.iter().map(|&i| key(src[i as usize])).collect();
    let m = keys.len();
    let (_, &mut t, above) = keys.select_nth_unstable(m - k);
    let greater = above.iter().filter(|&&x| x > t).count();
    let mut ties = k - greater;
    let mut out = Vec::with_capacity(k);
    for &i in cands {
        let kx = key(src[i as usize]);
        if kx > t {
            out.push(i);
        } else if kx == t && ties > 0 {
            ties -= 1;
            out.push(i);
        }
    }
    out
}

/// Appends to `idx` the indices `i >= from` with `key(src[i]) >= t`, in
/// order, stopping once `idx.len() == max`. Returns the index after the
/// last element examined (`src.len()` when it went through).
fn collect_ge(src: &[f32], from: usize, t: u32, idx: &mut Vec<u32>, max: usize) -> usize {
    #[allow(unused_mut)]
    let mut from = from;
    #[cfg(target_arch = "x86_64")]
    if let Some(p) = crate::simd::collect_ge(src, from, t, idx, max) {
        if idx.len() >= max {
            return p;
        }
        // The vector part went through whole groups; the tail is scalar.
        from = p;
    }
    collect_ge_scalar(src, from, t, idx, max)
}

/// Portable [`collect_ge`].
pub(crate) fn collect_ge_scalar(
    src: &[f32],
    from: usize,
    t: u32,
    idx: &mut Vec<u32>,
    max: usize,
) -> usize {
    if idx.len() >= max {
        return from;
    }
    for (i, &x) in src.iter().enumerate().skip(from) {
        if key(x) >= t {
            idx.push(i as u32);
            if idx.len() >= max {
                return i + 1;
            }
        }
    }
    src.len()
}

/// splitmix64 step, for the deterministic sample.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Minimum sample size.
const MIN_SAMPLE: usize = 4096;
/// Minimum number of sample elements above the estimated threshold.
const MIN_ABOVE: usize = 256;
/// Consecutive elements per sampled run.
const RUN: usize = 16;

/// The sample of magnitude keys used to estimate the k-th largest, and the
/// rank `j` (from the top) in it that corresponds to `k`, with the sample
/// partitioned around `s - j` (so `sample[s - j]` is the estimate). `None`
/// when the sample would be more than a quarter of the tensor.
///
/// Sample size: 1 %, at least [`MIN_SAMPLE`] and enough for [`MIN_ABOVE`]
/// elements above the threshold (relative error of the resulting count
/// about 1/sqrt(MIN_ABOVE)). Stratified cluster sample: one run of [`RUN`]
/// consecutive elements (a cache line's worth, so the sample costs s / RUN
/// cache misses rather than s) at a uniform position in each of s / RUN
/// equal strata, from a fixed seed.
fn sample_keys(src: &[f32], k: usize) -> Option<(Vec<u32>, usize)> {
    let n = src.len();
    let s = (n / 100)
        .max(MIN_SAMPLE)
        .max(n.saturating_mul(MIN_ABOVE) / k.max(1));
    if s.saturating_mul(4) >= n {
        return None;
    }
    // Stratum j starts at floor(j * n / m), computed in 32.32 fixed point
    // (n < 2^32, so j * step < 2^64); strata are at least 4 RUN long.
    let m = s.div_ceil(RUN);
    let step = ((n as u64) << 32) / m as u64;
    let mut st = 0x5eed_0000_0000_0000u64 ^ n as u64;
    let mut sample = Vec::with_capacity(m * RUN);
    let mut a = 0usize;
    for j in 0..m {
        let b = if j + 1 == m {
            n
        } else {
            (((j + 1) as u64 * step) >> 32) as usize
        };
        let r = splitmix(&mut st) >> 32;
        let off = ((r * (b - a - RUN + 1) as u64) >> 32) as usize;
        sample.extend(src[a + off..a + off + RUN].iter().map(|&x| key(x)));
        a = b;
    }
    let s = sample.len();
    let j = ((k as f64 * s as f64 / n as f64).round() as usize).clamp(1, s);
    sample.select_nth_unstable(s - j);
    Some((sample, j))
}

/// Estimated key of the `k`-th largest magnitude, from [`sample_keys`].
fn sample_threshold(src: &[f32], k: usize) -> Option<u32> {
    sample_keys(src, k).map(|(sample, j)| sample[sample.len() - j])
}

/// Sampled-threshold selection (see [`crate::Codec::TopK`]): returns between
/// `ceil(k/2)` and `2k` indices, ascending, normally about `k`.
pub(crate) fn select_sampled(src: &[f32], k: usize) -> Vec<u32> {
    let n = src.len();
    if k >= n {
        return (0..n as u32).collect();
    }
    if k == 0 {
        return Vec::new();
    }
    let lo = k.div_ceil(2);
    let hi = 2 * k;
    // Candidates beyond this abort a scan (the threshold was too low).
    let cap = 4 * k;

    let Some((mut sample, j)) = sample_keys(src, k) else {
        // The sample would be most of the tensor: select exactly.
        return select_exact_full(src, k);
    };
    let s = sample.len();
    let rank_for = |want: f64| -> usize { (want.round() as usize).clamp(1, s) };
    let t = sample[s - j];

    let mut idx = Vec::with_capacity(hi + 1);
    let p = collect_ge(src, 0, t, &mut idx, cap + 1);
    if p < n || idx.len() > cap {
        // Too many: estimate the k-th largest from the prefix [0, p) scanned
        // so far, keep the candidates above it and go on from p.
        let mut keys: Vec<u32> = idx.iter().map(|&i| key(src[i as usize])).collect();
        let m = keys.len();
        let r = ((k as f64 * p as f64 / n as f64).round() as usize).clamp(1, m);
        keys.select_nth_unstable(m - r);
        let t2 = keys[m - r];
        if t2 <= t {
            // Ties at the threshold: no threshold separates them.
            return select_exact(src, k);
        }
        idx.retain(|&i| key(src[i as usize]) >= t2);
        let p2 = collect_ge(src, p, t2, &mut idx, cap + 1);
        if p2 < n || idx.len() > cap || idx.len() < lo {
            return select_exact(src, k);
        }
    } else if idx.len() < lo {
        // Too few: lower the threshold once, using the sample.
        let c = idx.len();
        let want = if c == 0 {
            4.0 * j as f64
        } else {
            j as f64 * k as f64 / c as f64
        };
        let j2 = rank_for(want).max(j + 1).min(s);
        let t2 = if j2 > j {
            sample.select_nth_unstable(s - j2);
            sample[s - j2]
        } else {
            t
        };
        if t2 >= t {
            return select_exact(src, k);
        }
        idx.clear();
        let p2 = collect_ge(src, 0, t2, &mut idx, cap + 1);
        if p2 < n || idx.len() > cap || idx.len() < lo {
            return select_exact(src, k);
        }
    }
    if idx.len() > hi {
        return cut_to_k(src, &idx, k);
    }
    idx
}

/// Decodes (validated) into `out` (zeros elsewhere) or scatter-adds.
pub(crate) fn decode(enc: &[u8], out: &mut [f32], add: bool) -> Result<(), CompressError> {
    let n = out.len();
    let Some((head, body)) = enc.split_first_chunk::<4>() else {
        return Err(CompressError::BadLength {
            expected: 4,
            got: enc.len(),
            n,
        });
    };
    let k = u32::from_le_bytes(*head) as usize;
    if k > n {
        return Err(CompressError::Corrupt(format!(
            "top-k count {k} exceeds {n} elements"
        )));
    }
    // k <= n and n f32 values fit in memory, so 8 * k cannot overflow.
    let expected = 4 + 8 * k;
    if enc.len() != expected {
        return Err(CompressError::BadLength {
            expected,
            got: enc.len(),
            n,
        });
    }
    let (ib, vb) = body.split_at(4 * k);
    let index = |c: &[u8]| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize;
    let mut next = 0usize;
    for c in ib.chunks_exact(4) {
        let i = index(c);
        if i >= n {
            return Err(CompressError::Corrupt(format!(
                "top-k index {i} out of range for {n} elements"
            )));
        }
        if i < next {
            return Err(CompressError::Corrupt(
                "top-k indices not strictly ascending".into(),
            ));
        }
        next = i + 1;
    }
    if !add {
        out.fill(0.0);
    }
    for (c, v) in ib.chunks_exact(4).zip(vb.chunks_exact(4)) {
        let v = f32::from_le_bytes([v[0], v[1], v[2], v[3]]);
        let o = &mut out[index(c)];
        if add {
            *o += v;
        } else {
            *o = v;
        }
    }
    Ok(())
}

/// Largest dropped magnitude.
pub(crate) fn error_bound(src: &[f32], ratio: f64, sampled: bool) -> f32 {
    let idx = select(src, ratio, sampled);
    let mut kept = idx.iter().peekable();
    let mut worst = 0u32;
    for (i, &x) in src.iter().enumerate() {
        if kept.peek().is_some_and(|&&j| j as usize == i) {
            kept.next();
        } else {
            worst = worst.max(key(x));
        }
    }
    f32::from_bits(worst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k_values() {
        assert_eq!(target_k(0.01, 0), 0);
        assert_eq!(target_k(0.01, 1), 1);
        assert_eq!(target_k(0.01, 1000), 10);
        assert_eq!(target_k(0.01, 1001), 11);
        assert_eq!(target_k(0.07, 100), 7);
        assert_eq!(target_k(1.0, 100), 100);
        assert_eq!(target_k(1e-12, 100), 1);
    }

    #[test]
    fn exact_ties_go_low() {
        let src = [1.0, 3.0, -3.0, 2.0, 3.0, 0.0];
        assert_eq!(select_exact(&src, 2), vec![1, 2]);
        assert_eq!(select_exact(&src, 4), vec![1, 2, 3, 4]);
        assert_eq!(select_exact(&src, 3), vec![1, 2, 4]);
    }

    #[test]
    fn prefiltered_exact_equals_full_selection() {
        let mut st = 99u64;
        let n = 300_000;
        // Continuous values, and values on a coarse grid (many ties).
        let cont: Vec<f32> = (0..n)
            .map(|_| (splitmix(&mut st) >> 40) as f32 - 8e6)
            .collect();
        let grid: Vec<f32> = cont.iter().map(|x| (x / 1e6).round()).collect();
        for v in [&cont, &grid] {
            for k in [1, 10, 300, 3000, 30_000, 150_000] {
                assert_eq!(select_exact(v, k), select_exact_full(v, k), "k={k}");
            }
        }
    }

    #[test]
    fn sampled_all_equal_falls_back() {
        let src = vec![1.5f32; 100_000];
        let idx = select_sampled(&src, 1000);
        assert_eq!(idx.len(), 1000);
        assert_eq!(idx, (0..1000).collect::<Vec<u32>>());
    }

    #[test]
    fn sampled_mostly_zero() {
        let mut src = vec![0.0f32; 200_000];
        for i in (0..200_000).step_by(1000) {
            src[i] = 1.0 + i as f32;
        }
        // 200 nonzeros, k = 2000: the zeros tie, exact fallback.
        let idx = select_sampled(&src, 2000);
        assert!((1000..=4000).contains(&idx.len()));
        for i in (0..200_000).step_by(1000) {
            assert!(idx.contains(&(i as u32)));
        }
    }

    #[test]
    fn collect_matches_scalar() {
        let src: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32 - 50.0).collect();
        for t in [0u32, 1, key(10.0), key(49.0), key(50.0), key(1000.0)] {
            for from in [0, 3, 500, 999, 1000] {
                for max in [0, 1, 7, 10_000] {
                    let mut a = Vec::new();
                    let mut b = Vec::new();
                    let pa = collect_ge(&src, from, t, &mut a, max);
                    let pb = collect_ge_scalar(&src, from, t, &mut b, max);
                    assert_eq!((pa, &a), (pb, &b), "t={t} from={from} max={max}");
                }
            }
        }
    }
}
