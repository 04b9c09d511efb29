//! Portable element-wise kernels; the reference the vector paths must match bit for bit.

use crate::{DataType, ReduceOp};
use float8::{F8E4M3, F8E5M2};
use half::{bf16, f16};

/// One element type as the kernels see it.
pub(crate) trait Elem: Copy {
    fn read(b: &[u8]) -> Self;
    fn write(self, b: &mut [u8]);
    fn combine(op: ReduceOp, a: Self, b: Self) -> Self;
    fn div(self, n: usize) -> Self;
}

macro_rules! int_elem {
    ($t:ty) => {
        impl Elem for $t {
            #[inline(always)]
            fn read(b: &[u8]) -> Self {
                <$t>::from_ne_bytes(b.try_into().expect("element width"))
            }
            #[inline(always)]
            fn write(self, b: &mut [u8]) {
                b.copy_from_slice(&self.to_ne_bytes());
            }
            #[inline(always)]
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
                    ReduceOp::Prod => a.wrapping_mul(b),
                    ReduceOp::Max => a.max(b),
                    ReduceOp::Min => a.min(b),
                    ReduceOp::BitAnd => a & b,
                    ReduceOp::BitOr => a | b,
                    ReduceOp::BitXor => a ^ b,
                }
            }
            #[inline(always)]
            fn div(self, n: usize) -> Self {
                // In i128: n may not fit the element type (u8 with 256 ranks).
                (self as i128 / n as i128) as $t
            }
        }
    };
}
int_elem!(i8);
int_elem!(u8);
int_elem!(i32);
int_elem!(u32);
int_elem!(i64);
int_elem!(u64);

/// IEEE 754-2019 `maximum` / `minimum`, commutative bit for bit (so that
/// deterministic mode's canonical order fixes every bit whichever operand a
/// schedule holds locally): the larger (smaller) value; between equal
/// values, +0 and -0, the AND (OR) of their bits, so +0 for max and -0 for
/// min; a NaN operand gives a quiet NaN, the OR of both operands' bits.
macro_rules! float_extremum {
    ($t:ty, $quiet:expr) => {
        impl Extremum for $t {
            #[inline(always)]
            fn extremum(a: Self, b: Self, max: bool) -> Self {
                let (x, y) = (a.to_bits(), b.to_bits());
                if a.is_nan() || b.is_nan() {
                    <$t>::from_bits(x | y | $quiet)
                } else if a == b {
                    <$t>::from_bits(if max { x & y } else { x | y })
                } else if (a > b) == max {
                    a
                } else {
                    b
                }
            }
        }
    };
}

/// Commutative float max / min (see `float_extremum!`).
trait Extremum: Sized {
    fn extremum(a: Self, b: Self, max: bool) -> Self;
}
float_extremum!(f32, 0x0040_0000);
float_extremum!(f64, 0x0008_0000_0000_0000);

/// Float combine: sum and product round once (x86's NaN rule, which the
/// SIMD paths share); max and min are [`Extremum`].
macro_rules! float_elem {
    ($t:ty) => {
        impl Elem for $t {
            #[inline(always)]
            fn read(b: &[u8]) -> Self {
                <$t>::from_ne_bytes(b.try_into().expect("element width"))
            }
            #[inline(always)]
            fn write(self, b: &mut [u8]) {
                b.copy_from_slice(&self.to_ne_bytes());
            }
            #[inline(always)]
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a + b,
                    ReduceOp::Prod => a * b,
                    ReduceOp::Max => <$t>::extremum(a, b, true),
                    ReduceOp::Min => <$t>::extremum(a, b, false),
                    ReduceOp::BitAnd | ReduceOp::BitOr | ReduceOp::BitXor => {
                        unreachable!("bitwise reduction on a float type is rejected earlier")
                    }
                }
            }
            #[inline(always)]
            fn div(self, n: usize) -> Self {
                self / (n as $t)
            }
        }
    };
}
float_elem!(f32);
float_elem!(f64);

macro_rules! half_elem {
    ($t:ty) => {
        impl Elem for $t {
            #[inline(always)]
            fn read(b: &[u8]) -> Self {
                <$t>::from_bits(u16::from_ne_bytes(b.try_into().expect("element width")))
            }
            #[inline(always)]
            fn write(self, b: &mut [u8]) {
                b.copy_from_slice(&self.to_bits().to_ne_bytes());
            }
            #[inline(always)]
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                // Accumulate in f32, round to nearest even once.
                <$t>::from_f32(f32::combine(op, a.to_f32(), b.to_f32()))
            }
            #[inline(always)]
            fn div(self, n: usize) -> Self {
                <$t>::from_f32(self.to_f32() / n as f32)
            }
        }
    };
}
half_elem!(f16);
half_elem!(bf16);

