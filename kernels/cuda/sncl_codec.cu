// sncl's device codec kernels: the `compress` crate's formats (fp16, bf16,
// blockwise int8, exact top-k) produced and consumed on the device,
// bit-identical to the CPU codecs so host and device ranks interoperate.
//
// ABI: every kernel is
//   extern "C" __global__ void sncl_codec_<name>(SnclCodecArgs args);
// with the one argument struct below passed by value (kernels/src/cuda_codec.rs
// mirrors it and lists the kernels and the sequences that make up one codec
// operation). Formats (little endian, see compress/src/lib.rs):
//   fp16/bf16: n x u16, nearest even (NaN as the `half` crate);
//   int8:      per block of `param` elements (the last may be shorter): f32
//              scale absmax/127, then one i8 per element;
//   top-k:     u32 k, k x u32 indices (ascending), k x f32 values.
//
// Host-shim rules (sncl_host_emu.h): a plain kernel has no shared memory,
// no barriers and no warp operations: the shim runs its threads one after
// the other, so each thread's work is independent inside one kernel.
// "Single" kernels do their work on thread 0 of block 0 only. Block
// kernels (SNCL_FOR_EACH_CODEC_BLOCK_KERNEL) let a block's threads
// cooperate through __shared__ memory and __syncthreads, written in
// SNCL_EACH_THREAD phases (the shim's "Block kernels" rules); they are
// launched with at most SNCL_CODEC_BLOCK_THREADS threads per block.
// Whatever needs a step across blocks (a top-k threshold, compaction
// offsets) is a documented sequence of kernels on one stream, or the last
// block of a launch to finish does it (SNCL_TS_TICKET). Global atomics are
// plain read-modify-writes on the host (launches of one stream never
// overlap, and the shim runs blocks one after the other).
//
// Sequences (all on the stream, no host round trip):
//   encode fp16/bf16:  encode_<f>
//   decode fp16/bf16:  decode_<f>             (nsrcs inputs; add or overwrite)
//   fused reduce:      decsum_encode_<f>      (sum of nsrcs decoded inputs in f32 from +0,
//                                              re-encoded; optional f32 sum in aux)
//   encode int8:       int8_encode            (one DRAM pass: a thread group per
//                                              block, statistics then quantisation)
//   decode int8:       int8_decode            (nsrcs inputs; add or overwrite)
//   encode MX:         mx_encode              (a thread per 32-element block)
//   decode MX:         mx_decode              (a thread per element; nsrcs inputs)
//   encode top-k:      topk_init, then for each radix select 4 x topk_hist and one
//                      topk_count, finally topk_write (compaction); sampled top-k adds
//                      topk_sample and two more selects and counts (see
//                      sncl_codec_topk.cuh: 7 launches exact, 18 sampled)
//   decode top-k:      topk_check_init, topk_check, topk_clear, topk_scatter
//                      (validated: on bad input the status word work[0] is non-zero
//                      and the output is untouched)
//   error feedback:    ef_compensate (grad += residual) before encoding; decode of the
//                      encoding into the residual, then ef_residual (r = grad - r)
#include "sncl_device.cuh"

#define SNCL_CODEC_MAX_SRCS 8
// The most threads a block kernel is launched with (its shared arrays).
#define SNCL_CODEC_BLOCK_THREADS 256

// Block kernels' phases (sncl_host_emu.h): every thread runs the braces.
#ifndef SNCL_HOST_EMU
#define SNCL_EACH_THREAD
#define SNCL_UNROLL8 _Pragma("unroll 8")
#else
#define SNCL_UNROLL8
#endif
struct SnclCodecArgs {
  const void* src[SNCL_CODEC_MAX_SRCS];  // inputs: f32 (encode) or encoded bytes (decode)
  void* dst;                             // output: encoded bytes (encode) or f32 (decode)
  void* aux;                             // f32 side buffer (residual, grad, sum) or null
  void* work;                            // device workspace (kernels/src/cuda_codec.rs sizes it)
  unsigned long long n;                  // elements
  unsigned long long param;              // int8: block size; top-k: k
  unsigned long long enc_len;            // top-k decode: encoded bytes given;
                                         // sampled top-k encode: sample runs
  unsigned long long rank;               // sampled top-k: the sample rank j
  unsigned int seed;                     // int8-sr: the 32-bit kernel seed
  unsigned int pass;                     // top-k radix pass 0..3
  int nsrcs;                             // 1..8
  int flags;                             // SNCL_CODEC_ADD, _STOCHASTIC, _SAMPLED
  unsigned int when;                     // top-k: the modes this launch runs in (0: all)
  unsigned int pad;
};                                       // 8*8 + 3*8 + 4*8 + 6*4 = 144 bytes

