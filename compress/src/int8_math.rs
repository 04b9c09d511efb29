//! Blockwise int8's arithmetic, shared by the portable reference code
//! (`int8.rs`) and the vector kernels (`simd.rs`), so both give the same
//! bytes: block classification, scales, rounding and the stochastic
//! rounding's random numbers.
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
