//! The public (vectorised where available) kernels must agree with the
//! portable reference in `kernels::scalar` bit for bit.
//!
//! The single exception: a sum or product of two NaNs must be *a* NaN, but its
//! payload may differ, because the compiler is free to commute the scalar
//! reference's operands.

use kernels::{scalar, DataType, ReduceOp};
use proptest::prelude::*;

const F32_SPECIAL: &[u32] = &[
    0x0000_0000, // +0
    0x8000_0000, // -0
    0x7f80_0000, // +inf
    0xff80_0000, // -inf
    0x7fc0_0000, // qNaN
    0xffc0_0000, // -qNaN (x86 default NaN)
    0x7f80_0001, // sNaN
    0x7fff_ffff, // NaN, full payload
    0xff81_2345, // -sNaN with payload
    0x0000_0001, // smallest subnormal
    0x007f_ffff, // largest subnormal
    0x8000_0001, // -smallest subnormal
    0x0080_0000, // MIN_POSITIVE
    0x7f7f_ffff, // MAX
    0xff7f_ffff, // -MAX
    0x3f80_0000, // 1.0
    0xbf80_0000, // -1.0
    0x3f80_8000, // bf16 tie, rounds down to even
    0x3f81_8000, // bf16 tie, rounds up to even
    0x3f80_8001, // just above a bf16 tie
    0x7f7f_8000, // rounds to +inf in bf16
    0x477f_e000, // 65504 = f16 MAX
    0x477f_f000, // f16 tie at MAX, rounds to inf
    0x3380_0000, // 2^-24, smallest f16 subnormal
    0x3300_0000, // 2^-25, f16 tie to 0
    0x3300_0001, // just above 2^-25
    0x3880_0000, // 2^-14 = f16 MIN_POSITIVE
];

const F64_SPECIAL: &[u64] = &[
    0,
    0x8000_0000_0000_0000,
    0x7ff0_0000_0000_0000,
    0xfff0_0000_0000_0000,
    0x7ff8_0000_0000_0000,
    0xfff8_0000_0000_0000,
    0x7ff0_0000_0000_0001,
    0x7fff_ffff_ffff_ffff,
    1,
    0x000f_ffff_ffff_ffff,
    0x8000_0000_0000_0001,
    0x0010_0000_0000_0000,
    0x7fef_ffff_ffff_ffff,
    0xffef_ffff_ffff_ffff,
    0x3ff0_0000_0000_0000,
    0xbff0_0000_0000_0000,
];

const F16_SPECIAL: &[u16] = &[
    0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7c01, 0xfd23, 0x7fff, 0x0001, 0x03ff, 0x8001,
    0x0400, 0x7bff, 0xfbff, 0x3c00, 0xbc00, 0x3c01, 0x0200,
];

const BF16_SPECIAL: &[u16] = &[
    0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81, 0xff92, 0x7fff, 0x0001, 0x007f, 0x8001,
    0x0080, 0x7f7f, 0xff7f, 0x3f80, 0xbf80, 0x3f81, 0x4000,
];

const INT_SPECIAL: &[u64] = &[
    0,
    1,
    u64::MAX,
    0x7f,
    0x80,
    0xff,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x7fff_ffff_ffff_ffff,
    0x8000_0000_0000_0000,
    0x1_0000_0001,
];

/// Element bits: a special value when `pick` is even, random bits otherwise.
fn element(dtype: DataType, pick: u8, bits: u64) -> u64 {
    fn sel<T: Copy + Into<u64>>(list: &[T], bits: u64) -> u64 {
        list[(bits % list.len() as u64) as usize].into()
    }
    if pick % 2 == 1 {
        return bits;
    }
    match dtype {
        DataType::Float32 => sel(F32_SPECIAL, bits),
        DataType::Float64 => sel(F64_SPECIAL, bits),
        DataType::Float16 => sel(F16_SPECIAL, bits),
        DataType::Bfloat16 => sel(BF16_SPECIAL, bits),
        _ => sel(INT_SPECIAL, bits),
    }
}

/// `off` junk bytes followed by the elements, so `&v[off..]` is unaligned.
fn buffer(dtype: DataType, off: usize, elems: &[(u8, u64)]) -> Vec<u8> {
    let w = dtype.size();
    let mut v = vec![0xa5u8; off];
    for &(pick, bits) in elems {
        let e = element(dtype, pick, bits);
        v.extend_from_slice(&e.to_le_bytes()[..w]);
    }
    v
}

