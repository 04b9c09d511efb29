//! AVX2 / F16C kernels for x86_64, selected once at run time.
//!
//! All of the crate's `unsafe` code lives in this module. The kernels work on
//! raw byte pointers with unaligned 128/256-bit loads and stores, so buffers
//! need no alignment. Every element, including those in a buffer's tail, goes
//! through the same vector instruction sequence (the tail is staged through a
//! zero-padded stack block), so a result never depends on an element's
//! position or on the buffer's length — this keeps NaN payloads deterministic.
//!
//! Float semantics match `scalar.rs` bit for bit: `vmaxps(a, b)` is exactly
//! `if a > b { a } else { b }`, f16 goes through the same F16C instructions the
//! `half` crate uses on this CPU, and bf16 rounding reproduces
//! `half::bf16::from_f32` (nearest-even, NaN → `(bits >> 16) | 0x40`). The only
//! freedom left is which NaN payload a sum or product of two NaNs gets, where
//! scalar code is at the mercy of the compiler's operand order.

use crate::{DataType, ReduceOp};
use core::arch::x86_64::*;
use core::marker::PhantomData;
use core::ptr;
use std::sync::OnceLock;

/// A selected kernel: `d[..len] = a[..len] op b[..len]`, or for divide kernels
/// `d[..len] = a[..len] / n` (then `b` is ignored). `n` is ignored by the
/// binary kernels.
///
/// # Safety
/// `a` and `b` must be readable and `d` writable for `len` bytes; `d` may equal
/// `a` or `b` but must not otherwise overlap them; the CPU must support the
/// features the kernel was compiled for (guaranteed by [`table`]).
type Kernel = unsafe fn(d: *mut u8, a: *const u8, b: *const u8, len: usize, n: usize);

