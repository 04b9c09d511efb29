// sncl's device reduce kernels: one generic reduce-copy (n sources folded
// left to right into m destinations, NCCL's reduceCopy shape) instantiated
// for every dtype x op, and the divide that finishes an average.
//
// ABI (fixed; the CUDA and emulated backends launch these by name):
//   extern "C" __global__ void sncl_reduce_copy_<dtype>_<op>(SnclReduceCopyArgs args);
//   extern "C" __global__ void sncl_divide_<dtype>(void* data, unsigned long long count,
//                                                  unsigned long long divisor);
// <dtype>: int8 uint8 int32 uint32 int64 uint64 half float double bfloat16
//          f8e4m3 f8e5m2;
// <op>: sum prod max min, and band bor bxor on the integer types.
//
// Every kernel is a grid-stride loop, correct for any grid and block shape.
// When every pointer is 16-byte aligned, the bulk moves in 16-byte packs
// (uint4 loads and stores) and a scalar loop does the tail; otherwise
// everything goes element by element. The arithmetic is the same either way
// (sncl_device.cuh), so results never depend on alignment or shape.
//
// A destination may be a source (in place): each element is read from
// every source before any destination is written, by the same thread.
#include "sncl_device.cuh"

#define SNCL_MAX_ARGS 8
struct SnclReduceCopyArgs {
  const void* srcs[SNCL_MAX_ARGS];  // nsrcs used
  void* dsts[SNCL_MAX_ARGS];        // ndsts used
  unsigned long long count;         // elements
  int nsrcs;                        // 1..8 (1 = copy)
  int ndsts;                        // 1..8
};

// 16 bytes seen as elements.
template <typename T>
union SnclPack {
  uint4 u;
  T e[sizeof(uint4) / sizeof(T)];
};

