//! fp16 and bf16: portable reference code and dispatch to the vector kernels.

use half::{bf16, f16};

/// Appends the fp16 encoding of `src` to `out`.
pub(crate) fn encode_fp16(src: &[f32], out: &mut Vec<u8>) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::encode_half(false, src, out) {
        return;
    }
    encode_scalar(false, src, out);
}

/// Appends the bf16 encoding of `src` to `out`.
pub(crate) fn encode_bf16(src: &[f32], out: &mut Vec<u8>) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::encode_half(true, src, out) {
        return;
    }
    encode_scalar(true, src, out);
}

/// bf16 bits of `x`, exactly `half::bf16::from_f32`.
#[inline]
pub(crate) fn bf16_bits(x: f32) -> u16 {
    bf16::from_f32(x).to_bits()
}

/// fp16 bits of `x` (IEEE round to nearest even).
#[inline]
pub(crate) fn f16_bits(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}

/// Portable encoder (also the reference the vector kernels are tested
/// against).
pub(crate) fn encode_scalar(bf: bool, src: &[f32], out: &mut Vec<u8>) {
    let start = out.len();
    out.resize(start + 2 * src.len(), 0);
    let dst = &mut out[start..];
    for (d, &x) in dst.chunks_exact_mut(2).zip(src) {
        let h = if bf { bf16_bits(x) } else { f16_bits(x) };
        d.copy_from_slice(&h.to_le_bytes());
    }
}

/// Decodes `enc` (exactly `2 * out.len()` bytes) into `out`, or adds it.
pub(crate) fn decode(bf: bool, enc: &[u8], out: &mut [f32], add: bool) {
    debug_assert_eq!(enc.len(), 2 * out.len());
    #[cfg(target_arch = "x86_64")]
    if crate::simd::decode_half(bf, enc, out, add) {
        return;
    }
    decode_scalar(bf, enc, out, add);
}

/// Portable decoder.
pub(crate) fn decode_scalar(bf: bool, enc: &[u8], out: &mut [f32], add: bool) {
    for (o, b) in out.iter_mut().zip(enc.chunks_exact(2)) {
        let h = u16::from_le_bytes([b[0], b[1]]);
        let v = if bf {
            f32::from_bits(u32::from(h) << 16)
        } else {
            f16::from_bits(h).to_f32()
        };
        if add {
            *o += v;
        } else {
            *o = v;
        }
    }
}

/// Half an ulp of the target format at `src`'s largest magnitude.
pub(crate) fn error_bound(bf: bool, src: &[f32]) -> f32 {
    let amax = src
        .iter()
        .fold(0u32, |m, x| m.max(x.to_bits() & 0x7fff_ffff));
    if amax == 0 {
        return 0.0;
    }
    let a = f32::from_bits(amax);
    if !a.is_finite() {
        return f32::INFINITY;
    }
    // Rounding `a` to the format overflows: the error is unbounded.
    let rounded_inf = if bf {
        bf16::from_f32(a).is_infinite()
    } else {
        f16::from_f32(a).is_infinite()
    };
    if rounded_inf {
        return f32::INFINITY;
    }
    // Binary exponent of `a` (f32 subnormals count as exponent -126).
    let e = ((amax >> 23) as i32 - 127).max(-126);
    // Mantissa bits and smallest normal exponent of the target format.
    let (mant, emin) = if bf { (7, -126) } else { (10, -14) };
    // One ulp at exponent e is 2^(max(e, emin) - mant); half of that.
    let exp = e.max(emin) - mant - 1;
    // Through f64: exact for every power of two down to 2^-134.
    2f64.powi(exp) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_values() {
        assert_eq!(error_bound(false, &[1.0]), 2f32.powi(-11));
        assert_eq!(error_bound(false, &[1.9, -0.5]), 2f32.powi(-11));
        assert_eq!(error_bound(false, &[2.0]), 2f32.powi(-10));
        assert_eq!(error_bound(false, &[1e-9]), 2f32.powi(-25));
        assert_eq!(error_bound(false, &[70000.0]), f32::INFINITY);
        assert_eq!(error_bound(false, &[65504.0]), 16.0);
        assert_eq!(error_bound(true, &[1.0]), 2f32.powi(-8));
        assert_eq!(error_bound(true, &[f32::MAX]), f32::INFINITY);
        assert_eq!(error_bound(true, &[1e-45]), 2f32.powi(-134));
        assert_eq!(error_bound(true, &[0.0, -0.0]), 0.0);
        assert_eq!(error_bound(true, &[f32::NAN]), f32::INFINITY);
    }
}