/// Kernels selected for this CPU, built once.
struct Table {
    /// Indexed by `dtype as usize * 8 + op as usize`.
    reduce: [Option<Kernel>; 80],
    /// Indexed by `dtype as usize`.
    divide: [Option<Kernel>; 10],
    /// Human-readable name of the selected instruction sets.
    name: &'static str,
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
        reduce: [None; 80],
        divide: [None; 10],
        name: match (avx2, f16c) {
            (true, true) => "avx2+f16c",
            (true, false) => "avx2",
            _ => "scalar",
        },
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
    assert!(a.len() == len && b.len() == len, "kernel slice lengths differ");
    // SAFETY: the table only holds kernels whose target features were
    // detected; all three slices are valid for `len` bytes, and `dst` is a
    // unique borrow so it cannot overlap `a` or `b`.
    unsafe { k(dst.as_mut_ptr(), a.as_ptr(), b.as_ptr(), len, 0) };
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
    unsafe { k(p, p, src.as_ptr(), len, 0) };
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
    unsafe { k(p, p, p, buf.len(), n) };
    true
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

// ---------------------------------------------------------------------------
// Drivers. The target-feature functions are the only places the vector code
// is instantiated; everything below them is `#[inline(always)]` so that the
// intrinsics are inlined into a context where AVX2 / F16C are enabled.

/// # Safety
/// See [`Kernel`]; the CPU must support AVX2.
#[target_feature(enable = "avx2")]
unsafe fn avx2<B: Block>(d: *mut u8, a: *const u8, b: *const u8, len: usize, n: usize) {
    run::<B>(d, a, b, len, n)
}

/// # Safety
/// See [`Kernel`]; the CPU must support AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
unsafe fn avx2_f16c<B: Block>(d: *mut u8, a: *const u8, b: *const u8, len: usize, n: usize) {
    run::<B>(d, a, b, len, n)
}

/// One vector step over `BYTES` bytes.
trait Block {
    /// Bytes consumed from each input and written per step (at most 32).
    const BYTES: usize;
    /// Per-call constant (the divisor for divide kernels).
    type Ctx: Copy;
    /// Builds the per-call constant.
    ///
    /// # Safety
    /// Called only where the kernel's target features are enabled.
    unsafe fn ctx(n: usize) -> Self::Ctx;
    /// Reads `BYTES` bytes at `a` and `b`, writes `BYTES` bytes at `d`. Every
    /// load happens before the store, so `d` may equal `a` or `b`.
    ///
    /// # Safety
    /// The pointers must be valid for `BYTES` bytes and the kernel's target
    /// features must be enabled.
    unsafe fn step(c: Self::Ctx, d: *mut u8, a: *const u8, b: *const u8);
}

/// Largest `Block::BYTES`.
const MAX_BLOCK: usize = 32;

#[inline(always)]
unsafe fn run<B: Block>(d: *mut u8, a: *const u8, b: *const u8, len: usize, n: usize) {
    debug_assert!(B::BYTES <= MAX_BLOCK);
    let c = B::ctx(n);
    let mut i = 0;
    while i + 4 * B::BYTES <= len {
        B::step(c, d.add(i), a.add(i), b.add(i));
        let j = i + B::BYTES;
        B::step(c, d.add(j), a.add(j), b.add(j));
        let j = i + 2 * B::BYTES;
        B::step(c, d.add(j), a.add(j), b.add(j));
        let j = i + 3 * B::BYTES;
        B::step(c, d.add(j), a.add(j), b.add(j));
        i += 4 * B::BYTES;
    }
    while i + B::BYTES <= len {
        B::step(c, d.add(i), a.add(i), b.add(i));
        i += B::BYTES;
    }
    if i < len {
        // Stage the tail through zero-padded blocks so it sees exactly the
        // same instructions as the body.
        let rem = len - i;
        let mut ta = [0u8; MAX_BLOCK];
        let mut tb = [0u8; MAX_BLOCK];
        ptr::copy_nonoverlapping(a.add(i), ta.as_mut_ptr(), rem);
        ptr::copy_nonoverlapping(b.add(i), tb.as_mut_ptr(), rem);
        let pa = ta.as_mut_ptr();
        B::step(c, pa, pa, tb.as_ptr());
        ptr::copy_nonoverlapping(ta.as_ptr(), d.add(i), rem);
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
    const BYTES: usize = 32;
    type Ctx = ();
    #[inline(always)]
    unsafe fn ctx(_: usize) {}
    #[inline(always)]
    unsafe fn step(_: (), d: *mut u8, a: *const u8, b: *const u8) {
        let x = _mm256_loadu_si256(a.cast());
        let y = _mm256_loadu_si256(b.cast());
        _mm256_storeu_si256(d.cast(), O::apply(x, y));
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

/// Eight f16 elements (16 bytes), widened to f32 with F16C.
struct Half<O>(PhantomData<O>);

impl<O: OpPs> Block for Half<O> {
    const BYTES: usize = 16;
    type Ctx = ();
    #[inline(always)]
    unsafe fn ctx(_: usize) {}
    #[inline(always)]
    unsafe fn step(_: (), d: *mut u8, a: *const u8, b: *const u8) {
        let x = _mm256_cvtph_ps(_mm_loadu_si128(a.cast()));
        let y = _mm256_cvtph_ps(_mm_loadu_si128(b.cast()));
        let r = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(O::ps(x, y));
        _mm_storeu_si128(d.cast(), r);
    }
}

/// Sixteen bf16 elements (32 bytes), widened to f32 by shifting.
struct Brain<O>(PhantomData<O>);

impl<O: OpPs> Block for Brain<O> {
    const BYTES: usize = 32;
    type Ctx = ();
    #[inline(always)]
    unsafe fn ctx(_: usize) {}
    #[inline(always)]
    unsafe fn step(_: (), d: *mut u8, a: *const u8, b: *const u8) {
        let x = _mm256_loadu_si256(a.cast());
        let y = _mm256_loadu_si256(b.cast());
        let z = _mm256_setzero_si256();
        // Interleaving with zero puts each bf16 in the high half of a 32-bit
        // lane, i.e. makes it an f32. Per 128-bit lane, `lo` holds elements
        // 0..4 and `hi` elements 4..8; `packus` below restores the order.
        let (xl, xh) = (_mm256_unpacklo_epi16(z, x), _mm256_unpackhi_epi16(z, x));
        let (yl, yh) = (_mm256_unpacklo_epi16(z, y), _mm256_unpackhi_epi16(z, y));
        let rl = O::ps(_mm256_castsi256_ps(xl), _mm256_castsi256_ps(yl));
        let rh = O::ps(_mm256_castsi256_ps(xh), _mm256_castsi256_ps(yh));
        let r = _mm256_packus_epi32(f32_to_bf16(rl), f32_to_bf16(rh));
        _mm256_storeu_si256(d.cast(), r);
    }
}

/// Rounds f32 lanes to bf16 exactly like `half::bf16::from_f32`: NaN becomes
/// `(bits >> 16) | 0x40`, everything else rounds to nearest even. Returns the
/// bf16 bits zero-extended in each 32-bit lane.
#[inline(always)]
unsafe fn f32_to_bf16(v: __m256) -> __m256i {
    let x = _mm256_castps_si256(v);
    let abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7fff_ffff));
    // Both sides are non-negative as i32, so the signed compare is exact.
    let is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f80_0000));
    let hi = _mm256_srli_epi32::<16>(x);
    let lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    let biased = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb);
    let rounded = _mm256_srli_epi32::<16>(biased);
    let nan = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    _mm256_blendv_epi8(rounded, nan, is_nan)
}

