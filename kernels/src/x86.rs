//! AVX2 / F16C kernels for x86_64, selected once at run time.
//!
//! All of the crate's `unsafe` code lives in this module. The kernels work on
//! raw byte pointers with unaligned 256-bit loads and stores, so buffers need
//! no alignment. Every element, including those in a buffer's tail, goes
//! through the same vector instructions (the tail is loaded with masked loads
//! into a zero-padded register), so a result never depends on an element's
//! position or on the buffer's length — this keeps NaN payloads deterministic.
//!
//! Detection runs once: the first call fills a [`OnceLock`]ed table of
//! function pointers indexed by `(dtype, op)`, so a call costs one atomic
//! load, one indirect call and, for an 8-byte buffer, a handful of masked
//! loads and stores (about 3.5 ns, see BENCH.md).
//!
//! Float semantics match `scalar.rs` bit for bit: max and min are IEEE
//! 754-2019 maximum and minimum, commutative bit for bit (`vmaxps` plus a
//! fix-up where operands are equal or unordered), f16 goes through the same F16C instructions the
//! `half` crate uses on this CPU, and bf16 rounding reproduces
//! `half::bf16::from_f32` (nearest-even, NaN → `(bits >> 16) | 0x40`). The only
//! freedom left is which NaN payload a sum or product of two NaNs gets, where
//! scalar code is at the mercy of the compiler's operand order.

#![warn(clippy::undocumented_unsafe_blocks)]

use crate::{DataType, ReduceOp};
use core::arch::x86_64::*;
use core::marker::PhantomData;
use std::sync::OnceLock;

/// A selected kernel: `d[..len] = a[..len] op b[..len]`, or for divide kernels
/// `d[..len] = a[..len] / n` (then `b` is ignored). `n` is ignored by the
/// binary kernels. With `stream`, the bulk of `d` is written with
/// non-temporal stores.
///
/// # Safety
/// `a` and `b` must be readable and `d` writable for `len` bytes; `d` may equal
/// `a` or `b` but must not otherwise overlap them; the CPU must support the
/// features the kernel was compiled for (guaranteed by [`table`]). With
/// `stream`, the distance from `d` to the next 32-byte boundary must be a
/// multiple of the element size, so that no element straddles it.
type Kernel = unsafe fn(d: *mut u8, a: *const u8, b: *const u8, len: usize, n: usize, stream: bool);

/// From this size on, `reduce_into` and `copy` write the destination with
/// non-temporal stores. Measured on the development machine (32 MiB L3):
/// from 16 MiB on streaming wins by 15–30 % (the buffers no longer stay in
/// cache, and skipping the destination's read-for-ownership saves a quarter
/// of a reduction's memory traffic and a third of a copy's); below it cached
/// stores win for copies and keep the result in cache for whoever reads it
/// next (typically a peer on another core). See BENCH.md.
const STREAM_MIN: usize = 16 << 20;

/// Kernels selected for this CPU, built once.
struct Table {
    /// Indexed by `dtype as usize * 8 + op as usize`.
    reduce: [Option<Kernel>; DataType::ALL.len() * 8],
    /// Indexed by `dtype as usize`.
    divide: [Option<Kernel>; DataType::ALL.len()],
    /// Human-readable name of the selected instruction sets.
    name: &'static str,
    /// AVX2 (hence AVX, for streaming copies) is available.
    avx2: bool,
}

static TABLE: OnceLock<Table> = OnceLock::new();

#[inline]
fn table() -> &'static Table {
    TABLE.get_or_init(build_table)
}

#[cold]
fn build_table() -> Table {
    let avx2 = is_x86_feature_detected!("avx2");
    let f16c = avx2 && is_x86_feature_detected!("f16c");
    let mut t = Table {
        reduce: [None; DataType::ALL.len() * 8],
        divide: [None; DataType::ALL.len()],
        name: match (avx2, f16c) {
            (true, true) => "avx2+f16c",
            (true, false) => "avx2",
            _ => "scalar",
        },
        avx2,
    };
    if !avx2 {
        return t;
    }
    for dtype in DataType::ALL {
        if dtype == DataType::Float16 && !f16c {
            continue;
        }
        for op in ReduceOp::ALL {
            t.reduce[dtype as usize * 8 + op as usize] = reduce_kernel(dtype, op);
        }
        t.divide[dtype as usize] = divide_kernel(dtype);
    }
    t
}

