//! Element types and reduction operators. Numeric values equal NCCL's
//! `ncclDataType_t` / `ncclRedOp_t` so the C ABI can pass them through.

/// Element type of a buffer.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DataType {
    /// Signed 8-bit integer.
    Int8 = 0,
    /// Unsigned 8-bit integer.
    Uint8 = 1,
    /// Signed 32-bit integer.
    Int32 = 2,
    /// Unsigned 32-bit integer.
    Uint32 = 3,
    /// Signed 64-bit integer.
    Int64 = 4,
    /// Unsigned 64-bit integer.
    Uint64 = 5,
    /// IEEE half precision.
    Float16 = 6,
    /// IEEE single precision.
    Float32 = 7,
    /// IEEE double precision.
    Float64 = 8,
    /// bfloat16 (8-bit exponent, 7-bit mantissa).
    Bfloat16 = 9,
    /// 8-bit float, 4-bit exponent, 3-bit mantissa, the OCP "E4M3FN" format
    /// (`float8::F8E4M3`, CUDA's `__nv_fp8_e4m3`, torch's
    /// `float8_e4m3fn`): bias 7, no infinities, NaN is `S.1111.111`, largest
    /// finite value ±448.
    ///
    /// Reductions (sum, prod, min, max, avg) decode both operands to f32,
    /// apply one f32 operation and round back to nearest even after every
    /// step, saturating as CUDA's `__NV_SATFINITE` conversion does (and as
    /// NCCL's fp8 reductions do): a result beyond ±448 (an overflow, or an
    /// infinite f32) becomes ±448; a NaN result becomes NaN
    /// (`S.1111.111`). Copies move the bits unchanged.
    Float8e4m3 = 10,
    /// 8-bit float, 5-bit exponent, 2-bit mantissa (`float8::F8E5M2`,
    /// CUDA's `__nv_fp8_e5m2`, torch's `float8_e5m2`): IEEE-like with bias
    /// 15, infinities `S.11111.00`, NaNs `S.11111.{01,10,11}`, largest
    /// finite value ±57344.
    ///
    /// Reductions as for [`DataType::Float8e4m3`] with `__NV_SATFINITE`
    /// saturation: a result beyond ±57344 becomes ±57344, and so does an
    /// infinite result, so an infinity that takes part in a reduction
    /// comes out as the largest finite value of its sign; a NaN result is
    /// a quiet NaN (`S.11111.1x`). Copies move the bits unchanged.
    Float8e5m2 = 11,
}

impl DataType {
    /// Every data type, in NCCL order.
    pub const ALL: [DataType; 12] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Float16,
        DataType::Float32,
        DataType::Float64,
        DataType::Bfloat16,
        DataType::Float8e4m3,
        DataType::Float8e5m2,
    ];

    /// Size of one element in bytes.
    #[inline]
    pub const fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 | DataType::Float8e4m3 | DataType::Float8e5m2 => 1,
            DataType::Float16 | DataType::Bfloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
        }
    }

    /// The name nccl-tests prints (`float`, `half`, `bfloat16`, `f8e4m3`, ...).
    #[inline]
    pub const fn name(self) -> &'static str {
        match self {
            DataType::Int8 => "int8",
            DataType::Uint8 => "uint8",
            DataType::Int32 => "int32",
            DataType::Uint32 => "uint32",
            DataType::Int64 => "int64",
            DataType::Uint64 => "uint64",
            DataType::Float16 => "half",
            DataType::Float32 => "float",
            DataType::Float64 => "double",
            DataType::Bfloat16 => "bfloat16",
            DataType::Float8e4m3 => "f8e4m3",
            DataType::Float8e5m2 => "f8e5m2",
        }
    }

    /// Parses nccl-tests names and Rust-style aliases (`f32`, `bf16`, `i8`, ...).
    pub fn from_name(name: &str) -> Option<DataType> {
        let dt = match name.to_ascii_lowercase().as_str() {
            "int8" | "i8" | "char" => DataType::Int8,
            "uint8" | "u8" => DataType::Uint8,
            "int32" | "i32" | "int" => DataType::Int32,
            "uint32" | "u32" => DataType::Uint32,
            "int64" | "i64" => DataType::Int64,
            "uint64" | "u64" => DataType::Uint64,
            "half" | "float16" | "f16" | "fp16" => DataType::Float16,
            "float" | "float32" | "f32" | "fp32" => DataType::Float32,
            "double" | "float64" | "f64" | "fp64" => DataType::Float64,
            "bfloat16" | "bf16" => DataType::Bfloat16,
            "f8e4m3" | "float8e4m3" | "fp8e4m3" | "float8_e4m3fn" | "e4m3" => DataType::Float8e4m3,
            "f8e5m2" | "float8e5m2" | "fp8e5m2" | "float8_e5m2" | "e5m2" => DataType::Float8e5m2,
            _ => return None,
        };
        Some(dt)
    }

    /// Converts NCCL's numeric value.
    #[inline]
    pub fn from_u8(v: u8) -> Option<DataType> {
        DataType::ALL.get(v as usize).copied()
    }

    /// True for f16, bf16, f32, f64 and the two fp8 types.
    #[inline]
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::Float16
                | DataType::Float32
                | DataType::Float64
                | DataType::Bfloat16
                | DataType::Float8e4m3
                | DataType::Float8e5m2
        )
    }

    /// True for the two fp8 types.
    #[inline]
    pub const fn is_fp8(self) -> bool {
        matches!(self, DataType::Float8e4m3 | DataType::Float8e5m2)
    }
}

