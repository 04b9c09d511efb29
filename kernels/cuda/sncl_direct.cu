// sncl's direct all-reduce kernels (nvlink version 2): every rank's kernel
// reads its peers' buffers where they lie (CUDA IPC mappings on a GPU, the
// emulated device's shared memory in CI), synchronised by epoch counters in
// IPC memory. The shape of TensorRT-LLM's, vLLM's and PyTorch's
// symmetric-memory all-reduces:
//
// * one-shot (algo 1, small messages): each rank reads every rank's whole
//   input, folds them in rank order and writes its own output;
// * two-shot (algo 2, medium and large messages): rank r folds slice r of
//   every rank's input into slice r of its own output (a reduce-scatter),
//   then copies every other slice q from rank q's output (an all-gather).
//
// Every rank folds every element in rank order (one-shot) or one rank folds
// it and the others copy it (two-shot), so every rank's result is
// bit-identical, with the CPU kernels' rounding (sncl_device.cuh).
//
// ABI (fixed; the CUDA and emulated backends launch these by name):
//   extern "C" __global__ void sncl_direct_all_reduce_<dtype>_<op>(SnclDirectArgs args);
// <dtype> as in sncl_reduce.cu; <op>: sum prod max min (avg runs sum, then
// sncl_divide_<dtype>). Launched with the same grid and block on every
// rank (the per-block flags pair block b of every rank).
//
// Flags. Rank r's flag area (IPC memory, SNCL_DIRECT_MAX_BLOCKS u64
// counters) holds, per block b, 4 * epoch + phase: 1 "my input is ready"
// (the kernel started, so stream order made the input ready), 2 "my slice
// is reduced" (two-shot), 3 "I have read everything I need of yours". The
// counters only grow (epochs are numbered from 1, the same on every rank),
// so nothing is ever reset and a peer one operation ahead satisfies every
// wait of this one. Block b of every rank handles the same elements (the
// partition depends only on the count, the rank count and the launch
// shape), so block b only ever waits on block b of its peers: no grid-wide
// barrier, and on the host shim (blocks run one after the other) every
// rank's block 0 finishes before its block 1 starts, on every rank alike.
//
// Deadlines. A spinning kernel cannot be timed out from the host, so it
// polls an abort word in pinned host memory (control[0]) that the host sets
// at its deadline, at a peer's death or at the communicator's abort; it
// then stops, writing control[2] = 1. While it waits long on a peer it
// writes that peer + 1 into control[1], so the host can name it.
//
// Requirements (checked by the callers): 2 to SNCL_DIRECT_MAX_RANKS ranks;
// every input and output the same count; every pointer 16-byte aligned or
// all at the same offset modulo 16 (the pack path is chosen alike on every
// rank); in place (outputs[r] == inputs[r]) one-shot folds into `scratch`
// (count elements of this rank's own memory) and copies at the end.
#include "sncl_device.cuh"

#ifdef SNCL_HOST_EMU
#include <sched.h>
#include <time.h>
#else
// On the device every thread runs a phase (the host shim loops over them).
#ifndef SNCL_EACH_THREAD
#define SNCL_EACH_THREAD
#endif
#endif

#define SNCL_DIRECT_MAX_RANKS 8
#define SNCL_DIRECT_MAX_BLOCKS 64

struct SnclDirectArgs {
  const void* inputs[SNCL_DIRECT_MAX_RANKS];        // every rank's input, here mapped
  void* outputs[SNCL_DIRECT_MAX_RANKS];             // every rank's output (two-shot reads peers')
  unsigned long long* flags[SNCL_DIRECT_MAX_RANKS];  // every rank's flag area
  void* scratch;                                    // one-shot in place: count elements, else null
  unsigned int* control;                            // pinned: abort, waiting peer + 1, aborted
  unsigned long long count;                         // elements
  unsigned long long epoch;                         // >= 1, the same on every rank
  int rank;
  int nranks;
  int algo;  // 1 one-shot, 2 two-shot
  int in_place;
};

// 16 bytes seen as elements.
template <typename T>
union SnclDirectPack {
  uint4 u;
  T e[sizeof(uint4) / sizeof(T)];
};

// ---- Memory access across processes ----------------------------------------