/// Name of the instruction sets the kernels use on this CPU.
pub(crate) fn backend() -> &'static str {
    table().name
}

/// `dst = a op b` with a vector kernel; `false` (nothing written) when there
/// is none for this CPU and `(dtype, op)`.
#[inline]
pub(crate) fn reduce_into(
    dtype: DataType,
    op: ReduceOp,
    dst: &mut [u8],
    a: &[u8],
    b: &[u8],
) -> bool {
    let Some(k) = table().reduce[dtype as usize * 8 + op as usize] else {
        return false;
    };
    let len = dst.len();
    assert!(
        a.len() == len && b.len() == len,
        "kernel slice lengths differ"
    );
    let d = dst.as_mut_ptr();
    // Streaming needs whole elements before the first 32-byte boundary,
    // which holds whenever `dst` is aligned to the element size.
    let stream = len >= STREAM_MIN && (d as usize).is_multiple_of(dtype.size());
    // SAFETY: the table only holds kernels whose target features were
    // detected; all three slices are valid for `len` bytes, and `dst` is a
    // unique borrow so it cannot overlap `a` or `b`. The alignment condition
    // for `stream` is checked just above (element sizes divide 32).
    unsafe { k(d, a.as_ptr(), b.as_ptr(), len, 0, stream) };
    true
}

/// `acc = acc op src` with a vector kernel; `false` when there is none.
#[inline]
pub(crate) fn reduce_inplace(dtype: DataType, op: ReduceOp, acc: &mut [u8], src: &[u8]) -> bool {
    let Some(k) = table().reduce[dtype as usize * 8 + op as usize] else {
        return false;
    };
    let len = acc.len();
    assert!(src.len() == len, "kernel slice lengths differ");
    let p = acc.as_mut_ptr();
    // SAFETY: features detected (see `reduce_into`); `acc` and `src` are valid
    // for `len` bytes. `d == a` is allowed: every block is loaded completely
    // before it is stored. `src` cannot overlap the unique borrow `acc`.
    unsafe { k(p, p, src.as_ptr(), len, 0, false) };
    true
}

/// `buf /= n` with a vector kernel (float types only); `false` when there is none.
#[inline]
pub(crate) fn divide(dtype: DataType, buf: &mut [u8], n: usize) -> bool {
    let Some(k) = table().divide[dtype as usize] else {
        return false;
    };
    let p = buf.as_mut_ptr();
    // SAFETY: features detected (see `reduce_into`); `buf` is valid for
    // `buf.len()` bytes and divide kernels only read `a` (== `d`), never `b`.
    unsafe { k(p, p, p, buf.len(), n, false) };
    true
}

/// Copies with non-temporal stores when that wins (large buffers, AVX
/// available); `false` (nothing written) otherwise.
#[inline]
pub(crate) fn copy(dst: &mut [u8], src: &[u8]) -> bool {
    let len = dst.len();
    if len < STREAM_MIN || !table().avx2 {
        return false;
    }
    assert!(src.len() == len, "copy slice lengths differ");
    let head = dst.as_ptr().align_offset(W).min(len);
    let end = head + (len - head) / (4 * W) * (4 * W);
    dst[..head].copy_from_slice(&src[..head]);
    // SAFETY: AVX2 (hence AVX) was detected; `dst` and `src` are valid for
    // `len >= end` bytes and cannot overlap (unique borrow); `dst + head` is
    // 32-byte aligned and `end - head` is a multiple of 128.
    unsafe {
        stream_copy(
            dst.as_mut_ptr().add(head),
            src.as_ptr().add(head),
            end - head,
        )
    };
    dst[end..].copy_from_slice(&src[end..]);
    true
}

/// # Safety
/// AVX must be available; `d` (32-byte aligned) writable and `s` readable
/// for `len` bytes, a multiple of 128; no overlap.
#[target_feature(enable = "avx")]
unsafe fn stream_copy(d: *mut u8, s: *const u8, len: usize) {
    let mut i = 0;
    while i < len {
        let v0 = _mm256_loadu_si256(s.add(i).cast());
        let v1 = _mm256_loadu_si256(s.add(i + 32).cast());
        let v2 = _mm256_loadu_si256(s.add(i + 64).cast());
        let v3 = _mm256_loadu_si256(s.add(i + 96).cast());
        _mm256_stream_si256(d.add(i).cast(), v0);
        _mm256_stream_si256(d.add(i + 32).cast(), v1);
        _mm256_stream_si256(d.add(i + 64).cast(), v2);
        _mm256_stream_si256(d.add(i + 96).cast(), v3);
        i += 128;
    }
    _mm_sfence();
}