/// Every fp8 bit pattern decoded (`float8`'s exact `to_f32`), built at
/// compile time: decoding is a table lookup.
macro_rules! fp8_table {
    ($t:ty) => {{
        let mut t = [0f32; 256];
        let mut i = 0;
        while i < 256 {
            t[i] = <$t>::from_bits(i as u8).to_f32();
            i += 1;
        }
        t
    }};
}
static E4M3_F32: [f32; 256] = fp8_table!(F8E4M3);
static E5M2_F32: [f32; 256] = fp8_table!(F8E5M2);

/// fp8: decode to f32, one f32 operation, round to nearest even back with
/// CUDA's `__NV_SATFINITE` saturation (`float8`'s `from_f32`): overflow and
/// infinities become the largest finite value of their sign.
macro_rules! fp8_elem {
    ($t:ty, $table:ident) => {
        impl Elem for $t {
            #[inline(always)]
            fn read(b: &[u8]) -> Self {
                <$t>::from_bits(b[0])
            }
            #[inline(always)]
            fn write(self, b: &mut [u8]) {
                b[0] = self.to_bits();
            }
            #[inline(always)]
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                let (x, y) = ($table[a.to_bits() as usize], $table[b.to_bits() as usize]);
                <$t>::from_f32(f32::combine(op, x, y))
            }
            #[inline(always)]
            fn div(self, n: usize) -> Self {
                <$t>::from_f32($table[self.to_bits() as usize] / n as f32)
            }
        }
    };
}
fp8_elem!(F8E4M3, E4M3_F32);
fp8_elem!(F8E5M2, E5M2_F32);

fn reduce_into_t<T: Elem>(op: ReduceOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
    let w = std::mem::size_of::<T>();
    for ((d, x), y) in dst
        .chunks_exact_mut(w)
        .zip(a.chunks_exact(w))
        .zip(b.chunks_exact(w))
    {
        T::combine(op, T::read(x), T::read(y)).write(d);
    }
}

fn reduce_inplace_t<T: Elem>(op: ReduceOp, acc: &mut [u8], src: &[u8]) {
    let w = std::mem::size_of::<T>();
    for (d, y) in acc.chunks_exact_mut(w).zip(src.chunks_exact(w)) {
        let x = T::read(d);
        T::combine(op, x, T::read(y)).write(d);
    }
}

fn div_t<T: Elem>(buf: &mut [u8], n: usize) {
    let w = std::mem::size_of::<T>();
    for d in buf.chunks_exact_mut(w) {
        T::read(d).div(n).write(d);
    }
}

macro_rules! dispatch {
    ($dtype:expr, $f:ident ( $($arg:expr),* )) => {
        match $dtype {
            DataType::Int8 => $f::<i8>($($arg),*),
            DataType::Uint8 => $f::<u8>($($arg),*),
            DataType::Int32 => $f::<i32>($($arg),*),
            DataType::Uint32 => $f::<u32>($($arg),*),
            DataType::Int64 => $f::<i64>($($arg),*),
            DataType::Uint64 => $f::<u64>($($arg),*),
            DataType::Float16 => $f::<f16>($($arg),*),
            DataType::Float32 => $f::<f32>($($arg),*),
            DataType::Float64 => $f::<f64>($($arg),*),
            DataType::Bfloat16 => $f::<bf16>($($arg),*),
            DataType::Float8e4m3 => $f::<F8E4M3>($($arg),*),
            DataType::Float8e5m2 => $f::<F8E5M2>($($arg),*),
        }
    };
}

/// `dst[i] = a[i] op b[i]`, portable.
pub fn reduce_into(dtype: DataType, op: ReduceOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
    dispatch!(dtype, reduce_into_t(op, dst, a, b))
}

/// `acc[i] = acc[i] op src[i]`, portable.
pub fn reduce_inplace(dtype: DataType, op: ReduceOp, acc: &mut [u8], src: &[u8]) {
    dispatch!(dtype, reduce_inplace_t(op, acc, src))
}

