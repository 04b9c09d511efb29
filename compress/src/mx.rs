//! MXFP8 and MXFP4: the block-scaled formats of the OCP Microscaling (MX)
//! Formats Specification v1.0.
//!
//! A block of [`MX_BLOCK`] (32) elements shares one E8M0 scale `X` (a
//! power of two, `2^(s − 127)` for the scale byte `s`; `0xFF` is NaN); each
//! element is stored as `P_i` in the element format, and decodes to
//! `X · P_i`. The scale follows the specification's conversion (section
//! 6.3): `shared_exp = ⌊log2(max_i |V_i|)⌋ − emax_elem`, where `emax_elem`
//! is the exponent of the element format's largest normal number (E4M3: 8,
//! E5M2: 15, E2M1: 2), clamped to the scale's range (−127 ..= 127); then
//! `P_i = quantize(V_i / X)` rounded to nearest even, values past the
//! largest normal clamped to it (±448, ±57344, ±6).
//!
//! * The element conversions round to nearest even and saturate as CUDA's
//!   `__NV_SATFINITE` conversions do; they are written here (bit tricks,
//!   about five times faster) and tested bit-identical to the maintained
//!   crates' (`float8` for E4M3/E5M2, `float4` for E2M1) over a dense sweep
//!   of the range they take (every 61st f32 pattern, every tie and its
//!   neighbours). Decoding uses `float8`'s values.
//! * A block holding a NaN or an infinity gets the NaN scale (`0xFF`) and
//!   zero elements: the whole block decodes to NaN (the specification leaves
//!   the conversion of such inputs to the implementation; like the int8
//!   codec, sncl never hides an overflow).
//! * A block of zeros gets the smallest scale (`0x00`, 2^−127) and decodes
//!   to zeros (signs kept).
//!
//! Layout, little endian: for each block (the last one may be shorter), the
//! scale byte, then the elements: MXFP8 one byte each; MXFP4 two per byte,
//! the lower-indexed element in the low nibble (an odd last element leaves
//! the high nibble 0).

use float8::{F8E4M3, F8E5M2};

use crate::CompressError;

/// Elements per shared scale (the specification's `k`).
pub const MX_BLOCK: usize = 32;

/// The element format of an MX codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MxElement {
    /// MXFP8 with E4M3 elements (bias 7, largest normal 448, no infinity).
    E4M3,
    /// MXFP8 with E5M2 elements (bias 15, largest normal 57344).
    E5M2,
    /// MXFP4: E2M1 elements (0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives).
    E2M1,
}

/// The E8M0 scale byte that means NaN.
const NAN_SCALE: u8 = 0xFF;

/// E2M1 codes 0..16 as values (sign in bit 3).
const E2M1_VALUES: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

impl MxElement {
    /// Exponent of the element format's largest normal number.
    pub fn emax(self) -> i32 {
        match self {
            MxElement::E4M3 => 8,
            MxElement::E5M2 => 15,
            MxElement::E2M1 => 2,
        }
    }

    /// The element format's largest normal number.
    pub fn max_normal(self) -> f32 {
        match self {
            MxElement::E4M3 => 448.0,
            MxElement::E5M2 => 57344.0,
            MxElement::E2M1 => 6.0,
        }
    }

    /// Explicit mantissa bits.
    fn mantissa_bits(self) -> i32 {
        match self {
            MxElement::E4M3 => 3,
            MxElement::E5M2 => 2,
            MxElement::E2M1 => 1,
        }
    }

    /// Encoded bytes of a block of `len` elements (scale included).
    fn block_bytes(self, len: usize) -> usize {
        1 + match self {
            MxElement::E2M1 => len.div_ceil(2),
            _ => len,
        }
    }

    /// The element code of `q` (already divided by the scale, so finite and
    /// below `2^(emax + 1)` in magnitude): round to nearest even, clamp to
    /// the largest normal, sign kept (also on a zero). Bit-identical to the
    /// `float8` / `float4` crates' satfinite conversions (tested).
    #[inline(always)]
    fn quantize(self, q: f32) -> u8 {
        match self {
            MxElement::E4M3 => Quantizer::<0x3C80_0000, 3, 7, 0x7E, 7>::code(q, 512.0),
            MxElement::E5M2 => Quantizer::<0x3880_0000, 2, 15, 0x7B, 7>::code(q, 65536.0),
            MxElement::E2M1 => Quantizer::<0x3F80_0000, 1, 1, 0x7, 3>::code(q, 2.0),
        }
    }
}