// ---------------------------------------------------------------------------
// Kernel selection.

fn reduce_kernel(dtype: DataType, op: ReduceOp) -> Option<Kernel> {
    use DataType as D;
    use ReduceOp as R;
    // Bitwise operators are the same instruction for every integer width.
    match op {
        R::BitAnd | R::BitOr | R::BitXor if dtype.is_float() => return None,
        R::BitAnd => return Some(avx2::<Native<And>>),
        R::BitOr => return Some(avx2::<Native<Or>>),
        R::BitXor => return Some(avx2::<Native<Xor>>),
        _ => {}
    }
    let k: Kernel = match (dtype, op) {
        (D::Int8 | D::Uint8, R::Sum | R::Avg) => avx2::<Native<AddI8>>,
        (D::Int8 | D::Uint8, R::Prod) => avx2::<Native<MulI8>>,
        (D::Int8, R::Max) => avx2::<Native<MaxI8>>,
        (D::Int8, R::Min) => avx2::<Native<MinI8>>,
        (D::Uint8, R::Max) => avx2::<Native<MaxU8>>,
        (D::Uint8, R::Min) => avx2::<Native<MinU8>>,

        (D::Int32 | D::Uint32, R::Sum | R::Avg) => avx2::<Native<AddI32>>,
        (D::Int32 | D::Uint32, R::Prod) => avx2::<Native<MulI32>>,
        (D::Int32, R::Max) => avx2::<Native<MaxI32>>,
        (D::Int32, R::Min) => avx2::<Native<MinI32>>,
        (D::Uint32, R::Max) => avx2::<Native<MaxU32>>,
        (D::Uint32, R::Min) => avx2::<Native<MinU32>>,

        (D::Int64 | D::Uint64, R::Sum | R::Avg) => avx2::<Native<AddI64>>,
        (D::Int64 | D::Uint64, R::Prod) => avx2::<Native<MulI64>>,
        (D::Int64, R::Max) => avx2::<Native<MaxI64>>,
        (D::Int64, R::Min) => avx2::<Native<MinI64>>,
        (D::Uint64, R::Max) => avx2::<Native<MaxU64>>,
        (D::Uint64, R::Min) => avx2::<Native<MinU64>>,

        (D::Float32, R::Sum | R::Avg) => avx2::<Native<Ps<Add>>>,
        (D::Float32, R::Prod) => avx2::<Native<Ps<Mul>>>,
        (D::Float32, R::Max) => avx2::<Native<Ps<Max>>>,
        (D::Float32, R::Min) => avx2::<Native<Ps<Min>>>,

        (D::Float64, R::Sum | R::Avg) => avx2::<Native<Pd<Add>>>,
        (D::Float64, R::Prod) => avx2::<Native<Pd<Mul>>>,
        (D::Float64, R::Max) => avx2::<Native<Pd<Max>>>,
        (D::Float64, R::Min) => avx2::<Native<Pd<Min>>>,

        (D::Float16, R::Sum | R::Avg) => avx2_f16c::<Half<Add>>,
        (D::Float16, R::Prod) => avx2_f16c::<Half<Mul>>,
        (D::Float16, R::Max) => avx2_f16c::<Half<Max>>,
        (D::Float16, R::Min) => avx2_f16c::<Half<Min>>,

        (D::Bfloat16, R::Sum | R::Avg) => avx2::<Brain<Add>>,
        (D::Bfloat16, R::Prod) => avx2::<Brain<Mul>>,
        (D::Bfloat16, R::Max) => avx2::<Brain<Max>>,
        (D::Bfloat16, R::Min) => avx2::<Brain<Min>>,

        // fp8 runs the portable code (decode, f32 op, saturating encode).
        (D::Float8e4m3 | D::Float8e5m2, _) => return None,

        (_, R::BitAnd | R::BitOr | R::BitXor) => unreachable!("handled above"),
    };
    Some(k)
}

