//! Blockwise int8: portable reference code and dispatch to the vector kernels.
//!
//! Per block: `absmax` is the largest `|x|`; `scale = absmax / 127` is
//! stored as f32; each element is `q = clamp(round(x · inv), -127, 127)` with
//! `inv = 127 / absmax` (both computed in f32), decoded as `q · scale`.
//! Blocks whose absmax is below [`TINY`] compute `x · 127 / absmax` in f64
//! instead (there `127 / absmax` would overflow f32). Rounding is nearest
//! even, or `floor(y + u)` for stochastic rounding with `u` from
//! [`uniform`]. The vector kernels perform exactly these f32 operations, so
//! both give the same bytes.

/// Blocks with `absmax` below this (2⁻¹⁰⁰) are quantised in f64.
pub(crate) const TINY: f32 = 7.888_609e-31;
/// Bits of [`TINY`].
pub(crate) const TINY_BITS: u32 = TINY.to_bits();
/// Bits of +infinity: an absmax with bits at or above this is not finite.
pub(crate) const INF_BITS: u32 = 0x7f80_0000;

/// Encoded bytes for `n` elements.
pub(crate) fn encoded_len(n: usize, block: usize) -> usize {
    n + 4 * n.div_ceil(block)
}

/// Folds a 64-bit caller seed to the 32 bits the kernels use.
fn fold_seed(seed: u64) -> u32 {
    hash32((seed ^ (seed >> 32)) as u32 ^ 0x5bd1_e995)
}

/// Seed of one block's stochastic rounding: the call's seed mixed with the
/// XOR and the wrapping sum of the block's f32 bits (both independent of
/// summation order, so the vector kernels get the same value). Encoding is
/// thus a pure function of the input and the seed, and a block whose data
/// changes gets unrelated random numbers.
#[inline]
pub(crate) fn block_seed(seed: u32, xor: u32, sum: u32) -> u32 {
    hash32(hash32(seed ^ xor).wrapping_add(sum) ^ 0x632b_e5ab)
}

/// XOR and wrapping sum of the bits of `s`.
#[inline]
pub(crate) fn xor_sum_bits(s: &[f32]) -> (u32, u32) {
    s.iter().fold((0u32, 0u32), |(x, a), v| {
        (x ^ v.to_bits(), a.wrapping_add(v.to_bits()))
    })
}

/// A bijective 32-bit mixer (lowbias32).
#[inline]
pub(crate) fn hash32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x
}

