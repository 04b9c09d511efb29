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
//   encode top-k:      topk_init, topk_zero, then for each radix select 4 x (topk_hist,
//                      topk_hist_sum, topk_pick) and the counting passes topk_count,
//                      topk_scan, topk_scan_groups, finally topk_write (compaction); sampled
//                      top-k adds topk_sample and the topk_ctl_* decisions (see below)
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

// One thread per int8 block: work[2b] = absmax bits, work[2b + 1] = the
// block's stochastic-rounding seed (compress::int8::block_seed).
SNCL_CODEC_KERNEL(int8_stats) {
  const float* s = (const float*)a.src[0];
  unsigned int* w = (unsigned int*)a.work;
  const unsigned long long block = a.param;
  if (block == 0) return;  // refused by the callers; no division by zero
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
  if (block == 0) return;  // refused by the callers; no division by zero
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
  if (block == 0) return;  // refused by the callers; no division by zero
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

// ---- top-k: radix select, sampled threshold, compaction ---------------------
//
// One state machine in the workspace drives both selections; every top-k
// kernel runs only in the modes of its launch's `when` mask (0: always), so
// a plan is a fixed launch sequence and every decision stays on the device.
//
// * exact (mode EXACT): radix select of the k-th largest key t (4 passes of
//   8 bits over the keys |x| bits), then count per chunk the keys above t
//   and equal to it, scan, and write: keys > t, and the first `ties` keys
//   equal to t in index order (compress's tie rule: lowest indices).
// * sampled (compress::topk::select_sampled, decision for decision): gather
//   the stratified sample (topk_sample), select its j-th largest key t
//   (mode SAMPLE), count keys >= t per chunk and in all (c). Then
//   (topk_ctl_count) lo <= c <= hi: keep every key >= t (mode FINAL);
//   hi < c <= cap: exact; c > cap: find p (after the (cap+1)-th key >= t)
//   and select t2 = the r-th largest among those cap+1 (mode A); c < lo:
//   t2 = a lower sample rank's key (mode B). t2 not beyond t: exact; else
//   count keys >= t2 (mode RECOUNT) and keep them if lo <= c2 <= hi, else
//   exact. lo = ceil(k/2), hi = 2k, cap = 4k. The result is the same
//   indices compress selects.
//
// Histograms are privatised: block b adds into copy b % SNCL_TOPK_HCOPIES
// (global atomics on a few hot bins would otherwise serialise), then
// topk_hist_sum adds the copies into copy 0 and clears the others.
//
// Workspace (u64 words): [0..16) state (see SNCL_TS_*), then
// SNCL_TOPK_HCOPIES x 256 histogram bins; then u32 gt[nchunks], eq[nchunks], group_gt[ngroups],
// group_eq[ngroups], sample[16 * runs].

#define SNCL_TS_PREFIX 0  // radix select: key bits found so far
#define SNCL_TS_MASK 1    // which bits of the prefix are known
#define SNCL_TS_WANT 2    // rank still wanted below the prefix (after: ties)
#define SNCL_TS_MODE 5    // SNCL_TM_*
#define SNCL_TS_THR 6     // compaction threshold
#define SNCL_TS_TIES 7    // exact: keys equal to THR to keep
#define SNCL_TS_T 8       // sampled: the first threshold t
#define SNCL_TS_P 9       // mode A: the prefix end p
#define SNCL_TS_TOTAL 10  // the last count's total

#define SNCL_TM_EXACT 1u
#define SNCL_TM_FINAL 2u
#define SNCL_TM_A 4u
#define SNCL_TM_B 8u
#define SNCL_TM_RECOUNT 16u
#define SNCL_TM_SAMPLE 32u

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
  unsigned int* sample;
  unsigned long long nchunks;
  unsigned long long ngroups;
};