fn divide_kernel(dtype: DataType) -> Option<Kernel> {
    // Integer division has no vector instruction; those stay scalar.
    match dtype {
        DataType::Float32 => Some(avx2::<DivPs>),
        DataType::Float64 => Some(avx2::<DivPd>),
        DataType::Float16 => Some(avx2_f16c::<DivHalf>),
        DataType::Bfloat16 => Some(avx2::<DivBrain>),
        _ => None,
    }
}

/// Bytes per step.
const W: usize = 32;

// ---------------------------------------------------------------------------
// Drivers. The target-feature functions are the only places the vector code
// is instantiated; everything below them is `#[inline(always)]` so that the
// intrinsics are inlined into a context where AVX2 / F16C are enabled.

/// # Safety
/// See [`Kernel`]; the CPU must support AVX2.
#[target_feature(enable = "avx2")]
unsafe fn avx2<B: Block>(
    d: *mut u8,
    a: *const u8,
    b: *const u8,
    len: usize,
    n: usize,
    stream: bool,
) {
    run::<B>(d, a, b, len, n, stream)
}

/// # Safety
/// See [`Kernel`]; the CPU must support AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
unsafe fn avx2_f16c<B: Block>(
    d: *mut u8,
    a: *const u8,
    b: *const u8,
    len: usize,
    n: usize,
    stream: bool,
) {
    run::<B>(d, a, b, len, n, stream)
}

/// One vector step: 32 bytes of each input in, 32 bytes out.
trait Block {
    /// Per-call constant (the divisor for divide kernels).
    type Ctx: Copy;
    /// Builds the per-call constant.
    ///
    /// # Safety
    /// Called only where the kernel's target features are enabled.
    unsafe fn ctx(n: usize) -> Self::Ctx;
    /// Computes one step from `x` and `y`.
    ///
    /// # Safety
    /// Called only where the kernel's target features are enabled.
    unsafe fn compute(c: Self::Ctx, x: __m256i, y: __m256i) -> __m256i;
}

/// One full step at byte offset `i`. Both loads precede the store, so `d`
/// may equal `a` or `b`. `NT` selects a non-temporal store, for which
/// `d + i` must be 32-byte aligned.
#[inline(always)]
unsafe fn step<B: Block, const NT: bool>(
    c: B::Ctx,
    d: *mut u8,
    a: *const u8,
    b: *const u8,
    i: usize,
) {
    let x = _mm256_loadu_si256(a.add(i).cast());
    let y = _mm256_loadu_si256(b.add(i).cast());
    let r = B::compute(c, x, y);
    if NT {
        _mm256_stream_si256(d.add(i).cast(), r);
    } else {
        _mm256_storeu_si256(d.add(i).cast(), r);
    }
}

/// Bytes `i..end`: whole steps, then (unless `NT`, where the range is a
/// multiple of four steps) a partial one.
#[inline(always)]
unsafe fn span<B: Block, const NT: bool>(
    c: B::Ctx,
    d: *mut u8,
    a: *const u8,
    b: *const u8,
    mut i: usize,
    end: usize,
) {
    while i + 4 * W <= end {
        step::<B, NT>(c, d, a, b, i);
        step::<B, NT>(c, d, a, b, i + W);
        step::<B, NT>(c, d, a, b, i + 2 * W);
        step::<B, NT>(c, d, a, b, i + 3 * W);
        i += 4 * W;
    }
    if NT {
        return;
    }
    while i + W <= end {
        step::<B, false>(c, d, a, b, i);
        i += W;
    }
    if i < end {
        // The tail goes through exactly the same `compute` as the body, on
        // zero-padded registers, so results do not depend on position.
        let rem = end - i;
        let x = load_partial(a.add(i), rem);
        let y = load_partial(b.add(i), rem);
        store_partial(d.add(i), rem, B::compute(c, x, y));
    }
}

#[inline(always)]
unsafe fn run<B: Block>(
    d: *mut u8,
    a: *const u8,
    b: *const u8,
    len: usize,
    n: usize,
    stream: bool,
) {
    let c = B::ctx(n);
    if !stream {
        return span::<B, false>(c, d, a, b, 0, len);
    }
    // Up to the first 32-byte boundary of `d` (whole elements, see `Kernel`),
    // then aligned non-temporal stores, then the rest.
    let head = (d as usize).wrapping_neg() % W;
    let head = head.min(len);
    let end = head + (len - head) / (4 * W) * (4 * W);
    span::<B, false>(c, d, a, b, 0, head);
    span::<B, true>(c, d, a, b, head, end);
    _mm_sfence();
    span::<B, false>(c, d, a, b, end, len);
}