/// Reduction operator.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReduceOp {
    /// Sum (integers wrap).
    Sum = 0,
    /// Product (integers wrap).
    Prod = 1,
    /// Maximum.
    Max = 2,
    /// Minimum.
    Min = 3,
    /// Sum divided by the number of ranks (integers: truncating division).
    Avg = 4,
    /// Bitwise and (integer types only).
    BitAnd = 5,
    /// Bitwise or (integer types only).
    BitOr = 6,
    /// Bitwise xor (integer types only).
    BitXor = 7,
}

impl ReduceOp {
    /// Every operator.
    pub const ALL: [ReduceOp; 8] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Avg,
        ReduceOp::BitAnd,
        ReduceOp::BitOr,
        ReduceOp::BitXor,
    ];

    /// The name nccl-tests prints.
    #[inline]
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Avg => "avg",
            ReduceOp::BitAnd => "band",
            ReduceOp::BitOr => "bor",
            ReduceOp::BitXor => "bxor",
        }
    }

    /// Parses an operator name.
    pub fn from_name(name: &str) -> Option<ReduceOp> {
        let op = match name.to_ascii_lowercase().as_str() {
            "sum" => ReduceOp::Sum,
            "prod" | "product" => ReduceOp::Prod,
            "max" => ReduceOp::Max,
            "min" => ReduceOp::Min,
            "avg" | "mean" => ReduceOp::Avg,
            "band" | "and" => ReduceOp::BitAnd,
            "bor" | "or" => ReduceOp::BitOr,
            "bxor" | "xor" => ReduceOp::BitXor,
            _ => return None,
        };
        Some(op)
    }

    /// Converts the numeric value.
    #[inline]
    pub fn from_u8(v: u8) -> Option<ReduceOp> {
        ReduceOp::ALL.get(v as usize).copied()
    }

    /// Whether this operator is defined for `dtype` (bitwise ones only on integers).
    #[inline]
    pub const fn supports(self, dtype: DataType) -> bool {
        match self {
            ReduceOp::BitAnd | ReduceOp::BitOr | ReduceOp::BitXor => !dtype.is_float(),
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NCCL's values (ncclFloat8e4m3 = 10, ncclFloat8e5m2 = 11), the names
    /// commbench takes, one byte each, and no bitwise reductions.
    #[test]
    fn fp8_types() {
        for (dtype, value, name) in [
            (DataType::Float8e4m3, 10, "f8e4m3"),
            (DataType::Float8e5m2, 11, "f8e5m2"),
        ] {
            assert_eq!(dtype as u8, value);
            assert_eq!(DataType::from_u8(value), Some(dtype));
            assert_eq!(dtype.name(), name);
            assert_eq!(DataType::from_name(name), Some(dtype));
            assert_eq!(dtype.size(), 1);
            assert!(dtype.is_float() && dtype.is_fp8());
            for op in ReduceOp::ALL {
                let bitwise = matches!(op, ReduceOp::BitAnd | ReduceOp::BitOr | ReduceOp::BitXor);
                assert_eq!(op.supports(dtype), !bitwise, "{} {}", op.name(), name);
            }
        }
        assert_eq!(DataType::from_u8(12), None);
        assert_eq!(
            DataType::from_name("float8_e4m3fn"),
            Some(DataType::Float8e4m3)
        );
    }
}
