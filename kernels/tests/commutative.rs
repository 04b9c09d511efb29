//! Float max and min are commutative bit for bit, for every float type and
//! on every value — ±0, infinities, NaNs of any payload, subnormals — as
//! deterministic mode needs (a schedule may hold either operand of a
//! canonical tree node locally): IEEE 754-2019 maximum / minimum, with +0
//! above -0 and a NaN operand giving a quiet NaN. Sums and products are
//! commutative on every pair but two NaNs (whose payload is x86's first
//! operand's), which this checks too.

use kernels::{reduce_into, DataType, ReduceOp};

const F32: &[u32] = &[
    0x0000_0000, // +0
    0x8000_0000, // -0
    0x7f80_0000, // +inf
    0xff80_0000, // -inf
    0x7fc0_0000, // qNaN
    0xffc0_0000, // -qNaN
    0x7f80_0001, // sNaN
    0xff81_2345, // -sNaN with payload
    0x0000_0001, // smallest subnormal
    0x8000_0001, // -smallest subnormal
    0x3f80_0000, // 1.0
    0xbf80_0000, // -1.0
    0x3f80_0001, // just above 1
    0x7f7f_ffff, // MAX
];

const F64: &[u64] = &[
    0x0000_0000_0000_0000,
    0x8000_0000_0000_0000,
    0x7ff0_0000_0000_0000,
    0xfff0_0000_0000_0000,
    0x7ff8_0000_0000_0000,
    0xfff8_0000_0000_0000,
    0x7ff0_0000_0000_0001,
    0x3ff0_0000_0000_0000,
    0xbff0_0000_0000_0000,
    0x0000_0000_0000_0001,
];

/// Every pattern of a narrow type, or the specials of a wide one, as bytes.
fn values(dtype: DataType) -> Vec<Vec<u8>> {
    match dtype {
        DataType::Float32 => F32.iter().map(|v| v.to_ne_bytes().to_vec()).collect(),
        DataType::Float64 => F64.iter().map(|v| v.to_ne_bytes().to_vec()).collect(),
        DataType::Float16 | DataType::Bfloat16 => (0..=u16::MAX)
            .step_by(97)
            .chain([
                0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xfe01, 0x7f80, 0xff80, 0x7fc0,
                0x7f81,
            ])
            .map(|v| v.to_ne_bytes().to_vec())
            .collect(),
        _ => (0..=u8::MAX).map(|v| vec![v]).collect(),
    }
}

fn is_nan(dtype: DataType, b: &[u8]) -> bool {
    match dtype {
        DataType::Float32 => f32::from_ne_bytes(b.try_into().unwrap()).is_nan(),
        DataType::Float64 => f64::from_ne_bytes(b.try_into().unwrap()).is_nan(),
        DataType::Float16 => {
            half::f16::from_bits(u16::from_ne_bytes(b.try_into().unwrap())).is_nan()
        }
        DataType::Bfloat16 => {
            half::bf16::from_bits(u16::from_ne_bytes(b.try_into().unwrap())).is_nan()
        }
        DataType::Float8e4m3 => b[0] & 0x7f == 0x7f,
        _ => b[0] & 0x7f > 0x7c,
    }
}

#[test]
fn float_reductions_commute_bit_for_bit() {
    let floats = [
        DataType::Float32,
        DataType::Float64,
        DataType::Float16,
        DataType::Bfloat16,
        DataType::Float8e4m3,
        DataType::Float8e5m2,
    ];
    for dtype in floats {
        let vals = values(dtype);
        // Long enough for the vector paths: each pair fills a whole buffer.
        let lanes = 67;
        for op in [ReduceOp::Max, ReduceOp::Min, ReduceOp::Sum, ReduceOp::Prod] {
            for a in &vals {
                let xs: Vec<u8> = a.repeat(lanes);
                for b in &vals {
                    if matches!(op, ReduceOp::Sum | ReduceOp::Prod)
                        && is_nan(dtype, a)
                        && is_nan(dtype, b)
                    {
                        continue;
                    }
                    let ys: Vec<u8> = b.repeat(lanes);
                    let mut ab = vec![0u8; xs.len()];
                    let mut ba = vec![0u8; xs.len()];
                    reduce_into(dtype, op, &mut ab, &xs, &ys);
                    reduce_into(dtype, op, &mut ba, &ys, &xs);
                    assert_eq!(ab, ba, "{dtype:?} {op:?} of {a:02x?} and {b:02x?}");
                }
            }
        }
    }
}

#[test]
fn signed_zeros_and_nans_follow_ieee_maximum_and_minimum() {
    let f = |op, a: f32, b: f32| {
        let mut out = [0u8; 4];
        reduce_into(
            DataType::Float32,
            op,
            &mut out,
            &a.to_ne_bytes(),
            &b.to_ne_bytes(),
        );
        f32::from_ne_bytes(out)
    };
    assert_eq!(f(ReduceOp::Max, -0.0, 0.0).to_bits(), 0);
    assert_eq!(f(ReduceOp::Max, 0.0, -0.0).to_bits(), 0);
    assert_eq!(f(ReduceOp::Min, 0.0, -0.0).to_bits(), 0x8000_0000);
    assert_eq!(f(ReduceOp::Min, -0.0, 0.0).to_bits(), 0x8000_0000);
    assert!(f(ReduceOp::Max, f32::NAN, 1.0).is_nan());
    assert!(f(ReduceOp::Max, 1.0, f32::NAN).is_nan());
    assert!(f(ReduceOp::Min, f32::INFINITY, f32::NAN).is_nan());
    assert_eq!(f(ReduceOp::Max, -3.0, 2.0), 2.0);
    assert_eq!(f(ReduceOp::Min, -3.0, 2.0), -3.0);
}

/// Vectors mixing lanes that take the AVX2 fast path (ordered, unequal)
/// with lanes that need the fix-up (±0 pairs, equal values, NaNs) give the
/// scalar reference's bits, in both operand orders.
#[test]
fn mixed_lanes_match_the_scalar_reference() {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..200 {
        let len = 1 + (next() % 70) as usize;
        let pick = |x: u64, y: u64| -> (u32, u32) {
            let a = F32[(x % F32.len() as u64) as usize];
            let b = match y % 3 {
                0 => a,                                        // equal: fix-up lane
                1 => a ^ 0x8000_0000,                          // sign flipped (±0 pairs)
                _ => F32[(y / 3 % F32.len() as u64) as usize], // anything
            };
            (a, b)
        };
        let (mut xs, mut ys) = (Vec::new(), Vec::new());
        for _ in 0..len {
            let (a, b) = pick(next(), next());
            xs.extend_from_slice(&a.to_ne_bytes());
            ys.extend_from_slice(&b.to_ne_bytes());
        }
        for op in [ReduceOp::Max, ReduceOp::Min] {
            let mut fast = vec![0u8; xs.len()];
            let mut reference = vec![0u8; xs.len()];
            reduce_into(DataType::Float32, op, &mut fast, &xs, &ys);
            kernels::scalar::reduce_into(DataType::Float32, op, &mut reference, &xs, &ys);
            assert_eq!(fast, reference, "{op:?} over {len} mixed lanes");
        }
    }
}
