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
// Host-shim rule (sncl_host_emu.h runs every thread of a launch one after
// the other): no shared memory, no barriers, no warp operations. Each
// thread's work is independent inside one kernel; whatever needs a
// cross-thread step (an int8 block's absmax, a top-k threshold, compaction
// offsets) is split into a documented sequence of kernels on one stream.
// "Single" kernels do their work on thread 0 of block 0 only. Global
// atomics are plain read-modify-writes on the host (launches of one stream
// never overlap).
//
// Sequences (all on the stream, no host round trip):
//   encode fp16/bf16:  encode_<f>
//   decode fp16/bf16:  decode_<f>             (nsrcs inputs; add or overwrite)
//   fused reduce:      decsum_encode_<f>      (sum of nsrcs decoded inputs in f32 from +0,
//                                              re-encoded; optional f32 sum in aux)
//   encode int8:       int8_stats, int8_quantize
//   decode int8:       int8_decode            (nsrcs inputs; add or overwrite)
//   encode top-k:      topk_init, 4 x (topk_hist, topk_pick) with pass 0..3 (radix
//                      select of the k-th largest |x|, 8 bits a pass), topk_count,
//                      topk_scan, topk_scan_groups, topk_write (compaction)
//   decode top-k:      topk_check_init, topk_check, topk_clear, topk_scatter
//                      (validated: on bad input the status word work[0] is non-zero
//                      and the output is untouched)
//   error feedback:    ef_compensate (grad += residual) before encoding; decode of the
//                      encoding into the residual, then ef_residual (r = grad - r)
#include "sncl_device.cuh"

#define SNCL_CODEC_MAX_SRCS 8
struct SnclCodecArgs {
  const void* src[SNCL_CODEC_MAX_SRCS];  // inputs: f32 (encode) or encoded bytes (decode)
  void* dst;                             // output: encoded bytes (encode) or f32 (decode)
  void* aux;                             // f32 side buffer (residual, grad, sum) or null
  void* work;                            // device workspace (kernels/src/cuda_codec.rs sizes it)
  unsigned long long n;                  // elements
  unsigned long long param;              // int8: block size; top-k: k
  unsigned long long enc_len;            // top-k decode: encoded bytes given
  unsigned int seed;                     // int8-sr: the 32-bit kernel seed
  unsigned int pass;                     // top-k radix pass 0..3
  int nsrcs;                             // 1..8
  int flags;                             // SNCL_CODEC_ADD, SNCL_CODEC_STOCHASTIC
};                                       // 8*8 + 3*8 + 3*8 + 4*4 = 128 bytes

// flags: decode adds to dst instead of overwriting it; int8 rounds
// stochastically.
#define SNCL_CODEC_ADD 1
#define SNCL_CODEC_STOCHASTIC 2

