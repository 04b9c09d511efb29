//! AVX2 / F16C kernels for x86_64, selected at run time.
//!
//! All of the crate's `unsafe` code lives in this module. Every entry point
//! is a safe function that returns `false` / `None` (having done nothing)
//! when the CPU lacks the features, so the caller falls back to the portable
//! code in `dense`, `int8` and `topk`; the kernels produce the same bits as
//! that code:
//!
//! * fp16 uses `vcvtps2ph` with round-to-nearest-even, the instruction the
//!   `half` crate itself uses on such a CPU (so NaN handling matches too);
//! * bf16 reproduces `half::bf16::from_f32`: `(x + 0x7fff + lsb) >> 16`, and
//!   NaN as `(x >> 16) | 0x40`;
//! * int8 performs the same f32 operations (multiply, `roundps` to nearest
//!   even or `floor(y + u)`, clamp, convert) in the same order; blocks that
//!   are zero, non-finite or tiny use the portable per-element code;
//! * decoding is exact widening (fp16/bf16) or one multiply (int8) and one
//!   add for `decode_add`, never fused.
//!
//! Encoders write straight into the spare capacity of the output `Vec` and
//! only then set its length, so there is no zero-fill pass. Large outputs
//! (see [`STREAM_MIN`]) are written with non-temporal stores.

#![warn(clippy::undocumented_unsafe_blocks)]

use crate::int8_math::{self as int8, BlockKind};
use core::arch::x86_64::*;
use core::ptr;

/// From this many output bytes on, fp16/bf16 encode and decode (not
/// `decode_add`) write with non-temporal stores: the output is larger than
/// the caches, and skipping the read-for-ownership of the destination saves
/// a third of the memory traffic of a widening decode. See BENCH.md.
const STREAM_MIN: usize = 16 << 20;

#[inline]
fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2")
}

#[inline]
fn has_f16c() -> bool {
    is_x86_feature_detected!("f16c")
}

/// Name of the instruction sets the kernels use on this CPU.
pub(crate) fn backend() -> &'static str {
    match (has_avx2(), has_f16c()) {
        (true, true) => "avx2+f16c",
        (true, false) => "avx2",
        _ => "scalar",
    }
}

// ---------------------------------------------------------------- fp16/bf16

/// Sixteen f32 at `s` to sixteen fp16 (nearest even).
///
/// # Safety
/// AVX2 and F16C available; `s` readable for 64 bytes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn f16_narrow16(s: *const f32) -> __m256i {
    let lo = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(s));
    let hi = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(s.add(8)));
    _mm256_set_m128i(hi, lo)
}

/// Rounds eight f32 (as bits) to bf16 like `half::bf16::from_f32`; the
/// result is in the low 16 bits of each 32-bit lane.
#[inline]
#[target_feature(enable = "avx2")]
fn bf16_round(x: __m256i) -> __m256i {
    let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(x), _mm256_set1_epi32(1));
    let rounded = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb);
    let abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7fff_ffff));
    let nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f80_0000));
    let quiet = _mm256_or_si256(x, _mm256_set1_epi32(0x0040_0000));
    _mm256_srli_epi32::<16>(_mm256_blendv_epi8(rounded, quiet, nan))
}

/// Sixteen f32 at `s` to sixteen bf16.
///
/// # Safety
/// AVX2 available; `s` readable for 64 bytes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn bf16_narrow16(s: *const f32) -> __m256i {
    let a = bf16_round(_mm256_loadu_si256(s.cast()));
    let b = bf16_round(_mm256_loadu_si256(s.add(8).cast()));
    // packus interleaves 128-bit lanes: [a0-3 b0-3 | a4-7 b4-7]; the lanes'
    // values are < 2^16, so nothing saturates.
    _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(a, b))
}

/// Eight fp16 at `p` widened to f32.
///
/// # Safety
/// AVX2 and F16C available; `p` readable for 16 bytes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn f16_widen8(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
}