/// Uniform in `[0, 1)` with 24 random bits for element `i` under `seed`:
/// the top bits of a two-multiply hash of `i ^ seed` (cheaper than
/// [`hash32`], whose outer xor-shifts only matter for the low bits).
#[inline]
pub(crate) fn uniform(seed: u32, i: u32) -> f32 {
    let mut x = (i ^ seed).wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    (x >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// Quantises `y` (already multiplied by `inv`) to nearest even.
#[inline]
pub(crate) fn q_nearest(y: f32) -> i8 {
    y.round_ties_even().clamp(-127.0, 127.0) as i8
}

/// Quantises `y` stochastically with uniform `u`.
#[inline]
pub(crate) fn q_stochastic(y: f32, u: f32) -> i8 {
    (y + u).floor().clamp(-127.0, 127.0) as i8
}

/// What a block's absmax (as bits of `|x|`) says about how to encode it.
pub(crate) enum BlockKind {
    /// All zeros: scale 0, zero bytes.
    Zero,
    /// Holds NaN or ±inf: NaN scale, zero bytes.
    NonFinite,
    /// Absmax below [`TINY`]: quantise in f64.
    Tiny(f32),
    /// Normal case: `(scale, inv)`.
    Normal(f32, f32),
}

/// Classifies a block by its absmax bits.
#[inline]
pub(crate) fn block_kind(amax_bits: u32) -> BlockKind {
    if amax_bits == 0 {
        BlockKind::Zero
    } else if amax_bits >= INF_BITS {
        BlockKind::NonFinite
    } else if amax_bits < TINY_BITS {
        BlockKind::Tiny(f32::from_bits(amax_bits))
    } else {
        let a = f32::from_bits(amax_bits);
        BlockKind::Normal(a / 127.0, 127.0 / a)
    }
}

/// Scale of a tiny block.
#[inline]
pub(crate) fn tiny_scale(absmax: f32) -> f32 {
    absmax / 127.0
}

/// `q` for an element of a tiny block (f64 arithmetic).
#[inline]
pub(crate) fn q_tiny(x: f32, absmax: f32, stochastic: bool, u: f32) -> i8 {
    let y = (f64::from(x) * (127.0 / f64::from(absmax))) as f32;
    if stochastic {
        q_stochastic(y, u)
    } else {
        q_nearest(y)
    }
}

/// Largest `|x|` bits of `s` (integer max, so NaN ranks above infinity).
#[inline]
pub(crate) fn absmax_bits(s: &[f32]) -> u32 {
    s.iter().fold(0u32, |m, x| m.max(x.to_bits() & 0x7fff_ffff))
}

/// Appends the int8 encoding of `src` to `out`; stochastic rounding mixes
/// `seed` (0 when `None`) with each block's content, see [`block_seed`].
pub(crate) fn encode(
    src: &[f32],
    block: usize,
    stochastic: bool,
    seed: Option<u64>,
    out: &mut Vec<u8>,
) {
    let seed = match (stochastic, seed) {
        (true, Some(s)) => fold_seed(s),
        _ => 0,
    };
    encode_with_seed(src, block, stochastic, seed, out);
}

/// [`encode`] with the kernels' 32-bit seed.
pub(crate) fn encode_with_seed(
    src: &[f32],
    block: usize,
    stochastic: bool,
    seed: u32,
    out: &mut Vec<u8>,
) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::encode_int8(src, block, stochastic, seed, out) {
        return;
    }
    encode_scalar(src, block, stochastic, seed, out);
}

/// Portable encoder.
pub(crate) fn encode_scalar(
    src: &[f32],
    block: usize,
    stochastic: bool,
    seed: u32,
    out: &mut Vec<u8>,
) {
    let start = out.len();
    out.resize(start + encoded_len(src.len(), block), 0);
    let dst = &mut out[start..];
    for (b, (blk, d)) in src.chunks(block).zip(dst.chunks_mut(block + 4)).enumerate() {
        let base = (b * block) as u32;
        let (scale_bytes, q) = d.split_at_mut(4);
        let bseed = if stochastic {
            let (x, a) = xor_sum_bits(blk);
            block_seed(seed, x, a)
        } else {
            0
        };
        let u = |j: usize| {
            if stochastic {
                uniform(bseed, base.wrapping_add(j as u32))
            } else {
                0.0
            }
        };
        let scale = match block_kind(absmax_bits(blk)) {
            BlockKind::Zero => 0.0,
            BlockKind::NonFinite => f32::NAN,
            BlockKind::Tiny(a) => {
                for (j, (o, &x)) in q.iter_mut().zip(blk).enumerate() {
                    *o = q_tiny(x, a, stochastic, u(j)) as u8;
                }
                tiny_scale(a)
            }
            BlockKind::Normal(scale, inv) => {
                for (j, (o, &x)) in q.iter_mut().zip(blk).enumerate() {
                    let y = x * inv;
                    *o = if stochastic {
                        q_stochastic(y, u(j))
                    } else {
                        q_nearest(y)
                    } as u8;
                }
                scale
            }
        };
        scale_bytes.copy_from_slice(&scale.to_le_bytes());
    }
}

/// Decodes `enc` (exactly `encoded_len(out.len(), block)` bytes) into `out`,
/// or adds it.
pub(crate) fn decode(enc: &[u8], block: usize, out: &mut [f32], add: bool) {
    debug_assert_eq!(enc.len(), encoded_len(out.len(), block));
    #[cfg(target_arch = "x86_64")]
    if crate::simd::decode_int8(enc, block, out, add) {
        return;
    }
    decode_scalar(enc, block, out, add);
}

/// Portable decoder.
pub(crate) fn decode_scalar(enc: &[u8], block: usize, out: &mut [f32], add: bool) {
    for (o, e) in out.chunks_mut(block).zip(enc.chunks(block + 4)) {
        let (s, q) = e.split_at(4);
        let scale = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
        for (o, &q) in o.iter_mut().zip(q) {
            let v = f32::from(q as i8) * scale;
            if add {
                *o += v;
            } else {
                *o = v;
            }
        }
    }
}

/// Largest per-block error bound (see [`crate::Codec::error_bound`]).
pub(crate) fn error_bound(src: &[f32], _block: usize, stochastic: bool) -> f32 {
    // The block with the largest absmax has the largest scale, so the bound
    // only depends on the global absmax.
    let amax = absmax_bits(src);
    let scale = match block_kind(amax) {
        BlockKind::Zero => return 0.0,
        BlockKind::NonFinite => return f32::INFINITY,
        BlockKind::Tiny(a) => tiny_scale(a),
        BlockKind::Normal(scale, _) => scale,
    };
    let half = if stochastic { 1.0 } else { 0.5 };
    // 2^-140 (a subnormal) covers the rounding of subnormal scales.
    scale * half * (1.0 + 1.0 / 4096.0) + f32::from_bits(1 << 9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants() {
        assert_eq!(TINY, 2f32.powi(-100));
        assert_eq!(TINY_BITS, 0x0d80_0000);
        assert_eq!(f32::INFINITY.to_bits(), INF_BITS);
    }

    #[test]
    fn scalar_known_values() {
        let src = [1.0f32, -0.5, 0.0, 127.0 / 254.0];
        let mut out = Vec::new();
        encode_scalar(&src, 256, false, 0, &mut out);
        assert_eq!(out.len(), 8);
        assert_eq!(
            f32::from_le_bytes(out[..4].try_into().unwrap()),
            1.0 / 127.0
        );
        // 127 * 0.5 = 63.5 rounds to even 64 (in magnitude) with sign.
        assert_eq!(out[4..], [127u8, (-64i8) as u8, 0, 64]);
    }

    #[test]
    fn uniform_is_flat() {
        // 16 bins over consecutive indices, and over seeds for one index.
        for (seed_step, idx_step) in [(0u32, 1u32), (1, 0)] {
            let mut bins = [0u32; 16];
            for t in 0..65_536u32 {
                let u = uniform(0x1234_5678 ^ (t * seed_step), 77 + t * idx_step);
                bins[(u * 16.0) as usize] += 1;
            }
            for b in bins {
                assert!((3_700..4_500).contains(&b), "{bins:?}");
            }
        }
    }

    #[test]
    fn uniform_range() {
        for i in 0..10_000 {
            let u = uniform(12345, i);
            assert!((0.0..1.0).contains(&u));
        }
    }
}
