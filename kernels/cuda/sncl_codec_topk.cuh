// sncl_codec_topk.cuh: the top-k kernels of sncl_codec.cu (exact and
// sampled selection, compaction, validated decode). Included once, by
// sncl_codec.cu, after its primitives and SnclCodecArgs; see its header for
// the ABI and the host-shim rules.
#ifndef SNCL_CODEC_TOPK_CUH
#define SNCL_CODEC_TOPK_CUH

// ---- top-k: radix select, sampled threshold, compaction ---------------------
//
// One state machine in the workspace drives both selections; every top-k
// kernel runs only in the modes of its launch's `when` mask (0: always), so
// a plan is a fixed launch sequence and every decision stays on the device.
// The steps that need every block's work (summing the histogram copies and
// picking a digit, scanning the chunk counts, the decisions) run in the
// last block of a launch to finish: each block takes a ticket
// (SNCL_TS_TICKET) after a fence; the one that draws gridDim.x - 1 does
// them and puts the ticket back to 0. So a radix select is 4 launches of
// topk_hist and a count one launch of topk_count:
//
//   exact:   topk_init, 4 x topk_hist, topk_count, topk_write        (7)
//   sampled: topk_init, topk_sample, 4 x topk_hist (SAMPLE), topk_count
//            (SAMPLE), 4 x topk_hist (A, B), topk_count (RECOUNT), 4 x
//            topk_hist (EXACT), topk_count (EXACT), topk_write       (18)
//
// A launch whose modes are not the current one returns at once in every
// block (the mode changes only in the last block's steps).
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
// (global atomics on a few hot bins would otherwise serialise), then the
// last block adds the copies into copy 0 and clears the others.
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
#define SNCL_TS_TICKET 11 // blocks of the running launch done so far

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

// The state (thread 0; param = k, rank = the sample rank j (sampled),
// flags & SNCL_CODEC_SAMPLED) and every histogram copy cleared (one thread
// per bin).
SNCL_CODEC_KERNEL(topk_init) {
  SnclTopkWork w = sncl_topk_work(a);
  for (unsigned long long i = sncl_codec_first(); i < 256 * SNCL_TOPK_HCOPIES;
       i += sncl_codec_stride())
    w.hist[i] = 0;
  if (!sncl_codec_single()) return;
  for (int i = 0; i < 16; ++i) w.state[i] = 0;
  if (a.flags & SNCL_CODEC_SAMPLED) {
    w.state[SNCL_TS_MODE] = SNCL_TM_SAMPLE;
    sncl_topk_select(w, a.rank);
  } else {
    sncl_topk_exact(w, a.param);
  }
}