/// `-1` in the first eight 32-bit lanes, then zeros: a window of eight at
/// `8 - k` has exactly its first `k` lanes set.
static LANE_MASKS: [i32; 16] = [-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0];

/// Mask with the first `k <= 8` 32-bit lanes set.
#[inline(always)]
unsafe fn lanes(k: usize) -> __m256i {
    debug_assert!(k <= 8);
    _mm256_loadu_si256(LANE_MASKS.as_ptr().add(8 - k).cast())
}

/// Loads `n < 32` bytes into the low bytes of a zeroed register without
/// touching memory past `src + n`. Done in registers (masked load plus a
/// blend for a last partial 4-byte lane) rather than through a stack buffer,
/// which would cost a store-forwarding stall.
#[inline(always)]
unsafe fn load_partial(src: *const u8, n: usize) -> __m256i {
    debug_assert!(n < 32);
    let words = n / 4;
    let mut v = _mm256_maskload_epi32(src.cast(), lanes(words));
    let r = n % 4;
    if r != 0 {
        let p = src.add(words * 4);
        let mut x = u32::from(*p);
        if r > 1 {
            x |= u32::from(*p.add(1)) << 8;
        }
        if r > 2 {
            x |= u32::from(*p.add(2)) << 16;
        }
        let at = _mm256_cmpeq_epi32(
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            _mm256_set1_epi32(words as i32),
        );
        v = _mm256_blendv_epi8(v, _mm256_set1_epi32(x as i32), at);
    }
    v
}

/// Stores the low `n < 32` bytes of `v` without touching memory past `dst + n`.
#[inline(always)]
unsafe fn store_partial(dst: *mut u8, n: usize, v: __m256i) {
    debug_assert!(n < 32);
    let words = n / 4;
    _mm256_maskstore_epi32(dst.cast(), lanes(words), v);
    let r = n % 4;
    if r != 0 {
        let lane = _mm256_permutevar8x32_epi32(v, _mm256_set1_epi32(words as i32));
        let x = _mm256_cvtsi256_si32(lane) as u32;
        let p = dst.add(words * 4);
        *p = x as u8;
        if r > 1 {
            *p.add(1) = (x >> 8) as u8;
        }
        if r > 2 {
            *p.add(2) = (x >> 16) as u8;
        }
    }
}

// ---------------------------------------------------------------------------
// Block types.

/// Operation on a full 256-bit register of native elements.
trait Op256 {
    unsafe fn apply(a: __m256i, b: __m256i) -> __m256i;
}

/// Operation on eight f32 lanes (also used for f16 and bf16, widened).
trait OpPs {
    unsafe fn ps(a: __m256, b: __m256) -> __m256;
}

/// Operation on four f64 lanes.
trait OpPd {
    unsafe fn pd(a: __m256d, b: __m256d) -> __m256d;
}

/// 32 bytes of natively supported elements.
struct Native<O>(PhantomData<O>);

impl<O: Op256> Block for Native<O> {
    type Ctx = ();
    #[inline(always)]
    unsafe fn ctx(_: usize) {}
    #[inline(always)]
    unsafe fn compute(_: (), x: __m256i, y: __m256i) -> __m256i {
        O::apply(x, y)
    }
}

/// f32 lanes viewed as a 256-bit integer register.
struct Ps<O>(PhantomData<O>);

impl<O: OpPs> Op256 for Ps<O> {
    #[inline(always)]
    unsafe fn apply(a: __m256i, b: __m256i) -> __m256i {
        _mm256_castps_si256(O::ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b)))
    }
}

/// f64 lanes viewed as a 256-bit integer register.
struct Pd<O>(PhantomData<O>);

impl<O: OpPd> Op256 for Pd<O> {
    #[inline(always)]
    unsafe fn apply(a: __m256i, b: __m256i) -> __m256i {
        _mm256_castpd_si256(O::pd(_mm256_castsi256_pd(a), _mm256_castsi256_pd(b)))
    }
}

/// Sixteen f16 elements (32 bytes), widened to f32 with F16C. Converting
/// back in registers and storing 256 bits at once avoids the slow
/// memory-destination form of `vcvtps2ph`.
struct Half<O>(PhantomData<O>);