#ifdef SNCL_HOST_EMU
__device__ __forceinline__ unsigned long long sncl_flag_load(const unsigned long long* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
__device__ __forceinline__ void sncl_flag_store(unsigned long long* p, unsigned long long v) {
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
__device__ __forceinline__ unsigned int sncl_word_load(const unsigned int* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
__device__ __forceinline__ void sncl_word_store(unsigned int* p, unsigned int v) {
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
__device__ __forceinline__ void sncl_fence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
// Peers' data: plain loads (the fences above order them on the host).
__device__ __forceinline__ uint4 sncl_load_pack(const uint4* p) { return *p; }
template <typename T>
__device__ __forceinline__ T sncl_load_elem(const T* p) {
  return *p;
}
// A waiting host thread yields, then sleeps: the emulated ranks share few
// cores with their peers.
__device__ __forceinline__ void sncl_pause(unsigned long long spins) {
  if (spins < 256) {
    sched_yield();
  } else {
    struct timespec ts = {0, 20000};
    nanosleep(&ts, nullptr);
  }
}
#else
__device__ __forceinline__ unsigned long long sncl_flag_load(const unsigned long long* p) {
  return *(const volatile unsigned long long*)p;
}
__device__ __forceinline__ void sncl_flag_store(unsigned long long* p, unsigned long long v) {
  *(volatile unsigned long long*)p = v;
}
__device__ __forceinline__ unsigned int sncl_word_load(const unsigned int* p) {
  return *(const volatile unsigned int*)p;
}
__device__ __forceinline__ void sncl_word_store(unsigned int* p, unsigned int v) {
  *(volatile unsigned int*)p = v;
}
__device__ __forceinline__ void sncl_fence_system() { __threadfence_system(); }
// Peers' data bypasses L1 (ld.global.cg): another process wrote it during
// this kernel, and L1 is not coherent with writes from elsewhere.
__device__ __forceinline__ uint4 sncl_load_pack(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
template <typename T>
__device__ __forceinline__ T sncl_load_elem(const T* p) {
  return *(const volatile T*)p;
}
__device__ __forceinline__ void sncl_pause(unsigned long long spins) {
#if __CUDA_ARCH__ >= 700
  __nanosleep(spins < 64 ? 32 : 256);
#else
  (void)spins;
#endif
}
#endif

// ---- Flags -------------------------------------------------------------------

// Thread 0 of the block raises this rank's counter of this block to
// `value`, after the whole block's writes (barrier, then a system fence).
__device__ __forceinline__ void sncl_direct_raise(const SnclDirectArgs& a,
                                                  unsigned long long value) {
  __syncthreads();
  SNCL_EACH_THREAD {
    if (threadIdx.x == 0) {
      sncl_fence_system();
      sncl_flag_store(a.flags[a.rank] + blockIdx.x, value);
    }
  }
}

// Thread 0 waits until every peer's counter of this block reaches `value`
// (peers in rank order); 0, or the peer + 1 it gave up on at an abort.
__device__ __forceinline__ int sncl_direct_spin(const SnclDirectArgs& a,
                                                unsigned long long value) {
  for (int p = 0; p < a.nranks; ++p) {
    if (p == a.rank) continue;
    const unsigned long long* f = a.flags[p] + blockIdx.x;
    unsigned long long spins = 0;
    bool said = false;
    while (sncl_flag_load(f) < value) {
      ++spins;
      if ((spins & 255) == 0) {
        if (sncl_word_load(a.control) != 0) {
          sncl_word_store(a.control + 1, (unsigned int)p + 1);
          sncl_word_store(a.control + 2, 1);
          return p + 1;
        }
        if (!said && spins >= 4096) {
          sncl_word_store(a.control + 1, (unsigned int)p + 1);
          said = true;
        }
      }
      sncl_pause(spins);
    }
    if (said) sncl_word_store(a.control + 1, 0);
  }
  sncl_fence_system();
  return 0;
}

// The whole block waits for every peer's counter of this block to reach
// `value`; false (in every thread) when the host aborted the operation.
__device__ __forceinline__ bool sncl_direct_wait(const SnclDirectArgs& a, unsigned long long value,
                                                 int* gave_up) {
  SNCL_EACH_THREAD {
    if (threadIdx.x == 0) *gave_up = sncl_direct_spin(a, value);
  }
  __syncthreads();
  return *gave_up == 0;
}

// ---- Folds -------------------------------------------------------------------

// This block's share of elements [lo, hi): dst[i] = src[0][i] op ... op
// src[n-1][i] (n = 1: a copy). Pack p (16 bytes) of the range goes to block
// p / blockDim % gridDim, the same on every rank; the tail (elements past
// the last whole pack of the range, or the whole range when `packed` is
// false) goes element by element to the same rule.
template <typename Op>
__device__ __forceinline__ void sncl_direct_fold(const void* const* srcs, int n, void* dst,
                                                 unsigned long long lo, unsigned long long hi,
                                                 bool packed) {
  typedef typename Op::T T;
  const unsigned long long kPack = sizeof(uint4) / sizeof(T);
  const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  // lo is a multiple of kPack whenever packed (the callers' slices are).
  const unsigned long long npacks = packed ? (hi - lo) / kPack : 0;
  const unsigned long long p0 = lo / kPack;
  for (unsigned long long p = first; p < npacks; p += stride) {
    SnclDirectPack<T> acc, v;
    acc.u = sncl_load_pack(static_cast<const uint4*>(srcs[0]) + p0 + p);
    for (int s = 1; s < n; ++s) {
      v.u = sncl_load_pack(static_cast<const uint4*>(srcs[s]) + p0 + p);
      SNCL_UNROLL
      for (int e = 0; e < (int)kPack; ++e) acc.e[e] = Op::apply(acc.e[e], v.e[e]);
    }
    static_cast<uint4*>(dst)[p0 + p] = acc.u;
  }
  for (unsigned long long i = lo + npacks * kPack + first; i < hi; i += stride) {
    T acc = sncl_load_elem(static_cast<const T*>(srcs[0]) + i);
    for (int s = 1; s < n; ++s) acc = Op::apply(acc, sncl_load_elem(static_cast<const T*>(srcs[s]) + i));
    static_cast<T*>(dst)[i] = acc;
  }
}

// Whether every pointer of the operation is 16-byte aligned.
__device__ __forceinline__ bool sncl_direct_packed(const SnclDirectArgs& a) {
  unsigned long long bits = (unsigned long long)a.scratch;
  for (int r = 0; r < a.nranks; ++r) {
    bits |= (unsigned long long)a.inputs[r] | (unsigned long long)a.outputs[r];
  }
  return (bits & 15) == 0;
}

// Two-shot's slice of rank r: [r * slice, min(count, (r + 1) * slice)),
// slice a whole number of packs.
template <typename T>
__device__ __forceinline__ unsigned long long sncl_direct_slice(const SnclDirectArgs& a) {
  const unsigned long long kPack = sizeof(uint4) / sizeof(T);
  const unsigned long long per = (a.count + a.nranks - 1) / a.nranks;
  return (per + kPack - 1) / kPack * kPack;
}

template <typename Op>
__device__ __forceinline__ void sncl_direct_body(const SnclDirectArgs& a) {
  typedef typename Op::T T;
  __shared__ int gave_up;
  __shared__ unsigned long long epoch;
  // Epoch 0: derived on the device, one more than the last this block
  // completed (its own counter holds 4 * e + 3 after epoch e, 0 before the
  // first): every launch of a captured graph then runs the next epoch.
  SNCL_EACH_THREAD {
    if (threadIdx.x == 0) {
      epoch = a.epoch != 0 ? a.epoch : sncl_flag_load(a.flags[a.rank] + blockIdx.x) / 4 + 1;
    }
  }
  __syncthreads();
  const unsigned long long e4 = epoch * 4;
  const bool packed = sncl_direct_packed(a);
  const int me = a.rank;
  // Inputs ready everywhere.
  sncl_direct_raise(a, e4 + 1);
  if (!sncl_direct_wait(a, e4 + 1, &gave_up)) return;
  if (a.algo == 1) {
    void* dst = a.in_place ? a.scratch : a.outputs[me];
    SNCL_EACH_THREAD { sncl_direct_fold<Op>(a.inputs, a.nranks, dst, 0, a.count, packed); }
    // Everyone has read every input: outputs (and, in place, inputs) may
    // be written, and the caller may reuse its input after the kernel.
    sncl_direct_raise(a, e4 + 3);
    if (!sncl_direct_wait(a, e4 + 3, &gave_up)) return;
    if (a.in_place) {
      const void* from[1] = {a.scratch};
      SNCL_EACH_THREAD { sncl_direct_fold<Op>(from, 1, a.outputs[me], 0, a.count, packed); }
    }
    return;
  }
  const unsigned long long slice = sncl_direct_slice<T>(a);
  const unsigned long long lo = slice * me < a.count ? slice * me : a.count;
  const unsigned long long hi = lo + slice < a.count ? lo + slice : a.count;
  SNCL_EACH_THREAD { sncl_direct_fold<Op>(a.inputs, a.nranks, a.outputs[me], lo, hi, packed); }
  sncl_direct_raise(a, e4 + 2);
  if (!sncl_direct_wait(a, e4 + 2, &gave_up)) return;
  for (int q = 0; q < a.nranks; ++q) {
    if (q == me) continue;
    const unsigned long long qlo = slice * q < a.count ? slice * q : a.count;
    const unsigned long long qhi = qlo + slice < a.count ? qlo + slice : a.count;
    const void* from[1] = {a.outputs[q]};
    SNCL_EACH_THREAD { sncl_direct_fold<Op>(from, 1, a.outputs[me], qlo, qhi, packed); }
  }
  // Everyone has copied every slice: the buffers may be reused.
  sncl_direct_raise(a, e4 + 3);
  (void)sncl_direct_wait(a, e4 + 3, &gave_up);
}

#define SNCL_DIRECT_OPS(X, dt) X(dt, sum) X(dt, prod) X(dt, max) X(dt, min)

#define SNCL_DEFINE_DIRECT_KERNEL(dt, op)                                                  \
  struct SnclDirectOp_##dt##_##op {                                                       \
    typedef sncl_##dt##_t T;                                                              \
    static __device__ __forceinline__ T apply(T a, T b) { return sncl_##dt##_##op(a, b); } \
  };                                                                                      \
  extern "C" __global__ void sncl_direct_all_reduce_##dt##_##op(SnclDirectArgs args) {    \
    sncl_direct_body<SnclDirectOp_##dt##_##op>(args);                                     \
  }

// Every direct kernel, X(dtype, op) (the host launch table).
#define SNCL_FOR_EACH_DIRECT_KERNEL(X)                                                    \
  SNCL_DIRECT_OPS(X, int8) SNCL_DIRECT_OPS(X, uint8) SNCL_DIRECT_OPS(X, int32)            \
  SNCL_DIRECT_OPS(X, uint32) SNCL_DIRECT_OPS(X, int64) SNCL_DIRECT_OPS(X, uint64)         \
  SNCL_DIRECT_OPS(X, half) SNCL_DIRECT_OPS(X, float) SNCL_DIRECT_OPS(X, double)           \
  SNCL_DIRECT_OPS(X, bfloat16) SNCL_DIRECT_OPS(X, f8e4m3) SNCL_DIRECT_OPS(X, f8e5m2)

// As sncl_reduce.cu: -DSNCL_ONLY_DTYPE=<n> compiles one dtype's kernels.
#if defined(SNCL_ONLY_DTYPE)
#define SNCL_DIRECT_WANT(n) (SNCL_ONLY_DTYPE == (n))
#else
#define SNCL_DIRECT_WANT(n) 1
#endif

#if SNCL_DIRECT_WANT(0)
#define SNCL_DIRECT_EMITTED
SNCL_DIRECT_OPS(SNCL_DEFINE_DIRECT_KERNEL, int8)
#endif
#if SNCL_DIRECT_WANT(1)
#define SNCL_DIRECT_EMITTED
SNCL_DIRECT_OPS(SNCL_DEFINE_DIRECT_KERNEL, uint8)
#endif
#if SNCL_DIRECT_WANT(2)
#define SNCL_DIRECT_EMITTED
SNCL_DIRECT_OPS(SNCL_DEFINE_DIRECT_KERNEL, int32)
#endif
#if SNCL_DIRECT_WANT(3)
#define SNCL_DIRECT_EMITTED
SNCL_DIRECT_OPS(SNCL_DEFINE_DIRECT_KERNEL, uint32)
#endif
#if SNCL_DIRECT_WANT(4)
#define SNCL_DIRECT_EMITTED
SNCL_DIRECT_OPS(SNCL_DEFINE_DIRECT_KERNEL, int64)
#endif
#if SNCL_DIRECT_WANT(5)
#define SNCL_DIRECT_EMITTED
SNCL_DIRECT_OPS(SNCL_DEFINE_DIRECT_KERNEL, uint64)
#endif
#if SNCL_DIRECT_WANT(6)
#define SNCL_DIRECT_EMITTED
SNCL_DIRECT_OPS(SNCL_DEFINE_DIRECT_KERNEL, half)
#endif
#if SNCL_DIRECT_WANT(7)
#define SNCL_DIRECT_EMITTED
SNCL_DIRECT_OPS(SNCL_DEFINE_DIRECT_KERNEL, float)
#endif
#if SNCL_DIRECT_WANT(8)
#define SNCL_DIRECT_EMITTED
SNCL_DIRECT_OPS(SNCL_DEFINE_DIRECT_KERNEL, double)
#endif
#if SNCL_DIRECT_WANT(9)
#define SNCL_DIRECT_EMITTED
SNCL_DIRECT_OPS(SNCL_DEFINE_DIRECT_KERNEL, bfloat16)
#endif
#if SNCL_DIRECT_WANT(10)
#define SNCL_DIRECT_EMITTED
SNCL_DIRECT_OPS(SNCL_DEFINE_DIRECT_KERNEL, f8e4m3)
#endif
#if SNCL_DIRECT_WANT(11)
#define SNCL_DIRECT_EMITTED
SNCL_DIRECT_OPS(SNCL_DEFINE_DIRECT_KERNEL, f8e5m2)
#endif

#if defined(SNCL_ONLY_DTYPE) && !defined(SNCL_DIRECT_EMITTED)
#error "SNCL_ONLY_DTYPE names no dtype (expected 0 to 11, kernels::cuda::dtype_options)"
#endif