/// Round-to-nearest-even, saturating conversion of an f32 to a small float
/// format, branch-free: `MIN_NORMAL` is the format's smallest normal as f32
/// bits, `M` its explicit mantissa bits, `BIAS` its exponent bias,
/// `MAX_CODE` its largest normal's code, `SIGN_BIT` its sign bit;
/// `sub_units` is 1 / the smallest subnormal step. Integer and f32
/// arithmetic only (no float-to-int conversion), so loops over it
/// vectorise.
struct Quantizer<
    const MIN_NORMAL: u32,
    const M: u32,
    const BIAS: u32,
    const MAX_CODE: u32,
    const SIGN_BIT: u32,
>;

impl<
        const MIN_NORMAL: u32,
        const M: u32,
        const BIAS: u32,
        const MAX_CODE: u32,
        const SIGN_BIT: u32,
    > Quantizer<MIN_NORMAL, M, BIAS, MAX_CODE, SIGN_BIT>
{
    #[inline(always)]
    fn code(q: f32, sub_units: f32) -> u8 {
        let b = q.to_bits();
        let a = b & 0x7fff_ffff;
        let sign = (b >> 31) << SIGN_BIT;
        // Normal: round the f32 mantissa to M bits (nearest even), then
        // rebias the exponent (a carry out of the mantissa bumps it).
        let cut = 23 - M;
        let r = (a + ((1 << (cut - 1)) - 1) + ((a >> cut) & 1)) >> cut;
        let normal = r.wrapping_sub((127 - BIAS) << M).min(MAX_CODE);
        // Subnormal: a count of the smallest step, rounded to nearest even
        // by the FPU (a count of 2^M is the smallest normal's code).
        // Adding 2^23 leaves the rounded count in the low mantissa bits.
        let units = f32::from_bits(a) * sub_units;
        let sub = (units + 8_388_608.0).to_bits() - 0x4B00_0000;
        let code = if a >= MIN_NORMAL { normal } else { sub };
        (sign | code) as u8
    }
}

/// Every E4M3 code's value (the `float8` crate's decoding).
fn e4m3_table() -> &'static [f32; 256] {
    static T: std::sync::OnceLock<[f32; 256]> = std::sync::OnceLock::new();
    T.get_or_init(|| std::array::from_fn(|c| F8E4M3::from_bits(c as u8).to_f32()))
}

/// Every E5M2 code's value.
fn e5m2_table() -> &'static [f32; 256] {
    static T: std::sync::OnceLock<[f32; 256]> = std::sync::OnceLock::new();
    T.get_or_init(|| std::array::from_fn(|c| F8E5M2::from_bits(c as u8).to_f32()))
}

/// Encoded bytes for `n` elements.
pub(crate) fn encoded_len(elem: MxElement, n: usize) -> usize {
    let full = n / MX_BLOCK;
    let rest = n % MX_BLOCK;
    full * elem.block_bytes(MX_BLOCK) + if rest > 0 { elem.block_bytes(rest) } else { 0 }
}

/// `⌊log2 |a|⌋` of a finite, non-zero magnitude given by its bits.
fn floor_log2(abs_bits: u32) -> i32 {
    let exp = (abs_bits >> 23) as i32;
    if exp > 0 {
        exp - 127
    } else {
        // Subnormal: m · 2^−149 with m < 2^23.
        (31 - abs_bits.leading_zeros() as i32) - 149
    }
}

/// The scale byte of a block (OCP MX v1.0 section 6.3), or [`NAN_SCALE`].
fn block_scale(elem: MxElement, block: &[f32]) -> u8 {
    let amax = block
        .iter()
        .fold(0u32, |m, x| m.max(x.to_bits() & 0x7fff_ffff));
    if amax >= 0x7f80_0000 {
        return NAN_SCALE; // an infinity or a NaN
    }
    if amax == 0 {
        return 0;
    }
    let shared = (floor_log2(amax) - elem.emax()).clamp(-127, 127);
    (shared + 127) as u8
}

/// The scale `2^(s − 127)` of scale byte `s` (not NaN) as an f32.
fn scale_value(s: u8) -> f32 {
    if s == 0 {
        f32::from_bits(1 << 22) // 2^−127, an f32 subnormal
    } else {
        f32::from_bits(u32::from(s) << 23)
    }
}