impl<O: OpPs> Block for Half<O> {
    type Ctx = ();
    #[inline(always)]
    unsafe fn ctx(_: usize) {}
    #[inline(always)]
    unsafe fn compute(_: (), x: __m256i, y: __m256i) -> __m256i {
        let (xl, xh) = f16_widen(x);
        let (yl, yh) = f16_widen(y);
        f16_narrow(O::ps(xl, yl), O::ps(xh, yh))
    }
}

/// Sixteen f16 to two registers of f32 (elements 0..8 and 8..16).
#[inline(always)]
unsafe fn f16_widen(x: __m256i) -> (__m256, __m256) {
    (
        _mm256_cvtph_ps(_mm256_castsi256_si128(x)),
        _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(x)),
    )
}

/// Inverse of [`f16_widen`], rounding to nearest even like `half`.
#[inline(always)]
unsafe fn f16_narrow(lo: __m256, hi: __m256) -> __m256i {
    let lo = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(lo);
    let hi = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(hi);
    _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi)
}

/// Sixteen bf16 elements (32 bytes), widened to f32 by shifting.
struct Brain<O>(PhantomData<O>);

impl<O: OpPs> Block for Brain<O> {
    type Ctx = ();
    #[inline(always)]
    unsafe fn ctx(_: usize) {}
    #[inline(always)]
    unsafe fn compute(_: (), x: __m256i, y: __m256i) -> __m256i {
        let (xe, xo) = bf16_widen(x);
        let (ye, yo) = bf16_widen(y);
        bf16_narrow(O::ps(xe, ye), O::ps(xo, yo))
    }
}

/// Splits sixteen bf16 into two f32 registers: a bf16 is the high half of
/// an f32, so shifting the even elements up (and masking the odd ones in
/// place) widens them exactly. Returns (even elements, odd elements).
#[inline(always)]
unsafe fn bf16_widen(x: __m256i) -> (__m256, __m256) {
    let even = _mm256_slli_epi32::<16>(x);
    let odd = _mm256_and_si256(x, _mm256_set1_epi32(0xffff_0000_u32 as i32));
    (_mm256_castsi256_ps(even), _mm256_castsi256_ps(odd))
}

/// Inverse of [`bf16_widen`], rounding like `half::bf16::from_f32`.
#[inline(always)]
unsafe fn bf16_narrow(even: __m256, odd: __m256) -> __m256i {
    // One compare finds a NaN in either register; NaN-free blocks (the
    // normal case) skip the NaN fix-up, which is a third of the work.
    let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(even, odd);
    let (even, odd) = if _mm256_testz_ps(nan, nan) != 0 {
        (bf16_round_finite(even), bf16_round_finite(odd))
    } else {
        (bf16_round(even), bf16_round(odd))
    };
    // Low 16 bits of each lane from `even`, high 16 bits from `odd`.
    _mm256_blend_epi16::<0b1010_1010>(_mm256_srli_epi32::<16>(even), odd)
}

/// Rounds non-NaN f32 lanes to nearest-even bf16 (`x + 0x7fff + lsb`),
/// leaving the result in the high 16 bits of each lane (the low bits are
/// garbage). Infinities and overflow to infinity come out right.
#[inline(always)]
unsafe fn bf16_round_finite(v: __m256) -> __m256i {
    let x = _mm256_castps_si256(v);
    let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(x), _mm256_set1_epi32(1));
    _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb)
}

/// [`bf16_round_finite`], plus NaN as `half::bf16::from_f32` does it:
/// `(x >> 16) | 0x40`.
#[inline(always)]
unsafe fn bf16_round(v: __m256) -> __m256i {
    let x = _mm256_castps_si256(v);
    let is_nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
    let quiet = _mm256_or_si256(x, _mm256_set1_epi32(0x0040_0000));
    _mm256_blendv_epi8(bf16_round_finite(v), quiet, is_nan)
}

/// `a / n` for f32.
struct DivPs;

impl Block for DivPs {
    type Ctx = __m256;
    #[inline(always)]
    unsafe fn ctx(n: usize) -> __m256 {
        _mm256_set1_ps(n as f32)
    }
    #[inline(always)]
    unsafe fn compute(c: __m256, x: __m256i, _: __m256i) -> __m256i {
        _mm256_castps_si256(_mm256_div_ps(_mm256_castsi256_ps(x), c))
    }
}

