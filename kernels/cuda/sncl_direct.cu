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
// bit-identical. A fold combines its sources with the CPU kernels'
// arithmetic (sncl_device.cuh) in an accumulator type: the element type,
// or f32 for f16, bf16 and fp8, rounded to the element type once at the
// end (SnclDirectAcc_*), so n ranks' half-precision values lose one
// rounding where the CPU's pairwise folds lose n - 1.
//
// ABI (fixed; the CUDA and emulated backends launch these by name):
//   extern "C" __global__ void sncl_direct_all_reduce_<dtype>_<op>(SnclDirectArgs args);
// <dtype> as in sncl_reduce.cu; <op>: sum prod max min (avg runs sum, then
// sncl_divide_<dtype>). Launched with the same grid and block on every
// rank (the per-block flags pair block b of every rank).
//
// Flags. Rank r's flag area (IPC memory, SNCL_DIRECT_MAX_BLOCKS u64
// counters, then SNCL_DIRECT_MAX_BLOCKS fingerprint words) holds, per
// block b, 4 * epoch + phase: 1 "my input is ready"
// (the kernel started, so stream order made the input ready), 2 "my slice
// is reduced" (two-shot), 3 "I have read everything I need of yours". The
// counters only grow (epochs are numbered from 1, the same on every rank),
// so nothing is ever reset and a peer one operation ahead satisfies every
// wait of this one. Block b of every rank handles the same elements (the
// partition depends only on an element's position and the launch shape,
// see sncl_direct_fold), so block b only ever waits on block b of its
// peers: no grid-wide
// barrier, and on the host shim (blocks run one after the other) every
// rank's block 0 finishes before its block 1 starts, on every rank alike.
//
// Fingerprints (staged only). A staged launch with a fingerprint (a hash
// of the call's collective, type, op, count and root; 0: none) writes it
// into block b's fingerprint word before its first "ready" and, once
// every peer's block b is ready, compares theirs: ranks that called
// different operations all stop there, before writing any result, with
// control[3] = the first differing peer + 1 and control[2] = 1 (the lane
// would otherwise fold mismatched counts into a wrong result, silently).
// A peer's word is read only after its "ready" of this operation, and no
// peer writes the next operation's before this one's last phase.
//
// LL (algo 3, a staged all-reduce, small messages): NCCL's low-latency
// protocol. Every 4 bytes of this rank's input go out as one 8-byte line
// {data, (u32)epoch}, a single store the GPU makes whole (an aligned 8-byte
// access is single-copy atomic), so a peer that reads a line whose flag is
// this epoch has its data: no fence and no "ready" round. The lines live in
// the LL region after the flag area (the lane's flag area holds it;
// nothing else is ever written there): block b owns two slots of
// SNCL_DIRECT_LL_BLOCK_BYTES of lines plus two header lines, one per
// parity of its epoch. Epochs are per block (derived from block b's own
// counter), and a block's lines depend on the grid, so slots are per
// block: block b's slot is only ever written by block b of its rank and
// read by block b of the peers, in block b's epoch sequence.
// - No wait before writing: block b writes its slot of parity e & 1 at
//   epoch e; the peers last read it at e - 2. Block b's epoch e - 1 (in an
//   earlier kernel, so finished) read each peer's lines of e - 1 or waited
//   for its "ready" of e - 1, written by a kernel of the peer launched
//   after the one that ran its epoch e - 2. An LL operation does not wait
//   for its peers' reads at its end ("read", 4e + 3, is raised for the
//   counters' sake): nothing but LL touches the slots.
// - No stale line carries this epoch's flag: a slot holds zeros (the region
//   is zeroed when the lane opens) or lines of earlier LL epochs of its
//   block, and block b clears both its slots in any staged operation whose
//   epochs reach a multiple of 2^30 (at its end, once every peer has read
//   everything: they are all in that operation then). An LL call whose
//   epoch is such a multiple runs one-shot staged instead. So every line
//   is younger than 2^30 + (rounds of one operation) epochs and its (u32)
//   flag differs from this epoch's: the counters wrap 2^32 safely.
// - Block b's header lines (after its lines in the slot) carry the call's
//   fingerprint, checked before any data line is read. A peer whose block b
//   runs another staged operation at this epoch writes none and raises
//   "ready" (4e + 1); this block then raises its own (its fingerprint word
//   is published) so that the peer's check finds the mismatch as well. A
//   call that takes LL on one rank only (another count, another grid) meets
//   no peer and ends at the host's deadline.
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
#define SNCL_DIRECT_LL_BLOCK_BYTES 16384
// One LL slot: SNCL_DIRECT_LL_BLOCK_BYTES of lines, then 2 header lines.
#define SNCL_DIRECT_LL_SLOT_BYTES (SNCL_DIRECT_LL_BLOCK_BYTES + 16)
// Epochs at multiples of this clear the LL slots (see "LL").
#define SNCL_DIRECT_LL_REFRESH (1ULL << 30)

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
  int algo;  // 1 one-shot, 2 two-shot, 3 LL (staged all-reduce; see "LL")
  int in_place;
  // Staged (the kernel path's lane): the kernel copies `source` (count
  // elements of this rank's memory) into inputs[rank] round by round and
  // writes the result to `result` (this rank's memory, `source` allowed);
  // inputs[] are the lane buffers of `chunk` elements, two-shot publishes
  // its reduced slice in inputs[rank] and outputs[] are unused. Null: the
  // buffers are the operation's own (windows).
  const void* source;
  void* result;
  // Elements per round (staged: at most the lane's, a whole number of
  // 16-byte packs; 0: the whole count in one round). Round k runs epoch
  // epoch + k: a staged launch spans ceil(count / chunk) epochs.
  unsigned long long chunk;
  // Staged only: which collective (SNCL_DIRECT_COLL_*; `algo` matters for
  // all-reduce only) and the root of broadcast, reduce, gather and
  // scatter. `count` is then the elements of one rank's piece: all-gather
  // and gather read `count` and write nranks * count (gather: the root
  // only), reduce-scatter and scatter read nranks * count (scatter: the
  // root only) and write `count`, all-to-all reads and writes nranks *
  // count, broadcast and reduce read and write `count`. A collective with
  // a side of nranks pieces to share (reduce-scatter, all-to-all,
  // scatter) runs rounds of `chunk` elements of every piece: the lane
  // holds nranks * chunk.
  int coll;
  int root;
  // Staged only: the call's fingerprint (see "Fingerprints"; 0: no check).
  unsigned long long fingerprint;
};