fn read(dtype: DataType, s: &[u8], i: usize) -> u64 {
    let w = dtype.size();
    let mut b = [0u8; 8];
    b[..w].copy_from_slice(&s[i * w..(i + 1) * w]);
    u64::from_le_bytes(b)
}

fn is_nan(dtype: DataType, bits: u64) -> bool {
    match dtype {
        DataType::Float32 => f32::from_bits(bits as u32).is_nan(),
        DataType::Float64 => f64::from_bits(bits).is_nan(),
        DataType::Float16 => half::f16::from_bits(bits as u16).is_nan(),
        DataType::Bfloat16 => half::bf16::from_bits(bits as u16).is_nan(),
        _ => false,
    }
}

/// Compares the vector result `got` with the scalar result `want`.
fn compare(
    dtype: DataType,
    op: ReduceOp,
    a: &[u8],
    b: &[u8],
    got: &[u8],
    want: &[u8],
) -> Result<(), String> {
    for i in 0..got.len() / dtype.size() {
        let (g, w) = (read(dtype, got, i), read(dtype, want, i));
        if g == w {
            continue;
        }
        let (x, y) = (read(dtype, a, i), read(dtype, b, i));
        let commutes = matches!(op, ReduceOp::Sum | ReduceOp::Avg | ReduceOp::Prod);
        if commutes && is_nan(dtype, x) && is_nan(dtype, y) && is_nan(dtype, g) && is_nan(dtype, w)
        {
            continue;
        }
        return Err(format!(
            "{dtype:?} {op:?} element {i}: {x:#x} op {y:#x} = {g:#x}, scalar says {w:#x}"
        ));
    }
    Ok(())
}

/// Checks `reduce_into` and `reduce_inplace` against the scalar reference,
/// with the three buffers at byte offsets `offs`.
fn check(
    dtype: DataType,
    op: ReduceOp,
    offs: [usize; 3],
    xs: &[(u8, u64)],
    ys: &[(u8, u64)],
) -> Result<(), String> {
    let a = buffer(dtype, offs[1], xs);
    let b = buffer(dtype, offs[2], ys);
    let (a, b) = (&a[offs[1]..], &b[offs[2]..]);
    let n = a.len();

    let mut want = vec![0u8; n];
    scalar::reduce_into(dtype, op, &mut want, a, b);

    let mut got = vec![0x5au8; offs[0] + n];
    kernels::reduce_into(dtype, op, &mut got[offs[0]..], a, b);
    compare(dtype, op, a, b, &got[offs[0]..], &want).map_err(|e| format!("into: {e}"))?;
    if got[..offs[0]].iter().any(|&x| x != 0x5a) {
        return Err("reduce_into wrote before the destination".into());
    }

    let mut acc = vec![0x5au8; offs[0]];
    acc.extend_from_slice(a);
    acc.push(0x5a);
    kernels::reduce_inplace(dtype, op, &mut acc[offs[0]..offs[0] + n], b);
    compare(dtype, op, a, b, &acc[offs[0]..offs[0] + n], &want)
        .map_err(|e| format!("inplace: {e}"))?;
    if acc[..offs[0]].iter().any(|&x| x != 0x5a) || acc[offs[0] + n] != 0x5a {
        return Err("reduce_inplace wrote outside the accumulator".into());
    }
    Ok(())
}

fn supported() -> Vec<(DataType, ReduceOp)> {
    let mut v = Vec::new();
    for d in DataType::ALL {
        for o in ReduceOp::ALL {
            if o.supports(d) {
                v.push((d, o));
            }
        }
    }
    v
}