__device__ __forceinline__ SnclTopkWork sncl_topk_work(const SnclCodecArgs& a) {
  SnclTopkWork w;
  w.state = (unsigned long long*)a.work;
  w.hist = w.state + 16;  // SNCL_TOPK_HCOPIES histograms of 256 bins
  w.nchunks = (a.n + SNCL_TOPK_CHUNK - 1) / SNCL_TOPK_CHUNK;
  w.ngroups = (w.nchunks + SNCL_TOPK_GROUP - 1) / SNCL_TOPK_GROUP;
  w.gt = (unsigned int*)(w.hist + 256 * SNCL_TOPK_HCOPIES);
  w.eq = w.gt + w.nchunks;
  w.ggt = w.eq + w.nchunks;
  w.geq = w.ggt + w.ngroups;
  w.sample = w.geq + w.ngroups;
  return w;
}

// Whether this launch runs in the current mode.
__device__ __forceinline__ bool sncl_topk_on(const SnclCodecArgs& a, const SnclTopkWork& w) {
  return a.when == 0 || (w.state[SNCL_TS_MODE] & a.when) != 0;
}

// Starts a radix select of the `want`-th largest key.
__device__ __forceinline__ void sncl_topk_select(SnclTopkWork& w, unsigned long long want) {
  w.state[SNCL_TS_PREFIX] = 0;
  w.state[SNCL_TS_MASK] = 0;
  w.state[SNCL_TS_WANT] = want;
}

// Goes to exact selection.
__device__ __forceinline__ void sncl_topk_exact(SnclTopkWork& w, unsigned long long k) {
  w.state[SNCL_TS_MODE] = SNCL_TM_EXACT;
  sncl_topk_select(w, k);
}

// Rust's f64::round for x >= 0 (half away from zero).
__device__ __forceinline__ double sncl_codec_round(double x) {
#ifdef SNCL_HOST_EMU
  double r = __builtin_floor(x);
#else
  double r;
  asm("cvt.rmi.f64.f64 %0, %1;" : "=d"(r) : "d"(x));
#endif
  return __dadd_rn(x, -r) >= 0.5 ? __dadd_rn(r, 1.0) : r;
}

