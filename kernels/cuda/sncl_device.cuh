// sncl_device.cuh: the element arithmetic of sncl's device kernels, one pure
// __device__ function per dtype x op, bit-identical to the CPU kernels
// (kernels/src/scalar.rs and x86.rs):
//
// * integers wrap (computed in the unsigned type of the same width);
// * float max / min are IEEE 754-2019 maximum / minimum, commutative bit
//   for bit: the larger / smaller value; between equal values (+0, -0) the
//   AND / OR of their bits (+0 for max, -0 for min); a NaN operand gives a
//   quiet NaN, the OR of both operands' bits;
// * float sum/prod/divide round once (the *_rn intrinsics, never fused),
//   and a NaN result follows x86's rule, so a GPU gives the bits an x86 CPU
//   gives: the first NaN operand, quieted, or else the default NaN
//   (0xffc00000 / 0xfff8000000000000);
// * f16 and bf16 are widened to f32, combined as f32 and rounded to
//   nearest even after every operation, NaN as the `half` crate does it;
// * fp8 (e4m3 = OCP E4M3FN, e5m2) likewise through f32, rounded to nearest
//   even with CUDA's __NV_SATFINITE saturation (overflow and infinities
//   become the largest finite value of their sign), decoded and encoded as
//   the `float8` crate (a port of cuda_fp8.hpp's software path) does it;
//   software conversions, no cuda_fp8.h, so sm_80 and the host shim work;
// * integer divide truncates toward zero with the divisor as an unsigned
//   64-bit value (the CPU divides in i128); a divisor of 0 leaves integers
//   unchanged (the CPU refuses it; callers must too).
//
// No dependency on CUDA's headers: NVRTC compiles this with no include path.
#ifndef SNCL_DEVICE_CUH
#define SNCL_DEVICE_CUH

#ifdef SNCL_HOST_EMU
#include "sncl_host_emu.h"
#define SNCL_UNROLL _Pragma("GCC unroll 16")
#else
#define SNCL_UNROLL _Pragma("unroll")
#endif

// Element storage types, named by DataType::name(); half and bfloat16 are
// their bits.
typedef signed char sncl_int8_t;
typedef unsigned char sncl_uint8_t;
typedef int sncl_int32_t;
typedef unsigned int sncl_uint32_t;
typedef long long sncl_int64_t;
typedef unsigned long long sncl_uint64_t;
typedef unsigned short sncl_half_t;
typedef float sncl_float_t;
typedef double sncl_double_t;
typedef unsigned short sncl_bfloat16_t;
typedef unsigned char sncl_f8e4m3_t;
typedef unsigned char sncl_f8e5m2_t;

// ---- NaN rules (x86's, see above) ----------------------------------------

__device__ __forceinline__ bool sncl_f32_bits_nan(unsigned int u) {
  return (u & 0x7fffffffu) > 0x7f800000u;
}

// The NaN an x86 CPU returns for `a op b` when the result is NaN.
__device__ __forceinline__ float sncl_f32_nan(float a, float b) {
  const unsigned int ua = __float_as_uint(a);
  const unsigned int ub = __float_as_uint(b);
  if (sncl_f32_bits_nan(ua)) return __uint_as_float(ua | 0x00400000u);
  if (sncl_f32_bits_nan(ub)) return __uint_as_float(ub | 0x00400000u);
  return __uint_as_float(0xffc00000u);
}

__device__ __forceinline__ float sncl_f32_fix(float r, float a, float b) {
  return r == r ? r : sncl_f32_nan(a, b);
}