/// Eight bf16 at `p` widened to f32 (exact: a bf16 is an f32's top half).
///
/// # Safety
/// AVX2 available; `p` readable for 16 bytes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn bf16_widen8(p: *const u8) -> __m256 {
    let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w))
}

/// Stamps out the encode and decode kernels of one 16-bit format.
macro_rules! half_kernels {
    ($feat:literal, $enc:ident, $dec:ident, $narrow16:ident, $widen8:ident) => {
        /// Writes the `2n` encoded bytes of `s[..n]` to `d`.
        ///
        /// # Safety
        /// The kernel's features are available; `s` readable for `n` f32,
        /// `d` writable for `2n` bytes (may be uninitialised), no overlap.
        #[target_feature(enable = $feat)]
        unsafe fn $enc(s: *const f32, d: *mut u8, n: usize, stream: bool) {
            // Up to 15 elements through a zero-padded buffer, so they see the
            // same instructions as the rest.
            let padded = |s: *const f32, d: *mut u8, m: usize| {
                debug_assert!(m < 16);
                let mut buf = [0f32; 16];
                let mut o = [0u8; 32];
                ptr::copy_nonoverlapping(s, buf.as_mut_ptr(), m);
                _mm256_storeu_si256(o.as_mut_ptr().cast(), $narrow16(buf.as_ptr()));
                ptr::copy_nonoverlapping(o.as_ptr(), d, 2 * m);
            };
            let mut i = 0;
            if stream && (d as usize) % 2 == 0 {
                let head = ((32 - (d as usize) % 32) % 32 / 2).min(n);
                padded(s, d, head);
                i = head;
                while i + 16 <= n {
                    _mm256_stream_si256(d.add(2 * i).cast(), $narrow16(s.add(i)));
                    i += 16;
                }
                _mm_sfence();
            } else {
                while i + 16 <= n {
                    _mm256_storeu_si256(d.add(2 * i).cast(), $narrow16(s.add(i)));
                    i += 16;
                }
            }
            padded(s.add(i), d.add(2 * i), n - i);
        }

        /// Decodes `2 * out.len()` bytes at `e` into `out`, or adds them.
        ///
        /// # Safety
        /// The kernel's features are available; `e` readable for
        /// `2 * out.len()` bytes.
        #[target_feature(enable = $feat)]
        unsafe fn $dec(e: *const u8, out: &mut [f32], add: bool, stream: bool) {
            let n = out.len();
            let o = out.as_mut_ptr();
            // Up to 7 elements through a zero-padded buffer.
            let padded = |e: *const u8, o: *mut f32, m: usize| {
                debug_assert!(m < 8);
                let mut buf = [0u8; 16];
                let mut w = [0f32; 8];
                ptr::copy_nonoverlapping(e, buf.as_mut_ptr(), 2 * m);
                _mm256_storeu_ps(w.as_mut_ptr(), $widen8(buf.as_ptr()));
                for (j, &v) in w.iter().enumerate().take(m) {
                    if add {
                        *o.add(j) += v;
                    } else {
                        *o.add(j) = v;
                    }
                }
            };
            let mut i = 0;
            if add {
                while i + 8 <= n {
                    let v = _mm256_add_ps(_mm256_loadu_ps(o.add(i)), $widen8(e.add(2 * i)));
                    _mm256_storeu_ps(o.add(i), v);
                    i += 8;
                }
            } else if stream {
                // `o` is 4-byte aligned (it is an f32 slice).
                let head = ((32 - (o as usize) % 32) % 32 / 4).min(n);
                padded(e, o, head);
                i = head;
                while i + 8 <= n {
                    _mm256_stream_ps(o.add(i), $widen8(e.add(2 * i)));
                    i += 8;
                }
                _mm_sfence();
            } else {
                while i + 8 <= n {
                    _mm256_storeu_ps(o.add(i), $widen8(e.add(2 * i)));
                    i += 8;
                }
            }
            padded(e.add(2 * i), o.add(i), n - i);
        }
    };
}