/// `buf[i] /= n`, portable.
pub fn divide(dtype: DataType, buf: &mut [u8], n: usize) {
    dispatch!(dtype, div_t(buf, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_average_with_more_ranks_than_the_type_holds() {
        let mut b = [200u8, 255];
        divide(DataType::Uint8, &mut b, 256);
        assert_eq!(b, [0, 0]);
        let mut i = (-128i8).to_ne_bytes();
        divide(DataType::Int8, &mut i, 255);
        assert_eq!(i8::from_ne_bytes(i), 0);
        let mut j = (-128i8).to_ne_bytes();
        divide(DataType::Int8, &mut j, 128);
        assert_eq!(i8::from_ne_bytes(j), -1);
    }

    fn fp8(dtype: DataType, op: ReduceOp, a: u8, b: u8) -> u8 {
        let mut d = [0u8];
        reduce_into(dtype, op, &mut d, &[a], &[b]);
        d[0]
    }

    /// The decode tables hold `float8`'s `to_f32` for every pattern.
    #[test]
    fn fp8_tables_decode_every_pattern() {
        for i in 0..=255u8 {
            assert_eq!(
                E4M3_F32[i as usize].to_bits(),
                F8E4M3::from_bits(i).to_f32().to_bits()
            );
            assert_eq!(
                E5M2_F32[i as usize].to_bits(),
                F8E5M2::from_bits(i).to_f32().to_bits()
            );
        }
    }

    /// e4m3 (no infinities, max 448 = 0x7e): sums round to nearest even
    /// and saturate at ±448; NaN (S.1111.111) propagates.
    #[test]
    fn e4m3_rounds_to_nearest_even_and_saturates() {
        let e = DataType::Float8e4m3;
        let enc = |v: f32| F8E4M3::from_f32(v).to_bits();
        assert_eq!(enc(448.0), 0x7e);
        assert_eq!(fp8(e, ReduceOp::Sum, enc(1.0), enc(2.0)), enc(3.0));
        // 1 + 0.0625 is halfway between 1 and 1.125: ties to even (1).
        assert_eq!(fp8(e, ReduceOp::Sum, enc(1.0), enc(0.0625)), enc(1.0));
        // 1.125 + 0.0625 is halfway between 1.125 and 1.25: to even (1.25).
        assert_eq!(fp8(e, ReduceOp::Sum, enc(1.125), enc(0.0625)), enc(1.25));
        // Overflow saturates, keeping the sign.
        assert_eq!(fp8(e, ReduceOp::Sum, 0x7e, 0x7e), 0x7e);
        assert_eq!(fp8(e, ReduceOp::Sum, 0xfe, 0xfe), 0xfe);
        assert_eq!(fp8(e, ReduceOp::Prod, enc(32.0), enc(32.0)), 0x7e);
        assert_eq!(fp8(e, ReduceOp::Prod, enc(-32.0), enc(32.0)), 0xfe);
        // 448 + 16 is halfway to 480 (not representable): to even, 448.
        assert_eq!(fp8(e, ReduceOp::Sum, 0x7e, enc(16.0)), 0x7e);
        // NaN wins sum, max and min (in max/min whichever operand it is).
        assert_eq!(fp8(e, ReduceOp::Sum, 0x7f, enc(1.0)), 0x7f);
        assert_eq!(fp8(e, ReduceOp::Sum, enc(1.0), 0xff), 0x7f);
        assert_eq!(fp8(e, ReduceOp::Max, enc(1.0), 0x7f), 0x7f);
        assert_eq!(fp8(e, ReduceOp::Max, 0x7f, enc(1.0)), 0x7f);
        assert_eq!(fp8(e, ReduceOp::Max, enc(2.0), enc(-3.0)), enc(2.0));
        assert_eq!(fp8(e, ReduceOp::Min, enc(2.0), enc(-3.0)), enc(-3.0));
        // Smallest subnormal 2^-9 (0x01): halved rounds to zero (even).
        let mut d = [0x01u8];
        divide(e, &mut d, 2);
        assert_eq!(d, [0x00]);
        let mut d = [enc(3.0)];
        divide(e, &mut d, 2);
        assert_eq!(d, [enc(1.5)]);
    }

    /// e5m2 (max 57344 = 0x7b, inf 0x7c): overflow and infinities in a
    /// reduction saturate to ±57344 (`__NV_SATFINITE`); NaN stays NaN.
    #[test]
    fn e5m2_saturates_overflow_and_infinities() {
        let e = DataType::Float8e5m2;
        let enc = |v: f32| F8E5M2::from_f32(v).to_bits();
        assert_eq!(enc(57344.0), 0x7b);
        assert_eq!(fp8(e, ReduceOp::Sum, 0x7b, 0x7b), 0x7b);
        assert_eq!(fp8(e, ReduceOp::Sum, 0xfb, 0xfb), 0xfb);
        assert_eq!(fp8(e, ReduceOp::Sum, 0x7c, enc(1.0)), 0x7b);
        assert_eq!(fp8(e, ReduceOp::Max, 0x7c, enc(1.0)), 0x7b);
        assert_eq!(fp8(e, ReduceOp::Min, 0xfc, enc(1.0)), 0xfb);
        // inf + -inf is NaN (x86's default NaN, negative): quiet, S.11111.10.
        assert_eq!(fp8(e, ReduceOp::Sum, 0x7c, 0xfc), 0xfe);
        assert_eq!(fp8(e, ReduceOp::Sum, 0x7d, enc(1.0)), 0x7f);
        assert_eq!(fp8(e, ReduceOp::Sum, enc(1.0), enc(0.25)), enc(1.25));
        // 1 + 0.125 is halfway between 1 and 1.25: to even (1).
        assert_eq!(fp8(e, ReduceOp::Sum, enc(1.0), enc(0.125)), enc(1.0));
        // A copy (no reduction) keeps an infinity.
        let mut d = [0u8];
        crate::copy(&mut d, &[0x7c]);
        assert_eq!(d, [0x7c]);
    }
}