// The first (block, thread) index of this thread and the stride of a
// grid-stride loop.
__device__ __forceinline__ unsigned long long sncl_thread_first() {
  return (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ unsigned long long sncl_thread_stride() {
  return (unsigned long long)gridDim.x * blockDim.x;
}

// One fold step over a whole pack: a.e[k] = a.e[k] op b.e[k].
template <typename Op>
__device__ __forceinline__ uint4 sncl_pack_fold_inline(uint4 a, uint4 b) {
  typedef typename Op::T T;
  SnclPack<T> x, y;
  x.u = a;
  y.u = b;
  SNCL_UNROLL
  for (int e = 0; e < (int)(sizeof(uint4) / sizeof(T)); ++e) x.e[e] = Op::apply(x.e[e], y.e[e]);
  return x.u;
}

// The same as a call. Narrow types (f16, bf16, fp8, 8-bit integers) put 8
// or 16 element operations, each with its conversions, in a pack; inlined
// into the unrolled fold over up to 8 sources that is 7 copies per kernel,
// which is what NVRTC spent its time on (2-6x the compile time of a 32-bit
// type). One out-of-line pack step per kernel keeps the 16-byte loads, all
// issued before the fold, and the loop's memory-level parallelism as is.
template <typename Op>
__device__ __noinline__ uint4 sncl_pack_fold_outline(uint4 a, uint4 b) {
  return sncl_pack_fold_inline<Op>(a, b);
}

template <typename Op>
__device__ __noinline__ typename Op::T sncl_elem_fold_outline(typename Op::T a, typename Op::T b) {
  return Op::apply(a, b);
}

// Outline the fold of types narrower than 32 bits.
template <typename Op>
struct SnclFold {
  typedef typename Op::T T;
  static const bool kOutline = sizeof(T) < 4;
  static __device__ __forceinline__ uint4 pack(uint4 a, uint4 b) {
    if constexpr (kOutline) {
      return sncl_pack_fold_outline<Op>(a, b);
    } else {
      return sncl_pack_fold_inline<Op>(a, b);
    }
  }
  static __device__ __forceinline__ T elem(T a, T b) {
    if constexpr (kOutline) {
      return sncl_elem_fold_outline<Op>(a, b);
    } else {
      return Op::apply(a, b);
    }
  }
};

// dsts[j][i] = srcs[0][i] op srcs[1][i] op ... for i < count, every j.
template <typename Op>
__device__ __forceinline__ void sncl_reduce_copy_body(const SnclReduceCopyArgs& args) {
  typedef typename Op::T T;
  const int kPack = (int)(sizeof(uint4) / sizeof(T));
  const unsigned long long count = args.count;
  const int nsrcs = args.nsrcs;
  const int ndsts = args.ndsts;
  const unsigned long long first = sncl_thread_first();
  const unsigned long long stride = sncl_thread_stride();

  unsigned long long addr_bits = 0;
  SNCL_UNROLL
  for (int k = 0; k < SNCL_MAX_ARGS; ++k) {
    if (k < nsrcs) addr_bits |= (unsigned long long)args.srcs[k];
    if (k < ndsts) addr_bits |= (unsigned long long)args.dsts[k];
  }
  const unsigned long long npacks = (addr_bits & 15) == 0 ? count / kPack : 0;

  for (unsigned long long p = first; p < npacks; p += stride) {
    // All loads first (more bytes in flight), then the fold.
    SnclPack<T> v[SNCL_MAX_ARGS];
    v[0].u = static_cast<const uint4*>(args.srcs[0])[p];
    SNCL_UNROLL
    for (int s = 1; s < SNCL_MAX_ARGS; ++s) {
      if (s < nsrcs) {
        v[s].u = static_cast<const uint4*>(args.srcs[s])[p];
      } else {
        v[s].u = uint4{0, 0, 0, 0};
      }
    }
    SNCL_UNROLL
    for (int s = 1; s < SNCL_MAX_ARGS; ++s) {
      if (s < nsrcs) v[0].u = SnclFold<Op>::pack(v[0].u, v[s].u);
    }
    SNCL_UNROLL
    for (int d = 0; d < SNCL_MAX_ARGS; ++d) {
      if (d < ndsts) static_cast<uint4*>(args.dsts[d])[p] = v[0].u;
    }
  }

  for (unsigned long long i = npacks * kPack + first; i < count; i += stride) {
    T acc = static_cast<const T*>(args.srcs[0])[i];
    SNCL_UNROLL
    for (int s = 1; s < SNCL_MAX_ARGS; ++s) {
      if (s < nsrcs) acc = SnclFold<Op>::elem(acc, static_cast<const T*>(args.srcs[s])[i]);
    }
    SNCL_UNROLL
    for (int d = 0; d < SNCL_MAX_ARGS; ++d) {
      if (d < ndsts) static_cast<T*>(args.dsts[d])[i] = acc;
    }
  }
}

// One pack divided element by element; out of line for narrow types, as
// the fold (a division is a long instruction sequence, 16 of them per pack).
template <typename T, T (*Div)(T, unsigned long long)>
__device__ __forceinline__ uint4 sncl_pack_divide_inline(uint4 a, unsigned long long divisor) {
  SnclPack<T> v;
  v.u = a;
  SNCL_UNROLL
  for (int e = 0; e < (int)(sizeof(uint4) / sizeof(T)); ++e) v.e[e] = Div(v.e[e], divisor);
  return v.u;
}

template <typename T, T (*Div)(T, unsigned long long)>
__device__ __noinline__ uint4 sncl_pack_divide_outline(uint4 a, unsigned long long divisor) {
  return sncl_pack_divide_inline<T, Div>(a, divisor);
}

// data[i] = data[i] / divisor for i < count.
template <typename T, T (*Div)(T, unsigned long long)>
__device__ __forceinline__ void sncl_divide_body(void* data, unsigned long long count,
                                                 unsigned long long divisor) {
  const int kPack = (int)(sizeof(uint4) / sizeof(T));
  const unsigned long long first = sncl_thread_first();
  const unsigned long long stride = sncl_thread_stride();
  const unsigned long long npacks = ((unsigned long long)data & 15) == 0 ? count / kPack : 0;
  for (unsigned long long p = first; p < npacks; p += stride) {
    uint4* x = static_cast<uint4*>(data) + p;
    if constexpr (sizeof(T) < 4) {
      *x = sncl_pack_divide_outline<T, Div>(*x, divisor);
    } else {
      *x = sncl_pack_divide_inline<T, Div>(*x, divisor);
    }
  }
  for (unsigned long long i = npacks * kPack + first; i < count; i += stride) {
    T* x = static_cast<T*>(data) + i;
    *x = Div(*x, divisor);
  }
}

// Every dtype, and every (dtype, op) with a kernel; X(dtype) / X(dtype, op).
#define SNCL_FOR_EACH_DTYPE(X) \
  X(int8) X(uint8) X(int32) X(uint32) X(int64) X(uint64) X(half) X(float) X(double) X(bfloat16) \
  X(f8e4m3) X(f8e5m2)
#define SNCL_INT_KERNELS(X, dt) \
  X(dt, sum) X(dt, prod) X(dt, max) X(dt, min) X(dt, band) X(dt, bor) X(dt, bxor)
#define SNCL_FLOAT_KERNELS(X, dt) X(dt, sum) X(dt, prod) X(dt, max) X(dt, min)
#define SNCL_FOR_EACH_REDUCE_KERNEL(X)                                                         \
  SNCL_INT_KERNELS(X, int8) SNCL_INT_KERNELS(X, uint8) SNCL_INT_KERNELS(X, int32)              \
  SNCL_INT_KERNELS(X, uint32) SNCL_INT_KERNELS(X, int64) SNCL_INT_KERNELS(X, uint64)           \
  SNCL_FLOAT_KERNELS(X, half) SNCL_FLOAT_KERNELS(X, float) SNCL_FLOAT_KERNELS(X, double)       \
  SNCL_FLOAT_KERNELS(X, bfloat16) SNCL_FLOAT_KERNELS(X, f8e4m3) SNCL_FLOAT_KERNELS(X, f8e5m2)

#define SNCL_DEFINE_REDUCE_KERNEL(dt, op)                                                    \
  struct SnclOp_##dt##_##op {                                                                \
    typedef sncl_##dt##_t T;                                                                 \
    static __device__ __forceinline__ T apply(T a, T b) { return sncl_##dt##_##op(a, b); } \
  };                                                                                         \
  extern "C" __global__ void sncl_reduce_copy_##dt##_##op(SnclReduceCopyArgs args) {        \
    sncl_reduce_copy_body<SnclOp_##dt##_##op>(args);                                         \
  }

#define SNCL_DEFINE_DIVIDE_KERNEL(dt)                                                          \
  extern "C" __global__ void sncl_divide_##dt(void* data, unsigned long long count,           \
                                              unsigned long long divisor) {                   \
    sncl_divide_body<sncl_##dt##_t, sncl_##dt##_div>(data, count, divisor);                   \
  }

