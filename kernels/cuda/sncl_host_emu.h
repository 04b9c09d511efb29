// sncl_host_emu.h: just enough of CUDA to compile sncl's kernels as ordinary
// C++17 for the host (the emulated device and the CPU checks). Used only
// when SNCL_HOST_EMU is defined; NVRTC never sees this file.
//
// A "launch" runs every thread of every block one after the other on the
// calling OS thread. That is correct for sncl's kernels because they are
// grid-stride loops with no shared memory and no barriers: each element is
// handled by exactly one (block, thread), whatever the order. The built-in
// index variables are thread_local, so host threads (the emulator's
// streams) can run kernels at the same time.
//
// Block kernels (shared memory and barriers) are the exception: they are
// launched with sncl_host_launch_blocks, which calls the kernel once per
// block, and are written in phases (see "Block kernels" below) so that one
// host call runs the whole block cooperatively.
#ifndef SNCL_HOST_EMU_H
#define SNCL_HOST_EMU_H

#ifndef SNCL_HOST_EMU
#error "sncl_host_emu.h is the host shim; define SNCL_HOST_EMU"
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))

struct dim3 {
  unsigned int x, y, z;
};

inline thread_local dim3 threadIdx = {0, 0, 0};
inline thread_local dim3 blockIdx = {0, 0, 0};
inline thread_local dim3 blockDim = {1, 1, 1};
inline thread_local dim3 gridDim = {1, 1, 1};

struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};

// Bit casts (CUDA intrinsics on the device).
inline unsigned int __float_as_uint(float f) {
  unsigned int u;
  __builtin_memcpy(&u, &f, sizeof u);
  return u;
}
inline float __uint_as_float(unsigned int u) {
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}
inline long long __double_as_longlong(double d) {
  long long u;
  __builtin_memcpy(&u, &d, sizeof u);
  return u;
}
inline double __longlong_as_double(long long u) {
  double d;
  __builtin_memcpy(&d, &u, sizeof d);
  return d;
}

// IEEE round-to-nearest arithmetic (CUDA intrinsics that are never fused
// into an FMA). x86-64 computes float and double in SSE registers, so
// plain operators round exactly once; the build passes -ffp-contract=off.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline float __ull2float_rn(unsigned long long v) { return (float)v; }
inline double __ull2double_rn(unsigned long long v) { return (double)v; }

// Runs `kernel()` for every (block, thread) of a grid x block launch, in
// order, on this OS thread.
template <typename Kernel>
inline void sncl_host_launch(unsigned int grid, unsigned int block, Kernel kernel) {
  gridDim = dim3{grid, 1, 1};
  blockDim = dim3{block, 1, 1};
  for (unsigned int b = 0; b < grid; ++b) {
    blockIdx = dim3{b, 0, 0};
    for (unsigned int t = 0; t < block; ++t) {
      threadIdx = dim3{t, 0, 0};
      kernel();
    }
  }
}

// ---- Block kernels ----------------------------------------------------------
//
// A kernel whose threads cooperate within a block is written as phases
// separated by barriers:
//
//   __shared__ unsigned int part[N];
//   for (...uniform loop...) {            // same trip count in every thread
//     SNCL_EACH_THREAD { part[threadIdx.x] = ...; }
//     __syncthreads();
//     SNCL_EACH_THREAD { ... part[...] ...; }
//     __syncthreads();
//   }
//
// On the device SNCL_EACH_THREAD is nothing (every thread runs the braces)
// and __syncthreads is the barrier. Here the kernel runs once per block:
// SNCL_EACH_THREAD loops over the block's threads, so a phase has run in
// every thread before the next starts, which is what the barrier
// guarantees; __shared__ is nothing (a local of the one call is the
// block's). Rules, which keep both readings the same: code outside a phase
// is uniform (depends only on the arguments, blockIdx, blockDim, gridDim
// and shared memory read after a barrier) and uses no threadIdx; what a
// thread keeps from one phase to the next goes through shared memory; a
// phase's body has no break, continue or return of its own (they would
// leave the host's loop over threads).
#define __shared__
#define __syncthreads() ((void)0)
#define SNCL_EACH_THREAD \
  for (threadIdx.x = sncl_host_first_thread(); threadIdx.x < blockDim.x; ++threadIdx.x)

// 0. A launch has at least one thread (the C entry points refuse empty
// shapes); saying so lets the compiler see that every phase runs.
inline unsigned int sncl_host_first_thread() {
  if (blockDim.x == 0) __builtin_unreachable();
  return 0;
}

// Runs `kernel()` once per block of a grid x block launch, in order, on
// this OS thread; the kernel's phases visit the block's threads.
template <typename Kernel>
inline void sncl_host_launch_blocks(unsigned int grid, unsigned int block, Kernel kernel) {
  gridDim = dim3{grid, 1, 1};
  blockDim = dim3{block, 1, 1};
  for (unsigned int b = 0; b < grid; ++b) {
    blockIdx = dim3{b, 0, 0};
    threadIdx = dim3{0, 0, 0};
    kernel();
  }
}

// Runs `kernel()` for block `b` alone of a grid x block launch on this OS
// thread (the strict driver model runs the blocks of one launch on threads
// of their own, as co-resident blocks run on a GPU).
template <typename Kernel>
inline void sncl_host_launch_one_block(unsigned int grid, unsigned int block, unsigned int b,
                                       Kernel kernel) {
  gridDim = dim3{grid, 1, 1};
  blockDim = dim3{block, 1, 1};
  blockIdx = dim3{b, 0, 0};
  threadIdx = dim3{0, 0, 0};
  kernel();
}

#endif  // SNCL_HOST_EMU_H
