//! Reference semantics: element types, deterministic data, and what every
//! reduction must produce, computed independently of sncl.

use std::fmt::Debug;

use half::{bf16, f16};
use sncl::{Element, ReduceOp};

// ---------------------------------------------------------------------------
// Values and the reference semantics.

/// A test element type: random bits for data movement, exact small values
/// for reductions, and an independent reference of each operator.
pub trait TE: Element + Debug {
    const NAME: &'static str;
    const INT: bool;
    /// Arbitrary bits (NaN patterns included for floats): moved, never reduced.
    fn from_bits(h: u64) -> Self;
    /// The bits, for exact comparison.
    fn bits(self) -> u64;
    /// An input for a reduction with `op` whose result is exact in this type.
    fn gen(op: ReduceOp, h: u64) -> Self;
    /// Reference `a op b` (`Avg` sums).
    fn comb(op: ReduceOp, a: Self, b: Self) -> Self;
    /// Reference final step (`Avg` divides by the rank count).
    fn fin(self, op: ReduceOp, n: usize) -> Self;
}

macro_rules! int_te {
    ($t:ty) => {
        impl TE for $t {
            const NAME: &'static str = stringify!($t);
            const INT: bool = true;
            fn from_bits(h: u64) -> Self {
                h as $t
            }
            fn bits(self) -> u64 {
                self as u64
            }
            fn gen(op: ReduceOp, h: u64) -> Self {
                // Integers are exact with wrapping: any value will do. Odd
                // factors keep products from collapsing to zero.
                let v = (h >> 7) as $t;
                if op == ReduceOp::Prod {
                    v | 1
                } else {
                    v
                }
            }
            fn comb(op: ReduceOp, a: Self, b: Self) -> Self {
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
            fn fin(self, op: ReduceOp, n: usize) -> Self {
                if op == ReduceOp::Avg {
                    self / (n as $t)
                } else {
                    self
                }
            }
        }
    };
}
int_te!(i8);
int_te!(u8);
int_te!(i32);
int_te!(u32);
int_te!(i64);
int_te!(u64);

/// Small values whose sums and products are exact even in bf16: integers in
/// -8..=8, and factors ±0.5, ±1, ±2 for products (8 of them stay within
/// 2^-8..2^8).
pub fn float_gen(op: ReduceOp, h: u64) -> f64 {
    match op {
        ReduceOp::Prod => [1.0, 2.0, -1.0, 0.5, 1.0, -2.0, 1.0, -0.5][(h >> 61) as usize],
        _ => ((h >> 32) % 17) as f64 - 8.0,
    }
}

pub fn fcomb<F: PartialOrd + std::ops::Add<Output = F> + std::ops::Mul<Output = F>>(
    op: ReduceOp,
    a: F,
    b: F,
) -> F {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => a + b,
        ReduceOp::Prod => a * b,
        ReduceOp::Max => {
            if a > b {
                a
            } else {
                b
            }
        }
        ReduceOp::Min => {
            if a < b {
                a
            } else {
                b
            }
        }
        _ => panic!("bitwise reference on a float"),
    }
}

impl TE for f32 {
    const NAME: &'static str = "f32";
    const INT: bool = false;
    fn from_bits(h: u64) -> Self {
        f32::from_bits(h as u32)
    }
    fn bits(self) -> u64 {
        self.to_bits() as u64
    }
    fn gen(op: ReduceOp, h: u64) -> Self {
        float_gen(op, h) as f32
    }
    fn comb(op: ReduceOp, a: Self, b: Self) -> Self {
        fcomb(op, a, b)
    }
    fn fin(self, op: ReduceOp, n: usize) -> Self {
        if op == ReduceOp::Avg {
            self / n as f32
        } else {
            self
        }
    }
}

impl TE for f64 {
    const NAME: &'static str = "f64";
    const INT: bool = false;
    fn from_bits(h: u64) -> Self {
        f64::from_bits(h)
    }
    fn bits(self) -> u64 {
        self.to_bits()
    }
    fn gen(op: ReduceOp, h: u64) -> Self {
        float_gen(op, h)
    }
    fn comb(op: ReduceOp, a: Self, b: Self) -> Self {
        fcomb(op, a, b)
    }
    fn fin(self, op: ReduceOp, n: usize) -> Self {
        if op == ReduceOp::Avg {
            self / n as f64
        } else {
            self
        }
    }
}