// Without SNCL_ONLY_DTYPE: every kernel (the host shim build, the CI
// check). With -DSNCL_ONLY_DTYPE=<n> (n = the dtype's ncclDataType_t value,
// 0 int8 .. 11 f8e5m2; kernels::cuda::dtype_options): only that dtype's
// reduce-copy and divide kernels, so a device compiles what it uses.
#if defined(SNCL_ONLY_DTYPE)
#define SNCL_WANT_DTYPE(n) (SNCL_ONLY_DTYPE == (n))
#else
#define SNCL_WANT_DTYPE(n) 1
#endif

#if SNCL_WANT_DTYPE(0)
#define SNCL_EMITTED_A_DTYPE
SNCL_INT_KERNELS(SNCL_DEFINE_REDUCE_KERNEL, int8)
SNCL_DEFINE_DIVIDE_KERNEL(int8)
#endif
#if SNCL_WANT_DTYPE(1)
#define SNCL_EMITTED_A_DTYPE
SNCL_INT_KERNELS(SNCL_DEFINE_REDUCE_KERNEL, uint8)
SNCL_DEFINE_DIVIDE_KERNEL(uint8)
#endif
#if SNCL_WANT_DTYPE(2)
#define SNCL_EMITTED_A_DTYPE
SNCL_INT_KERNELS(SNCL_DEFINE_REDUCE_KERNEL, int32)
SNCL_DEFINE_DIVIDE_KERNEL(int32)
#endif
#if SNCL_WANT_DTYPE(3)
#define SNCL_EMITTED_A_DTYPE
SNCL_INT_KERNELS(SNCL_DEFINE_REDUCE_KERNEL, uint32)
SNCL_DEFINE_DIVIDE_KERNEL(uint32)
#endif
#if SNCL_WANT_DTYPE(4)
#define SNCL_EMITTED_A_DTYPE
SNCL_INT_KERNELS(SNCL_DEFINE_REDUCE_KERNEL, int64)
SNCL_DEFINE_DIVIDE_KERNEL(int64)
#endif
#if SNCL_WANT_DTYPE(5)
#define SNCL_EMITTED_A_DTYPE
SNCL_INT_KERNELS(SNCL_DEFINE_REDUCE_KERNEL, uint64)
SNCL_DEFINE_DIVIDE_KERNEL(uint64)
#endif
#if SNCL_WANT_DTYPE(6)
#define SNCL_EMITTED_A_DTYPE
SNCL_FLOAT_KERNELS(SNCL_DEFINE_REDUCE_KERNEL, half)
SNCL_DEFINE_DIVIDE_KERNEL(half)
#endif
#if SNCL_WANT_DTYPE(7)
#define SNCL_EMITTED_A_DTYPE
SNCL_FLOAT_KERNELS(SNCL_DEFINE_REDUCE_KERNEL, float)
SNCL_DEFINE_DIVIDE_KERNEL(float)
#endif
#if SNCL_WANT_DTYPE(8)
#define SNCL_EMITTED_A_DTYPE
SNCL_FLOAT_KERNELS(SNCL_DEFINE_REDUCE_KERNEL, double)
SNCL_DEFINE_DIVIDE_KERNEL(double)
#endif
#if SNCL_WANT_DTYPE(9)
#define SNCL_EMITTED_A_DTYPE
SNCL_FLOAT_KERNELS(SNCL_DEFINE_REDUCE_KERNEL, bfloat16)
SNCL_DEFINE_DIVIDE_KERNEL(bfloat16)
#endif
#if SNCL_WANT_DTYPE(10)
#define SNCL_EMITTED_A_DTYPE
SNCL_FLOAT_KERNELS(SNCL_DEFINE_REDUCE_KERNEL, f8e4m3)
SNCL_DEFINE_DIVIDE_KERNEL(f8e4m3)
#endif
#if SNCL_WANT_DTYPE(11)
#define SNCL_EMITTED_A_DTYPE
SNCL_FLOAT_KERNELS(SNCL_DEFINE_REDUCE_KERNEL, f8e5m2)
SNCL_DEFINE_DIVIDE_KERNEL(f8e5m2)
#endif

#if !defined(SNCL_EMITTED_A_DTYPE)
#error "SNCL_ONLY_DTYPE names no dtype: expected 0 (int8) to 11 (f8e5m2)"
#endif