/// `1 / scale` for scale byte `s` (not NaN; at most 252, as encoding
/// produces, so the reciprocal is a normal f32).
fn inverse_scale(s: u8) -> f32 {
    // 2^(127 − s) has the biased exponent 254 − s.
    f32::from_bits((254 - u32::from(s)) << 23)
}

pub(crate) fn encode(elem: MxElement, src: &[f32], out: &mut Vec<u8>) {
    out.clear();
    out.resize(encoded_len(elem, src.len()), 0);
    let mut at = 0;
    for block in src.chunks(MX_BLOCK) {
        let s = block_scale(elem, block);
        let bytes = elem.block_bytes(block.len());
        out[at] = s;
        let dst = &mut out[at + 1..at + bytes];
        at += bytes;
        if s == NAN_SCALE {
            continue; // zero elements
        }
        // Dividing by a power of two is a multiplication by its (exact)
        // reciprocal.
        let inv = inverse_scale(s);
        match elem {
            MxElement::E2M1 => {
                // Codes first, then the nibbles packed (both loops
                // vectorise; a short last block pads with a zero code).
                let mut vals = [0f32; MX_BLOCK];
                vals[..block.len()].copy_from_slice(block);
                let codes: [u8; MX_BLOCK] =
                    std::array::from_fn(|i| MxElement::E2M1.quantize(vals[i] * inv));
                let packed: [u8; MX_BLOCK / 2] =
                    std::array::from_fn(|i| codes[2 * i] | (codes[2 * i + 1] << 4));
                dst.copy_from_slice(&packed[..dst.len()]);
            }
            MxElement::E4M3 | MxElement::E5M2 => {
                // On a whole block of fixed size, so the loop vectorises.
                let mut vals = [0f32; MX_BLOCK];
                vals[..block.len()].copy_from_slice(block);
                let codes: [u8; MX_BLOCK] = if elem == MxElement::E4M3 {
                    std::array::from_fn(|i| MxElement::E4M3.quantize(vals[i] * inv))
                } else {
                    std::array::from_fn(|i| MxElement::E5M2.quantize(vals[i] * inv))
                };
                dst.copy_from_slice(&codes[..dst.len()]);
            }
        }
    }
}

/// Decodes `n = out.len()` elements; with `add`, adds them to `out`.
pub(crate) fn decode(
    elem: MxElement,
    enc: &[u8],
    out: &mut [f32],
    add: bool,
) -> Result<(), CompressError> {
    let n = out.len();
    crate::check_len(enc, encoded_len(elem, n), n)?;
    let mut at = 0;
    for block in out.chunks_mut(MX_BLOCK) {
        let bytes = elem.block_bytes(block.len());
        let (s, codes) = (enc[at], &enc[at + 1..at + bytes]);
        at += bytes;
        let put = |o: &mut f32, v: f32| {
            if add {
                *o += v;
            } else {
                *o = v;
            }
        };
        if s == NAN_SCALE {
            block.iter_mut().for_each(|o| put(o, f32::NAN));
            continue;
        }
        let x = scale_value(s);
        match elem {
            MxElement::E2M1 => {
                for (i, o) in block.iter_mut().enumerate() {
                    let c = (codes[i / 2] >> (4 * (i % 2))) & 0xF;
                    put(o, E2M1_VALUES[usize::from(c)] * x);
                }
            }
            _ => {
                let table = match elem {
                    MxElement::E4M3 => e4m3_table(),
                    _ => e5m2_table(),
                };
                for (o, &c) in block.iter_mut().zip(codes) {
                    put(o, table[usize::from(c)] * x);
                }
            }
        }
    }
    Ok(())
}