half_kernels!(
    "avx2,f16c",
    f16_encode,
    f16_decode,
    f16_narrow16,
    f16_widen8
);
half_kernels!("avx2", bf16_encode, bf16_decode, bf16_narrow16, bf16_widen8);

/// Appends the fp16 (`bf == false`) or bf16 encoding of `src` to `out`;
/// `false` (nothing done) without the CPU features.
pub(crate) fn encode_half(bf: bool, src: &[f32], out: &mut Vec<u8>) -> bool {
    if !has_avx2() || (!bf && !has_f16c()) {
        return false;
    }
    let n = src.len();
    let len = 2 * n;
    out.reserve(len);
    let start = out.len();
    let stream = len >= STREAM_MIN;
    // SAFETY: the features were detected above. After `reserve`, the buffer
    // has room for `start + len` bytes, so `d` is writable for `len` bytes;
    // it cannot overlap `src` (a shared borrow while `out` is unique). The
    // kernel writes all `len` bytes, so the new length covers initialised
    // bytes only.
    unsafe {
        let d = out.as_mut_ptr().add(start);
        if bf {
            bf16_encode(src.as_ptr(), d, n, stream);
        } else {
            f16_encode(src.as_ptr(), d, n, stream);
        }
        out.set_len(start + len);
    }
    true
}

/// Decodes `enc` (`2 * out.len()` bytes) into `out` or adds it; `false`
/// (nothing done) without the CPU features.
pub(crate) fn decode_half(bf: bool, enc: &[u8], out: &mut [f32], add: bool) -> bool {
    if !has_avx2() || (!bf && !has_f16c()) {
        return false;
    }
    assert_eq!(enc.len(), 2 * out.len(), "encoded length mismatch");
    let stream = !add && out.len() * 4 >= STREAM_MIN;
    // SAFETY: the features were detected above; `enc` holds exactly
    // `2 * out.len()` bytes (asserted).
    unsafe {
        if bf {
            bf16_decode(enc.as_ptr(), out, add, stream);
        } else {
            f16_decode(enc.as_ptr(), out, add, stream);
        }
    }
    true
}

// --------------------------------------------------------------------- int8

/// Largest `|x|` bits of `s` (integer max: NaN ranks above infinity), as
/// [`int8::absmax_bits`].
#[target_feature(enable = "avx2")]
fn absmax_bits(s: &[f32]) -> u32 {
    let mask = _mm256_set1_epi32(0x7fff_ffff);
    let mut m = [_mm256_setzero_si256(); 4];
    let mut chunks = s.chunks_exact(32);
    for c in &mut chunks {
        for (t, mt) in m.iter_mut().enumerate() {
            // SAFETY: `c` has 32 elements, so `c[8t..8t+8]` is readable.
            let x = unsafe { _mm256_loadu_si256(c.as_ptr().add(8 * t).cast()) };
            *mt = _mm256_max_epi32(*mt, _mm256_and_si256(x, mask));
        }
    }
    let v = _mm256_max_epi32(_mm256_max_epi32(m[0], m[1]), _mm256_max_epi32(m[2], m[3]));
    let v = _mm_max_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let v = _mm_max_epi32(v, _mm_shuffle_epi32::<0b01_00_11_10>(v));
    let v = _mm_max_epi32(v, _mm_shuffle_epi32::<0b10_11_00_01>(v));
    // Lanes are non-negative, so the signed max is the unsigned max.
    (_mm_cvtsi128_si32(v) as u32).max(int8::absmax_bits(chunks.remainder()))
}