#define SNCL_DIRECT_COLL_ALL_REDUCE 0
#define SNCL_DIRECT_COLL_ALL_GATHER 1
#define SNCL_DIRECT_COLL_REDUCE_SCATTER 2
#define SNCL_DIRECT_COLL_BROADCAST 3
#define SNCL_DIRECT_COLL_REDUCE 4
#define SNCL_DIRECT_COLL_ALL_TO_ALL 5
#define SNCL_DIRECT_COLL_GATHER 6
#define SNCL_DIRECT_COLL_SCATTER 7

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
               : "l"(p)
               : "memory");
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

// Every 256th spin of a wait on `peer`: true once the host aborted
// (control[1] then names the peer, control[2] is set); from 4096 spins
// control[1] names the peer as the one waited on long (*said: the waiter
// clears it once the wait ends).
__device__ __forceinline__ bool sncl_spin_aborted(const SnclDirectArgs& a, int peer,
                                                  unsigned long long spins, bool* said) {
  if ((spins & 255) != 0) return false;
  if (sncl_word_load(a.control) != 0) {
    sncl_word_store(a.control + 1, (unsigned int)peer + 1);
    sncl_word_store(a.control + 2, 1);
    return true;
  }
  if (!*said && spins >= 4096) {
    sncl_word_store(a.control + 1, (unsigned int)peer + 1);
    *said = true;
  }
  return false;
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
      if (sncl_spin_aborted(a, p, ++spins, &said)) return p + 1;
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

// Staged, after the first "ready" of an operation: the whole block learns
// whether every peer's block wrote this block's fingerprint (false in
// every thread where one differs: control[3] names it, control[2] is set).
__device__ __forceinline__ bool sncl_direct_same_op(const SnclDirectArgs& a, int* gave_up) {
  SNCL_EACH_THREAD {
    if (threadIdx.x == 0 && a.fingerprint != 0) {
      for (int p = 0; p < a.nranks; ++p) {
        if (p == a.rank) continue;
        if (sncl_flag_load(a.flags[p] + SNCL_DIRECT_MAX_BLOCKS + blockIdx.x) != a.fingerprint) {
          sncl_word_store(a.control + 3, (unsigned int)p + 1);
          sncl_word_store(a.control + 2, 1);
          *gave_up = p + 1;
          break;
        }
      }
    }
  }
  __syncthreads();
  return *gave_up == 0;
}

// ---- Folds -------------------------------------------------------------------

// 16 bytes at `p`, which need not be aligned (a staged operation's source
// and result, a lane's piece of an odd length): element by element then,
// each load bypassing L1 as for the peers' data. The host shim copies
// unaligned packs with memcpy: a compiler may merge the two branches'
// plain loads into one and keep the aligned branch's 16-byte alignment.
template <typename T>
__device__ __forceinline__ uint4 sncl_load_pack_any(const void* p, bool aligned) {
  if (aligned) return sncl_load_pack(static_cast<const uint4*>(p));
  SnclDirectPack<T> v;
#ifdef SNCL_HOST_EMU
  __builtin_memcpy(&v, p, sizeof(v));
#else
  SNCL_UNROLL
  for (int e = 0; e < (int)(sizeof(uint4) / sizeof(T)); ++e) {
    v.e[e] = sncl_load_elem(static_cast<const T*>(p) + e);
  }
#endif
  return v.u;
}
template <typename T>
__device__ __forceinline__ void sncl_store_pack_any(void* p, uint4 u, bool aligned) {
  if (aligned) {
    *static_cast<uint4*>(p) = u;
    return;
  }
  SnclDirectPack<T> v;
  v.u = u;
#ifdef SNCL_HOST_EMU
  __builtin_memcpy(p, &v, sizeof(v));
#else
  SNCL_UNROLL
  for (int e = 0; e < (int)(sizeof(uint4) / sizeof(T)); ++e) static_cast<T*>(p)[e] = v.e[e];
#endif
}

__device__ __forceinline__ bool sncl_aligned16(const void* p) {
  return ((unsigned long long)p & 15) == 0;
}

// This block's share of elements [lo, hi): dst[i] = src[0][i] op ... op
// src[n-1][i] (n = 1: a copy), also into dst2[i] where dst2 is not null.
//
// Who touches an element depends only on its position in the lane,
// `base + i`, never on the range or the pointers: 16-byte pack
// P = (base + i) / kPack belongs to block P / blockDim % gridDim (thread
// P % blockDim of it). So a copy into a lane and every later read of the
// same lane position fall to the same block whatever the rounds' and
// slices' lengths, and block b only ever waits on block b of its peers:
// a block that passed "everyone has read my lane" for its positions may
// overwrite them in the next round while other blocks still work. A pack
// the range covers whole, at a pointer that is 16-byte aligned there, is
// moved as one 16-byte access; the rest element by element (`packed`
// false: everything).
template <typename Op>
__device__ __forceinline__ void sncl_direct_fold(const void* const* srcs, int n, void* dst,
                                                 void* dst2, unsigned long long lo,
                                                 unsigned long long hi, bool packed,
                                                 unsigned long long base) {
  typedef typename Op::T T;
  typedef typename Op::Acc Acc;
  typedef typename Acc::A A;
  const unsigned long long kPack = sizeof(uint4) / sizeof(T);
  if (hi <= lo) return;
  const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  // A pointer is aligned at every pack boundary of the lane where it is
  // aligned at lane position 0 (`base` elements before the range's base).
  const unsigned long long shift = base * sizeof(T);
  bool src_aligned = packed;
  for (int s = 0; s < n; ++s) {
    src_aligned = src_aligned && sncl_aligned16(static_cast<const char*>(srcs[s]) - shift);
  }
  const bool dst_aligned = packed && sncl_aligned16(static_cast<char*>(dst) - shift);
  const bool dst2_aligned =
      packed && dst2 != nullptr && sncl_aligned16(static_cast<char*>(dst2) - shift);
  const unsigned long long p_lo = (base + lo) / kPack;
  const unsigned long long p_hi = (base + hi + kPack - 1) / kPack;
  // This thread's packs: P = first (mod stride), from p_lo.
  for (unsigned long long p = p_lo + (first + stride - p_lo % stride) % stride; p < p_hi;
       p += stride) {
    const unsigned long long at = p * kPack;  // lane position of the pack
    const unsigned long long e_lo = at > base + lo ? at - base : lo;
    const unsigned long long e_hi = at + kPack - base < hi ? at + kPack - base : hi;
    if (e_hi - e_lo == kPack) {
      const unsigned long long off = e_lo * sizeof(T);
      SnclDirectPack<T> out, v;
      if (n > 1) {
        // Every source's loads are issued before the fold (they overlap
        // in flight; the fold waits for each in turn). The fold runs in
        // the accumulator type (f32 for 16- and 8-bit floats), rounded
        // once at the end; a copy (n = 1) moves bits.
        uint4 loaded[SNCL_DIRECT_MAX_RANKS] = {};
        SNCL_UNROLL
        for (int s = 0; s < SNCL_DIRECT_MAX_RANKS; ++s) {
          if (s < n) {
            loaded[s] = sncl_load_pack_any<T>(static_cast<const char*>(srcs[s]) + off, src_aligned);
          }
        }
        out.u = loaded[0];
        A acc[kPack];
        SNCL_UNROLL
        for (int e = 0; e < (int)kPack; ++e) acc[e] = Acc::widen(out.e[e]);
        SNCL_UNROLL
        for (int s = 1; s < SNCL_DIRECT_MAX_RANKS; ++s) {
          if (s >= n) break;
          v.u = loaded[s];
          SNCL_UNROLL
          for (int e = 0; e < (int)kPack; ++e) acc[e] = Op::combine(acc[e], Acc::widen(v.e[e]));
        }
        SNCL_UNROLL
        for (int e = 0; e < (int)kPack; ++e) out.e[e] = Acc::narrow(acc[e]);
      } else {
        out.u = sncl_load_pack_any<T>(static_cast<const char*>(srcs[0]) + off, src_aligned);
      }
      sncl_store_pack_any<T>(static_cast<char*>(dst) + off, out.u, dst_aligned);
      if (dst2 != nullptr) {
        sncl_store_pack_any<T>(static_cast<char*>(dst2) + off, out.u, dst2_aligned);
      }
      continue;
    }
    for (unsigned long long i = e_lo; i < e_hi; ++i) {
      T out = sncl_load_elem(static_cast<const T*>(srcs[0]) + i);
      if (n > 1) {
        A acc = Acc::widen(out);
        for (int s = 1; s < n; ++s) {
          acc = Op::combine(acc, Acc::widen(sncl_load_elem(static_cast<const T*>(srcs[s]) + i)));
        }
        out = Acc::narrow(acc);
      }
      static_cast<T*>(dst)[i] = out;
      if (dst2 != nullptr) static_cast<T*>(dst2)[i] = out;
    }
  }
}

// Whether every buffer the peers share is 16-byte aligned (the inputs,
// outputs and scratch as every rank sees them; a staged operation's own
// source and result do not count: they are read and written alike
// whatever their alignment, see sncl_direct_fold).
__device__ __forceinline__ bool sncl_direct_packed(const SnclDirectArgs& a) {
  unsigned long long bits = (unsigned long long)a.scratch;
  for (int r = 0; r < a.nranks; ++r) {
    bits |= (unsigned long long)a.inputs[r] | (unsigned long long)a.outputs[r];
  }
  return (bits & 15) == 0;
}

// Two-shot's slice of a round of `count` elements: rank r's is
// [r * slice, min(count, (r + 1) * slice)), slice a whole number of packs.
template <typename T>
__device__ __forceinline__ unsigned long long sncl_direct_slice(const SnclDirectArgs& a,
                                                                unsigned long long count) {
  const unsigned long long kPack = sizeof(uint4) / sizeof(T);
  const unsigned long long per = (count + a.nranks - 1) / a.nranks;
  return (per + kPack - 1) / kPack * kPack;
}

// Rank q's two-shot slice of a round of `count` elements, as [*lo, *hi).
template <typename T>
__device__ __forceinline__ void sncl_direct_slice_of(const SnclDirectArgs& a,
                                                     unsigned long long count, int q,
                                                     unsigned long long* lo,
                                                     unsigned long long* hi) {
  const unsigned long long slice = sncl_direct_slice<T>(a, count);
  *lo = slice * q < count ? slice * q : count;
  *hi = *lo + slice < count ? *lo + slice : count;
}

// Whether a staged collective shares a side of nranks pieces: a round
// then holds a share of every piece, piece q at lane position q * n.
__device__ __forceinline__ bool sncl_direct_pieces(int coll) {
  return coll == SNCL_DIRECT_COLL_REDUCE_SCATTER || coll == SNCL_DIRECT_COLL_ALL_TO_ALL ||
         coll == SNCL_DIRECT_COLL_SCATTER;
}

// One round of a staged collective other than all-reduce (see
// SnclDirectArgs::coll): elements [base, base + n) of every piece. Lane
// positions are owned by blocks as in sncl_direct_staged_round (piece q of
// a round sits at lane position q * n where the collective has pieces), so
// block b's "ready" covers what block b of any peer reads. The caller then
// raises and awaits "everyone has read my lane".
template <typename Op>
__device__ __forceinline__ bool sncl_direct_staged_other(const SnclDirectArgs& a,
                                                         unsigned long long base,
                                                         unsigned long long n,
                                                         unsigned long long e4, bool first,
                                                         int* gave_up) {
  typedef typename Op::T T;
  const int me = a.rank;
  const int coll = a.coll;
  const T* source = static_cast<const T*>(a.source);
  T* result = static_cast<T*>(a.result);
  T* lane = static_cast<T*>(const_cast<void*>(a.inputs[me]));
  const unsigned long long count = a.count;
  // Into this rank's lane: its pieces (every rank's but a scatter's
  // non-roots), else its one piece (every rank's but a broadcast's
  // non-roots).
  if (sncl_direct_pieces(coll)) {
    if (coll != SNCL_DIRECT_COLL_SCATTER || me == a.root) {
      for (int q = 0; q < a.nranks; ++q) {
        const void* from[1] = {source + q * count + base};
        SNCL_EACH_THREAD {
          sncl_direct_fold<Op>(from, 1, lane + q * n, nullptr, 0, n, true, q * n);
        }
      }
    }
  } else if (coll != SNCL_DIRECT_COLL_BROADCAST || me == a.root) {
    const void* from[1] = {source + base};
    SNCL_EACH_THREAD { sncl_direct_fold<Op>(from, 1, lane, nullptr, 0, n, true, 0); }
  }
  sncl_direct_raise(a, e4 + 1);
  if (!sncl_direct_wait(a, e4 + 1, gave_up)) return false;
  if (first && !sncl_direct_same_op(a, gave_up)) return false;
  if (coll == SNCL_DIRECT_COLL_ALL_GATHER || (coll == SNCL_DIRECT_COLL_GATHER && me == a.root)) {
    for (int q = 0; q < a.nranks; ++q) {
      const void* from[1] = {a.inputs[q]};
      SNCL_EACH_THREAD {
        sncl_direct_fold<Op>(from, 1, result + q * count + base, nullptr, 0, n, true, 0);
      }
    }
  } else if (coll == SNCL_DIRECT_COLL_ALL_TO_ALL) {
    // Piece `me` of every rank's lane lands in result piece q.
    for (int q = 0; q < a.nranks; ++q) {
      const void* from[1] = {static_cast<const T*>(a.inputs[q]) + me * n};
      SNCL_EACH_THREAD {
        sncl_direct_fold<Op>(from, 1, result + q * count + base, nullptr, 0, n, true, me * n);
      }
    }
  } else if (coll == SNCL_DIRECT_COLL_SCATTER) {
    const void* from[1] = {static_cast<const T*>(a.inputs[a.root]) + me * n};
    SNCL_EACH_THREAD {
      sncl_direct_fold<Op>(from, 1, result + base, nullptr, 0, n, true, me * n);
    }
  } else if (coll == SNCL_DIRECT_COLL_REDUCE_SCATTER) {
    const void* from[SNCL_DIRECT_MAX_RANKS];
    for (int p = 0; p < a.nranks; ++p) from[p] = static_cast<const T*>(a.inputs[p]) + me * n;
    SNCL_EACH_THREAD {
      sncl_direct_fold<Op>(from, a.nranks, result + base, nullptr, 0, n, true, me * n);
    }
  } else if (coll == SNCL_DIRECT_COLL_BROADCAST) {
    const void* from[1] = {a.inputs[a.root]};
    if (me != a.root || a.result != a.source) {
      SNCL_EACH_THREAD { sncl_direct_fold<Op>(from, 1, result + base, nullptr, 0, n, true, 0); }
    }
  } else if (coll == SNCL_DIRECT_COLL_REDUCE && me == a.root) {
    SNCL_EACH_THREAD { sncl_direct_fold<Op>(a.inputs, a.nranks, result + base, nullptr, 0, n, true, 0); }
  }
  return true;
}

// One round of a staged operation: elements [base, base + n) of the
// source and result go through the lane buffers (inputs[]); epoch e4 / 4.
// Lane position i holds element base + i, and who copies it in is who
// reads it in every rank (sncl_direct_fold), so block b's "my input is
// ready" covers everything block b of any peer reads. Two-shot folds slice
// r into the result and back into this rank's lane (where no peer reads
// slice r: its own slice), whence the peers copy it. The last wait
// ("everyone has read my lane") lets the next round or operation
// overwrite this block's lane positions.
template <typename Op>
__device__ __forceinline__ bool sncl_direct_staged_round(const SnclDirectArgs& a,
                                                         unsigned long long base,
                                                         unsigned long long n,
                                                         unsigned long long e4, bool first,
                                                         int* gave_up) {
  typedef typename Op::T T;
  const int me = a.rank;
  const void* src[1] = {static_cast<const T*>(a.source) + base};
  T* result = static_cast<T*>(a.result) + base;
  void* lane = const_cast<void*>(a.inputs[me]);
  if (a.coll != SNCL_DIRECT_COLL_ALL_REDUCE) {
    if (!sncl_direct_staged_other<Op>(a, base, n, e4, first, gave_up)) return false;
  } else {
    SNCL_EACH_THREAD { sncl_direct_fold<Op>(src, 1, lane, nullptr, 0, n, true, 0); }
    sncl_direct_raise(a, e4 + 1);
    if (!sncl_direct_wait(a, e4 + 1, gave_up)) return false;
    if (first && !sncl_direct_same_op(a, gave_up)) return false;
    if (a.algo != 2) {  // one-shot (LL at a refresh epoch too)
      SNCL_EACH_THREAD {
        sncl_direct_fold<Op>(a.inputs, a.nranks, result, nullptr, 0, n, true, 0);
      }
    } else {
      unsigned long long lo, hi;
      sncl_direct_slice_of<T>(a, n, me, &lo, &hi);
      SNCL_EACH_THREAD { sncl_direct_fold<Op>(a.inputs, a.nranks, result, lane, lo, hi, true, 0); }
      sncl_direct_raise(a, e4 + 2);
      if (!sncl_direct_wait(a, e4 + 2, gave_up)) return false;
      for (int q = 0; q < a.nranks; ++q) {
        if (q == me) continue;
        sncl_direct_slice_of<T>(a, n, q, &lo, &hi);
        const void* from[1] = {a.inputs[q]};
        SNCL_EACH_THREAD { sncl_direct_fold<Op>(from, 1, result, nullptr, lo, hi, true, 0); }
      }
    }
  }
  sncl_direct_raise(a, e4 + 3);
  return sncl_direct_wait(a, e4 + 3, gave_up);
}

// ---- LL ------------------------------------------------------------------------

#ifdef SNCL_HOST_EMU
__device__ __forceinline__ void sncl_ll_store(unsigned long long* p, unsigned long long v) {
  __atomic_store_n(p, v, __ATOMIC_RELAXED);
}
__device__ __forceinline__ unsigned long long sncl_ll_load(const unsigned long long* p) {
  return __atomic_load_n(p, __ATOMIC_RELAXED);
}
#else
// One 8-byte access each (data and flag travel together); volatile: a
// peer writes the line during this kernel.
__device__ __forceinline__ void sncl_ll_store(unsigned long long* p, unsigned long long v) {
  *(volatile unsigned long long*)p = v;
}
__device__ __forceinline__ unsigned long long sncl_ll_load(const unsigned long long* p) {
  return *(const volatile unsigned long long*)p;
}
#endif

__device__ __forceinline__ unsigned long long sncl_ll_line(unsigned int data, unsigned int flag) {
  return ((unsigned long long)flag << 32) | data;
}

// Rank q's LL slot of this block for `epoch` (by its parity): lines, then
// the 2 header lines at SNCL_DIRECT_LL_BLOCK_BYTES.
__device__ __forceinline__ unsigned long long* sncl_ll_slot(const SnclDirectArgs& a, int q,
                                                           unsigned long long epoch) {
  char* region = reinterpret_cast<char*>(a.flags[q] + 2 * SNCL_DIRECT_MAX_BLOCKS);
  return reinterpret_cast<unsigned long long*>(
      region + (2ULL * blockIdx.x + (epoch & 1)) * SNCL_DIRECT_LL_SLOT_BYTES);
}

// Whether a call at `epoch` may run LL (else one-shot staged, which clears
// the slots: see "LL").
__device__ __forceinline__ bool sncl_ll_epoch(unsigned long long epoch) {
  return (epoch & (SNCL_DIRECT_LL_REFRESH - 1)) != 0;
}

// Clears both of this block's LL slots (this rank's). Only once every peer
// has read everything of this block's (the end of a staged operation).
__device__ __forceinline__ void sncl_ll_clear(const SnclDirectArgs& a) {
  unsigned long long* slots = sncl_ll_slot(a, a.rank, 0);
  const unsigned long long words = 2ULL * SNCL_DIRECT_LL_SLOT_BYTES / 8;
  SNCL_EACH_THREAD {
    for (unsigned long long w = threadIdx.x; w < words; w += blockDim.x) sncl_ll_store(slots + w, 0);
  }
}

// Waits for `line` of peer `peer` to carry `flag`; its data in *out, or
// false once the host aborted (control words as sncl_direct_spin).
__device__ __forceinline__ bool sncl_ll_wait(const SnclDirectArgs& a,
                                             const unsigned long long* line, unsigned int flag,
                                             int peer, unsigned int* out) {
  unsigned long long spins = 0;
  bool said = false;
  unsigned long long v = sncl_ll_load(line);
  while ((unsigned int)(v >> 32) != flag) {
    if (sncl_spin_aborted(a, peer, ++spins, &said)) return false;
    sncl_pause(spins);
    v = sncl_ll_load(line);
  }
  if (said) sncl_word_store(a.control + 1, 0);
  *out = (unsigned int)v;
  return true;
}

// Pack p (16 bytes) of this rank's source, zero past its `bytes`.
template <typename T>
__device__ __forceinline__ uint4 sncl_ll_source_pack(const SnclDirectArgs& a, unsigned long long p,
                                                     unsigned long long bytes) {
  const char* src = static_cast<const char*>(a.source) + p * 16;
  if ((p + 1) * 16 <= bytes) return sncl_load_pack_any<T>(src, sncl_aligned16(src));
  SnclDirectPack<T> v;
  v.u.x = v.u.y = v.u.z = v.u.w = 0;
  for (unsigned long long e = 0; p * 16 + e * sizeof(T) < bytes; ++e) {
    v.e[e] = sncl_load_elem(reinterpret_cast<const T*>(src) + e);
  }
  return v.u;
}

// Whether peer q's block made this rank's call at `epoch` (its header
// lines, the fingerprint): 0 yes, 1 the host aborted, 2 it made another
// (another fingerprint, or another staged operation: "ready" raised, no
// header lines).
__device__ __forceinline__ int sncl_ll_same_op(const SnclDirectArgs& a, int q,
                                               const unsigned long long* theirs,
                                               unsigned long long epoch) {
  const unsigned int flag = (unsigned int)epoch;
  const unsigned long long* counter = a.flags[q] + blockIdx.x;
  unsigned long long spins = 0;
  bool said = false;
  unsigned long long lo = sncl_ll_load(theirs);
  while ((unsigned int)(lo >> 32) != flag) {
    if (sncl_spin_aborted(a, q, ++spins, &said)) return 1;
    if ((spins & 255) == 0 && sncl_flag_load(counter) >= epoch * 4 + 1) {
      // Its "ready" of this epoch follows its header lines where it runs
      // LL too (a fence between): look once more after a fence.
      sncl_fence_system();
      lo = sncl_ll_load(theirs);
      if ((unsigned int)(lo >> 32) == flag) break;
      if (said) sncl_word_store(a.control + 1, 0);
      return 2;
    }
    sncl_pause(spins);
    lo = sncl_ll_load(theirs);
  }
  if (said) sncl_word_store(a.control + 1, 0);
  unsigned int hi = 0;
  if (!sncl_ll_wait(a, theirs + 1, flag, q, &hi)) return 1;
  const unsigned long long theirs_fp = ((unsigned long long)hi << 32) | (unsigned int)lo;
  return a.fingerprint != 0 && theirs_fp != a.fingerprint ? 2 : 0;
}

// The LL all-reduce (see "LL" above): this block's lines into its slot,
// the peers' fingerprints, then every rank's lines folded in rank order
// into the result, and "read" raised without waiting for the peers'.
// Pack p = blockIdx.x * blockDim.x + t + k * stride is line group
// k * blockDim.x + t of the block's slot (the host checks that they fit).
template <typename Op>
__device__ __forceinline__ void sncl_direct_ll(const SnclDirectArgs& a, unsigned long long epoch,
                                               int* gave_up) {
  typedef typename Op::T T;
  typedef typename Op::Acc Acc;
  typedef typename Acc::A A;
  const unsigned long long kPack = sizeof(uint4) / sizeof(T);
  const int me = a.rank;
  const unsigned int flag = (unsigned int)epoch;
  const unsigned long long header = SNCL_DIRECT_LL_BLOCK_BYTES / 8;
  const unsigned long long bytes = a.count * sizeof(T);
  const unsigned long long packs = (bytes + 15) / 16;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long* mine = sncl_ll_slot(a, me, epoch);
  SNCL_EACH_THREAD {
    unsigned long long line = 4ULL * threadIdx.x;
    for (unsigned long long p = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         p < packs; p += stride, line += 4ULL * blockDim.x) {
      const uint4 v = sncl_ll_source_pack<T>(a, p, bytes);
      sncl_ll_store(mine + line, sncl_ll_line(v.x, flag));
      sncl_ll_store(mine + line + 1, sncl_ll_line(v.y, flag));
      sncl_ll_store(mine + line + 2, sncl_ll_line(v.z, flag));
      sncl_ll_store(mine + line + 3, sncl_ll_line(v.w, flag));
    }
    if (threadIdx.x == 0) {
      sncl_ll_store(mine + header, sncl_ll_line((unsigned int)a.fingerprint, flag));
      sncl_ll_store(mine + header + 1, sncl_ll_line((unsigned int)(a.fingerprint >> 32), flag));
    }
  }
  __syncthreads();
  // Every peer's block made the same call (see "LL": a mismatch raises
  // this block's "ready" so that a staged peer finds it too).
  SNCL_EACH_THREAD {
    if (threadIdx.x == 0) {
      *gave_up = 0;
      for (int q = 0; q < a.nranks && *gave_up == 0; ++q) {
        if (q == me) continue;
        const int seen = sncl_ll_same_op(a, q, sncl_ll_slot(a, q, epoch) + header, epoch);
        if (seen != 0) *gave_up = q + 1;
        if (seen == 2) {
          sncl_word_store(a.control + 3, (unsigned int)q + 1);
          sncl_word_store(a.control + 2, 1);
        }
      }
    }
  }
  __syncthreads();
  if (*gave_up != 0) {
    if (sncl_word_load(a.control + 3) != 0) sncl_direct_raise(a, epoch * 4 + 1);
    return;
  }
  // Every rank's pack p, folded in rank order (this rank's from its source).
  __shared__ int stopped;
  SNCL_EACH_THREAD {
    if (threadIdx.x == 0) stopped = 0;
  }
  __syncthreads();
  SNCL_EACH_THREAD {
    bool ok = true;
    unsigned long long line = 4ULL * threadIdx.x;
    for (unsigned long long p = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         ok && p < packs; p += stride, line += 4ULL * blockDim.x) {
      A acc[kPack] = {};  // rank 0's pack widened first (q == 0 below)
      for (int q = 0; ok && q < a.nranks; ++q) {
        SnclDirectPack<T> v;
        v.u.x = v.u.y = v.u.z = v.u.w = 0;
        if (q == me) {
          v.u = sncl_ll_source_pack<T>(a, p, bytes);
        } else {
          const unsigned long long* lines = sncl_ll_slot(a, q, epoch) + line;
          ok = sncl_ll_wait(a, lines, flag, q, &v.u.x) && sncl_ll_wait(a, lines + 1, flag, q, &v.u.y) &&
               sncl_ll_wait(a, lines + 2, flag, q, &v.u.z) && sncl_ll_wait(a, lines + 3, flag, q, &v.u.w);
          if (!ok) stopped = q + 1;
        }
        SNCL_UNROLL
        for (int e = 0; e < (int)kPack; ++e) {
          acc[e] = q == 0 ? Acc::widen(v.e[e]) : Op::combine(acc[e], Acc::widen(v.e[e]));
        }
      }
      if (!ok) break;
      SnclDirectPack<T> out;
      SNCL_UNROLL
      for (int e = 0; e < (int)kPack; ++e) out.e[e] = Acc::narrow(acc[e]);
      char* dst = static_cast<char*>(a.result) + p * 16;
      if ((p + 1) * 16 <= bytes) {
        sncl_store_pack_any<T>(dst, out.u, sncl_aligned16(dst));
      } else {
        for (unsigned long long e = 0; p * 16 + e * sizeof(T) < bytes; ++e) {
          reinterpret_cast<T*>(dst)[e] = out.e[e];
        }
      }
    }
  }
  __syncthreads();
  if (stopped != 0) {
    *gave_up = stopped;
    return;
  }
  sncl_direct_raise(a, epoch * 4 + 3);
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
  if (a.source != nullptr) {
    // This call's fingerprint, published by the first round's "ready".
    SNCL_EACH_THREAD {
      if (threadIdx.x == 0 && a.fingerprint != 0) {
        sncl_flag_store(a.flags[a.rank] + SNCL_DIRECT_MAX_BLOCKS + blockIdx.x, a.fingerprint);
      }
    }
    if (a.algo == 3 && a.coll == SNCL_DIRECT_COLL_ALL_REDUCE && sncl_ll_epoch(epoch)) {
      sncl_direct_ll<Op>(a, epoch, &gave_up);
      return;
    }
    // Rounds of `chunk` elements (a whole number of packs), one epoch each.
    const unsigned long long per = a.chunk == 0 || a.chunk > a.count ? a.count : a.chunk;
    unsigned long long base = 0, k = 0;
    do {
      const unsigned long long n = a.count - base < per ? a.count - base : per;
      if (!sncl_direct_staged_round<Op>(a, base, n, (epoch + k) * 4, k == 0, &gave_up)) return;
      base += n;
      ++k;
    } while (base < a.count);
    // Epochs epoch .. epoch + k - 1 reached a multiple of the refresh
    // period: every peer is in this operation's last round, done with
    // this block's LL slots (see "LL").
    if ((epoch - 1) / SNCL_DIRECT_LL_REFRESH != (epoch + k - 1) / SNCL_DIRECT_LL_REFRESH) {
      sncl_ll_clear(a);
    }
    return;
  }
  const unsigned long long e4 = epoch * 4;
  const bool packed = sncl_direct_packed(a);
  const int me = a.rank;
  // Inputs ready everywhere.
  sncl_direct_raise(a, e4 + 1);
  if (!sncl_direct_wait(a, e4 + 1, &gave_up)) return;
  if (a.algo == 1) {
    void* dst = a.in_place ? a.scratch : a.outputs[me];
    SNCL_EACH_THREAD { sncl_direct_fold<Op>(a.inputs, a.nranks, dst, nullptr, 0, a.count, packed, 0); }
    // Everyone has read every input: outputs (and, in place, inputs) may
    // be written, and the caller may reuse its input after the kernel.
    sncl_direct_raise(a, e4 + 3);
    if (!sncl_direct_wait(a, e4 + 3, &gave_up)) return;
    if (a.in_place) {
      const void* from[1] = {a.scratch};
      SNCL_EACH_THREAD {
        sncl_direct_fold<Op>(from, 1, a.outputs[me], nullptr, 0, a.count, packed, 0);
      }
    }
    return;
  }
  unsigned long long lo, hi;
  sncl_direct_slice_of<T>(a, a.count, me, &lo, &hi);
  SNCL_EACH_THREAD {
    sncl_direct_fold<Op>(a.inputs, a.nranks, a.outputs[me], nullptr, lo, hi, packed, 0);
  }
  sncl_direct_raise(a, e4 + 2);
  if (!sncl_direct_wait(a, e4 + 2, &gave_up)) return;
  for (int q = 0; q < a.nranks; ++q) {
    if (q == me) continue;
    unsigned long long qlo, qhi;
    sncl_direct_slice_of<T>(a, a.count, q, &qlo, &qhi);
    const void* from[1] = {a.outputs[q]};
    SNCL_EACH_THREAD { sncl_direct_fold<Op>(from, 1, a.outputs[me], nullptr, qlo, qhi, packed, 0); }
  }
  // Everyone has copied every slice: the buffers may be reused.
  sncl_direct_raise(a, e4 + 3);
  (void)sncl_direct_wait(a, e4 + 3, &gave_up);
}

#define SNCL_DIRECT_OPS(X, dt) X(dt, sum) X(dt, prod) X(dt, max) X(dt, min)

// The type a fold accumulates in: f32 for f16, bf16 and fp8 (widened,
// combined as f32, rounded once when the fold ends: NCCL's and the
// symmetric-memory all-reduces' choice, so n ranks' bf16 gradients lose
// one rounding, not n - 1), the element type itself for the others.
#define SNCL_DIRECT_ACC_F32(dt, TO_F32, FROM_F32)                                          \
  struct SnclDirectAcc_##dt {                                                              \
    typedef float A;                                                                       \
    static __device__ __forceinline__ A widen(sncl_##dt##_t v) { return TO_F32(v); }       \
    static __device__ __forceinline__ sncl_##dt##_t narrow(A v) { return FROM_F32(v); }    \
    static __device__ __forceinline__ A sum(A a, A b) { return sncl_float_sum(a, b); }     \
    static __device__ __forceinline__ A prod(A a, A b) { return sncl_float_prod(a, b); }   \
    static __device__ __forceinline__ A max(A a, A b) { return sncl_float_max(a, b); }     \
    static __device__ __forceinline__ A min(A a, A b) { return sncl_float_min(a, b); }     \
  };
#define SNCL_DIRECT_ACC_SAME(dt)                                                           \
  struct SnclDirectAcc_##dt {                                                              \
    typedef sncl_##dt##_t A;                                                               \
    static __device__ __forceinline__ A widen(A v) { return v; }                           \
    static __device__ __forceinline__ A narrow(A v) { return v; }                          \
    static __device__ __forceinline__ A sum(A a, A b) { return sncl_##dt##_sum(a, b); }    \
    static __device__ __forceinline__ A prod(A a, A b) { return sncl_##dt##_prod(a, b); }  \
    static __device__ __forceinline__ A max(A a, A b) { return sncl_##dt##_max(a, b); }    \
    static __device__ __forceinline__ A min(A a, A b) { return sncl_##dt##_min(a, b); }    \
  };
SNCL_DIRECT_ACC_SAME(int8)
SNCL_DIRECT_ACC_SAME(uint8)
SNCL_DIRECT_ACC_SAME(int32)
SNCL_DIRECT_ACC_SAME(uint32)
SNCL_DIRECT_ACC_SAME(int64)
SNCL_DIRECT_ACC_SAME(uint64)
SNCL_DIRECT_ACC_SAME(float)
SNCL_DIRECT_ACC_SAME(double)
SNCL_DIRECT_ACC_F32(half, sncl_h2f, sncl_f2h)
SNCL_DIRECT_ACC_F32(bfloat16, sncl_b2f, sncl_f2b)
SNCL_DIRECT_ACC_F32(f8e4m3, sncl_e4m3_to_f32, sncl_f32_to_e4m3)
SNCL_DIRECT_ACC_F32(f8e5m2, sncl_e5m2_to_f32, sncl_f32_to_e5m2)

#define SNCL_DEFINE_DIRECT_KERNEL(dt, op)                                                  \
  struct SnclDirectOp_##dt##_##op {                                                       \
    typedef sncl_##dt##_t T;                                                              \
    typedef SnclDirectAcc_##dt Acc;                                                       \
    typedef SnclDirectAcc_##dt::A A;                                                      \
    static __device__ __forceinline__ A combine(A a, A b) { return Acc::op(a, b); }       \
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