/// `a / n` for f32.
struct DivPs;

impl Block for DivPs {
    const BYTES: usize = 32;
    type Ctx = __m256;
    #[inline(always)]
    unsafe fn ctx(n: usize) -> __m256 {
        _mm256_set1_ps(n as f32)
    }
    #[inline(always)]
    unsafe fn step(c: __m256, d: *mut u8, a: *const u8, _: *const u8) {
        _mm256_storeu_ps(d.cast(), _mm256_div_ps(_mm256_loadu_ps(a.cast()), c));
    }
}

/// `a / n` for f64.
struct DivPd;

impl Block for DivPd {
    const BYTES: usize = 32;
    type Ctx = __m256d;
    #[inline(always)]
    unsafe fn ctx(n: usize) -> __m256d {
        _mm256_set1_pd(n as f64)
    }
    #[inline(always)]
    unsafe fn step(c: __m256d, d: *mut u8, a: *const u8, _: *const u8) {
        _mm256_storeu_pd(d.cast(), _mm256_div_pd(_mm256_loadu_pd(a.cast()), c));
    }
}

/// `a / n` for f16, computed in f32.
struct DivHalf;

impl Block for DivHalf {
    const BYTES: usize = 16;
    type Ctx = __m256;
    #[inline(always)]
    unsafe fn ctx(n: usize) -> __m256 {
        _mm256_set1_ps(n as f32)
    }
    #[inline(always)]
    unsafe fn step(c: __m256, d: *mut u8, a: *const u8, _: *const u8) {
        let x = _mm256_cvtph_ps(_mm_loadu_si128(a.cast()));
        let r = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_div_ps(x, c));
        _mm_storeu_si128(d.cast(), r);
    }
}

/// `a / n` for bf16, computed in f32.
struct DivBrain;

impl Block for DivBrain {
    const BYTES: usize = 32;
    type Ctx = __m256;
    #[inline(always)]
    unsafe fn ctx(n: usize) -> __m256 {
        _mm256_set1_ps(n as f32)
    }
    #[inline(always)]
    unsafe fn step(c: __m256, d: *mut u8, a: *const u8, _: *const u8) {
        let x = _mm256_loadu_si256(a.cast());
        let z = _mm256_setzero_si256();
        let xl = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, x));
        let xh = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, x));
        let rl = f32_to_bf16(_mm256_div_ps(xl, c));
        let rh = f32_to_bf16(_mm256_div_ps(xh, c));
        _mm256_storeu_si256(d.cast(), _mm256_packus_epi32(rl, rh));
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
op256!(MaxI64, |a, b| _mm256_blendv_epi8(b, a, _mm256_cmpgt_epi64(a, b)));
op256!(MinI64, |a, b| _mm256_blendv_epi8(b, a, _mm256_cmpgt_epi64(b, a)));
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
/// `if a > b { a } else { b }` — exactly `vmaxps a, b`.
struct Max;
/// `if a < b { a } else { b }` — exactly `vminps a, b`.
struct Min;

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
float_op!(Max, _mm256_max_ps, _mm256_max_pd);
float_op!(Min, _mm256_min_ps, _mm256_min_pd);