/// Largest `|x|` bits, XOR and wrapping sum of the bits of `s`, as
/// [`int8::absmax_bits`] and [`int8::xor_sum_bits`].
#[target_feature(enable = "avx2")]
fn absmax_xor_sum(s: &[f32]) -> (u32, u32, u32) {
    let mask = _mm256_set1_epi32(0x7fff_ffff);
    let (mut m, mut x, mut a) = (
        _mm256_setzero_si256(),
        _mm256_setzero_si256(),
        _mm256_setzero_si256(),
    );
    let mut chunks = s.chunks_exact(8);
    for c in &mut chunks {
        // SAFETY: `c` has 8 elements.
        let v = unsafe { _mm256_loadu_si256(c.as_ptr().cast()) };
        m = _mm256_max_epi32(m, _mm256_and_si256(v, mask));
        x = _mm256_xor_si256(x, v);
        a = _mm256_add_epi32(a, v);
    }
    let (mut lm, mut lx, mut la) = ([0u32; 8], [0u32; 8], [0u32; 8]);
    // SAFETY: each array is 32 bytes.
    unsafe {
        _mm256_storeu_si256(lm.as_mut_ptr().cast(), m);
        _mm256_storeu_si256(lx.as_mut_ptr().cast(), x);
        _mm256_storeu_si256(la.as_mut_ptr().cast(), a);
    }
    let rest = chunks.remainder();
    let (rx, ra) = int8::xor_sum_bits(rest);
    (
        lm.iter().fold(int8::absmax_bits(rest), |p, &q| p.max(q)),
        lx.iter().fold(rx, |p, &q| p ^ q),
        la.iter().fold(ra, |p, &q| p.wrapping_add(q)),
    )
}

/// Eight uniforms in `[0, 1)` for elements `i0 .. i0 + 8`, as
/// [`int8::uniform`].
#[inline]
#[target_feature(enable = "avx2")]
fn uniform8(seed: __m256i, i0: u32) -> __m256 {
    let i = _mm256_add_epi32(
        _mm256_set1_epi32(i0 as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    );
    let mut x = _mm256_mullo_epi32(_mm256_xor_si256(i, seed), _mm256_set1_epi32(0x7feb_352d));
    x = _mm256_xor_si256(x, _mm256_srli_epi32::<15>(x));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x846c_a68b_u32 as i32));
    let r = _mm256_cvtepi32_ps(_mm256_srli_epi32::<8>(x));
    _mm256_mul_ps(r, _mm256_set1_ps(1.0 / 16_777_216.0))
}

/// Quantises a normal block: `q[j] = clamp(round(blk[j] * inv))`.
///
/// # Safety
/// AVX2 available; `q` writable for `blk.len()` bytes.
#[target_feature(enable = "avx2")]
unsafe fn quantize_block(
    blk: &[f32],
    inv: f32,
    stochastic: bool,
    seed: u32,
    base: u32,
    q: *mut u8,
) {
    let vinv = _mm256_set1_ps(inv);
    let lo = _mm256_set1_ps(-127.0);
    let hi = _mm256_set1_ps(127.0);
    let vseed = _mm256_set1_epi32(seed as i32);
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let m = blk.len();
    let p = blk.as_ptr();
    let mut j = 0;
    while j + 32 <= m {
        let mut r = [_mm256_setzero_si256(); 4];
        for (t, rt) in r.iter_mut().enumerate() {
            let y = _mm256_mul_ps(_mm256_loadu_ps(p.add(j + 8 * t)), vinv);
            *rt = if stochastic {
                let u = uniform8(vseed, base.wrapping_add((j + 8 * t) as u32));
                let z = _mm256_floor_ps(_mm256_add_ps(y, u));
                _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(z, lo), hi))
            } else {
                // `cvtps2dq` rounds to nearest even (Rust keeps the default
                // MXCSR). No clamp is needed: |x| <= absmax and
                // inv = fl(127 / absmax), so |y| <= 127 (1 + 2^-24)^2 < 127.5.
                _mm256_cvtps_epi32(y)
            };
        }
        // packs interleave 128-bit lanes; dwords come out as
        // [a0-3 b0-3 c0-3 d0-3 a4-7 b4-7 c4-7 d4-7] and `order` sorts them.
        let ab = _mm256_packs_epi32(r[0], r[1]);
        let cd = _mm256_packs_epi32(r[2], r[3]);
        let v = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), order);
        _mm256_storeu_si256(q.add(j).cast(), v);
        j += 32;
    }
    while j < m {
        let y = blk[j] * inv;
        let v = if stochastic {
            int8::q_stochastic(y, int8::uniform(seed, base.wrapping_add(j as u32)))
        } else {
            int8::q_nearest(y)
        };
        q.add(j).write(v as u8);
        j += 1;
    }
}