// Elements per top-k compaction chunk and chunks per scan group.
#define SNCL_TOPK_CHUNK 256ull
#define SNCL_TOPK_GROUP 256ull

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
__device__ __forceinline__ void sncl_codec_atomic_add(unsigned long long* p, unsigned long long v) {
  asm volatile("red.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void sncl_codec_atomic_or(unsigned int* p, unsigned int v) {
  asm volatile("red.global.or.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
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

#define SNCL_CAST_KERNELS(f, TO_F32, FROM_F32)                                          \
  SNCL_CODEC_KERNEL(encode_##f) {                                                      \
    const float* s = (const float*)a.src[0];                                           \
    unsigned short* d = (unsigned short*)a.dst;                                        \
    for (unsigned long long i = sncl_codec_first(); i < a.n; i += sncl_codec_stride()) \
      d[i] = FROM_F32(s[i]);                                                           \
  }                                                                                    \
  SNCL_CODEC_KERNEL(decode_##f) {                                                      \
    float* d = (float*)a.dst;                                                          \
    for (unsigned long long i = sncl_codec_first(); i < a.n; i += sncl_codec_stride()) { \
      float acc = (a.flags & SNCL_CODEC_ADD) ? d[i] : TO_F32(((const unsigned short*)a.src[0])[i]);         \
      for (int r = (a.flags & SNCL_CODEC_ADD) ? 0 : 1; r < a.nsrcs; ++r)                                    \
        acc = sncl_float_sum(acc, TO_F32(((const unsigned short*)a.src[r])[i]));       \
      d[i] = acc;                                                                      \
    }                                                                                  \
  }                                                                                    \
  SNCL_CODEC_KERNEL(decsum_encode_##f) {                                               \
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

// One thread per int8 block: work[2b] = absmax bits, work[2b + 1] = the
// block's stochastic-rounding seed (compress::int8::block_seed).
SNCL_CODEC_KERNEL(int8_stats) {
  const float* s = (const float*)a.src[0];
  unsigned int* w = (unsigned int*)a.work;
  const unsigned long long block = a.param;
  const unsigned long long nblocks = (a.n + block - 1) / block;
  for (unsigned long long b = sncl_codec_first(); b < nblocks; b += sncl_codec_stride()) {
    const unsigned long long lo = b * block;
    const unsigned long long hi = lo + block < a.n ? lo + block : a.n;
    unsigned int amax = 0, x = 0, sum = 0;
    for (unsigned long long i = lo; i < hi; ++i) {
      const unsigned int u = __float_as_uint(s[i]);
      const unsigned int m = u & 0x7fffffffu;
      amax = m > amax ? m : amax;
      x ^= u;
      sum += u;
    }
    w[2 * b] = amax;
    w[2 * b + 1] = sncl_codec_hash32((sncl_codec_hash32(a.seed ^ x) + sum) ^ 0x632be5abu);
  }
}

// One thread per element: the i8 (and, for a block's first element, the
// scale) from the block's stats.
SNCL_CODEC_KERNEL(int8_quantize) {
  const float* s = (const float*)a.src[0];
  unsigned char* d = (unsigned char*)a.dst;
  const unsigned int* w = (const unsigned int*)a.work;
  const unsigned long long block = a.param;
  const bool stochastic = (a.flags & SNCL_CODEC_STOCHASTIC) != 0;
  for (unsigned long long i = sncl_codec_first(); i < a.n; i += sncl_codec_stride()) {
    const unsigned long long b = i / block;
    const unsigned long long j = i - b * block;
    unsigned char* out = d + b * (block + 4);
    const unsigned int amax = w[2 * b];
    const float u = stochastic ? sncl_codec_uniform(w[2 * b + 1], (unsigned int)i) : 0.0f;
    const float x = s[i];
    float scale;
    unsigned char q;
    if (amax == 0) {
      scale = 0.0f;
      q = 0;
    } else if (amax >= SNCL_INT8_INF_BITS) {
      scale = __uint_as_float(0x7fc00000u);
      q = 0;
    } else {
      const float am = __uint_as_float(amax);
      scale = __fdiv_rn(am, 127.0f);
      float y;
      if (amax < SNCL_INT8_TINY_BITS) {
        y = sncl_codec_d2f(__dmul_rn((double)x, __ddiv_rn(127.0, (double)am)));
      } else {
        y = __fmul_rn(x, __fdiv_rn(127.0f, am));
      }
      q = sncl_codec_q(y, stochastic, u);
    }
    out[4 + j] = q;
    if (j == 0) sncl_codec_store_u32(out, __float_as_uint(scale));
  }
}

// dst[i] (= or +=) the sum of the nsrcs decoded inputs, left to right.
SNCL_CODEC_KERNEL(int8_decode) {
  float* d = (float*)a.dst;
  const unsigned long long block = a.param;
  for (unsigned long long i = sncl_codec_first(); i < a.n; i += sncl_codec_stride()) {
    const unsigned long long b = i / block;
    const unsigned long long off = b * (block + 4);
    const unsigned long long j = i - b * block;
    float acc = d[i];
    for (int r = 0; r < a.nsrcs; ++r) {
      const unsigned char* e = (const unsigned char*)a.src[r] + off;
      const float scale = __uint_as_float(sncl_codec_load_u32(e));
      const float v = sncl_float_prod((float)(signed char)e[4 + j], scale);
      acc = (r == 0 && !(a.flags & SNCL_CODEC_ADD)) ? v : sncl_float_sum(acc, v);
    }
    d[i] = acc;
  }
}

// ---- top-k (exact): radix select, then compaction --------------------------
//
// Workspace (u64 words first): [0] prefix, [1] mask, [2] ties still to take,
// [3] k, [4] status; [8..8+256) the histogram; then u32 gt[nchunks],
// eq[nchunks], group_gt[ngroups], group_eq[ngroups].

__device__ __forceinline__ unsigned int sncl_codec_key(float x) {
  return __float_as_uint(x) & 0x7fffffffu;
}

struct SnclTopkWork {
  unsigned long long* state;
  unsigned long long* hist;
  unsigned int* gt;
  unsigned int* eq;
  unsigned int* ggt;
  unsigned int* geq;
  unsigned long long nchunks;
  unsigned long long ngroups;
};

__device__ __forceinline__ SnclTopkWork sncl_topk_work(const SnclCodecArgs& a) {
  SnclTopkWork w;
  w.state = (unsigned long long*)a.work;
  w.hist = w.state + 8;
  w.nchunks = (a.n + SNCL_TOPK_CHUNK - 1) / SNCL_TOPK_CHUNK;
  w.ngroups = (w.nchunks + SNCL_TOPK_GROUP - 1) / SNCL_TOPK_GROUP;
  w.gt = (unsigned int*)(w.hist + 256);
  w.eq = w.gt + w.nchunks;
  w.ggt = w.eq + w.nchunks;
  w.geq = w.ggt + w.ngroups;
  return w;
}

SNCL_CODEC_KERNEL(topk_init) {
  if (!sncl_codec_single()) return;
  SnclTopkWork w = sncl_topk_work(a);
  w.state[0] = 0;
  w.state[1] = 0;
  w.state[2] = a.param;
  w.state[3] = a.param;
  w.state[4] = 0;
  for (int b = 0; b < 256; ++b) w.hist[b] = 0;
  sncl_codec_store_u32((unsigned char*)a.dst, (unsigned int)a.param);
}

// Histogram of digit `pass` (bits 24-8*pass .. +8) of the keys that match
// the prefix found so far.
SNCL_CODEC_KERNEL(topk_hist) {
  const float* s = (const float*)a.src[0];
  SnclTopkWork w = sncl_topk_work(a);
  const unsigned int prefix = (unsigned int)w.state[0];
  const unsigned int mask = (unsigned int)w.state[1];
  const unsigned int shift = 24 - 8 * a.pass;
  for (unsigned long long i = sncl_codec_first(); i < a.n; i += sncl_codec_stride()) {
    const unsigned int key = sncl_codec_key(s[i]);
    if ((key & mask) == prefix) sncl_codec_atomic_add(&w.hist[(key >> shift) & 255u], 1);
  }
}

// The digit of the k-th largest key among the matching ones; clears the
// histogram for the next pass.
SNCL_CODEC_KERNEL(topk_pick) {
  if (!sncl_codec_single()) return;
  SnclTopkWork w = sncl_topk_work(a);
  const unsigned int shift = 24 - 8 * a.pass;
  unsigned long long want = w.state[2];
  unsigned long long above = 0;
  for (int b = 255; b >= 0; --b) {
    const unsigned long long c = w.hist[b];
    if (want > 0 && above + c >= want) {
      w.state[0] |= (unsigned long long)b << shift;
      w.state[2] = want - above;
      want = 0;
    } else if (want > 0) {
      above += c;
    }
    w.hist[b] = 0;
  }
  w.state[1] |= 255ull << shift;
}

// One thread per chunk: how many keys are above the threshold and equal to it.
SNCL_CODEC_KERNEL(topk_count) {
  const float* s = (const float*)a.src[0];
  SnclTopkWork w = sncl_topk_work(a);
  const unsigned int t = (unsigned int)w.state[0];
  for (unsigned long long c = sncl_codec_first(); c < w.nchunks; c += sncl_codec_stride()) {
    const unsigned long long lo = c * SNCL_TOPK_CHUNK;
    const unsigned long long hi = lo + SNCL_TOPK_CHUNK < a.n ? lo + SNCL_TOPK_CHUNK : a.n;
    unsigned int gt = 0, eq = 0;
    for (unsigned long long i = lo; i < hi; ++i) {
      const unsigned int key = sncl_codec_key(s[i]);
      gt += key > t;
      eq += key == t;
    }
    w.gt[c] = gt;
    w.eq[c] = eq;
  }
}

// One thread per group of chunks: exclusive scan of the group's counts in
// place, the group's totals to ggt/geq.
SNCL_CODEC_KERNEL(topk_scan) {
  SnclTopkWork w = sncl_topk_work(a);
  for (unsigned long long g = sncl_codec_first(); g < w.ngroups; g += sncl_codec_stride()) {
    const unsigned long long lo = g * SNCL_TOPK_GROUP;
    const unsigned long long hi =
        lo + SNCL_TOPK_GROUP < w.nchunks ? lo + SNCL_TOPK_GROUP : w.nchunks;
    unsigned int gt = 0, eq = 0;
    for (unsigned long long c = lo; c < hi; ++c) {
      const unsigned int cg = w.gt[c], ce = w.eq[c];
      w.gt[c] = gt;
      w.eq[c] = eq;
      gt += cg;
      eq += ce;
    }
    w.ggt[g] = gt;
    w.geq[g] = eq;
  }
}

// Exclusive scan of the group totals (one thread; n / 65536 groups).
SNCL_CODEC_KERNEL(topk_scan_groups) {
  if (!sncl_codec_single()) return;
  SnclTopkWork w = sncl_topk_work(a);
  unsigned int gt = 0, eq = 0;
  for (unsigned long long g = 0; g < w.ngroups; ++g) {
    const unsigned int cg = w.ggt[g], ce = w.geq[g];
    w.ggt[g] = gt;
    w.geq[g] = eq;
    gt += cg;
    eq += ce;
  }
}

// One thread per chunk: writes its kept indices and values. Kept: key > t,
// and the first `ties` keys equal to t in index order.
SNCL_CODEC_KERNEL(topk_write) {
  const float* s = (const float*)a.src[0];
  unsigned char* d = (unsigned char*)a.dst;
  SnclTopkWork w = sncl_topk_work(a);
  const unsigned int t = (unsigned int)w.state[0];
  const unsigned long long ties = w.state[2];
  const unsigned long long k = a.param;
  for (unsigned long long c = sncl_codec_first(); c < w.nchunks; c += sncl_codec_stride()) {
    const unsigned long long g = c / SNCL_TOPK_GROUP;
    unsigned long long gt = (unsigned long long)w.ggt[g] + w.gt[c];
    unsigned long long eq = (unsigned long long)w.geq[g] + w.eq[c];
    const unsigned long long lo = c * SNCL_TOPK_CHUNK;
    const unsigned long long hi = lo + SNCL_TOPK_CHUNK < a.n ? lo + SNCL_TOPK_CHUNK : a.n;
    for (unsigned long long i = lo; i < hi; ++i) {
      const float x = s[i];
      const unsigned int key = sncl_codec_key(x);
      unsigned long long pos;
      if (key > t) {
        pos = gt + (eq < ties ? eq : ties);
        ++gt;
      } else if (key == t && eq < ties) {
        pos = gt + eq;
        ++eq;
      } else {
        eq += key == t;
        continue;
      }
      sncl_codec_store_u32(d + 4 + 4 * pos, (unsigned int)i);
      sncl_codec_store_u32(d + 4 + 4 * k + 4 * pos, __float_as_uint(x));
    }
  }
}

// ---- top-k decode (validated) ----------------------------------------------
//
// Workspace: [0] status (u32: 0 ok, 1 short, 2 k > n, 3 length, 4 index out
// of range, 8 not ascending; bits or together), [1] k.

SNCL_CODEC_KERNEL(topk_check_init) {
  if (!sncl_codec_single()) return;
  unsigned int* w = (unsigned int*)a.work;
  const unsigned char* e = (const unsigned char*)a.src[0];
  w[0] = 0;
  w[1] = 0;
  if (a.enc_len < 4) {
    w[0] = 1;
    return;
  }
  const unsigned long long k = sncl_codec_load_u32(e);
  if (k > a.n) {
    w[0] = 2;
  } else if (a.enc_len != 4 + 8 * k) {
    w[0] = 3;
  } else {
    w[1] = (unsigned int)k;
  }
}

SNCL_CODEC_KERNEL(topk_check) {
  unsigned int* w = (unsigned int*)a.work;
  const unsigned char* e = (const unsigned char*)a.src[0] + 4;
  const unsigned long long k = w[1];
  for (unsigned long long i = sncl_codec_first(); i < k; i += sncl_codec_stride()) {
    const unsigned int idx = sncl_codec_load_u32(e + 4 * i);
    if (idx >= a.n) sncl_codec_atomic_or(&w[0], 4);
    if (i > 0 && idx <= sncl_codec_load_u32(e + 4 * (i - 1))) sncl_codec_atomic_or(&w[0], 8);
  }
}

SNCL_CODEC_KERNEL(topk_clear) {
  const unsigned int* w = (const unsigned int*)a.work;
  if ((a.flags & SNCL_CODEC_ADD) || w[0] != 0) return;
  float* d = (float*)a.dst;
  for (unsigned long long i = sncl_codec_first(); i < a.n; i += sncl_codec_stride()) d[i] = 0.0f;
}

SNCL_CODEC_KERNEL(topk_scatter) {
  const unsigned int* w = (const unsigned int*)a.work;
  if (w[0] != 0) return;
  const unsigned long long k = w[1];
  const unsigned char* e = (const unsigned char*)a.src[0] + 4;
  float* d = (float*)a.dst;
  for (unsigned long long i = sncl_codec_first(); i < k; i += sncl_codec_stride()) {
    const unsigned int idx = sncl_codec_load_u32(e + 4 * i);
    const float v = __uint_as_float(sncl_codec_load_u32(e + 4 * k + 4 * i));
    d[idx] = (a.flags & SNCL_CODEC_ADD) ? sncl_float_sum(d[idx], v) : v;
  }
}

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
#define SNCL_FOR_EACH_CODEC_KERNEL(X)                                                       \
  X(encode_f16) X(decode_f16) X(decsum_encode_f16) X(encode_bf16) X(decode_bf16)            \
  X(decsum_encode_bf16) X(int8_stats) X(int8_quantize) X(int8_decode) X(topk_init)          \
  X(topk_hist) X(topk_pick) X(topk_count) X(topk_scan) X(topk_scan_groups) X(topk_write)    \
  X(topk_check_init) X(topk_check) X(topk_clear) X(topk_scatter) X(ef_compensate)           \
  X(ef_residual)