/// The largest `|decode(encode(x))_i − x_i|` over `src`: per block, half a
/// step of the element grid's top binade or the clamp at the largest normal,
/// whichever is larger (infinite where a block holds a NaN or an infinity).
pub(crate) fn error_bound(elem: MxElement, src: &[f32]) -> f32 {
    let mut bound = 0.0f32;
    for block in src.chunks(MX_BLOCK) {
        let s = block_scale(elem, block);
        if s == NAN_SCALE {
            return f32::INFINITY;
        }
        let x = f64::from(scale_value(s));
        let top = 2f64.powi(elem.emax());
        let half_step = top / 2f64.powi(elem.mantissa_bits()) / 2.0;
        let clamp = 2.0 * top - f64::from(elem.max_normal());
        // Elements far below the scale lose everything below the element
        // format's smallest subnormal: covered by half_step at the top
        // binade, which is larger.
        bound = bound.max((half_step.max(clamp) * x) as f32);
    }
    bound
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The element format's values by the specification's definitions
    /// (sign, exponent, mantissa; E4M3's S.1111.111 is NaN), independent of
    /// the crates the codec converts with.
    fn grid(elem: MxElement) -> Vec<(u8, f64)> {
        let (ebits, mbits, bias) = match elem {
            MxElement::E4M3 => (4, 3, 7),
            MxElement::E5M2 => (5, 2, 15),
            MxElement::E2M1 => (2, 1, 1),
        };
        let mut out = Vec::new();
        for code in 0u16..(1 << (1 + ebits + mbits)) {
            let code = code as u8;
            let sign = if code >> (ebits + mbits) & 1 == 1 {
                -1.0
            } else {
                1.0
            };
            let e = i32::from(code >> mbits) & ((1 << ebits) - 1);
            let m = f64::from(code & ((1 << mbits) - 1));
            let v = if e == 0 {
                m / 2f64.powi(mbits) * 2f64.powi(1 - bias)
            } else {
                (1.0 + m / 2f64.powi(mbits)) * 2f64.powi(e - bias)
            };
            let special = match elem {
                MxElement::E4M3 => e == 15 && m == 7.0,
                MxElement::E5M2 => e == 31,
                MxElement::E2M1 => false,
            };
            if !special {
                out.push((code, sign * v));
            }
        }
        out
    }

    /// Round to nearest, ties to the even code, clamp to ±max normal: the
    /// specification's quantization, by search over the grid.
    fn reference_quantize(elem: MxElement, q: f64) -> f64 {
        let max = f64::from(elem.max_normal());
        let q = q.clamp(-max, max);
        let mut best: Option<(f64, u8, f64)> = None;
        for (code, v) in grid(elem) {
            let d = (v - q).abs();
            let better = match best {
                None => true,
                Some((bd, bc, _)) => d < bd || (d == bd && code & 1 == 0 && bc & 1 == 1),
            };
            if better {
                best = Some((d, code, v));
            }
        }
        best.unwrap().2
    }

    /// The whole conversion of a block, in f64 from the specification.
    fn reference_block(elem: MxElement, block: &[f32]) -> Vec<f64> {
        let amax = block.iter().fold(0f64, |m, &x| m.max(f64::from(x).abs()));
        if !amax.is_finite() || block.iter().any(|x| x.is_nan()) {
            return vec![f64::NAN; block.len()];
        }
        // ⌊log2 amax⌋ from the f64 exponent (every f32 is a normal f64).
        let shared = if amax == 0.0 {
            -127
        } else {
            let e = ((amax.to_bits() >> 52) & 0x7ff) as i32 - 1023;
            (e - elem.emax()).clamp(-127, 127)
        };
        let x = 2f64.powi(shared);
        block
            .iter()
            .map(|&v| reference_quantize(elem, f64::from(v) / x) * x)
            .collect()
    }

    fn rng(seed: u64) -> impl FnMut() -> u64 {
        let mut s = seed;
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        }
    }

    const ALL: [MxElement; 3] = [MxElement::E4M3, MxElement::E5M2, MxElement::E2M1];

    #[test]
    fn bit_exact_against_the_specification_reference() {
        let mut next = rng(0x5eed);
        for elem in ALL {
            for trial in 0..300 {
                let n = [1, 5, 31, 32, 33, 64, 95, 200][trial % 8];
                // Magnitudes over a wide range, ties and exact grid points.
                let src: Vec<f32> = (0..n)
                    .map(|i| {
                        let r = next();
                        match r % 5 {
                            0 => 0.0,
                            1 => {
                                (r >> 8) as f32 / 2f32.powi(20)
                                    * if i % 2 == 0 { 1.0 } else { -1.0 }
                            }
                            2 => f32::from_bits(((r >> 11) as u32 & 0x7fff_ffff) % 0x7f00_0000),
                            3 => 0.25 * ((r >> 20) % 64) as f32,
                            _ => -(((r >> 30) % 1000) as f32) * 0.001,
                        }
                    })
                    .collect();
                let mut enc = Vec::new();
                encode(elem, &src, &mut enc);
                assert_eq!(enc.len(), encoded_len(elem, n));
                let mut got = vec![0f32; n];
                decode(elem, &enc, &mut got, false).unwrap();
                let mut i = 0;
                for block in src.chunks(MX_BLOCK) {
                    for (k, want) in reference_block(elem, block).into_iter().enumerate() {
                        let g = f64::from(got[i + k]);
                        assert!(
                            g == want || (g.is_nan() && want.is_nan()),
                            "{elem:?} n {n} element {}: {} -> {g}, the specification gives {want}",
                            i + k,
                            block[k]
                        );
                    }
                    i += block.len();
                }
                let bound = error_bound(elem, &src);
                for (x, g) in src.iter().zip(&got) {
                    assert!(
                        (x - g).abs() <= bound,
                        "{elem:?}: |{x} - {g}| > bound {bound}"
                    );
                }
            }
        }
    }

    /// The fast conversions against the crates', over a dense sweep of the
    /// f32 values an element can be given (every 61st bit pattern below
    /// 2^(emax+1), plus every tie and its neighbours).
    #[test]
    fn fast_conversions_match_the_crates_bit_for_bit() {
        let crate_code = |elem: MxElement, q: f32| match elem {
            MxElement::E4M3 => F8E4M3::from_f32(q).to_bits(),
            MxElement::E5M2 => F8E5M2::from_f32(q).to_bits(),
            MxElement::E2M1 => float4::F4E2M1::from_f64(f64::from(q)).to_bits(),
        };
        for elem in ALL {
            let top = (2f32.powi(elem.emax() + 1)).to_bits();
            let check = |bits: u32| {
                for q in [f32::from_bits(bits), -f32::from_bits(bits)] {
                    assert_eq!(
                        elem.quantize(q),
                        crate_code(elem, q),
                        "{elem:?} {q:e} ({bits:#x})"
                    );
                }
            };
            let mut bits = 0u32;
            while bits < top {
                check(bits);
                bits += 61;
            }
            // Ties: halfway between neighbours of the grid, and one ulp off.
            let grid: Vec<f64> = grid(elem).into_iter().map(|(_, v)| v.abs()).collect();
            let mut g = grid.clone();
            g.sort_by(f64::total_cmp);
            g.dedup();
            for w in g.windows(2) {
                let mid = ((w[0] + w[1]) / 2.0) as f32;
                for d in [-1i32, 0, 1] {
                    check(mid.to_bits().saturating_add_signed(d));
                }
            }
        }
    }

    #[test]
    fn the_e2m1_crate_agrees_with_the_specification_grid() {
        // Every quarter step from -8 to 8 (ties included) and beyond.
        for k in -40..=40 {
            let q = f64::from(k) * 0.25;
            let c = float4::F4E2M1::from_f64(q).to_bits();
            assert_eq!(
                f64::from(E2M1_VALUES[usize::from(c)]),
                reference_quantize(MxElement::E2M1, q),
                "{q}"
            );
        }
    }

    #[test]
    fn special_blocks_nan_inf_zero_and_scale_range() {
        for elem in ALL {
            let mut enc = Vec::new();
            let mut src = vec![1.0f32; 40];
            src[3] = f32::INFINITY;
            src[35] = f32::NAN;
            encode(elem, &src, &mut enc);
            let mut out = vec![0f32; 40];
            decode(elem, &enc, &mut out, false).unwrap();
            assert!(out.iter().all(|v| v.is_nan()), "{elem:?}: {out:?}");
            let zeros = vec![0.0f32; 33];
            encode(elem, &zeros, &mut enc);
            assert_eq!(enc[0], 0);
            let mut out = vec![1f32; 33];
            decode(elem, &enc, &mut out, false).unwrap();
            assert!(out.iter().all(|&v| v == 0.0));
            // The largest finite f32 and the smallest subnormal.
            for v in [f32::MAX, f32::from_bits(1), -f32::MAX] {
                encode(elem, &[v], &mut enc);
                let mut out = [0f32];
                decode(elem, &enc, &mut out, false).unwrap();
                let want = reference_block(elem, &[v])[0];
                assert_eq!(f64::from(out[0]), want, "{elem:?} {v}");
            }
            // Wrong lengths are errors, and leave the output alone.
            let mut out = vec![7f32; 40];
            assert!(decode(elem, &enc, &mut out, false).is_err());
            assert!(out.iter().all(|&v| v == 7.0));
        }
    }

    #[test]
    fn sizes_are_8_25_and_4_25_bits_per_element() {
        assert_eq!(encoded_len(MxElement::E4M3, 3200), 3300);
        assert_eq!(encoded_len(MxElement::E2M1, 3200), 1700);
        assert_eq!(encoded_len(MxElement::E2M1, 33), 17 + 2);
        assert_eq!(encoded_len(MxElement::E5M2, 0), 0);
    }
}