/// Writes the int8 encoding of `src` to `d`.
///
/// # Safety
/// AVX2 available; `d` writable for `int8::encoded_len(src.len(), block)`
/// bytes (may be uninitialised), not overlapping `src`; `block > 0`.
#[target_feature(enable = "avx2")]
unsafe fn int8_encode(src: &[f32], block: usize, stochastic: bool, seed: u32, d: *mut u8) {
    for (b, blk) in src.chunks(block).enumerate() {
        let o = d.add(b * (block + 4));
        let q = o.add(4);
        let m = blk.len();
        let base = (b * block) as u32;
        let (amax, seed) = if stochastic {
            let (m, x, a) = absmax_xor_sum(blk);
            (m, int8::block_seed(seed, x, a))
        } else {
            (absmax_bits(blk), 0)
        };
        let scale = match int8::block_kind(amax) {
            BlockKind::Zero => {
                q.write_bytes(0, m);
                0.0
            }
            BlockKind::NonFinite => {
                q.write_bytes(0, m);
                f32::NAN
            }
            BlockKind::Tiny(a) => {
                for (j, &x) in blk.iter().enumerate() {
                    let u = if stochastic {
                        int8::uniform(seed, base.wrapping_add(j as u32))
                    } else {
                        0.0
                    };
                    q.add(j).write(int8::q_tiny(x, a, stochastic, u) as u8);
                }
                int8::tiny_scale(a)
            }
            BlockKind::Normal(scale, inv) => {
                quantize_block(blk, inv, stochastic, seed, base, q);
                scale
            }
        };
        ptr::copy_nonoverlapping(scale.to_le_bytes().as_ptr(), o, 4);
    }
}

/// Appends the int8 encoding of `src` to `out`; `false` (nothing done)
/// without AVX2.
pub(crate) fn encode_int8(
    src: &[f32],
    block: usize,
    stochastic: bool,
    seed: u32,
    out: &mut Vec<u8>,
) -> bool {
    if !has_avx2() {
        return false;
    }
    assert!(block > 0, "int8 block size must be positive");
    let len = int8::encoded_len(src.len(), block);
    out.reserve(len);
    let start = out.len();
    // SAFETY: AVX2 detected, `block > 0`; after `reserve` the buffer has
    // room for `start + len` bytes and cannot overlap `src`. The kernel
    // writes each block's 4 scale bytes and `m` value bytes, which tile
    // exactly `len` bytes, so the new length covers initialised bytes only.
    unsafe {
        int8_encode(src, block, stochastic, seed, out.as_mut_ptr().add(start));
        out.set_len(start + len);
    }
    true
}

/// Decodes int8 `enc` into `out` or adds it.
///
/// # Safety
/// AVX2 available; `enc.len() == int8::encoded_len(out.len(), block)`,
/// `block > 0`.
#[target_feature(enable = "avx2")]
unsafe fn int8_decode_avx2(enc: &[u8], block: usize, out: &mut [f32], add: bool) {
    for (o, e) in out.chunks_mut(block).zip(enc.chunks(block + 4)) {
        let (s, q) = e.split_at(4);
        let scale = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
        let vs = _mm256_set1_ps(scale);
        let m = o.len();
        debug_assert_eq!(q.len(), m);
        let (qp, op) = (q.as_ptr(), o.as_mut_ptr());
        let mut j = 0;
        while j + 8 <= m {
            let qi = _mm256_cvtepi8_epi32(_mm_loadl_epi64(qp.add(j).cast()));
            let mut v = _mm256_mul_ps(_mm256_cvtepi32_ps(qi), vs);
            if add {
                v = _mm256_add_ps(_mm256_loadu_ps(op.add(j)), v);
            }
            _mm256_storeu_ps(op.add(j), v);
            j += 8;
        }
        for (o, &q) in o[j..].iter_mut().zip(&q[j..]) {
            let v = f32::from(q as i8) * scale;
            if add {
                *o += v;
            } else {
                *o = v;
            }
        }
    }
}