/// `a / n` for f64.
struct DivPd;

impl Block for DivPd {
    type Ctx = __m256d;
    #[inline(always)]
    unsafe fn ctx(n: usize) -> __m256d {
        _mm256_set1_pd(n as f64)
    }
    #[inline(always)]
    unsafe fn compute(c: __m256d, x: __m256i, _: __m256i) -> __m256i {
        _mm256_castpd_si256(_mm256_div_pd(_mm256_castsi256_pd(x), c))
    }
}

/// `a / n` for f16, computed in f32.
struct DivHalf;

impl Block for DivHalf {
    type Ctx = __m256;
    #[inline(always)]
    unsafe fn ctx(n: usize) -> __m256 {
        _mm256_set1_ps(n as f32)
    }
    #[inline(always)]
    unsafe fn compute(c: __m256, x: __m256i, _: __m256i) -> __m256i {
        let (lo, hi) = f16_widen(x);
        f16_narrow(_mm256_div_ps(lo, c), _mm256_div_ps(hi, c))
    }
}

/// `a / n` for bf16, computed in f32.
struct DivBrain;

impl Block for DivBrain {
    type Ctx = __m256;
    #[inline(always)]
    unsafe fn ctx(n: usize) -> __m256 {
        _mm256_set1_ps(n as f32)
    }
    #[inline(always)]
    unsafe fn compute(c: __m256, x: __m256i, _: __m256i) -> __m256i {
        let (even, odd) = bf16_widen(x);
        bf16_narrow(_mm256_div_ps(even, c), _mm256_div_ps(odd, c))
    }
}

// ---------------------------------------------------------------------------
// Operations.