macro_rules! half_te {
    ($t:ty, $name:expr) => {
        impl TE for $t {
            const NAME: &'static str = $name;
            const INT: bool = false;
            fn from_bits(h: u64) -> Self {
                <$t>::from_bits(h as u16)
            }
            fn bits(self) -> u64 {
                self.to_bits() as u64
            }
            fn gen(op: ReduceOp, h: u64) -> Self {
                <$t>::from_f64(float_gen(op, h))
            }
            fn comb(op: ReduceOp, a: Self, b: Self) -> Self {
                // f32 accumulation, rounded once per step.
                <$t>::from_f32(fcomb(op, a.to_f32(), b.to_f32()))
            }
            fn fin(self, op: ReduceOp, n: usize) -> Self {
                if op == ReduceOp::Avg {
                    <$t>::from_f32(self.to_f32() / n as f32)
                } else {
                    self
                }
            }
        }
    };
}
half_te!(f16, "f16");
half_te!(bf16, "bf16");

/// fp8 holds few integers exactly (e5m2: up to 8), so a sum's inputs are
/// -1, 0 or 1 (every partial sum of up to 8 ranks, in any order, is exact);
/// products and min/max use [`float_gen`] (powers of two, small integers).
/// Each step in f32, rounded to nearest even with saturation (`float8`).
macro_rules! fp8_te {
    ($t:ty, $name:expr) => {
        impl TE for $t {
            const NAME: &'static str = $name;
            const INT: bool = false;
            fn from_bits(h: u64) -> Self {
                <$t>::from_bits(h as u8)
            }
            fn bits(self) -> u64 {
                self.to_bits() as u64
            }
            fn gen(op: ReduceOp, h: u64) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => {
                        <$t>::from_f64([0.0, 1.0, -1.0, 0.0][(h >> 62) as usize])
                    }
                    _ => <$t>::from_f64(float_gen(op, h)),
                }
            }
            fn comb(op: ReduceOp, a: Self, b: Self) -> Self {
                <$t>::from_f32(fcomb(op, a.to_f32(), b.to_f32()))
            }
            fn fin(self, op: ReduceOp, n: usize) -> Self {
                if op == ReduceOp::Avg {
                    <$t>::from_f32(self.to_f32() / n as f32)
                } else {
                    self
                }
            }
        }
    };
}
fp8_te!(kernels::F8E4M3, "f8e4m3");
fp8_te!(kernels::F8E5M2, "f8e5m2");

pub fn ops_for<T: TE>() -> &'static [ReduceOp] {
    if T::INT {
        &ReduceOp::ALL
    } else {
        &[
            ReduceOp::Sum,
            ReduceOp::Prod,
            ReduceOp::Min,
            ReduceOp::Max,
            ReduceOp::Avg,
        ]
    }
}

pub fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Per (operation, rank) seed: every rank derives every other rank's input.
pub fn seed(salt: u64, rank: usize) -> u64 {
    mix(salt.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ mix(rank as u64 + 0x1234_5678))
}

/// The `i`-th random word of a seed.
#[inline]
pub fn hh(seed: u64, i: usize) -> u64 {
    let mut x = seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 31;
    x = x.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    x ^ (x >> 32)
}

/// Reference reduction of element `i` over every rank's input.
pub fn reduce_ref<T: TE>(op: ReduceOp, seeds: &[u64], i: usize) -> T {
    let mut acc = T::gen(op, hh(seeds[0], i));
    for s in &seeds[1..] {
        acc = T::comb(op, acc, T::gen(op, hh(*s, i)));
    }
    acc.fin(op, seeds.len())
}

pub fn sentinel<T: TE>(len: usize, salt: u64) -> Vec<T> {
    let s = mix(salt ^ 0xDEAD_BEEF);
    (0..len).map(|i| T::from_bits(hh(s, i))).collect()
}

pub fn data<T: TE>(seed: u64, len: usize, offset: usize) -> Vec<T> {
    (0..len)
        .map(|i| T::from_bits(hh(seed, offset + i)))
        .collect()
}