/// Decodes int8 `enc` into `out` with non-temporal stores: every 32-byte
/// aligned group of 8 outputs is stored with one streaming store, assembled
/// in a register-sized buffer where it straddles a block boundary. The few
/// elements before the first aligned address and after the last full group
/// use ordinary stores.
///
/// # Safety
/// AVX2 available; `enc.len() == int8::encoded_len(out.len(), block)`,
/// `block > 0`.
#[target_feature(enable = "avx2")]
unsafe fn int8_decode_stream(enc: &[u8], block: usize, out: &mut [f32]) {
    let n = out.len();
    let o = out.as_mut_ptr();
    let e = enc.as_ptr();
    let stride = block + 4;
    let scale_of = |b: usize| {
        let s = &enc[b * stride..b * stride + 4];
        f32::from_le_bytes([s[0], s[1], s[2], s[3]])
    };
    let elem = |i: usize| {
        let (b, j) = (i / block, i % block);
        f32::from(enc[b * stride + 4 + j] as i8) * scale_of(b)
    };
    // `o` is 4-byte aligned (an f32 slice).
    let head = ((32 - (o as usize) % 32) % 32 / 4).min(n);
    for i in 0..head {
        *o.add(i) = elem(i);
    }
    let mut i = head; // next element to write; i - head is a multiple of 8 at group starts
    let mut buf = [0f32; 8];
    let mut fill = 0usize;
    let mut b = head / block;
    let mut j = head % block;
    while b * block < n {
        let m = block.min(n - b * block);
        let scale = scale_of(b);
        let vs = _mm256_set1_ps(scale);
        let q = e.add(b * stride + 4);
        // Finish a group that straddles the previous block's end.
        while fill > 0 && j < m {
            buf[fill] = f32::from(*q.add(j) as i8) * scale;
            fill += 1;
            j += 1;
            if fill == 8 {
                _mm256_stream_ps(o.add(i), _mm256_loadu_ps(buf.as_ptr()));
                i += 8;
                fill = 0;
            }
        }
        if fill == 0 {
            while j + 8 <= m {
                let qi = _mm256_cvtepi8_epi32(_mm_loadl_epi64(q.add(j).cast()));
                _mm256_stream_ps(o.add(i), _mm256_mul_ps(_mm256_cvtepi32_ps(qi), vs));
                i += 8;
                j += 8;
            }
            while j < m {
                buf[fill] = f32::from(*q.add(j) as i8) * scale;
                fill += 1;
                j += 1;
            }
        }
        b += 1;
        j = 0;
    }
    _mm_sfence();
    // The last, partial group.
    for (t, &v) in buf.iter().enumerate().take(fill) {
        *o.add(i + t) = v;
    }
    debug_assert_eq!(i + fill, n);
}

/// Decodes int8 `enc` into `out` or adds it; `false` (nothing done)
/// without AVX2.
pub(crate) fn decode_int8(enc: &[u8], block: usize, out: &mut [f32], add: bool) -> bool {
    if !has_avx2() {
        return false;
    }
    assert!(
        block > 0 && enc.len() == int8::encoded_len(out.len(), block),
        "int8 encoded length mismatch"
    );
    let stream = !add && out.len() * 4 >= STREAM_MIN;
    // SAFETY: AVX2 detected; length and block size asserted just above.
    // Every block's `m` value bytes follow its scale, so the 8-byte loads at
    // `j + 8 <= m` stay inside `enc`.
    unsafe {
        if stream {
            int8_decode_stream(enc, block, out);
        } else {
            int8_decode_avx2(enc, block, out, add);
        }
    }
    true
}

// -------------------------------------------------------------------- top-k

