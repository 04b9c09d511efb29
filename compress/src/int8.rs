//! Blockwise int8: portable reference code and dispatch to the vector
//! kernels, over the arithmetic of [`crate::int8_math`] (the format is
//! described there).

pub(crate) use crate::int8_math::encoded_len;
use crate::int8_math::{
    absmax_bits, block_kind, block_seed, hash32, q_nearest, q_stochastic, q_tiny, tiny_scale,
    uniform, xor_sum_bits, BlockKind,
};

/// Folds a 64-bit caller seed to the 32 bits the kernels use.
fn fold_seed(seed: u64) -> u32 {
    hash32((seed ^ (seed >> 32)) as u32 ^ 0x5bd1_e995)
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
    use crate::int8_math::{INF_BITS, TINY, TINY_BITS};

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