// flags: decode adds to dst instead of overwriting it; int8 rounds
// stochastically; top-k selects by a sampled threshold.
#define SNCL_CODEC_ADD 1
#define SNCL_CODEC_STOCHASTIC 2
#define SNCL_CODEC_SAMPLED 4
#define SNCL_CODEC_LEN_MAX 8  // top-k decode: enc_len is an upper bound (own encoding)

// Elements per top-k compaction chunk and chunks per scan group.
#define SNCL_TOPK_CHUNK 256ull
#define SNCL_TOPK_GROUP 256ull
// Private top-k histogram copies.
#define SNCL_TOPK_HCOPIES 64ull

// ---- Primitives the host shim lacks (inline PTX on the device) -----------

#ifdef SNCL_HOST_EMU
__device__ __forceinline__ float sncl_codec_rint(float y) { return __builtin_rintf(y); }
__device__ __forceinline__ float sncl_codec_floor(float y) { return __builtin_floorf(y); }
__device__ __forceinline__ float sncl_codec_u2f(unsigned int v) { return (float)v; }
__device__ __forceinline__ float sncl_codec_d2f(double d) { return (float)d; }
__device__ __forceinline__ void sncl_codec_atomic_add(unsigned long long* p, unsigned long long v) {
  *p += v;
}
__device__ __forceinline__ void sncl_codec_atomic_or(unsigned int* p, unsigned int v) { *p |= v; }
__device__ __forceinline__ unsigned long long sncl_codec_ticket(unsigned long long* p) {
  return (*p)++;
}
// Blocks run one after the other: every write is visible to the next.
__device__ __forceinline__ void sncl_codec_fence() {}
#else
__device__ __forceinline__ float sncl_codec_rint(float y) {
  float r;
  asm("cvt.rni.f32.f32 %0, %1;" : "=f"(r) : "f"(y));
  return r;
}
__device__ __forceinline__ float sncl_codec_floor(float y) {
  float r;
  asm("cvt.rmi.f32.f32 %0, %1;" : "=f"(r) : "f"(y));
  return r;
}
__device__ __forceinline__ float sncl_codec_u2f(unsigned int v) {
  float r;
  asm("cvt.rn.f32.u32 %0, %1;" : "=f"(r) : "r"(v));
  return r;
}
__device__ __forceinline__ float sncl_codec_d2f(double d) {
  float r;
  asm("cvt.rn.f32.f64 %0, %1;" : "=f"(r) : "d"(d));
  return r;
}
// Generic addressing: the workspace is global memory either way.
__device__ __forceinline__ void sncl_codec_atomic_add(unsigned long long* p, unsigned long long v) {
  asm volatile("red.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void sncl_codec_atomic_or(unsigned int* p, unsigned int v) {
  asm volatile("red.or.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// *p += 1, returning the old value.
__device__ __forceinline__ unsigned long long sncl_codec_ticket(unsigned long long* p) {
  unsigned long long old;
  asm volatile("atom.add.u64 %0, [%1], 1;" : "=l"(old) : "l"(p) : "memory");
  return old;
}
// This thread's global writes before the fence are seen by every thread of
// the device before its writes after it (__threadfence).
__device__ __forceinline__ void sncl_codec_fence() { asm volatile("membar.gl;" ::: "memory"); }
#endif

__device__ __forceinline__ unsigned long long sncl_codec_first() {
  return (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ unsigned long long sncl_codec_stride() {
  return (unsigned long long)gridDim.x * blockDim.x;
}
__device__ __forceinline__ bool sncl_codec_single() {
  return blockIdx.x == 0 && threadIdx.x == 0;
}

// Little-endian u32 at any byte address (encoded buffers have no alignment).
__device__ __forceinline__ unsigned int sncl_codec_load_u32(const unsigned char* p) {
  if (((unsigned long long)p & 3) == 0) return *(const unsigned int*)p;
  return (unsigned int)p[0] | ((unsigned int)p[1] << 8) | ((unsigned int)p[2] << 16) |
         ((unsigned int)p[3] << 24);
}
__device__ __forceinline__ void sncl_codec_store_u32(unsigned char* p, unsigned int v) {
  if (((unsigned long long)p & 3) == 0) {
    *(unsigned int*)p = v;
    return;
  }
  p[0] = (unsigned char)v;
  p[1] = (unsigned char)(v >> 8);
  p[2] = (unsigned char)(v >> 16);
  p[3] = (unsigned char)(v >> 24);
}

// a - b with the CPU's (x86) NaN rule: a + (-b) is exactly a - b for every
// non-NaN pair; a NaN result is the first NaN operand (b as given), quieted.
__device__ __forceinline__ float sncl_codec_sub(float a, float b) {
  return sncl_f32_fix(__fadd_rn(a, -b), a, b);
}

#define SNCL_CODEC_KERNEL(name) extern "C" __global__ void sncl_codec_##name(SnclCodecArgs a)

// ---- fp16 / bf16 ----------------------------------------------------------

// Packs of 4 elements per thread (16-byte f32 loads and stores, 8-byte
// u16 ones) when every pointer allows it, else element by element; the
// arithmetic is the same either way.
union SnclF32x4 {
  uint4 u;
  float f[4];
};
union SnclU16x4 {
  unsigned long long u;
  unsigned short h[4];
};

#define SNCL_CAST_KERNELS(fmt, TO_F32, FROM_F32)                                          \
  SNCL_CODEC_KERNEL(encode_##fmt) {                                                      \
    const float* s = (const float*)a.src[0];                                           \
    unsigned short* d = (unsigned short*)a.dst;                                        \
    const bool packs = (((unsigned long long)s & 15) | ((unsigned long long)d & 7)) == 0; \
    const unsigned long long np = packs ? a.n / 4 : 0;                                 \
    for (unsigned long long p = sncl_codec_first(); p < np; p += sncl_codec_stride()) { \
      SnclF32x4 x;                                                                     \
      x.u = ((const uint4*)s)[p];                                                      \
      SnclU16x4 h;                                                                     \
      for (int e = 0; e < 4; ++e) h.h[e] = FROM_F32(x.f[e]);                           \
      ((unsigned long long*)d)[p] = h.u;                                               \
    }                                                                                  \
    for (unsigned long long i = 4 * np + sncl_codec_first(); i < a.n; i += sncl_codec_stride()) \
      d[i] = FROM_F32(s[i]);                                                           \
  }                                                                                    \
  SNCL_CODEC_KERNEL(decode_##fmt) {                                                      \
    float* d = (float*)a.dst;                                                          \
    const bool add = (a.flags & SNCL_CODEC_ADD) != 0;                                  \
    unsigned long long bits = (unsigned long long)d & 15;                              \
    for (int r = 0; r < a.nsrcs; ++r) bits |= (unsigned long long)a.src[r] & 7;        \
    const unsigned long long np = bits == 0 ? a.n / 4 : 0;                             \
    for (unsigned long long p = sncl_codec_first(); p < np; p += sncl_codec_stride()) { \
      SnclF32x4 acc;                                                                   \
      SnclU16x4 h;                                                                     \
      if (add) acc.u = ((const uint4*)d)[p];                                           \
      for (int r = 0; r < a.nsrcs; ++r) {                                              \
        h.u = ((const unsigned long long*)a.src[r])[p];                                \
        for (int e = 0; e < 4; ++e) {                                                  \
          const float v = TO_F32(h.h[e]);                                              \
          acc.f[e] = (r == 0 && !add) ? v : sncl_float_sum(acc.f[e], v);               \
        }                                                                              \
      }                                                                                \
      ((uint4*)d)[p] = acc.u;                                                          \
    }                                                                                  \
    for (unsigned long long i = 4 * np + sncl_codec_first(); i < a.n; i += sncl_codec_stride()) { \
      float acc = add ? d[i] : TO_F32(((const unsigned short*)a.src[0])[i]);           \
      for (int r = add ? 0 : 1; r < a.nsrcs; ++r)                                      \
        acc = sncl_float_sum(acc, TO_F32(((const unsigned short*)a.src[r])[i]));       \
      d[i] = acc;                                                                      \
    }                                                                                  \
  }                                                                                    \
  SNCL_CODEC_KERNEL(decsum_encode_##fmt) {                                               \
    unsigned short* d = (unsigned short*)a.dst;                                        \
    float* sum = (float*)a.aux;                                                        \
    for (unsigned long long i = sncl_codec_first(); i < a.n; i += sncl_codec_stride()) { \
      float acc = 0.0f;                                                                \
      for (int r = 0; r < a.nsrcs; ++r)                                                \
        acc = sncl_float_sum(acc, TO_F32(((const unsigned short*)a.src[r])[i]));       \
      if (sum != 0) sum[i] = acc;                                                      \
      d[i] = FROM_F32(acc);                                                            \
    }                                                                                  \
  }

SNCL_CAST_KERNELS(f16, sncl_h2f, sncl_f2h)
SNCL_CAST_KERNELS(bf16, sncl_b2f, sncl_f2b)

// ---- int8 blockwise -------------------------------------------------------

// lowbias32, as compress's hash32.
__device__ __forceinline__ unsigned int sncl_codec_hash32(unsigned int x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// Uniform in [0, 1) with 24 bits for element i under a block seed.
__device__ __forceinline__ float sncl_codec_uniform(unsigned int seed, unsigned int i) {
  unsigned int x = (i ^ seed) * 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  return __fmul_rn(sncl_codec_u2f(x >> 8), 1.0f / 16777216.0f);
}

__device__ __forceinline__ unsigned char sncl_codec_q(float y, bool stochastic, float u) {
  float r = stochastic ? sncl_codec_floor(__fadd_rn(y, u)) : sncl_codec_rint(y);
  r = r < -127.0f ? -127.0f : (r > 127.0f ? 127.0f : r);
  return (unsigned char)(signed char)(int)r;
}

// Blocks below this absmax (2^-100) are quantised in f64.
#define SNCL_INT8_TINY_BITS 0x0d800000u
#define SNCL_INT8_INF_BITS 0x7f800000u

// Elements of an int8 block per thread of its group (about).
#define SNCL_INT8_PER_THREAD 8u

// Threads per int8 block: a power of two, about one per
// SNCL_INT8_PER_THREAD elements, at most the launch's block.
__device__ __forceinline__ unsigned int sncl_int8_group(unsigned long long block) {
  unsigned int g = 1;
  while ((unsigned long long)g * 2 * SNCL_INT8_PER_THREAD <= block && g * 2 <= blockDim.x) g *= 2;
  return g;
}

// Block kernel, one DRAM pass: each group of g threads owns an int8 block
// (a CUDA block holds blockDim / g groups). Phase 1: every thread gathers
// absmax, xor and wrapping sum of the bits of its elements (i = lo + l, lo
// + l + g, ... : the group's loads are contiguous); a tree in shared
// memory combines the group's (max, xor and wrapping add are associative
// and commutative: any order gives compress's values). Phase 2: every
// thread quantises its elements again, read back while they are still in
// L1/L2, and thread 0 of the group writes the scale. The block's
// stochastic-rounding seed is compress::int8::block_seed.
SNCL_CODEC_KERNEL(int8_encode) {
  __shared__ unsigned int sh_amax[SNCL_CODEC_BLOCK_THREADS];
  __shared__ unsigned int sh_xor[SNCL_CODEC_BLOCK_THREADS];
  __shared__ unsigned int sh_sum[SNCL_CODEC_BLOCK_THREADS];
  const float* s = (const float*)a.src[0];
  unsigned char* d = (unsigned char*)a.dst;
  const unsigned long long block = a.param;
  // Refused by the callers (no division by zero, no shared overflow).
  if (block == 0 || blockDim.x > SNCL_CODEC_BLOCK_THREADS) return;
  const bool stochastic = (a.flags & SNCL_CODEC_STOCHASTIC) != 0;
  const unsigned int g = sncl_int8_group(block);
  const unsigned int used = blockDim.x / g * g;  // threads in whole groups
  const unsigned long long per_round = (unsigned long long)gridDim.x * (blockDim.x / g);
  const unsigned long long nblocks = (a.n + block - 1) / block;
  for (unsigned long long b0 = (unsigned long long)blockIdx.x * (blockDim.x / g); b0 < nblocks;
       b0 += per_round) {
    SNCL_EACH_THREAD {
      const unsigned int t = threadIdx.x;
      const unsigned long long b = b0 + t / g;
      unsigned int amax = 0, x = 0, sum = 0;
      if (t < used && b < nblocks) {
        const unsigned long long lo = b * block;
        const unsigned long long hi = lo + block < a.n ? lo + block : a.n;
        // Unrolled so that a thread's loads are in flight together.
        SNCL_UNROLL8
        for (unsigned long long i = lo + t % g; i < hi; i += g) {
          const unsigned int u = __float_as_uint(s[i]);
          const unsigned int m = u & 0x7fffffffu;
          amax = m > amax ? m : amax;
          x ^= u;
          sum += u;
        }
      }
      sh_amax[t] = amax;
      sh_xor[t] = x;
      sh_sum[t] = sum;
    }
    __syncthreads();
    for (unsigned int h = g / 2; h > 0; h /= 2) {
      SNCL_EACH_THREAD {
        const unsigned int t = threadIdx.x;
        if (t < used && t % g < h) {
          sh_amax[t] = sh_amax[t + h] > sh_amax[t] ? sh_amax[t + h] : sh_amax[t];
          sh_xor[t] ^= sh_xor[t + h];
          sh_sum[t] += sh_sum[t + h];
        }
      }
      __syncthreads();
    }
    SNCL_EACH_THREAD {
      const unsigned int t = threadIdx.x;
      const unsigned int l = t % g;
      const unsigned long long b = b0 + t / g;
      if (t < used && b < nblocks) {
        const unsigned long long lo = b * block;
        const unsigned long long hi = lo + block < a.n ? lo + block : a.n;
        unsigned char* out = d + b * (block + 4);
        const unsigned int amax = sh_amax[t - l];
        const unsigned int seed =
            sncl_codec_hash32((sncl_codec_hash32(a.seed ^ sh_xor[t - l]) + sh_sum[t - l]) ^
                              0x632be5abu);
        float scale;
        if (amax == 0) {
          scale = 0.0f;
          for (unsigned long long i = lo + l; i < hi; i += g) out[4 + (i - lo)] = 0;
        } else if (amax >= SNCL_INT8_INF_BITS) {
          scale = __uint_as_float(0x7fc00000u);
          for (unsigned long long i = lo + l; i < hi; i += g) out[4 + (i - lo)] = 0;
        } else {
          const float am = __uint_as_float(amax);
          scale = __fdiv_rn(am, 127.0f);
          const bool tiny = amax < SNCL_INT8_TINY_BITS;  // quantised in f64
          const float inv = tiny ? 0.0f : __fdiv_rn(127.0f, am);
          const double dinv = tiny ? __ddiv_rn(127.0, (double)am) : 0.0;
          for (unsigned long long i = lo + l; i < hi; i += g) {
            const float x = s[i];
            const float y = tiny ? sncl_codec_d2f(__dmul_rn((double)x, dinv)) : __fmul_rn(x, inv);
            const float u = stochastic ? sncl_codec_uniform(seed, (unsigned int)i) : 0.0f;
            out[4 + (i - lo)] = sncl_codec_q(y, stochastic, u);
          }
        }
        if (l == 0) sncl_codec_store_u32(out, __float_as_uint(scale));
      }
    }
    __syncthreads();  // the next round's first phase overwrites the shared words
  }
}

// One decoded int8 element: q times its block's scale.
__device__ __forceinline__ float sncl_int8_value(signed char q, float scale) {
  return sncl_float_prod((float)q, scale);
}

// dst[i] (= or +=) the sum of the nsrcs decoded inputs, left to right.
// Packs of 4 elements per thread (a u32 of i8s per input, 16-byte f32 loads
// and stores) when the block size is a multiple of 4 and every pointer
// allows it (a pack then lies in one block), else element by element; the
// arithmetic is the same either way. Without SNCL_CODEC_ADD dst is only
// written.
SNCL_CODEC_KERNEL(int8_decode) {
  float* d = (float*)a.dst;
  const unsigned long long block = a.param;
  if (block == 0) return;  // refused by the callers; no division by zero
  const bool add = (a.flags & SNCL_CODEC_ADD) != 0;
  unsigned long long bits = ((unsigned long long)d & 15) | (block & 3);
  for (int r = 0; r < a.nsrcs; ++r) bits |= (unsigned long long)a.src[r] & 3;
  const unsigned long long np = bits == 0 ? a.n / 4 : 0;
  for (unsigned long long p = sncl_codec_first(); p < np; p += sncl_codec_stride()) {
    const unsigned long long b = 4 * p / block;
    const unsigned long long off = b * (block + 4);
    const unsigned long long j = 4 * p - b * block;
    SnclF32x4 acc;
    if (add) acc.u = ((const uint4*)d)[p];
    for (int r = 0; r < a.nsrcs; ++r) {
      const unsigned char* e = (const unsigned char*)a.src[r] + off;
      const float scale = __uint_as_float(*(const unsigned int*)e);
      const unsigned int q4 = *(const unsigned int*)(e + 4 + j);
      for (int k = 0; k < 4; ++k) {
        const float v = sncl_int8_value((signed char)(unsigned char)(q4 >> (8 * k)), scale);
        acc.f[k] = (r == 0 && !add) ? v : sncl_float_sum(acc.f[k], v);
      }
    }
    ((uint4*)d)[p] = acc.u;
  }
  for (unsigned long long i = 4 * np + sncl_codec_first(); i < a.n; i += sncl_codec_stride()) {
    const unsigned long long b = i / block;
    const unsigned long long off = b * (block + 4);
    const unsigned long long j = i - b * block;
    float acc = add ? d[i] : 0.0f;
    for (int r = 0; r < a.nsrcs; ++r) {
      const unsigned char* e = (const unsigned char*)a.src[r] + off;
      const float scale = __uint_as_float(sncl_codec_load_u32(e));
      const float v = sncl_int8_value((signed char)e[4 + j], scale);
      acc = (r == 0 && !add) ? v : sncl_float_sum(acc, v);
    }
    d[i] = acc;
  }
}

// ---- MX: OCP Microscaling v1.0 (compress/src/mx.rs, bit for bit) ------------
// Blocks of 32 elements: a scale byte (E8M0), then the elements (MXFP8: a
// byte each; MXFP4: two per byte, the lower-indexed in the low nibble; the
// last block may be shorter). a.param is the element format: 0 E4M3, 1
// E5M2, 2 E2M1. A block holding a NaN or an infinity gets the NaN scale
// (0xFF) and zero elements; a block of zeros the scale 0x00.
#define SNCL_MX_BLOCK 32

__device__ __forceinline__ unsigned long long sncl_mx_block_bytes(unsigned int fmt,
                                                                  unsigned long long len) {
  return 1 + (fmt == 2 ? (len + 1) / 2 : len);
}

// The element code of q (finite, already divided by the scale): round to
// nearest even, clamp to the largest normal, sign kept (compress's
// Quantizer: the same integer steps and the same two f32 operations, both
// rounded as on the CPU, never fused).
__device__ __forceinline__ unsigned int sncl_mx_quantize(unsigned int fmt, float q) {
  const unsigned int min_normal = fmt == 0 ? 0x3C800000u : fmt == 1 ? 0x38800000u : 0x3F800000u;
  const unsigned int m = fmt == 0 ? 3 : fmt == 1 ? 2 : 1;
  const unsigned int bias = fmt == 0 ? 7 : fmt == 1 ? 15 : 1;
  const unsigned int max_code = fmt == 0 ? 0x7Eu : fmt == 1 ? 0x7Bu : 0x7u;
  const unsigned int sign_bit = fmt == 2 ? 3 : 7;
  const float sub_units = fmt == 0 ? 512.0f : fmt == 1 ? 65536.0f : 2.0f;
  const unsigned int b = __float_as_uint(q);
  const unsigned int a = b & 0x7fffffffu;
  const unsigned int sign = (b >> 31) << sign_bit;
  const unsigned int cut = 23 - m;
  const unsigned int r = (a + ((1u << (cut - 1)) - 1) + ((a >> cut) & 1)) >> cut;
  unsigned int normal = r - ((127 - bias) << m);  // wraps as the CPU's does
  normal = normal < max_code ? normal : max_code;
  const float units = __fmul_rn(__uint_as_float(a), sub_units);
  const unsigned int sub = __float_as_uint(__fadd_rn(units, 8388608.0f)) - 0x4B000000u;
  return sign | (a >= min_normal ? normal : sub);
}

// The scale byte of elements lo..hi of s.
__device__ __forceinline__ unsigned int sncl_mx_scale(unsigned int fmt, const float* s,
                                                      unsigned long long lo,
                                                      unsigned long long hi) {
  unsigned int amax = 0;
  for (unsigned long long i = lo; i < hi; ++i) {
    const unsigned int m = __float_as_uint(s[i]) & 0x7fffffffu;
    amax = m > amax ? m : amax;
  }
  if (amax >= 0x7f800000u) return 0xFF;
  if (amax == 0) return 0;
  const int exp = (int)(amax >> 23);
  // A subnormal m * 2^-149: floor(log2 m) from m's exact conversion.
  const int floor_log2 =
      exp > 0 ? exp - 127 : (int)(__float_as_uint((float)amax) >> 23) - 127 - 149;
  int shared = floor_log2 - (fmt == 0 ? 8 : fmt == 1 ? 15 : 2);
  shared = shared < -127 ? -127 : shared > 127 ? 127 : shared;
  return (unsigned int)(shared + 127);
}

// E2M1 code c's value: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
__device__ __forceinline__ float sncl_e2m1_to_f32(unsigned int c) {
  const unsigned int e = (c >> 1) & 3, mant = c & 1;
  const float v = e == 0 ? 0.5f * (float)mant : (1.0f + 0.5f * (float)mant) * (float)(1u << (e - 1));
  return (c & 8) ? -v : v;
}

// One thread per MX block.
SNCL_CODEC_KERNEL(mx_encode) {
  const float* s = (const float*)a.src[0];
  unsigned char* d = (unsigned char*)a.dst;
  const unsigned int fmt = (unsigned int)a.param;
  if (fmt > 2) return;  // refused by the callers
  const unsigned long long nblocks = (a.n + SNCL_MX_BLOCK - 1) / SNCL_MX_BLOCK;
  const unsigned long long full = sncl_mx_block_bytes(fmt, SNCL_MX_BLOCK);
  for (unsigned long long b = sncl_codec_first(); b < nblocks; b += sncl_codec_stride()) {
    const unsigned long long lo = b * SNCL_MX_BLOCK;
    const unsigned long long hi = lo + SNCL_MX_BLOCK < a.n ? lo + SNCL_MX_BLOCK : a.n;
    unsigned char* o = d + b * full;
    const unsigned int scale = sncl_mx_scale(fmt, s, lo, hi);
    o[0] = (unsigned char)scale;
    const unsigned long long bytes = sncl_mx_block_bytes(fmt, hi - lo) - 1;
    if (scale == 0xFF) {
      for (unsigned long long k = 0; k < bytes; ++k) o[1 + k] = 0;
      continue;
    }
    // Dividing by the power of two is multiplying by its exact reciprocal.
    const float inv = __uint_as_float((254u - scale) << 23);
    for (unsigned long long k = 0; k < bytes; ++k) {
      if (fmt == 2) {
        const unsigned long long i = lo + 2 * k;
        const unsigned int c0 = sncl_mx_quantize(2, __fmul_rn(s[i], inv));
        const unsigned int c1 = i + 1 < hi ? sncl_mx_quantize(2, __fmul_rn(s[i + 1], inv)) : 0;
        o[1 + k] = (unsigned char)(c0 | (c1 << 4));
      } else {
        o[1 + k] = (unsigned char)sncl_mx_quantize(fmt, __fmul_rn(s[lo + k], inv));
      }
    }
  }
}

// One thread per element; nsrcs encodings summed in order into dst (added
// to it with SNCL_CODEC_ADD), as compress's decode then decode_add.
SNCL_CODEC_KERNEL(mx_decode) {
  float* d = (float*)a.dst;
  const unsigned int fmt = (unsigned int)a.param;
  if (fmt > 2) return;  // refused by the callers
  const bool add = (a.flags & SNCL_CODEC_ADD) != 0;
  const unsigned long long full = sncl_mx_block_bytes(fmt, SNCL_MX_BLOCK);
  for (unsigned long long i = sncl_codec_first(); i < a.n; i += sncl_codec_stride()) {
    const unsigned long long b = i / SNCL_MX_BLOCK, j = i % SNCL_MX_BLOCK;
    float acc = add ? d[i] : 0.0f;
    for (int r = 0; r < a.nsrcs; ++r) {
      const unsigned char* e = (const unsigned char*)a.src[r] + b * full;
      const unsigned int scale = e[0];
      float v;
      if (scale == 0xFF) {
        v = __uint_as_float(0x7fc00000u);
      } else {
        const float x = scale == 0 ? __uint_as_float(1u << 22) : __uint_as_float(scale << 23);
        const float p = fmt == 2   ? sncl_e2m1_to_f32((e[1 + j / 2] >> (4 * (j % 2))) & 0xF)
                        : fmt == 0 ? sncl_e4m3_to_f32(e[1 + j])
                                   : sncl_e5m2_to_f32(e[1 + j]);
        v = __fmul_rn(p, x);
      }
      acc = (r == 0 && !add) ? v : sncl_float_sum(acc, v);
    }
    d[i] = acc;
  }
}

// ---- top-k (sncl_codec_topk.cuh) -----------------------------------------

#include "sncl_codec_topk.cuh"

// ---- error feedback ----------------------------------------------------------

// dst (the gradient) += aux (the residual).
SNCL_CODEC_KERNEL(ef_compensate) {
  float* g = (float*)a.dst;
  const float* r = (const float*)a.aux;
  for (unsigned long long i = sncl_codec_first(); i < a.n; i += sncl_codec_stride())
    g[i] = sncl_float_sum(g[i], r[i]);
}

// dst (the residual, holding the decoded encoding) = aux (the compensated
// gradient) - dst.
SNCL_CODEC_KERNEL(ef_residual) {
  float* r = (float*)a.dst;
  const float* g = (const float*)a.aux;
  for (unsigned long long i = sncl_codec_first(); i < a.n; i += sncl_codec_stride())
    r[i] = sncl_codec_sub(g[i], r[i]);
}

// Every kernel, for the host launcher's table (X takes the short name).
#define SNCL_FOR_EACH_CODEC_KERNEL(X)                                                    \
  X(encode_f16) X(decode_f16) X(decsum_encode_f16) X(encode_bf16) X(decode_bf16)         \
  X(decsum_encode_bf16) X(int8_decode) X(topk_init) X(topk_sample) X(topk_write)         \
  X(topk_check_init) X(topk_check) X(topk_clear) X(topk_scatter) X(ef_compensate)        \
  X(ef_residual) X(mx_encode) X(mx_decode)
// The block kernels (launched with sncl_host_launch_blocks on the host).
#define SNCL_FOR_EACH_CODEC_BLOCK_KERNEL(X) X(int8_encode) X(topk_hist) X(topk_count)