/// The vector part of top-k's `collect_ge`: whole 32-element groups from
/// `from`; returns where it stopped (after the element that filled `idx`,
/// or the first element of the tail the caller finishes); `None` without
/// AVX2.
pub(crate) fn collect_ge(
    src: &[f32],
    from: usize,
    t: u32,
    idx: &mut Vec<u32>,
    max: usize,
) -> Option<usize> {
    if !has_avx2() {
        return None;
    }
    // SAFETY: AVX2 detected.
    Some(unsafe { collect_ge_avx2(src, from, t, idx, max) })
}

/// # Safety
/// AVX2 available.
#[target_feature(enable = "avx2")]
unsafe fn collect_ge_avx2(
    src: &[f32],
    from: usize,
    t: u32,
    idx: &mut Vec<u32>,
    max: usize,
) -> usize {
    if idx.len() >= max {
        return from;
    }
    let n = src.len();
    let p = src.as_ptr();
    let mask = _mm256_set1_epi32(0x7fff_ffff);
    // key >= t  <=>  key > t - 1 (keys are non-negative as i32; t = 0 gives
    // -1, below every key).
    let tv = _mm256_set1_epi32((t as i32).wrapping_sub(1));
    let mut i = from;
    while i + 32 <= n {
        let mut c = [_mm256_setzero_si256(); 4];
        for (j, cj) in c.iter_mut().enumerate() {
            let k = _mm256_and_si256(_mm256_loadu_si256(p.add(i + 8 * j).cast()), mask);
            *cj = _mm256_cmpgt_epi32(k, tv);
        }
        let any = _mm256_or_si256(_mm256_or_si256(c[0], c[1]), _mm256_or_si256(c[2], c[3]));
        if _mm256_testz_si256(any, any) == 0 {
            let mut bits = 0u32;
            for (j, cj) in c.iter().enumerate() {
                bits |= (_mm256_movemask_ps(_mm256_castsi256_ps(*cj)) as u32) << (8 * j);
            }
            while bits != 0 {
                let z = bits.trailing_zeros() as usize;
                idx.push((i + z) as u32);
                if idx.len() >= max {
                    return i + z + 1;
                }
                bits &= bits - 1;
            }
        }
        i += 32;
    }
    i
}

#[cfg(test)]
mod tests {
    use crate::{dense, int8, topk};
    use proptest::prelude::*;

    /// Any f32 bit pattern, biased toward interesting ones.
    fn any_f32() -> impl Strategy<Value = f32> {
        prop_oneof![
            4 => any::<u32>().prop_map(f32::from_bits),
            4 => -1000.0f32..1000.0,
            1 => Just(f32::NAN),
            1 => Just(f32::INFINITY),
            1 => Just(-0.0f32),
            1 => (0u32..0x0080_0000).prop_map(f32::from_bits),
            // Halfway cases for bf16 and fp16 rounding.
            2 => any::<u32>().prop_map(|b| f32::from_bits((b & 0xffff_0000) | 0x8000)),
            2 => any::<u32>().prop_map(|b| f32::from_bits((b & 0xffff_e000) | 0x1000)),
        ]
    }