__device__ __forceinline__ bool sncl_f64_bits_nan(unsigned long long u) {
  return (u & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
}

__device__ __forceinline__ double sncl_f64_nan(double a, double b) {
  const unsigned long long ua = (unsigned long long)__double_as_longlong(a);
  const unsigned long long ub = (unsigned long long)__double_as_longlong(b);
  if (sncl_f64_bits_nan(ua)) return __longlong_as_double((long long)(ua | 0x0008000000000000ull));
  if (sncl_f64_bits_nan(ub)) return __longlong_as_double((long long)(ub | 0x0008000000000000ull));
  return __longlong_as_double((long long)0xfff8000000000000ull);
}

__device__ __forceinline__ double sncl_f64_fix(double r, double a, double b) {
  return r == r ? r : sncl_f64_nan(a, b);
}

// ---- f16 <-> f32 (IEEE nearest-even; NaN as the `half` crate) -------------

// f16 NaN to f32: quiet bit set, payload shifted up.
__device__ __forceinline__ float sncl_h2f_nan(unsigned short h) {
  const unsigned int u = (unsigned int)h;
  return __uint_as_float(((u & 0x8000u) << 16) | 0x7fc00000u | ((u & 0x03ffu) << 13));
}

// f32 NaN to f16: quiet bit set, payload truncated.
__device__ __forceinline__ unsigned short sncl_f2h_nan(float f) {
  const unsigned int x = __float_as_uint(f);
  return (unsigned short)(((x >> 16) & 0x8000u) | 0x7e00u | ((x & 0x007fffffu) >> 13));
}

#ifdef SNCL_HOST_EMU
__device__ __forceinline__ float sncl_h2f(unsigned short h) {
  const unsigned int u = (unsigned int)h;
  const unsigned int sign = (u & 0x8000u) << 16;
  const unsigned int exp = u & 0x7c00u;
  const unsigned int man = u & 0x03ffu;
  if (exp == 0x7c00u) {
    return man == 0 ? __uint_as_float(sign | 0x7f800000u) : sncl_h2f_nan(h);
  }
  if (exp == 0) {
    if (man == 0) return __uint_as_float(sign);
    // Subnormal: normalise. man < 2^10, so clz(man) >= 22.
    const int e = __builtin_clz(man) - 21;  // shifts to bring the top bit to bit 10
    const unsigned int m = (man << e) & 0x03ffu;
    return __uint_as_float(sign | ((unsigned int)(127 - 15 + 1 - e) << 23) | (m << 13));
  }
  return __uint_as_float(sign | (((exp >> 10) + 127 - 15) << 23) | (man << 13));
}

__device__ __forceinline__ unsigned short sncl_f2h(float f) {
  const unsigned int x = __float_as_uint(f);
  const unsigned int sign = (x >> 16) & 0x8000u;
  const unsigned int exp = x & 0x7f800000u;
  const unsigned int man = x & 0x007fffffu;
  if (exp == 0x7f800000u) {
    return man == 0 ? (unsigned short)(sign | 0x7c00u) : sncl_f2h_nan(f);
  }
  const int half_exp = (int)(exp >> 23) - 127 + 15;
  if (half_exp >= 0x1f) return (unsigned short)(sign | 0x7c00u);
  if (half_exp <= 0) {
    if (14 - half_exp > 24) return (unsigned short)sign;
    const unsigned int m = man | 0x00800000u;
    unsigned int half_man = m >> (14 - half_exp);
    const unsigned int round_bit = 1u << (13 - half_exp);
    if ((m & round_bit) != 0 && (m & (3 * round_bit - 1)) != 0) half_man += 1;
    return (unsigned short)(sign | half_man);
  }
  const unsigned int bits = sign | ((unsigned int)half_exp << 10) | (man >> 13);
  const unsigned int round_bit = 0x1000u;
  if ((man & round_bit) != 0 && (man & (3 * round_bit - 1)) != 0) return (unsigned short)(bits + 1);
  return (unsigned short)bits;
}
#else
// The hardware conversions are exact IEEE nearest-even; only NaN payloads
// differ from the CPU's, so NaN takes the bit-level path.
__device__ __forceinline__ float sncl_h2f(unsigned short h) {
  if ((h & 0x7fffu) > 0x7c00u) return sncl_h2f_nan(h);
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

__device__ __forceinline__ unsigned short sncl_f2h(float f) {
  if (f != f) return sncl_f2h_nan(f);
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
#endif

// ---- bf16 <-> f32 (bit-level, the same on host and device) ----------------

__device__ __forceinline__ float sncl_b2f(unsigned short b) {
  const unsigned int u = (unsigned int)b;
  return __uint_as_float(((u & 0x7fffu) > 0x7f80u ? (u | 0x0040u) : u) << 16);
}

__device__ __forceinline__ unsigned short sncl_f2b(float f) {
  const unsigned int x = __float_as_uint(f);
  if (sncl_f32_bits_nan(x)) return (unsigned short)((x >> 16) | 0x0040u);
  return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// ---- fp8 <-> f32 (bit-level, the same on host and device) -----------------
// Decoding is exact; a NaN decodes to 0x7fffe000 (the f16 canonical NaN
// widened, as `float8` does it). Encoding rounds to nearest even and
// saturates (__NV_SATFINITE): |x| beyond the largest finite value (448 for
// e4m3, 57344 for e5m2), infinities included, gives that value with x's
// sign; NaN gives S.1111.111 (e4m3) or the quieted S.11111.1m (e5m2, m the
// f32 mantissa's second bit); |x| at most half the smallest subnormal gives
// a zero of x's sign. The results are those of `float8`'s port of
// cuda_fp8.hpp's __nv_cvt_double_to_fp8, computed in fewer steps.

__device__ __forceinline__ float sncl_e4m3_to_f32(unsigned char x) {
  const unsigned int a = x & 0x7fu;
  const unsigned int sign = ((unsigned int)x & 0x80u) << 24;
  if (a == 0x7fu) return __uint_as_float(0x7fffe000u);
  // Subnormal: a * 2^-9, exact in f32.
  if (a < 8u) return __uint_as_float(sign | __float_as_uint((float)a * 0.001953125f));
  // Normal: exponent e - 7 + 127, mantissa in the top 3 bits.
  return __uint_as_float(sign | ((a << 20) + (120u << 23)));
}

__device__ __forceinline__ float sncl_e5m2_to_f32(unsigned char x) {
  const unsigned short h = (unsigned short)((unsigned int)x << 8);
  if ((h & 0x7fffu) > 0x7c00u) return __uint_as_float(0x7fffe000u);
  return sncl_h2f(h);
}

// f32 -> fp8 with round to nearest even and __NV_SATFINITE. P: mantissa
// bits + 1, BIAS: exponent bias, MAXNORM: the largest finite encoding,
// MINNORM: f32 bits of the smallest normal, OVER: f32 bits from which the
// result saturates, MAGIC: 2^(23 - s) for the smallest subnormal 2^-s.
// Normal results round by adding half an ulp less one plus the kept
// lowest bit, then truncating (a carry moves into the exponent, as it
// should); subnormal ones by one f32 addition of MAGIC, whose ulp is the
// subnormal step, so the FPU rounds to nearest even (|x| at most half the
// smallest subnormal gives 0).
template <unsigned int P, unsigned int BIAS, unsigned int MAXNORM, unsigned int MINNORM,
          unsigned int OVER, unsigned int MAGIC>
__device__ __forceinline__ unsigned char sncl_f32_to_fp8(float f) {
  const unsigned int x = __float_as_uint(f);
  const unsigned int sign = (x >> 24) & 0x80u;
  const unsigned int absx = x & 0x7fffffffu;
  const unsigned int shift = 24 - P;
  unsigned int res;
  if (absx > 0x7f800000u) {
    // NaN: e4m3's only one; e5m2 quiet, keeping the second mantissa bit.
    res = P == 4 ? 0x7fu : (0x7eu | ((x >> shift) & 3u));
  } else if (absx >= OVER) {
    res = MAXNORM;
  } else if (absx >= MINNORM) {
    const unsigned int rebased = absx - ((127u - BIAS) << 23);
    res = (rebased + ((1u << (shift - 1)) - 1) + ((absx >> shift) & 1u)) >> shift;
  } else {
    res = __float_as_uint(__fadd_rn(__uint_as_float(absx), __uint_as_float(MAGIC))) - MAGIC;
  }
  return (unsigned char)(res | sign);
}

// e4m3: saturates above 464 (448 + half an ulp; 464 itself rounds to 448
// by ties-to-even); e5m2 from 61440 (57344 + half an ulp, a tie that would
// round up to the infinity). Subnormal steps 2^-9 and 2^-16.
__device__ __forceinline__ unsigned char sncl_f32_to_e4m3(float f) {
  return sncl_f32_to_fp8<4, 7, 0x7eu, 0x3c800000u, 0x43e80001u, 0x46800000u>(f);
}
__device__ __forceinline__ unsigned char sncl_f32_to_e5m2(float f) {
  return sncl_f32_to_fp8<3, 15, 0x7bu, 0x38800000u, 0x47700000u, 0x43000000u>(f);
}

// ---- The operations: sncl_<dtype>_<op>(a, b) and sncl_<dtype>_div(a, n) ----

#define SNCL_INT_OPS(dt, U)                                                   \
  __device__ __forceinline__ sncl_##dt##_t sncl_##dt##_sum(sncl_##dt##_t a,   \
                                                           sncl_##dt##_t b) { \
    return (sncl_##dt##_t)(U)((U)a + (U)b);                                   \
  }                                                                           \
  __device__ __forceinline__ sncl_##dt##_t sncl_##dt##_prod(sncl_##dt##_t a,  \
                                                            sncl_##dt##_t b) { \
    return (sncl_##dt##_t)(U)((U)a * (U)b);                                   \
  }                                                                           \
  __device__ __forceinline__ sncl_##dt##_t sncl_##dt##_max(sncl_##dt##_t a,   \
                                                           sncl_##dt##_t b) { \
    return a > b ? a : b;                                                     \
  }                                                                           \
  __device__ __forceinline__ sncl_##dt##_t sncl_##dt##_min(sncl_##dt##_t a,   \
                                                           sncl_##dt##_t b) { \
    return a < b ? a : b;                                                     \
  }                                                                           \
  __device__ __forceinline__ sncl_##dt##_t sncl_##dt##_band(sncl_##dt##_t a,  \
                                                            sncl_##dt##_t b) { \
    return (sncl_##dt##_t)(a & b);                                            \
  }                                                                           \
  __device__ __forceinline__ sncl_##dt##_t sncl_##dt##_bor(sncl_##dt##_t a,   \
                                                           sncl_##dt##_t b) { \
    return (sncl_##dt##_t)(a | b);                                            \
  }                                                                           \
  __device__ __forceinline__ sncl_##dt##_t sncl_##dt##_bxor(sncl_##dt##_t a,  \
                                                            sncl_##dt##_t b) { \
    return (sncl_##dt##_t)(a ^ b);                                            \
  }

// 8-bit operands promote to int before + and *; the products of two values
// below 256 fit, and the cast back to U wraps.
SNCL_INT_OPS(int8, unsigned char)
SNCL_INT_OPS(uint8, unsigned char)
SNCL_INT_OPS(int32, unsigned int)
SNCL_INT_OPS(uint32, unsigned int)
SNCL_INT_OPS(int64, unsigned long long)
SNCL_INT_OPS(uint64, unsigned long long)

// x / n truncated, as `(x as i128 / n as i128)` does it for n >= 1.
__device__ __forceinline__ long long sncl_sdiv(long long x, unsigned long long n) {
  if (n == 0) return x;
  if (n > 0x7fffffffffffffffull) {
    // |x| <= 2^63 <= n: only -2^63 / 2^63 is not 0.
    return (x == -0x7fffffffffffffffll - 1 && n == 0x8000000000000000ull) ? -1 : 0;
  }
  return x / (long long)n;
}

__device__ __forceinline__ unsigned long long sncl_udiv(unsigned long long x, unsigned long long n) {
  return n == 0 ? x : x / n;
}

__device__ __forceinline__ sncl_int8_t sncl_int8_div(sncl_int8_t a, unsigned long long n) {
  return (sncl_int8_t)sncl_sdiv(a, n);
}
__device__ __forceinline__ sncl_uint8_t sncl_uint8_div(sncl_uint8_t a, unsigned long long n) {
  return (sncl_uint8_t)sncl_udiv(a, n);
}
__device__ __forceinline__ sncl_int32_t sncl_int32_div(sncl_int32_t a, unsigned long long n) {
  return (sncl_int32_t)sncl_sdiv(a, n);
}
__device__ __forceinline__ sncl_uint32_t sncl_uint32_div(sncl_uint32_t a, unsigned long long n) {
  return (sncl_uint32_t)sncl_udiv(a, n);
}
__device__ __forceinline__ sncl_int64_t sncl_int64_div(sncl_int64_t a, unsigned long long n) {
  return sncl_sdiv(a, n);
}
__device__ __forceinline__ sncl_uint64_t sncl_uint64_div(sncl_uint64_t a, unsigned long long n) {
  return sncl_udiv(a, n);
}

// f32
__device__ __forceinline__ float sncl_float_sum(float a, float b) {
  return sncl_f32_fix(__fadd_rn(a, b), a, b);
}
__device__ __forceinline__ float sncl_float_prod(float a, float b) {
  return sncl_f32_fix(__fmul_rn(a, b), a, b);
}
__device__ __forceinline__ float sncl_float_extremum(float a, float b, bool max) {
  const unsigned int x = __float_as_uint(a), y = __float_as_uint(b);
  if (a != a || b != b) return __uint_as_float(x | y | 0x00400000u);
  if (a == b) return __uint_as_float(max ? (x & y) : (x | y));
  return ((a > b) == max) ? a : b;
}
__device__ __forceinline__ float sncl_float_max(float a, float b) {
  return sncl_float_extremum(a, b, true);
}
__device__ __forceinline__ float sncl_float_min(float a, float b) {
  return sncl_float_extremum(a, b, false);
}
__device__ __forceinline__ float sncl_float_div(float a, unsigned long long n) {
  const float d = __ull2float_rn(n);
  return sncl_f32_fix(__fdiv_rn(a, d), a, d);
}

// f64
__device__ __forceinline__ double sncl_double_sum(double a, double b) {
  return sncl_f64_fix(__dadd_rn(a, b), a, b);
}
__device__ __forceinline__ double sncl_double_prod(double a, double b) {
  return sncl_f64_fix(__dmul_rn(a, b), a, b);
}
__device__ __forceinline__ double sncl_double_extremum(double a, double b, bool max) {
  const unsigned long long x = (unsigned long long)__double_as_longlong(a);
  const unsigned long long y = (unsigned long long)__double_as_longlong(b);
  if (a != a || b != b) return __longlong_as_double((long long)(x | y | 0x0008000000000000ull));
  if (a == b) return __longlong_as_double((long long)(max ? (x & y) : (x | y)));
  return ((a > b) == max) ? a : b;
}
__device__ __forceinline__ double sncl_double_max(double a, double b) {
  return sncl_double_extremum(a, b, true);
}
__device__ __forceinline__ double sncl_double_min(double a, double b) {
  return sncl_double_extremum(a, b, false);
}
__device__ __forceinline__ double sncl_double_div(double a, unsigned long long n) {
  const double d = __ull2double_rn(n);
  return sncl_f64_fix(__ddiv_rn(a, d), a, d);
}

// f16, bf16 and fp8: widen, combine as f32, round to nearest even.
#define SNCL_NARROW_OPS(dt, TO_F32, FROM_F32)                                  \
  __device__ __forceinline__ sncl_##dt##_t sncl_##dt##_sum(sncl_##dt##_t a,    \
                                                           sncl_##dt##_t b) {  \
    return FROM_F32(sncl_float_sum(TO_F32(a), TO_F32(b)));                     \
  }                                                                            \
  __device__ __forceinline__ sncl_##dt##_t sncl_##dt##_prod(sncl_##dt##_t a,   \
                                                            sncl_##dt##_t b) { \
    return FROM_F32(sncl_float_prod(TO_F32(a), TO_F32(b)));                    \
  }                                                                            \
  __device__ __forceinline__ sncl_##dt##_t sncl_##dt##_max(sncl_##dt##_t a,    \
                                                           sncl_##dt##_t b) {  \
    return FROM_F32(sncl_float_max(TO_F32(a), TO_F32(b)));                     \
  }                                                                            \
  __device__ __forceinline__ sncl_##dt##_t sncl_##dt##_min(sncl_##dt##_t a,    \
                                                           sncl_##dt##_t b) {  \
    return FROM_F32(sncl_float_min(TO_F32(a), TO_F32(b)));                     \
  }                                                                            \
  __device__ __forceinline__ sncl_##dt##_t sncl_##dt##_div(sncl_##dt##_t a,    \
                                                           unsigned long long n) { \
    return FROM_F32(sncl_float_div(TO_F32(a), n));                             \
  }

SNCL_NARROW_OPS(half, sncl_h2f, sncl_f2h)
SNCL_NARROW_OPS(bfloat16, sncl_b2f, sncl_f2b)
SNCL_NARROW_OPS(f8e4m3, sncl_e4m3_to_f32, sncl_f32_to_e4m3)
SNCL_NARROW_OPS(f8e5m2, sncl_e5m2_to_f32, sncl_f32_to_e5m2)

#endif  // SNCL_DEVICE_CUH