fn elems() -> impl Strategy<Value = Vec<(u8, u64)>> {
    prop::collection::vec((any::<u8>(), any::<u64>()), 0..300)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn matches_scalar(
        case in 0..supported().len(),
        offs in [0usize..4, 0usize..4, 0usize..4],
        (xs, ys) in elems().prop_flat_map(|xs| {
            let n = xs.len();
            (Just(xs), prop::collection::vec((any::<u8>(), any::<u64>()), n))
        }),
    ) {
        let (dtype, op) = supported()[case];
        check(dtype, op, offs, &xs, &ys).map_err(TestCaseError::fail)?;
        // And once more from index 1 of a byte Vec, as callers slicing a
        // receive buffer would.
        check(dtype, op, [1, 1, 1], &xs, &ys).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn divide_matches_scalar(
        dtype_i in 0..DataType::ALL.len(),
        off in 0usize..4,
        n in 1usize..64,
        xs in elems(),
    ) {
        let dtype = DataType::ALL[dtype_i];
        let buf = buffer(dtype, off, &xs);
        let mut want = buf[off..].to_vec();
        scalar::divide(dtype, &mut want, n);
        let mut got = buf.clone();
        kernels::divide(dtype, &mut got[off..], n);
        // Division has a single (possibly NaN) operand, so no NaN leeway.
        prop_assert_eq!(&got[off..], &want[..]);
        prop_assert_eq!(&got[..off], &buf[..off]);
    }
}

/// Every f16 / bf16 bit pattern against every special value, every op.
#[test]
fn half_types_exhaustive() {
    for (dtype, specials) in [
        (DataType::Float16, F16_SPECIAL),
        (DataType::Bfloat16, BF16_SPECIAL),
    ] {
        let a: Vec<u8> = (0..=u16::MAX).flat_map(|x| x.to_le_bytes()).collect();
        for &s in specials.iter().chain(&[0x1234, 0x8765, 0x5555, 0x3c7f]) {
            let b: Vec<u8> = s.to_le_bytes().repeat(1 << 16);
            for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
                let mut got = vec![0u8; a.len()];
                let mut want = vec![0u8; a.len()];
                kernels::reduce_into(dtype, op, &mut got, &a, &b);
                scalar::reduce_into(dtype, op, &mut want, &a, &b);
                compare(dtype, op, &a, &b, &got, &want).unwrap();
                // And with the operands swapped.
                kernels::reduce_into(dtype, op, &mut got, &b, &a);
                scalar::reduce_into(dtype, op, &mut want, &b, &a);
                compare(dtype, op, &b, &a, &got, &want).unwrap();
            }
        }
        for n in [1, 2, 3, 7, 8, 24, 1000] {
            let mut got = a.clone();
            let mut want = a.clone();
            kernels::divide(dtype, &mut got, n);
            scalar::divide(dtype, &mut want, n);
            assert_eq!(got, want, "{dtype:?} divide by {n}");
        }
    }
}

/// Every pair of special values for every float type and op.
#[test]
fn float_specials_pairwise() {
    for dtype in [
        DataType::Float16,
        DataType::Bfloat16,
        DataType::Float32,
        DataType::Float64,
    ] {
        let count = match dtype {
            DataType::Float16 => F16_SPECIAL.len(),
            DataType::Bfloat16 => BF16_SPECIAL.len(),
            DataType::Float32 => F32_SPECIAL.len(),
            _ => F64_SPECIAL.len(),
        } as u64;
        let mut xs = Vec::new();
        let mut ys = Vec::new();
        for i in 0..count {
            for j in 0..count {
                xs.push((0, i));
                ys.push((0, j));
            }
        }
        for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
            check(dtype, op, [0, 1, 2], &xs, &ys).unwrap();
        }
    }
}

/// The result for an element does not depend on where it sits in the buffer
/// or how long the buffer is, even for NaN payloads.
#[test]
fn position_independent() {
    for dtype in DataType::ALL {
        for op in ReduceOp::ALL.into_iter().filter(|o| o.supports(dtype)) {
            let w = dtype.size();
            let n = 77;
            let xs: Vec<(u8, u64)> = (0..n).map(|i| (0, i * 7 + 3)).collect();
            let ys: Vec<(u8, u64)> = (0..n).map(|i| (0, i * 5 + 1)).collect();
            let a = buffer(dtype, 0, &xs);
            let b = buffer(dtype, 0, &ys);
            let mut whole = vec![0u8; a.len()];
            kernels::reduce_into(dtype, op, &mut whole, &a, &b);
            for start in 0..n as usize {
                for len in [1, 3, 9, 40] {
                    let end = (start + len).min(n as usize);
                    let r = start * w..end * w;
                    let mut part = vec![0u8; r.len()];
                    kernels::reduce_into(dtype, op, &mut part, &a[r.clone()], &b[r.clone()]);
                    assert_eq!(part, whole[r], "{dtype:?} {op:?} [{start}..{end})");
                }
            }
        }
    }
}

#[test]
fn integer_edges() {
    // Wrapping and signedness at the extremes, against the scalar reference.
    for dtype in DataType::ALL.into_iter().filter(|d| !d.is_float()) {
        let count = INT_SPECIAL.len() as u64;
        let mut xs = Vec::new();
        let mut ys = Vec::new();
        for i in 0..count {
            for j in 0..count {
                xs.push((0, i));
                ys.push((0, j));
            }
        }
        for op in ReduceOp::ALL {
            check(dtype, op, [3, 2, 1], &xs, &ys).unwrap();
        }
    }
}