macro_rules! op256 {
    ($(#[$m:meta])* $name:ident, |$a:ident, $b:ident| $body:expr) => {
        $(#[$m])*
        struct $name;
        impl Op256 for $name {
            #[inline(always)]
            unsafe fn apply($a: __m256i, $b: __m256i) -> __m256i {
                $body
            }
        }
    };
}

op256!(
    /// Bitwise and (any integer width).
    And, |a, b| _mm256_and_si256(a, b)
);
op256!(
    /// Bitwise or (any integer width).
    Or, |a, b| _mm256_or_si256(a, b)
);
op256!(
    /// Bitwise xor (any integer width).
    Xor, |a, b| _mm256_xor_si256(a, b)
);
op256!(
    /// Wrapping 8-bit add.
    AddI8, |a, b| _mm256_add_epi8(a, b)
);
op256!(
    /// Wrapping 8-bit multiply: two 16-bit multiplies, odd and even bytes.
    MulI8, |a, b| {
        let even = _mm256_mullo_epi16(a, b);
        let odd = _mm256_mullo_epi16(_mm256_srli_epi16::<8>(a), _mm256_srli_epi16::<8>(b));
        let lo = _mm256_and_si256(even, _mm256_set1_epi16(0xff));
        _mm256_or_si256(_mm256_slli_epi16::<8>(odd), lo)
    }
);
op256!(MaxI8, |a, b| _mm256_max_epi8(a, b));
op256!(MinI8, |a, b| _mm256_min_epi8(a, b));
op256!(MaxU8, |a, b| _mm256_max_epu8(a, b));
op256!(MinU8, |a, b| _mm256_min_epu8(a, b));
op256!(AddI32, |a, b| _mm256_add_epi32(a, b));
op256!(MulI32, |a, b| _mm256_mullo_epi32(a, b));
op256!(MaxI32, |a, b| _mm256_max_epi32(a, b));
op256!(MinI32, |a, b| _mm256_min_epi32(a, b));
op256!(MaxU32, |a, b| _mm256_max_epu32(a, b));
op256!(MinU32, |a, b| _mm256_min_epu32(a, b));
op256!(AddI64, |a, b| _mm256_add_epi64(a, b));
op256!(
    /// Wrapping 64-bit multiply from 32×32→64 multiplies:
    /// `lo(a)·lo(b) + ((hi(a)·lo(b) + lo(a)·hi(b)) << 32)`.
    MulI64, |a, b| {
        let lo = _mm256_mul_epu32(a, b);
        let t1 = _mm256_mul_epu32(_mm256_srli_epi64::<32>(a), b);
        let t2 = _mm256_mul_epu32(a, _mm256_srli_epi64::<32>(b));
        _mm256_add_epi64(lo, _mm256_slli_epi64::<32>(_mm256_add_epi64(t1, t2)))
    }
);
op256!(MaxI64, |a, b| _mm256_blendv_epi8(
    b,
    a,
    _mm256_cmpgt_epi64(a, b)
));
op256!(MinI64, |a, b| _mm256_blendv_epi8(
    b,
    a,
    _mm256_cmpgt_epi64(b, a)
));
op256!(MaxU64, |a, b| {
    let s = _mm256_set1_epi64x(i64::MIN);
    let gt = _mm256_cmpgt_epi64(_mm256_xor_si256(a, s), _mm256_xor_si256(b, s));
    _mm256_blendv_epi8(b, a, gt)
});
op256!(MinU64, |a, b| {
    let s = _mm256_set1_epi64x(i64::MIN);
    let lt = _mm256_cmpgt_epi64(_mm256_xor_si256(b, s), _mm256_xor_si256(a, s));
    _mm256_blendv_epi8(b, a, lt)
});

/// Float add.
struct Add;
/// Float multiply.
struct Mul;
/// IEEE 754-2019 `maximum`, commutative bit for bit (scalar.rs's
/// `float_extremum!`): the larger; between equal values (+0 and -0) the AND of
/// their bits (+0); a NaN operand makes a quiet NaN, the OR of both.
struct Max;
/// IEEE 754-2019 `minimum`, commutative bit for bit: the smaller; between
/// equal values the OR of their bits (-0); NaN as [`Max`].
struct Min;

/// `vmaxps` returns its second operand when the operands are equal or
/// unordered, so `max(a, b)` and `max(b, a)` agree except there: their AND
/// (max) or OR (min) settles equal values, and unordered lanes take
/// `a | b | quiet`. Vectors whose lanes are all ordered and unequal (the
/// usual case) take `max(a, b)` as it is. One macro per lane width makes
/// both extrema: `(Max, max, and)`, `(Min, min, or)`.
macro_rules! commutative_extremum {
    ($trait:ident, $f:ident, $vec:ty, $quiet:expr, $full:expr,
     [$cmp:ident, $mask:ident, $or:ident, $blend:ident],
     $(($name:ident, $ext:ident, $settle:ident)),+) => {$(
        impl $trait for $name {
            #[inline(always)]
            unsafe fn $f(a: $vec, b: $vec) -> $vec {
                let plain = $ext(a, b);
                if $mask($cmp::<_CMP_NEQ_OQ>(a, b)) == $full {
                    plain
                } else {
                    let settled = $settle(plain, $ext(b, a));
                    let unordered = $cmp::<_CMP_UNORD_Q>(a, b);
                    $blend(settled, $or($or(a, b), $quiet), unordered)
                }
            }
        }
    )+};
}

commutative_extremum!(
    OpPs,
    ps,
    __m256,
    _mm256_castsi256_ps(_mm256_set1_epi32(0x0040_0000)),
    0xff,
    [
        _mm256_cmp_ps,
        _mm256_movemask_ps,
        _mm256_or_ps,
        _mm256_blendv_ps
    ],
    (Max, _mm256_max_ps, _mm256_and_ps),
    (Min, _mm256_min_ps, _mm256_or_ps)
);
commutative_extremum!(
    OpPd,
    pd,
    __m256d,
    _mm256_castsi256_pd(_mm256_set1_epi64x(0x0008_0000_0000_0000)),
    0xf,
    [
        _mm256_cmp_pd,
        _mm256_movemask_pd,
        _mm256_or_pd,
        _mm256_blendv_pd
    ],
    (Max, _mm256_max_pd, _mm256_and_pd),
    (Min, _mm256_min_pd, _mm256_or_pd)
);

macro_rules! float_op {
    ($name:ident, $ps:ident, $pd:ident) => {
        impl OpPs for $name {
            #[inline(always)]
            unsafe fn ps(a: __m256, b: __m256) -> __m256 {
                $ps(a, b)
            }
        }
        impl OpPd for $name {
            #[inline(always)]
            unsafe fn pd(a: __m256d, b: __m256d) -> __m256d {
                $pd(a, b)
            }
        }
    };
}
float_op!(Add, _mm256_add_ps, _mm256_add_pd);
float_op!(Mul, _mm256_mul_ps, _mm256_mul_pd);
