//! Rust element types sncl can reduce and move.

use comm_core::DataType;
use half::{bf16, f16};

/// A plain-old-data element type with a matching [`DataType`].
///
/// # Safety
/// Implementors must be plain data with no padding and no invalid bit
/// patterns, of exactly `DTYPE.size()` bytes: sncl moves them as bytes.
pub unsafe trait Element: Copy + Send + Sync + 'static {
    /// The matching data type.
    const DTYPE: DataType;
}

macro_rules! element {
    ($t:ty, $d:ident) => {
        // SAFETY: a primitive numeric type or a `repr(transparent)` wrapper
        // of one (`float8`'s u8): no padding, every bit pattern valid.
        unsafe impl Element for $t {
            const DTYPE: DataType = DataType::$d;
        }
    };
}
element!(i8, Int8);
element!(u8, Uint8);
element!(i32, Int32);
element!(u32, Uint32);
element!(i64, Int64);
element!(u64, Uint64);
element!(f16, Float16);
element!(f32, Float32);
element!(f64, Float64);
element!(bf16, Bfloat16);
// The `float8` crate's types (re-exported by `kernels`): reductions in f32,
// rounded to nearest even with saturation, see `DataType::Float8e4m3`.
element!(kernels::F8E4M3, Float8e4m3);
element!(kernels::F8E5M2, Float8e5m2);

/// Views elements as bytes.
pub fn as_bytes<T: Element>(s: &[T]) -> &[u8] {
    // SAFETY: Element types are plain data without padding (trait contract).
    unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u8, std::mem::size_of_val(s)) }
}

/// Views elements as mutable bytes.
pub fn as_bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    // SAFETY: Element types are plain data in which every bit pattern is
    // valid (trait contract), so any bytes written keep them valid.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut u8, std::mem::size_of_val(s)) }
}