    fn f32_bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    proptest! {
        #[test]
        fn half_encode_matches_scalar(v in prop::collection::vec(any_f32(), 0..200), off in 0usize..3) {
            for bf in [false, true] {
                let src = &v[off.min(v.len())..];
                let mut a = vec![0xaa];
                let mut b = vec![0xaa];
                if super::encode_half(bf, src, &mut a) {
                    dense::encode_scalar(bf, src, &mut b);
                    prop_assert_eq!(&a, &b, "bf16={}", bf);
                }
            }
        }

        #[test]
        fn half_decode_matches_scalar(h in prop::collection::vec(any::<u16>(), 0..200), add in any::<bool>()) {
            let enc: Vec<u8> = h.iter().flat_map(|x| x.to_le_bytes()).collect();
            for bf in [false, true] {
                let mut a = vec![1.5f32; h.len()];
                let mut b = a.clone();
                if super::decode_half(bf, &enc, &mut a, add) {
                    dense::decode_scalar(bf, &enc, &mut b, add);
                    prop_assert_eq!(f32_bits(&a), f32_bits(&b));
                }
            }
        }

        #[test]
        fn int8_matches_scalar(
            v in prop::collection::vec(any_f32(), 0..700),
            scale_exp in -140i32..60,
            block in prop_oneof![Just(256usize), Just(32), 1usize..100],
            stochastic in any::<bool>(),
            seed in any::<u32>(),
            finite in any::<bool>(),
        ) {
            // Mostly finite data in one magnitude range, as gradients are.
            let src: Vec<f32> = if finite {
                v.iter()
                    .map(|x| if x.is_finite() { (x % 8.0) * 2f32.powi(scale_exp) } else { 0.0 })
                    .collect()
            } else {
                v
            };
            let mut a = Vec::new();
            let mut b = Vec::new();
            if super::encode_int8(&src, block, stochastic, seed, &mut a) {
                int8::encode_scalar(&src, block, stochastic, seed, &mut b);
                prop_assert_eq!(&a, &b);
                for add in [false, true] {
                    let mut da = vec![0.25f32; src.len()];
                    let mut db = da.clone();
                    prop_assert!(super::decode_int8(&a, block, &mut da, add));
                    int8::decode_scalar(&a, block, &mut db, add);
                    prop_assert_eq!(f32_bits(&da), f32_bits(&db));
                }
            }
        }

        #[test]
        fn collect_matches_scalar(
            v in prop::collection::vec(any_f32(), 0..300),
            t in any::<u32>(),
            from in 0usize..300,
            max in 0usize..400,
        ) {
            let t = t & 0x7fff_ffff;
            let from = from.min(v.len());
            let mut a = vec![7];
            let mut b = vec![7];
            if let Some(pa) = super::collect_ge(&v, from, t, &mut a, max) {
                // The caller finishes the tail (topk::collect_ge).
                let pa = topk::collect_ge_scalar(&v, pa, t, &mut a, max);
                let pb = topk::collect_ge_scalar(&v, from, t, &mut b, max);
                prop_assert_eq!((pa, a), (pb, b));
            }
        }
    }

    /// Large enough for the non-temporal paths, with unaligned slices.
    #[test]
    fn half_streaming_matches_scalar() {
        let n = (super::STREAM_MIN / 2) + 37;
        let v: Vec<f32> = (0..n + 1)
            .map(|i| f32::from_bits((i as u32).wrapping_mul(0x9e37_79b9)))
            .collect();
        let src = &v[1..];
        for bf in [false, true] {
            let mut a = vec![1u8];
            let mut b = vec![1u8];
            if !super::encode_half(bf, src, &mut a) {
                return;
            }
            dense::encode_scalar(bf, src, &mut b);
            assert!(a == b, "encode bf16={bf}");
            let mut da = vec![0f32; n + 1];
            let mut db = vec![0f32; n];
            assert!(super::decode_half(bf, &a[1..], &mut da[1..], false));
            dense::decode_scalar(bf, &a[1..], &mut db, false);
            assert!(f32_bits(&da[1..]) == f32_bits(&db), "decode bf16={bf}");
        }
    }

    /// Int8 decode through the non-temporal path, with blocks that do and do
    /// not line up with the 32-byte groups, and an unaligned output.
    #[test]
    fn int8_streaming_matches_scalar() {
        let n = super::STREAM_MIN / 4 + 13;
        let v: Vec<f32> = (0..n)
            .map(|i| ((i as u32).wrapping_mul(0x9e37_79b9) >> 8) as f32 - 8e6)
            .collect();
        for block in [256, 100, 7, 1] {
            let mut enc = Vec::new();
            if !super::encode_int8(&v, block, false, 0, &mut enc) {
                return;
            }
            for off in [0, 1, 3] {
                let mut da = vec![0f32; n + off];
                let mut db = vec![0f32; n];
                assert!(super::decode_int8(&enc, block, &mut da[off..], false));
                int8::decode_scalar(&enc, block, &mut db, false);
                assert!(
                    f32_bits(&da[off..]) == f32_bits(&db),
                    "block {block} off {off}"
                );
            }
        }
    }
}