#[test]
fn backend_uses_detected_features() {
    let b = kernels::backend();
    #[cfg(target_arch = "x86_64")]
    {
        let want = match (
            is_x86_feature_detected!("avx2"),
            is_x86_feature_detected!("f16c"),
        ) {
            (true, true) => "avx2+f16c",
            (true, false) => "avx2",
            _ => "scalar",
        };
        assert_eq!(b, want);
    }
    #[cfg(not(target_arch = "x86_64"))]
    assert_eq!(b, "scalar");
}

#[test]
fn small_values() {
    let a: Vec<u8> = [1.5f32, -2.0]
        .iter()
        .flat_map(|x| x.to_ne_bytes())
        .collect();
    let b: Vec<u8> = [2.25f32, 8.0]
        .iter()
        .flat_map(|x| x.to_ne_bytes())
        .collect();
    let mut d = vec![0u8; 8];
    kernels::reduce_into(DataType::Float32, ReduceOp::Sum, &mut d, &a, &b);
    let r: Vec<f32> = d
        .chunks(4)
        .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(r, [3.75, 6.0]);
    kernels::reduce_inplace(DataType::Float32, ReduceOp::Max, &mut d, &b);
    kernels::divide(DataType::Float32, &mut d, 2);
    let r: Vec<f32> = d
        .chunks(4)
        .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(r, [1.875, 4.0]);
}

#[test]
#[should_panic(expected = "equal length")]
fn length_mismatch_panics() {
    let mut d = vec![0u8; 8];
    kernels::reduce_into(DataType::Float32, ReduceOp::Sum, &mut d, &[0; 8], &[0; 4]);
}

#[test]
#[should_panic(expected = "multiple of 4 bytes")]
fn partial_element_panics() {
    let mut d = vec![0u8; 6];
    kernels::reduce_inplace(DataType::Int32, ReduceOp::Sum, &mut d, &[0; 6]);
}

#[test]
fn unsupported_ops_are_reported() {
    for d in DataType::ALL {
        for o in ReduceOp::ALL {
            assert_eq!(kernels::check_supported(d, o).is_ok(), o.supports(d));
        }
    }
    assert!(kernels::check_supported(DataType::Float32, ReduceOp::BitXor).is_err());
}

#[test]
fn copy_copies() {
    // Small, medium, and past the 16 MiB streaming threshold, at several
    // destination alignments.
    for len in [0usize, 1, 31, 32, 33, 4096, (1 << 21) + 3, (16 << 20) + 200] {
        let src: Vec<u8> = (0..len + 1).map(|i| (i * 31 % 251) as u8).collect();
        for off in [1, 8, 32] {
            let mut dst = vec![0u8; len + off + 1];
            kernels::copy(&mut dst[off..len + off], &src[1..]);
            assert!(dst[off..len + off] == src[1..], "copy of {len} at {off}");
            assert!(dst[..off].iter().all(|&x| x == 0));
            assert_eq!(dst[len + off], 0);
        }
    }
}

/// Buffers past the 16 MiB threshold where `reduce_into` switches to
/// non-temporal stores, at destination offsets that do and do not allow it.
#[test]
fn large_buffers_match_scalar() {
    let len = (16 << 20) + 40;
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut bytes = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                // Keep the high bytes tame so most floats are ordinary.
                (seed >> 56) as u8 & 0xbf
            })
            .collect()
    };
    let a = bytes(len);
    let b = bytes(len);
    for (dtype, op) in [
        (DataType::Float32, ReduceOp::Sum),
        (DataType::Float16, ReduceOp::Sum),
        (DataType::Bfloat16, ReduceOp::Sum),
        (DataType::Float64, ReduceOp::Max),
        (DataType::Int8, ReduceOp::Sum),
    ] {
        let mut want = vec![0u8; len];
        scalar::reduce_into(dtype, op, &mut want, &a, &b);
        for off in [0, 1, 2, 4, 8, 24] {
            let mut got = vec![0x5au8; len + off + 1];
            kernels::reduce_into(dtype, op, &mut got[off..len + off], &a, &b);
            compare(dtype, op, &a, &b, &got[off..len + off], &want).unwrap();
            assert!(got[..off].iter().all(|&x| x == 0x5a));
            assert_eq!(got[len + off], 0x5a);
        }
    }
}
