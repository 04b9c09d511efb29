//! Pre-multiplication for `snclRedOpCreatePreMulSum` operators.

use half::{bf16, f16};
use kernels::{F8E4M3, F8E5M2};

use sncl_rs::DataType;

fn each<const N: usize>(buf: &mut [u8], f: impl Fn([u8; N]) -> [u8; N]) {
    for c in buf.chunks_exact_mut(N) {
        let v: [u8; N] = (&*c).try_into().expect("chunk of N bytes");
        c.copy_from_slice(&f(v));
    }
}

/// Multiplies every element of `buf` (elements of `dtype`, native byte
/// order) by `scalar` (one element of `dtype`). Integers wrap; half,
/// bfloat16 and the fp8 types multiply in single precision and round once
/// (fp8 to nearest even, saturating to its largest finite value as
/// reductions do).
pub(crate) fn scale(buf: &mut [u8], dtype: DataType, scalar: &[u8]) {
    macro_rules! int {
        ($t:ty) => {{
            let s = <$t>::from_ne_bytes(scalar.try_into().expect("scalar size"));
            each(buf, |b| {
                <$t>::from_ne_bytes(b).wrapping_mul(s).to_ne_bytes()
            })
        }};
    }
    match dtype {
        DataType::Int8 => int!(i8),
        DataType::Uint8 => int!(u8),
        DataType::Int32 => int!(i32),
        DataType::Uint32 => int!(u32),
        DataType::Int64 => int!(i64),
        DataType::Uint64 => int!(u64),
        DataType::Float32 => {
            let s = f32::from_ne_bytes(scalar.try_into().expect("scalar size"));
            each(buf, |b| (f32::from_ne_bytes(b) * s).to_ne_bytes())
        }
        DataType::Float64 => {
            let s = f64::from_ne_bytes(scalar.try_into().expect("scalar size"));
            each(buf, |b| (f64::from_ne_bytes(b) * s).to_ne_bytes())
        }
        DataType::Float16 => {
            let s = f16::from_ne_bytes(scalar.try_into().expect("scalar size")).to_f32();
            each(buf, |b| {
                f16::from_f32(f16::from_ne_bytes(b).to_f32() * s).to_ne_bytes()
            })
        }
        DataType::Bfloat16 => {
            let s = bf16::from_ne_bytes(scalar.try_into().expect("scalar size")).to_f32();
            each(buf, |b| {
                bf16::from_f32(bf16::from_ne_bytes(b).to_f32() * s).to_ne_bytes()
            })
        }
        DataType::Float8e4m3 => {
            let s = F8E4M3::from_bits(scalar[0]).to_f32();
            each(buf, |[b]| {
                [F8E4M3::from_f32(F8E4M3::from_bits(b).to_f32() * s).to_bits()]
            })
        }
        DataType::Float8e5m2 => {
            let s = F8E5M2::from_bits(scalar[0]).to_f32();
            each(buf, |[b]| {
                [F8E5M2::from_f32(F8E5M2::from_bits(b).to_f32() * s).to_bits()]
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_every_type() {
        let mut b: Vec<u8> = [3i32, -4].iter().flat_map(|x| x.to_ne_bytes()).collect();
        scale(&mut b, DataType::Int32, &2i32.to_ne_bytes());
        assert_eq!(
            b,
            [6i32, -8]
                .iter()
                .flat_map(|x| x.to_ne_bytes())
                .collect::<Vec<_>>()
        );
        let mut b = f16::from_f32(1.5).to_ne_bytes().to_vec();
        scale(&mut b, DataType::Float16, &f16::from_f32(2.0).to_ne_bytes());
        assert_eq!(f16::from_ne_bytes([b[0], b[1]]).to_f32(), 3.0);
        let mut b = bf16::from_f32(-2.0).to_ne_bytes().to_vec();
        scale(
            &mut b,
            DataType::Bfloat16,
            &bf16::from_f32(0.5).to_ne_bytes(),
        );
        assert_eq!(bf16::from_ne_bytes([b[0], b[1]]).to_f32(), -1.0);
        let mut b = vec![200u8];
        scale(&mut b, DataType::Uint8, &[2]);
        assert_eq!(b, [144]);
        // fp8: 1.5 * 2 = 3; 448 * 2 saturates at 448 (0x7e), -57344 * 2
        // at -57344 (0xfb).
        let e4 = |v: f32| F8E4M3::from_f32(v).to_bits();
        let mut b = vec![e4(1.5), 0x7e];
        scale(&mut b, DataType::Float8e4m3, &[e4(2.0)]);
        assert_eq!(b, [e4(3.0), 0x7e]);
        let mut b = vec![0xfb];
        scale(
            &mut b,
            DataType::Float8e5m2,
            &[F8E5M2::from_f32(2.0).to_bits()],
        );
        assert_eq!(b, [0xfb]);
    }
}