__device__ __forceinline__ unsigned long long sncl_codec_clamp(unsigned long long v,
                                                               unsigned long long lo,
                                                               unsigned long long hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

// param = k, rank = the sample rank j (sampled), flags & SNCL_CODEC_SAMPLED.
SNCL_CODEC_KERNEL(topk_init) {
  if (!sncl_codec_single()) return;
  SnclTopkWork w = sncl_topk_work(a);
  for (int i = 0; i < 16; ++i) w.state[i] = 0;
  if (a.flags & SNCL_CODEC_SAMPLED) {
    w.state[SNCL_TS_MODE] = SNCL_TM_SAMPLE;
    sncl_topk_select(w, a.rank);
  } else {
    sncl_topk_exact(w, a.param);
  }
}

// Clears every histogram copy (one thread per bin).
SNCL_CODEC_KERNEL(topk_zero) {
  SnclTopkWork w = sncl_topk_work(a);
  for (unsigned long long i = sncl_codec_first(); i < 256 * SNCL_TOPK_HCOPIES;
       i += sncl_codec_stride())
    w.hist[i] = 0;
}

// The stratified sample: one thread per run (enc_len = runs m): 16 keys at
// a splitmix64-drawn offset in stratum j (compress::topk::sample_keys).
SNCL_CODEC_KERNEL(topk_sample) {
  const float* s = (const float*)a.src[0];
  SnclTopkWork w = sncl_topk_work(a);
  const unsigned long long m = a.enc_len;
  if (m == 0) return;
  const unsigned long long step = (a.n << 32) / m;
  const unsigned long long st0 = 0x5eed000000000000ull ^ a.n;
  for (unsigned long long j = sncl_codec_first(); j < m; j += sncl_codec_stride()) {
    const unsigned long long lo = (j * step) >> 32;
    const unsigned long long hi = j + 1 == m ? a.n : ((j + 1) * step) >> 32;
    unsigned long long z = st0 + (j + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const unsigned long long r = z >> 32;
    const unsigned long long off = (r * (hi - lo - 16 + 1)) >> 32;
    for (int t = 0; t < 16; ++t) w.sample[j * 16 + t] = sncl_codec_key(s[lo + off + t]);
  }
}

// Histogram of digit `pass` (bits 24-8*pass .. +8) of the keys that match
// the prefix so far: every key (EXACT), the sample (SAMPLE, B), or the keys
// >= t before p (A).
SNCL_CODEC_KERNEL(topk_hist) {
  const float* s = (const float*)a.src[0];
  SnclTopkWork w = sncl_topk_work(a);
  if (!sncl_topk_on(a, w)) return;
  const unsigned int mode = (unsigned int)w.state[SNCL_TS_MODE];
  const unsigned int prefix = (unsigned int)w.state[SNCL_TS_PREFIX];
  const unsigned int mask = (unsigned int)w.state[SNCL_TS_MASK];
  const unsigned int shift = 24 - 8 * a.pass;
  const bool sample = mode == SNCL_TM_SAMPLE || mode == SNCL_TM_B;
  const unsigned long long end = sample ? a.enc_len * 16
                                 : mode == SNCL_TM_A ? w.state[SNCL_TS_P]
                                                     : a.n;
  const unsigned int t = (unsigned int)w.state[SNCL_TS_T];
  unsigned long long* hist = w.hist + 256 * (blockIdx.x % SNCL_TOPK_HCOPIES);
  for (unsigned long long i = sncl_codec_first(); i < end; i += sncl_codec_stride()) {
    const unsigned int key = sample ? w.sample[i] : sncl_codec_key(s[i]);
    if (mode == SNCL_TM_A && key < t) continue;
    if ((key & mask) == prefix) sncl_codec_atomic_add(&hist[(key >> shift) & 255u], 1);
  }
}

// One thread per bin: copy 0 += the other copies, which are cleared.
SNCL_CODEC_KERNEL(topk_hist_sum) {
  SnclTopkWork w = sncl_topk_work(a);
  if (!sncl_topk_on(a, w)) return;
  for (unsigned long long b = sncl_codec_first(); b < 256; b += sncl_codec_stride()) {
    unsigned long long sum = w.hist[b];
    for (unsigned long long c = 1; c < SNCL_TOPK_HCOPIES; ++c) {
      sum += w.hist[256 * c + b];
      w.hist[256 * c + b] = 0;
    }
    w.hist[b] = sum;
  }
}

// The digit of the wanted key; clears the histogram for the next pass.
SNCL_CODEC_KERNEL(topk_pick) {
  if (!sncl_codec_single()) return;
  SnclTopkWork w = sncl_topk_work(a);
  if (!sncl_topk_on(a, w)) return;
  const unsigned int shift = 24 - 8 * a.pass;
  unsigned long long want = w.state[SNCL_TS_WANT];
  unsigned long long above = 0;
  for (int b = 255; b >= 0; --b) {
    const unsigned long long c = w.hist[b];
    if (want > 0 && above + c >= want) {
      w.state[SNCL_TS_PREFIX] |= (unsigned long long)b << shift;
      w.state[SNCL_TS_WANT] = want - above;
      want = 0;
    } else if (want > 0) {
      above += c;
    }
    w.hist[b] = 0;
  }
  w.state[SNCL_TS_MASK] |= 255ull << shift;
}

// After the selection of the sample's j-th largest (SAMPLE) or of the exact
// k-th largest (EXACT): the compaction threshold.
SNCL_CODEC_KERNEL(topk_ctl_select) {
  if (!sncl_codec_single()) return;
  SnclTopkWork w = sncl_topk_work(a);
  if (!sncl_topk_on(a, w)) return;
  const unsigned long long t = w.state[SNCL_TS_PREFIX];
  w.state[SNCL_TS_THR] = t;
  if (w.state[SNCL_TS_MODE] == SNCL_TM_EXACT) {
    w.state[SNCL_TS_TIES] = w.state[SNCL_TS_WANT];
  } else {
    w.state[SNCL_TS_T] = t;
  }
}

// One thread per chunk: EXACT counts keys above THR and equal to it; the
// other modes count keys >= THR (eq stays 0).
SNCL_CODEC_KERNEL(topk_count) {
  const float* s = (const float*)a.src[0];
  SnclTopkWork w = sncl_topk_work(a);
  if (!sncl_topk_on(a, w)) return;
  const unsigned int t = (unsigned int)w.state[SNCL_TS_THR];
  const bool exact = w.state[SNCL_TS_MODE] == SNCL_TM_EXACT;
  for (unsigned long long c = sncl_codec_first(); c < w.nchunks; c += sncl_codec_stride()) {
    const unsigned long long lo = c * SNCL_TOPK_CHUNK;
    const unsigned long long hi = lo + SNCL_TOPK_CHUNK < a.n ? lo + SNCL_TOPK_CHUNK : a.n;
    unsigned int gt = 0, eq = 0;
    for (unsigned long long i = lo; i < hi; ++i) {
      const unsigned int key = sncl_codec_key(s[i]);
      gt += exact ? key > t : key >= t;
      eq += exact && key == t;
    }
    w.gt[c] = gt;
    w.eq[c] = eq;
  }
}

// One thread per group of chunks: exclusive scan of the group's counts in
// place, the group's totals to ggt/geq.
SNCL_CODEC_KERNEL(topk_scan) {
  SnclTopkWork w = sncl_topk_work(a);
  if (!sncl_topk_on(a, w)) return;
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

// Exclusive scan of the group totals (one thread; n / 65536 groups); the
// total count to TOTAL.
SNCL_CODEC_KERNEL(topk_scan_groups) {
  if (!sncl_codec_single()) return;
  SnclTopkWork w = sncl_topk_work(a);
  if (!sncl_topk_on(a, w)) return;
  unsigned int gt = 0, eq = 0;
  for (unsigned long long g = 0; g < w.ngroups; ++g) {
    const unsigned int cg = w.ggt[g], ce = w.geq[g];
    w.ggt[g] = gt;
    w.geq[g] = eq;
    gt += cg;
    eq += ce;
  }
  w.state[SNCL_TS_TOTAL] = gt;
}

// SAMPLE, after counting c = #keys >= t: keep them, go exact, or prepare
// the second threshold (A or B). rank = j, enc_len = runs (sample 16 m).
SNCL_CODEC_KERNEL(topk_ctl_count) {
  if (!sncl_codec_single()) return;
  SnclTopkWork w = sncl_topk_work(a);
  if (!sncl_topk_on(a, w)) return;
  const float* s = (const float*)a.src[0];
  const unsigned long long k = a.param, lo = (k + 1) / 2, hi = 2 * k, cap = 4 * k;
  const unsigned long long c = w.state[SNCL_TS_TOTAL];
  const unsigned long long j = a.rank, ns = a.enc_len * 16;
  if (c >= lo && c <= hi) {
    w.state[SNCL_TS_MODE] = SNCL_TM_FINAL;
  } else if (c > hi && c <= cap) {
    sncl_topk_exact(w, k);
  } else if (c > cap) {
    // p: after the (cap+1)-th key >= t. The last chunk whose exclusive
    // prefix is below cap+1 holds it.
    const unsigned long long want = cap + 1;
    unsigned long long lo_c = 0, hi_c = w.nchunks;  // prefix(lo_c) < want
    while (hi_c - lo_c > 1) {
      const unsigned long long mid = (lo_c + hi_c) / 2;
      const unsigned long long pre = (unsigned long long)w.ggt[mid / SNCL_TOPK_GROUP] + w.gt[mid];
      if (pre < want) lo_c = mid; else hi_c = mid;
    }
    unsigned long long seen = (unsigned long long)w.ggt[lo_c / SNCL_TOPK_GROUP] + w.gt[lo_c];
    const unsigned int t = (unsigned int)w.state[SNCL_TS_T];
    unsigned long long p = a.n;
    for (unsigned long long i = lo_c * SNCL_TOPK_CHUNK; i < a.n; ++i) {
      if (sncl_codec_key(s[i]) >= t && ++seen == want) {
        p = i + 1;
        break;
      }
    }
    w.state[SNCL_TS_P] = p;
    const double x = __ddiv_rn(__dmul_rn((double)k, (double)p), (double)a.n);
    const unsigned long long r = sncl_codec_clamp((unsigned long long)sncl_codec_round(x), 1, want);
    w.state[SNCL_TS_MODE] = SNCL_TM_A;
    sncl_topk_select(w, r);
  } else {
    const double want = c == 0 ? __dmul_rn(4.0, (double)j)
                               : __ddiv_rn(__dmul_rn((double)j, (double)k), (double)c);
    unsigned long long j2 = sncl_codec_clamp((unsigned long long)sncl_codec_round(want), 1, ns);
    j2 = j2 > j + 1 ? j2 : j + 1;
    j2 = j2 < ns ? j2 : ns;
    if (j2 > j) {
      w.state[SNCL_TS_MODE] = SNCL_TM_B;
      sncl_topk_select(w, j2);
    } else {
      sncl_topk_exact(w, k);
    }
  }
}

// A or B, after selecting t2: recount with t2 when it is beyond t (A:
// higher, B: lower), else exact.
SNCL_CODEC_KERNEL(topk_ctl_second) {
  if (!sncl_codec_single()) return;
  SnclTopkWork w = sncl_topk_work(a);
  if (!sncl_topk_on(a, w)) return;
  const unsigned long long t = w.state[SNCL_TS_T], t2 = w.state[SNCL_TS_PREFIX];
  const bool a_mode = w.state[SNCL_TS_MODE] == SNCL_TM_A;
  if (a_mode ? t2 <= t : t2 >= t) {
    sncl_topk_exact(w, a.param);
  } else {
    w.state[SNCL_TS_MODE] = SNCL_TM_RECOUNT;
    w.state[SNCL_TS_THR] = t2;
  }
}

// RECOUNT, after counting c2 = #keys >= t2: keep them, or exact.
SNCL_CODEC_KERNEL(topk_ctl_recount) {
  if (!sncl_codec_single()) return;
  SnclTopkWork w = sncl_topk_work(a);
  if (!sncl_topk_on(a, w)) return;
  const unsigned long long k = a.param, c = w.state[SNCL_TS_TOTAL];
  if (c >= (k + 1) / 2 && c <= 2 * k) {
    w.state[SNCL_TS_MODE] = SNCL_TM_FINAL;
  } else {
    sncl_topk_exact(w, k);
  }
}

// One thread per chunk: the header and the kept indices and values. EXACT
// keeps keys > THR and the first TIES keys equal to it; FINAL keeps keys >=
// THR.
SNCL_CODEC_KERNEL(topk_write) {
  const float* s = (const float*)a.src[0];
  unsigned char* d = (unsigned char*)a.dst;
  SnclTopkWork w = sncl_topk_work(a);
  const bool exact = w.state[SNCL_TS_MODE] == SNCL_TM_EXACT;
  const unsigned int t = (unsigned int)w.state[SNCL_TS_THR];
  const unsigned long long ties = exact ? w.state[SNCL_TS_TIES] : 0;
  const unsigned long long k = exact ? a.param : w.state[SNCL_TS_TOTAL];
  if (sncl_codec_single()) sncl_codec_store_u32(d, (unsigned int)k);
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
      if (exact ? key > t : key >= t) {
        pos = gt + (eq < ties ? eq : ties);
        ++gt;
      } else if (exact && key == t && eq < ties) {
        pos = gt + eq;
        ++eq;
      } else {
        eq += exact && key == t;
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
  } else if ((a.flags & SNCL_CODEC_LEN_MAX) ? a.enc_len < 4 + 8 * k : a.enc_len != 4 + 8 * k) {
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
#define SNCL_FOR_EACH_CODEC_KERNEL(X)                                                    \
  X(encode_f16) X(decode_f16) X(decsum_encode_f16) X(encode_bf16) X(decode_bf16)         \
  X(decsum_encode_bf16) X(int8_stats) X(int8_quantize) X(int8_decode) X(topk_init)       \
  X(topk_zero) X(topk_sample) X(topk_hist) X(topk_hist_sum) X(topk_pick)                 \
  X(topk_ctl_select) X(topk_count) X(topk_scan) X(topk_scan_groups) X(topk_ctl_count)    \
  X(topk_ctl_second) X(topk_ctl_recount) X(topk_write) X(topk_check_init) X(topk_check)  \
  X(topk_clear) X(topk_scatter) X(ef_compensate) X(ef_residual)