// Block kernels' tail: whether this block is the launch's last to finish
// (uniform in the block). Every thread fences its global writes first, so
// the last block sees every block's.
__device__ __forceinline__ bool sncl_topk_last(SnclTopkWork& w, int* sh_last) {
  sncl_codec_fence();
  __syncthreads();
  SNCL_EACH_THREAD {
    if (threadIdx.x == 0) {
      *sh_last = sncl_codec_ticket(&w.state[SNCL_TS_TICKET]) == gridDim.x - 1ull;
    }
  }
  __syncthreads();
  const bool last = *sh_last != 0;
  if (last) sncl_codec_fence();
  return last;
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

// The digit of the wanted key (copy 0 of the histogram, summed), which
// is cleared for the next pass (sncl_topk_after_select's caller).
__device__ __forceinline__ void sncl_topk_pick(const SnclCodecArgs& a, SnclTopkWork& w) {
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

__device__ void sncl_topk_ctl_select(SnclTopkWork& w);
__device__ void sncl_topk_ctl_second(const SnclCodecArgs& a, SnclTopkWork& w);

// Block kernel: histogram of digit `pass` (bits 24-8*pass .. +8) of the
// keys that match the prefix so far: every key (EXACT), the sample
// (SAMPLE, B), or the keys >= t before p (A). The last block then sums the
// copies into copy 0 (one thread per bin), picks the digit, and after pass
// 3 takes the selection's decision: the compaction threshold (EXACT,
// SAMPLE) or the second threshold's (A, B).
SNCL_CODEC_KERNEL(topk_hist) {
  __shared__ int sh_last;
  const float* s = (const float*)a.src[0];
  SnclTopkWork w = sncl_topk_work(a);
  // Uniform in the launch; the block limit is the callers'.
  if (!sncl_topk_on(a, w) || blockDim.x > SNCL_CODEC_BLOCK_THREADS) return;
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
  SNCL_EACH_THREAD {
    for (unsigned long long i = sncl_codec_first(); i < end; i += sncl_codec_stride()) {
      const unsigned int key = sample ? w.sample[i] : sncl_codec_key(s[i]);
      if ((mode != SNCL_TM_A || key >= t) && (key & mask) == prefix)
        sncl_codec_atomic_add(&hist[(key >> shift) & 255u], 1);
    }
  }
  if (!sncl_topk_last(w, &sh_last)) return;
  SNCL_EACH_THREAD {
    for (unsigned int b = threadIdx.x; b < 256; b += blockDim.x) {
      // Other blocks' counts: read past this SM's L1.
      volatile unsigned long long* h = w.hist;
      unsigned long long sum = h[b];
      for (unsigned long long c = 1; c < SNCL_TOPK_HCOPIES; ++c) {
        sum += h[256 * c + b];
        h[256 * c + b] = 0;
      }
      h[b] = sum;
    }
  }
  __syncthreads();
  SNCL_EACH_THREAD {
    if (threadIdx.x == 0) {
      sncl_topk_pick(a, w);
      if (a.pass == 3) {
        if (mode == SNCL_TM_A || mode == SNCL_TM_B) {
          sncl_topk_ctl_second(a, w);
        } else {
          sncl_topk_ctl_select(w);
        }
      }
      w.state[SNCL_TS_TICKET] = 0;
    }
  }
}

// After the selection of the sample's j-th largest (SAMPLE) or of the exact
// k-th largest (EXACT): the compaction threshold.
__device__ void sncl_topk_ctl_select(SnclTopkWork& w) {
  const unsigned long long t = w.state[SNCL_TS_PREFIX];
  w.state[SNCL_TS_THR] = t;
  if (w.state[SNCL_TS_MODE] == SNCL_TM_EXACT) {
    w.state[SNCL_TS_TIES] = w.state[SNCL_TS_WANT];
  } else {
    w.state[SNCL_TS_T] = t;
  }
}

__device__ void sncl_topk_ctl_count(const SnclCodecArgs& a, SnclTopkWork& w);
__device__ void sncl_topk_ctl_recount(const SnclCodecArgs& a, SnclTopkWork& w);

// Block kernel: one thread per chunk: EXACT counts keys above THR and
// equal to it; the other modes count keys >= THR (eq stays 0). The last
// block then scans: one thread per group of chunks (exclusive scan of the
// group's counts in place, the group's totals to ggt/geq), then thread 0
// the group totals (n / 65536 of them; the total count to TOTAL) and takes
// the count's decision (SAMPLE, RECOUNT).
SNCL_CODEC_KERNEL(topk_count) {
  __shared__ int sh_last;
  const float* s = (const float*)a.src[0];
  SnclTopkWork w = sncl_topk_work(a);
  // Uniform in the launch; the block limit is the callers'.
  if (!sncl_topk_on(a, w) || blockDim.x > SNCL_CODEC_BLOCK_THREADS) return;
  const unsigned int t = (unsigned int)w.state[SNCL_TS_THR];
  const unsigned int mode = (unsigned int)w.state[SNCL_TS_MODE];
  const bool exact = mode == SNCL_TM_EXACT;
  SNCL_EACH_THREAD {
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
  if (!sncl_topk_last(w, &sh_last)) return;
  SNCL_EACH_THREAD {
    // Other blocks' counts: read past this SM's L1.
    volatile unsigned int* cgt = w.gt;
    volatile unsigned int* ceq = w.eq;
    for (unsigned long long g = threadIdx.x; g < w.ngroups; g += blockDim.x) {
      const unsigned long long lo = g * SNCL_TOPK_GROUP;
      const unsigned long long hi =
          lo + SNCL_TOPK_GROUP < w.nchunks ? lo + SNCL_TOPK_GROUP : w.nchunks;
      unsigned int gt = 0, eq = 0;
      for (unsigned long long c = lo; c < hi; ++c) {
        const unsigned int cg = cgt[c], ce = ceq[c];
        cgt[c] = gt;
        ceq[c] = eq;
        gt += cg;
        eq += ce;
      }
      w.ggt[g] = gt;
      w.geq[g] = eq;
    }
  }
  __syncthreads();
  SNCL_EACH_THREAD {
    if (threadIdx.x == 0) {
      unsigned int gt = 0, eq = 0;
      for (unsigned long long g = 0; g < w.ngroups; ++g) {
        const unsigned int cg = w.ggt[g], ce = w.geq[g];
        w.ggt[g] = gt;
        w.geq[g] = eq;
        gt += cg;
        eq += ce;
      }
      w.state[SNCL_TS_TOTAL] = gt;
      if (mode == SNCL_TM_SAMPLE) {
        sncl_topk_ctl_count(a, w);
      } else if (mode == SNCL_TM_RECOUNT) {
        sncl_topk_ctl_recount(a, w);
      }
      w.state[SNCL_TS_TICKET] = 0;
    }
  }
}

// SAMPLE, after counting c = #keys >= t: keep them, go exact, or prepare
// the second threshold (A or B). rank = j, enc_len = runs (sample 16 m).
__device__ void sncl_topk_ctl_count(const SnclCodecArgs& a, SnclTopkWork& w) {
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
__device__ void sncl_topk_ctl_second(const SnclCodecArgs& a, SnclTopkWork& w) {
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
__device__ void sncl_topk_ctl_recount(const SnclCodecArgs& a, SnclTopkWork& w) {
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

#endif  // SNCL_CODEC_TOPK_CUH
