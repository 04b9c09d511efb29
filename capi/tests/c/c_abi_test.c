/*
 * One rank of the C ABI test: every collective through sncl.h, checked
 * element by element. tests/c_abi.rs builds it with the system compiler and
 * runs 4 processes with SNCL_RANK, SNCL_WORLD_SIZE, SNCL_ROOT and
 * SNCL_SECRET set, so every rank computes the same unique id itself.
 *
 * Prints "OK rank N" and exits 0 when every check passed; exits non-zero
 * otherwise, saying what differed.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sncl.h"

static int rank, nranks;
static int failures;

#define CHECK(call)                                                            \
  do {                                                                         \
    snclResult_t r_ = (call);                                                  \
    if (r_ != snclSuccess) {                                                   \
      fprintf(stderr, "rank %d: %s:%d: %s returned %d (%s): %s\n", rank,       \
              __FILE__, __LINE__, #call, (int)r_, snclGetErrorString(r_),      \
              snclGetLastError(NULL));                                         \
      exit(2);                                                                 \
    }                                                                          \
  } while (0)

#define EXPECT(cond, ...)                                                      \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "rank %d: %s:%d: ", rank, __FILE__, __LINE__);           \
      fprintf(stderr, __VA_ARGS__);                                            \
      fputc('\n', stderr);                                                     \
      if (++failures > 20) exit(3);                                            \
    }                                                                          \
  } while (0)

/* ---- elements of every type, through doubles (test values are exact) ---- */

static uint16_t f2h(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  if ((x & 0x7fffffff) == 0) return (uint16_t)sign;
  int32_t e = (int32_t)((x >> 23) & 0xff) - 127 + 15;
  return (uint16_t)(sign | ((uint32_t)e << 10) | ((x & 0x7fffff) >> 13));
}

static float h2f(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, x;
  uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0 && m == 0)
    x = sign;
  else
    x = sign | ((e - 15 + 127) << 23) | (m << 13);
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static uint16_t f2b(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  return (uint16_t)(x >> 16);
}

static float b2f(uint16_t b) {
  uint32_t x = (uint32_t)b << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static size_t dsize(snclDataType_t t) {
  switch (t) {
    case snclInt8: case snclUint8: return 1;
    case snclFloat16: case snclBfloat16: return 2;
    case snclInt32: case snclUint32: case snclFloat32: return 4;
    default: return 8;
  }
}

static void put(void *b, size_t i, snclDataType_t t, double v) {
  switch (t) {
    case snclInt8: ((int8_t *)b)[i] = (int8_t)v; break;
    case snclUint8: ((uint8_t *)b)[i] = (uint8_t)v; break;
    case snclInt32: ((int32_t *)b)[i] = (int32_t)v; break;
    case snclUint32: ((uint32_t *)b)[i] = (uint32_t)v; break;
    case snclInt64: ((int64_t *)b)[i] = (int64_t)v; break;
    case snclUint64: ((uint64_t *)b)[i] = (uint64_t)v; break;
    case snclFloat16: ((uint16_t *)b)[i] = f2h((float)v); break;
    case snclFloat32: ((float *)b)[i] = (float)v; break;
    case snclFloat64: ((double *)b)[i] = v; break;
    case snclBfloat16: ((uint16_t *)b)[i] = f2b((float)v); break;
    default: abort();
  }
}

static double get(const void *b, size_t i, snclDataType_t t) {
  switch (t) {
    case snclInt8: return ((const int8_t *)b)[i];
    case snclUint8: return ((const uint8_t *)b)[i];
    case snclInt32: return ((const int32_t *)b)[i];
    case snclUint32: return ((const uint32_t *)b)[i];
    case snclInt64: return (double)((const int64_t *)b)[i];
    case snclUint64: return (double)((const uint64_t *)b)[i];
    case snclFloat16: return h2f(((const uint16_t *)b)[i]);
    case snclFloat32: return ((const float *)b)[i];
    case snclFloat64: return ((const double *)b)[i];
    case snclBfloat16: return b2f(((const uint16_t *)b)[i]);
    default: abort();
  }
}

static int is_float(snclDataType_t t) {
  return t == snclFloat16 || t == snclFloat32 || t == snclFloat64 || t == snclBfloat16;
}

static const char *tname(snclDataType_t t) {
  static const char *n[] = {"int8", "uint8", "int32", "uint32", "int64",
                            "uint64", "half", "float", "double", "bfloat16"};
  return n[t];
}

/* The value rank r contributes at index i: small, so every result is exact. */
static double val(int r, size_t i, int prod) {
  if (prod) return 1 + (double)((r + i) % 2);
  return 1 + (double)((r * 3 + i * 7) % 5);
}

/* The reduction of val over all ranks (op < snclNumOps, or scale for premul). */
static double expect_red(size_t i, snclRedOp_t op, snclDataType_t t, double scale) {
  int prod = op == snclProd;
  double acc = val(0, i, prod);
  for (int r = 1; r < nranks; r++) {
    double v = val(r, i, prod);
    switch (op) {
      case snclProd: acc *= v; break;
      case snclMax: acc = v > acc ? v : acc; break;
      case snclMin: acc = v < acc ? v : acc; break;
      default: acc += v;
    }
  }
  if (op == snclAvg) {
    acc /= nranks;
    if (!is_float(t)) acc = (double)(long long)acc;
  }
  if (op >= snclNumOps) acc *= scale;
  return acc;
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) abort();
  memset(p, 0, n ? n : 1);
  return p;
}

/* ---- the checks ---- */

static void check_all_reduce(snclComm_t comm, snclDataType_t t, snclRedOp_t op,
                             double scale, size_t count, int in_place) {
  size_t es = dsize(t);
  void *send = xmalloc(count * es), *recv = in_place ? send : xmalloc(count * es);
  for (size_t i = 0; i < count; i++) put(send, i, t, val(rank, i, op == snclProd));
  CHECK(snclAllReduce(send, recv, count, t, op, comm, NULL));
  for (size_t i = 0; i < count; i++) {
    double want = expect_red(i, op, t, scale), got = get(recv, i, t);
    EXPECT(got == want, "all_reduce %s op %d count %zu%s: [%zu] = %g, want %g", tname(t),
           (int)op, count, in_place ? " in place" : "", i, got, want);
    if (got != want) break;
  }
  if (!in_place) free(recv);
  free(send);
}

static void check_rooted(snclComm_t comm) {
  const size_t c = 777;
  float *a = xmalloc(c * 4), *b = xmalloc(c * 4);
  /* broadcast from 1, out of place */
  for (size_t i = 0; i < c; i++) a[i] = rank == 1 ? (float)val(1, i, 0) : -1.0f;
  CHECK(snclBroadcast(a, b, c, snclFloat32, 1, comm, NULL));
  for (size_t i = 0; i < c; i++)
    EXPECT(b[i] == (float)val(1, i, 0), "broadcast [%zu] = %g", i, b[i]);
  /* legacy in-place bcast from 2 */
  for (size_t i = 0; i < c; i++) a[i] = rank == 2 ? (float)(i * 2) : 0.0f;
  CHECK(snclBcast(a, c, snclFloat, 2, comm, NULL));
  for (size_t i = 0; i < c; i++) EXPECT(a[i] == (float)(i * 2), "bcast [%zu] = %g", i, a[i]);
  /* reduce to 3 (recvbuff NULL elsewhere), then in place to 0 */
  for (size_t i = 0; i < c; i++) a[i] = (float)val(rank, i, 0);
  CHECK(snclReduce(a, rank == 3 ? b : NULL, c, snclFloat32, snclSum, 3, comm, NULL));
  if (rank == 3)
    for (size_t i = 0; i < c; i++)
      EXPECT(b[i] == (float)expect_red(i, snclSum, snclFloat32, 1), "reduce [%zu] = %g", i, b[i]);
  CHECK(snclReduce(a, a, c, snclFloat32, snclMax, 0, comm, NULL));
  if (rank == 0)
    for (size_t i = 0; i < c; i++)
      EXPECT(a[i] == (float)expect_red(i, snclMax, snclFloat32, 1), "reduce max [%zu] = %g", i, a[i]);
  free(a);
  free(b);
}

static void check_gathers(snclComm_t comm) {
  const size_t c = 301;
  size_t n = (size_t)nranks;
  int32_t *s = xmalloc(n * c * 4), *r = xmalloc(n * c * 4);
  /* all_gather out of place and in place */
  for (size_t i = 0; i < c; i++) s[i] = rank * 1000 + (int32_t)i;
  CHECK(snclAllGather(s, r, c, snclInt32, comm, NULL));
  for (size_t q = 0; q < n; q++)
    for (size_t i = 0; i < c; i++)
      EXPECT(r[q * c + i] == (int32_t)(q * 1000 + i), "all_gather [%zu] = %d", q * c + i, r[q * c + i]);
  memset(r, 0, n * c * 4);
  for (size_t i = 0; i < c; i++) r[rank * c + i] = rank * 1000 + (int32_t)i;
  CHECK(snclAllGather(r + rank * c, r, c, snclInt32, comm, NULL));
  for (size_t q = 0; q < n; q++)
    for (size_t i = 0; i < c; i++)
      EXPECT(r[q * c + i] == (int32_t)(q * 1000 + i), "all_gather in place [%zu] = %d", q * c + i,
             r[q * c + i]);
  /* reduce_scatter out of place and in place */
  for (size_t j = 0; j < n * c; j++) s[j] = (int32_t)val(rank, j, 0);
  CHECK(snclReduceScatter(s, r, c, snclInt32, snclSum, comm, NULL));
  for (size_t i = 0; i < c; i++)
    EXPECT(r[i] == (int32_t)expect_red(rank * c + i, snclSum, snclInt32, 1),
           "reduce_scatter [%zu] = %d", i, r[i]);
  CHECK(snclReduceScatter(s, s + rank * c, c, snclInt32, snclSum, comm, NULL));
  for (size_t i = 0; i < c; i++)
    EXPECT(s[rank * c + i] == (int32_t)expect_red(rank * c + i, snclSum, snclInt32, 1),
           "reduce_scatter in place [%zu] = %d", i, s[rank * c + i]);
  /* alltoall */
  for (size_t j = 0; j < n; j++)
    for (size_t i = 0; i < c; i++) s[j * c + i] = rank * 1000 + (int32_t)(j * 100 + i);
  CHECK(snclAlltoAll(s, r, c, snclInt32, comm, NULL));
  for (size_t q = 0; q < n; q++)
    for (size_t i = 0; i < c; i++)
      EXPECT(r[q * c + i] == (int32_t)(q * 1000 + rank * 100 + i), "alltoall [%zu] = %d",
             q * c + i, r[q * c + i]);
  /* gather to 1, then in place to 2 */
  for (size_t i = 0; i < c; i++) s[i] = rank * 1000 + (int32_t)i;
  memset(r, 0, n * c * 4);
  CHECK(snclGather(s, rank == 1 ? r : NULL, c, snclInt32, 1, comm, NULL));
  if (rank == 1)
    for (size_t j = 0; j < n * c; j++)
      EXPECT(r[j] == (int32_t)((j / c) * 1000 + j % c), "gather [%zu] = %d", j, r[j]);
  memset(r, 0, n * c * 4);
  int32_t *gsend = rank == 2 ? r + 2 * c : s;
  for (size_t i = 0; i < c; i++) gsend[i] = rank * 1000 + (int32_t)i;
  CHECK(snclGather(gsend, r, c, snclInt32, 2, comm, NULL));
  if (rank == 2)
    for (size_t j = 0; j < n * c; j++)
      EXPECT(r[j] == (int32_t)((j / c) * 1000 + j % c), "gather in place [%zu] = %d", j, r[j]);
  /* scatter from 3, then in place from 0 */
  for (size_t j = 0; j < n * c; j++) s[j] = rank == 3 ? (int32_t)((j / c) * 100 + j % c) : -1;
  CHECK(snclScatter(rank == 3 ? s : NULL, r, c, snclInt32, 3, comm, NULL));
  for (size_t i = 0; i < c; i++)
    EXPECT(r[i] == (int32_t)(rank * 100 + i), "scatter [%zu] = %d", i, r[i]);
  for (size_t j = 0; j < n * c; j++) s[j] = rank == 0 ? (int32_t)((j / c) * 100 + j % c) : -1;
  CHECK(snclScatter(s, rank == 0 ? s : r, c, snclInt32, 0, comm, NULL));
  int32_t *got = rank == 0 ? s : r;
  for (size_t i = 0; i < c; i++)
    EXPECT(got[i] == (int32_t)(rank * 100 + i), "scatter in place [%zu] = %d", i, got[i]);
  free(s);
  free(r);
}

static void check_v(snclComm_t comm) {
  size_t n = (size_t)nranks;
  size_t counts[64] = {0}, displs[64] = {0}, total = 0;
  for (size_t q = 0; q < n; q++) {
    counts[q] = q + 1;
    displs[q] = total + q; /* a gap of q elements before each block */
    total += counts[q] + q;
  }
  double *s = xmalloc(counts[rank] * 8), *r = xmalloc(total * 8);
  for (size_t k = 0; k < counts[rank]; k++) s[k] = rank * 10.0 + (double)k;
  for (size_t j = 0; j < total; j++) r[j] = -1;
  CHECK(snclAllGatherV(s, r, counts, displs, snclDouble, comm, NULL));
  for (size_t q = 0; q < n; q++)
    for (size_t k = 0; k < counts[q]; k++)
      EXPECT(r[displs[q] + k] == q * 10.0 + (double)k, "all_gatherv [%zu] = %g", displs[q] + k,
             r[displs[q] + k]);
  free(s);
  free(r);

  size_t sc[64] = {0}, sd[64] = {0}, rc[64] = {0}, rd[64] = {0}, st = 0, rt = 0;
  for (size_t j = 0; j < n; j++) {
    sc[j] = (rank + j) % 3 + 1;
    sd[j] = st;
    st += sc[j];
    rc[j] = (j + rank) % 3 + 1;
    rd[j] = rt;
    rt += rc[j];
  }
  int64_t *a = xmalloc(st * 8), *b = xmalloc(rt * 8);
  for (size_t j = 0; j < n; j++)
    for (size_t k = 0; k < sc[j]; k++) a[sd[j] + k] = rank * 1000 + (int64_t)(j * 100 + k);
  CHECK(snclAlltoAllV(a, sc, sd, b, rc, rd, snclInt64, comm, NULL));
  for (size_t q = 0; q < n; q++)
    for (size_t k = 0; k < rc[q]; k++)
      EXPECT(b[rd[q] + k] == (int64_t)(q * 1000 + rank * 100 + k), "alltoallv [%zu] = %lld",
             rd[q] + k, (long long)b[rd[q] + k]);
  free(a);
  free(b);
}

static void check_p2p_and_groups(snclComm_t comm) {
  const size_t c = 4099;
  int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  float *s = xmalloc(c * 4), *r = xmalloc(c * 4), *self = xmalloc(c * 4);
  for (size_t i = 0; i < c; i++) s[i] = (float)(rank * 10000 + i);
  /* a ring exchange plus a send to itself, in one group */
  CHECK(snclGroupStart());
  CHECK(snclSend(s, c, snclFloat32, next, comm, NULL));
  CHECK(snclRecv(r, c, snclFloat32, prev, comm, NULL));
  CHECK(snclSend(s, c, snclFloat32, rank, comm, NULL));
  CHECK(snclRecv(self, c, snclFloat32, rank, comm, NULL));
  CHECK(snclGroupEnd());
  for (size_t i = 0; i < c; i++) {
    EXPECT(r[i] == (float)(prev * 10000 + i), "ring recv [%zu] = %g", i, r[i]);
    EXPECT(self[i] == s[i], "self recv [%zu] = %g", i, self[i]);
  }
  /* nested groups: two collectives and the exchange the other way */
  int32_t x = rank + 1, y = 10 * (rank + 1);
  CHECK(snclGroupStart());
  CHECK(snclAllReduce(&x, &x, 1, snclInt, snclSum, comm, NULL));
  CHECK(snclGroupStart());
  CHECK(snclAllReduce(&y, &y, 1, snclInt, snclMax, comm, NULL));
  CHECK(snclRecv(r, c, snclFloat32, next, comm, NULL));
  CHECK(snclSend(s, c, snclFloat32, prev, comm, NULL));
  CHECK(snclGroupEnd());
  CHECK(snclGroupEnd());
  EXPECT(x == nranks * (nranks + 1) / 2, "grouped all_reduce sum = %d", x);
  EXPECT(y == 10 * nranks, "grouped all_reduce max = %d", y);
  for (size_t i = 0; i < c; i++)
    EXPECT(r[i] == (float)(next * 10000 + i), "reverse ring recv [%zu] = %g", i, r[i]);
  free(s);
  free(r);
  free(self);
}

static void check_premulsum(snclComm_t comm) {
  const size_t c = 513;
  size_t n = (size_t)nranks;
  /* float, host immediate: the scalar is copied at creation */
  float fs = 0.5f;
  snclRedOp_t fop;
  CHECK(snclRedOpCreatePreMulSum(&fop, &fs, snclFloat32, snclScalarHostImmediate, comm));
  fs = 100.0f;
  check_all_reduce(comm, snclFloat32, fop, 0.5, c, 0);
  check_all_reduce(comm, snclFloat32, fop, 0.5, c, 1);
  /* double, "device" residence: read when the collective runs */
  double ds = 3.0;
  snclRedOp_t dop;
  CHECK(snclRedOpCreatePreMulSum(&dop, &ds, snclFloat64, snclScalarDevice, comm));
  ds = 2.0;
  check_all_reduce(comm, snclFloat64, dop, 2.0, c, 0);
  /* half and int32 through reduce and reduce_scatter */
  uint16_t hs = f2h(2.0f);
  snclRedOp_t hop;
  CHECK(snclRedOpCreatePreMulSum(&hop, &hs, snclHalf, snclScalarHostImmediate, comm));
  check_all_reduce(comm, snclFloat16, hop, 2.0, c, 1);
  int32_t is = 3;
  snclRedOp_t iop;
  CHECK(snclRedOpCreatePreMulSum(&iop, &is, snclInt32, snclScalarHostImmediate, comm));
  int32_t *s = xmalloc(n * c * 4), *r = xmalloc(n * c * 4);
  for (size_t j = 0; j < n * c; j++) s[j] = (int32_t)val(rank, j, 0);
  CHECK(snclReduce(s, r, c, snclInt32, iop, 1, comm, NULL));
  if (rank == 1)
    for (size_t i = 0; i < c; i++)
      EXPECT(r[i] == (int32_t)expect_red(i, iop, snclInt32, 3), "premul reduce [%zu] = %d", i, r[i]);
  CHECK(snclReduceScatter(s, r, c, snclInt32, iop, comm, NULL));
  for (size_t i = 0; i < c; i++)
    EXPECT(r[i] == (int32_t)expect_red(rank * c + i, iop, snclInt32, 3),
           "premul reduce_scatter [%zu] = %d", i, r[i]);
  /* an operator only fits its data type */
  EXPECT(snclAllReduce(s, r, c, snclFloat32, iop, comm, NULL) == snclInvalidArgument,
         "premul with another data type accepted");
  CHECK(snclRedOpDestroy(fop, comm));
  CHECK(snclRedOpDestroy(dop, comm));
  CHECK(snclRedOpDestroy(hop, comm));
  CHECK(snclRedOpDestroy(iop, comm));
  EXPECT(snclRedOpDestroy(iop, comm) == snclInvalidArgument, "double destroy accepted");
  EXPECT(snclAllReduce(s, r, c, snclInt32, iop, comm, NULL) == snclInvalidArgument,
         "destroyed operator accepted");
  free(s);
  free(r);
}

static void check_split(snclComm_t comm) {
  /* even / odd, ranked by descending parent rank */
  snclComm_t sub;
  CHECK(snclCommSplit(comm, rank % 2, -rank, &sub, NULL));
  int members[64], m = 0;
  for (int q = nranks - 1; q >= 0; q--)
    if (q % 2 == rank % 2) members[m++] = q;
  int sr = -1, sn = -1;
  CHECK(snclCommUserRank(sub, &sr));
  CHECK(snclCommCount(sub, &sn));
  EXPECT(sn == m, "split size %d, want %d", sn, m);
  EXPECT(sr >= 0 && sr < m && members[sr] == rank, "split rank %d", sr);
  int64_t x = rank, want = 0;
  for (int k = 0; k < m; k++) want += members[k];
  CHECK(snclAllReduce(&x, &x, 1, snclInt64, snclSum, sub, NULL));
  EXPECT(x == want, "all_reduce on the split communicator = %lld, want %lld", (long long)x,
         (long long)want);

  /* the last rank opts out; the others split non-blocking */
  snclConfig_t cfg = SNCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  cfg.timeoutMs = 60000;
  snclComm_t part = (snclComm_t)&cfg; /* must be overwritten */
  int color = rank == nranks - 1 ? SNCL_SPLIT_NOCOLOR : 7;
  snclResult_t res = snclCommSplit(comm, color, rank, &part, &cfg);
  if (color == SNCL_SPLIT_NOCOLOR) {
    EXPECT(res == snclSuccess, "NOCOLOR split returned %d", (int)res);
    EXPECT(part == NULL, "NOCOLOR split gave a communicator");
  } else {
    EXPECT(res == snclInProgress || res == snclSuccess, "non-blocking split returned %d: %s",
           (int)res, snclGetLastError(NULL));
    snclResult_t state;
    do CHECK(snclCommGetAsyncError(part, &state));
    while (state == snclInProgress);
    EXPECT(state == snclSuccess, "non-blocking split ended with %d: %s", (int)state,
           snclGetLastError(part));
    float f = 1.0f;
    CHECK(snclAllReduce(&f, &f, 1, snclFloat, snclSum, part, NULL));
    EXPECT(f == (float)(nranks - 1), "all_reduce on the partial communicator = %g", f);
    CHECK(snclCommFinalize(part));
    CHECK(snclCommDestroy(part));
  }
  CHECK(snclCommDestroy(sub));
}

static void check_streams(snclComm_t comm) {
  const size_t c = 10007;
  snclStream_t st;
  CHECK(snclStreamCreate(&st));
  float *a = xmalloc(c * 4), *b = xmalloc(c * 4), *s = xmalloc(c * 4), *r = xmalloc(c * 4);
  for (size_t i = 0; i < c; i++) {
    a[i] = (float)val(rank, i, 0);
    s[i] = (float)(rank * 10000 + i);
  }
  /* two dependent operations, then a group, all queued in order */
  CHECK(snclAllReduce(a, a, c, snclFloat32, snclSum, comm, st));
  CHECK(snclBroadcast(a, b, c, snclFloat32, 3, comm, st));
  CHECK(snclGroupStart());
  CHECK(snclSend(s, c, snclFloat32, (rank + 1) % nranks, comm, st));
  CHECK(snclRecv(r, c, snclFloat32, (rank + nranks - 1) % nranks, comm, st));
  CHECK(snclGroupEnd());
  CHECK(snclStreamSynchronize(st));
  EXPECT(snclStreamQuery(st) == snclSuccess, "stream busy after synchronize");
  int prev = (rank + nranks - 1) % nranks;
  for (size_t i = 0; i < c; i++) {
    float want = (float)expect_red(i, snclSum, snclFloat32, 1);
    EXPECT(a[i] == want, "stream all_reduce [%zu] = %g, want %g", i, a[i], want);
    EXPECT(b[i] == want, "stream broadcast [%zu] = %g, want %g", i, b[i], want);
    EXPECT(r[i] == (float)(prev * 10000 + i), "stream recv [%zu] = %g", i, r[i]);
    if (failures) break;
  }
  /* a NULL-stream operation after queued ones runs after them */
  int32_t x = 1;
  CHECK(snclAllReduce(a, a, c, snclFloat32, snclMax, comm, st));
  CHECK(snclAllReduce(&x, &x, 1, snclInt32, snclSum, comm, NULL));
  EXPECT(x == nranks, "all_reduce after queued work = %d", x);
  CHECK(snclStreamSynchronize(st));
  CHECK(snclStreamDestroy(st));
  free(a);
  free(b);
  free(s);
  free(r);
}

/* fp8 (NCCL 2.24's values 10 and 11): every rank contributes 1.0, the sum
 * is the rank count, encoded exactly (up to 4 ranks); max stays 1.0. */
static void check_fp8(snclComm_t comm) {
  int n = 0;
  CHECK(snclCommCount(comm, &n));
  if (n > 4) return;
  static const uint8_t e4m3[] = {0, 0x38, 0x40, 0x44, 0x48};
  static const uint8_t e5m2[] = {0, 0x3C, 0x40, 0x42, 0x44};
  const snclDataType_t types[] = {snclFloat8e4m3, snclFloat8e5m2};
  for (int k = 0; k < 2; k++) {
    const uint8_t *enc = k == 0 ? e4m3 : e5m2;
    uint8_t s[33], r[33];
    memset(s, enc[1], sizeof s);
    CHECK(snclAllReduce(s, r, sizeof s, types[k], snclSum, comm, NULL));
    for (size_t i = 0; i < sizeof r; i++)
      EXPECT(r[i] == enc[n], "fp8 type %d sum element %zu: %#x, expected %#x", (int)types[k], i,
             r[i], enc[n]);
    CHECK(snclAllReduce(s, r, sizeof s, types[k], snclMax, comm, NULL));
    EXPECT(r[0] == enc[1], "fp8 type %d max: %#x", (int)types[k], r[0]);
  }
}

static void check_errors(snclComm_t comm) {
  float f = 0;
  EXPECT(snclAllReduce(&f, &f, 1, (snclDataType_t)99, snclSum, comm, NULL) == snclInvalidArgument,
         "bad datatype accepted");
  EXPECT(strstr(snclGetLastError(NULL), "datatype") != NULL, "last error: %s",
         snclGetLastError(NULL));
  EXPECT(strstr(snclGetLastError(comm), "datatype") != NULL, "comm last error: %s",
         snclGetLastError(comm));
  EXPECT(snclAllReduce(&f, &f, 1, snclFloat, (snclRedOp_t)42, comm, NULL) == snclInvalidArgument,
         "bad operator accepted");
  EXPECT(snclBroadcast(&f, &f, 1, snclFloat, nranks, comm, NULL) == snclInvalidArgument,
         "bad root accepted");
  EXPECT(snclSend(&f, 1, snclFloat, -1, comm, NULL) == snclInvalidArgument, "bad peer accepted");
  EXPECT(snclAllReduce(&f, &f, 1, snclFloat, snclSum, NULL, NULL) == snclInvalidArgument,
         "NULL comm accepted");
  EXPECT(snclGroupEnd() == snclInvalidUsage, "unmatched snclGroupEnd accepted");
  EXPECT(strcmp(snclGetErrorString(snclSuccess), "no error") == 0, "success string");
  EXPECT(strlen(snclGetErrorString(snclInvalidArgument)) > 0, "error string");
  EXPECT(strcmp(snclGetErrorString((snclResult_t)1234), "unknown result code") == 0,
         "unknown string");
  snclResult_t state;
  CHECK(snclCommGetAsyncError(comm, &state));
  EXPECT(state == snclSuccess, "async error %d", (int)state);
}

/* Buffer registration on host memory (snclCommRegister): a hint, checked
 * and tracked; destroy releases what is left registered. */
static void check_registration(snclComm_t comm) {
  const size_t n = 1000;
  float *b = (float *)xmalloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) b[i] = (float)(rank + 1);
  void *handle = NULL, *other = NULL, *kept = NULL;
  CHECK(snclCommRegister(comm, b, n * sizeof(float), &handle));
  CHECK(snclCommRegister(comm, b + 10, 40, &other)); /* overlapping is allowed */
  EXPECT(handle != NULL && other != NULL && handle != other, "registration handles");
  CHECK(snclAllReduce(b, b, n, snclFloat, snclSum, comm, NULL));
  const float want = (float)(nranks * (nranks + 1) / 2);
  for (size_t i = 0; i < n; i++)
    EXPECT(b[i] == want, "registered all_reduce [%zu] = %g, expected %g", i, b[i], want);
  EXPECT(snclCommRegister(comm, NULL, 8, &kept) == snclInvalidArgument, "NULL buff accepted");
  EXPECT(snclCommRegister(comm, b, 0, &kept) == snclInvalidArgument, "size 0 accepted");
  EXPECT(snclCommRegister(comm, b, 8, NULL) == snclInvalidArgument, "NULL handle accepted");
  CHECK(snclCommDeregister(comm, handle));
  EXPECT(snclCommDeregister(comm, handle) == snclInvalidArgument, "deregistered twice");
  EXPECT(strstr(snclGetLastError(comm), "not a live registration") != NULL,
         "the last error: %s", snclGetLastError(comm));
  EXPECT(snclCommDeregister(comm, NULL) == snclInvalidArgument, "NULL handle deregistered");
  /* a handle is its communicator's only */
  snclComm_t sub = NULL;
  CHECK(snclCommSplit(comm, 0, rank, &sub, NULL));
  EXPECT(snclCommDeregister(sub, other) == snclInvalidArgument,
         "another communicator's registration deregistered");
  /* Right after the split, as NCCL allows: rank 0's store stays until
     every rank has finished creating the communicator. */
  CHECK(snclCommDestroy(sub));
  /* `other` stays registered: snclCommDestroy releases it */
  CHECK(snclCommRegister(comm, b, 64, &kept));
  CHECK(snclCommDeregister(comm, kept));
  free(b);
}

/* Per-call settings (snclCollConfig_t): each call's algorithm, chunk and
   tag; settings that do not apply fail alike on every rank before anything
   is sent, and the communicator goes on. */
static void check_coll_config(snclComm_t comm) {
  enum { c = 4099 };
  float *s = malloc(c * sizeof(float)), *r = malloc(c * sizeof(float));
  int *gi = malloc(c * sizeof(int)), *g = malloc((size_t)c * nranks * sizeof(int));
  for (int i = 0; i < c; i++) {
    s[i] = (float)((i + rank) % 5);
    gi[i] = rank * 10000 + i;
  }
  const char *algos[] = {"ring", "tree", "rd", "flat-ring", NULL};
  for (int a = 0; a < 5; a++) {
    snclCollConfig_t cc = SNCL_COLL_CONFIG_INITIALIZER;
    cc.algorithm = algos[a];
    cc.chunkBytes = a == 1 ? 1024 : 0;
    cc.userTag = 100 + (uint64_t)a;
    CHECK(snclAllReduceConfig(s, r, c, snclFloat32, snclSum, comm, NULL, &cc));
    for (int i = 0; i < c; i++) {
      float want = 0;
      for (int q = 0; q < nranks; q++) want += (float)((i + q) % 5);
      if (r[i] != want) {
        EXPECT(0, "all_reduce with %s: elem %d is %g, want %g", algos[a] ? algos[a] : "NULL", i,
               r[i], want);
        break;
      }
    }
  }
  CHECK(snclAllReduceConfig(s, r, c, snclFloat32, snclSum, comm, NULL, NULL));
  snclCollConfig_t flat = SNCL_COLL_CONFIG_INITIALIZER;
  flat.algorithm = "flat-ring";
  flat.userTag = 7;
  CHECK(snclAllGatherConfig(gi, g, c, snclInt32, comm, NULL, &flat));
  for (int q = 0; q < nranks; q++)
    EXPECT(g[(size_t)q * c + 17] == q * 10000 + 17, "all_gather block %d", q);
  CHECK(snclReduceScatterConfig(g, gi, c, snclInt32, snclSum, comm, NULL, &flat));
  EXPECT(gi[17] == nranks * (rank * 10000 + 17), "reduce_scatter with flat-ring: %d", gi[17]);
  snclCollConfig_t chain = SNCL_COLL_CONFIG_INITIALIZER;
  chain.algorithm = "ring";
  chain.chunkBytes = 512;
  float b = rank == 1 ? 42.0f : 0.0f;
  CHECK(snclBroadcastConfig(&b, &b, 1, snclFloat32, 1, comm, NULL, &chain));
  EXPECT(b == 42.0f, "broadcast with ring: %g", b);
  float x = (float)rank, sum = 0;
  CHECK(snclReduceConfig(&x, &sum, 1, snclFloat32, snclSum, 0, comm, NULL, &chain));
  if (rank == 0) EXPECT(sum == (float)(nranks * (nranks - 1) / 2), "reduce with ring: %g", sum);
  snclCollConfig_t pairwise = SNCL_COLL_CONFIG_INITIALIZER;
  pairwise.algorithm = "pairwise";
  CHECK(snclAlltoAllConfig(gi, g, 1, snclInt32, comm, NULL, &pairwise));

  /* Settings that do not apply. */
  snclCollConfig_t bad = SNCL_COLL_CONFIG_INITIALIZER;
  bad.algorithm = "tree";
  EXPECT(snclAlltoAllConfig(gi, g, 1, snclInt32, comm, NULL, &bad) == snclInvalidArgument,
         "alltoall with tree accepted");
  EXPECT(strstr(snclGetLastError(comm), "alltoall has no tree") != NULL, "error: %s",
         snclGetLastError(comm));
  bad.algorithm = "sideways";
  EXPECT(snclAllReduceConfig(s, r, c, snclFloat32, snclSum, comm, NULL, &bad) ==
             snclInvalidArgument,
         "unknown algorithm accepted");
  bad.algorithm = NULL;
  bad.protocol = "Simple";
  EXPECT(snclAllReduceConfig(s, r, c, snclFloat32, snclSum, comm, NULL, &bad) ==
             snclInvalidArgument,
         "protocol on host memory accepted");
  EXPECT(strstr(snclGetLastError(comm), "host memory") != NULL, "error: %s",
         snclGetLastError(comm));
  bad.protocol = "LL9";
  EXPECT(snclAllReduceConfig(s, r, c, snclFloat32, snclSum, comm, NULL, &bad) ==
             snclInvalidArgument,
         "unknown protocol accepted");
  bad.protocol = NULL;
  bad.maxCTAs = 2;
  EXPECT(snclAllReduceConfig(s, r, c, snclFloat32, snclSum, comm, NULL, &bad) ==
             snclInvalidArgument,
         "maxCTAs on host memory accepted");
  EXPECT(strstr(snclGetLastError(comm), "CTAs apply to device memory") != NULL, "error: %s",
         snclGetLastError(comm));
  bad.maxCTAs = -1;
  EXPECT(snclAllReduceConfig(s, r, c, snclFloat32, snclSum, comm, NULL, &bad) ==
             snclInvalidArgument,
         "negative maxCTAs accepted");
  {
    uint64_t named = 0, again = 0, previous = 1;
    CHECK(snclTagOfName("backward/bucket 3", &named));
    CHECK(snclTagOfName("backward/bucket 3", &again));
    EXPECT(named != 0 && named == again, "snclTagOfName: %llx, %llx",
           (unsigned long long)named, (unsigned long long)again);
    CHECK(snclSetThreadTag(named, &previous));
    EXPECT(previous == 0, "thread tag before: %llx", (unsigned long long)previous);
    CHECK(snclGetThreadTag(&again));
    EXPECT(again == named, "snclGetThreadTag: %llx", (unsigned long long)again);
    CHECK(snclSetThreadTag(0, NULL));
  }
  snclCollConfig_t zeroed;
  memset(&zeroed, 0, sizeof zeroed);
  EXPECT(snclAllReduceConfig(s, r, c, snclFloat32, snclSum, comm, NULL, &zeroed) ==
             snclInvalidArgument,
         "uninitialized snclCollConfig_t accepted");
  /* Nothing was sent: the next all-reduce matches on every rank. */
  r[3] = -1.0f;
  CHECK(snclAllReduce(s, r, c, snclFloat32, snclSum, comm, NULL));
  {
    float want = 0;
    for (int q = 0; q < nranks; q++) want += (float)((3 + q) % 5);
    EXPECT(r[3] == want, "all_reduce after the errors: %g, want %g", r[3], want);
  }
  free(s);
  free(r);
  free(gi);
  free(g);
}

int main(void) {
  const char *r = getenv("SNCL_RANK"), *n = getenv("SNCL_WORLD_SIZE");
  if (!r || !n) {
    fprintf(stderr, "set SNCL_RANK, SNCL_WORLD_SIZE, SNCL_ROOT and SNCL_SECRET\n");
    return 1;
  }
  rank = atoi(r);
  nranks = atoi(n);
  if (nranks < 2 || nranks > 64) {
    fprintf(stderr, "SNCL_WORLD_SIZE must be 2..64\n");
    return 1;
  }

  int version = 0;
  CHECK(snclGetVersion(&version));
  EXPECT(version == SNCL_VERSION_CODE, "version %d", version);
  EXPECT(SNCL_VERSION_CODE == SNCL_VERSION(SNCL_MAJOR, SNCL_MINOR, SNCL_PATCH), "version macro");
  /* the NCCL API version sncl mirrors: a renamed NCCL version guard picks
     the path written for NCCL 2.19 and later (registration, fp8 ...) */
#if SNCL_VERSION_CODE >= SNCL_VERSION(2, 19, 0)
  EXPECT(strlen(SNCL_RELEASE) > 0, "SNCL_RELEASE");
#else
  EXPECT(0, "SNCL_VERSION_CODE %d is below NCCL 2.19's", SNCL_VERSION_CODE);
#endif

  /* SNCL_ROOT and SNCL_SECRET are set: every rank computes the same id. */
  snclUniqueId id;
  CHECK(snclGetUniqueId(&id));
  snclConfig_t cfg = SNCL_CONFIG_INITIALIZER;
  cfg.blocking = 1;
  cfg.timeoutMs = 60000;
  snclComm_t comm;
  CHECK(snclCommInitRankConfig(&comm, nranks, id, rank, &cfg));
  int cr = -1, cn = -1;
  CHECK(snclCommUserRank(comm, &cr));
  CHECK(snclCommCount(comm, &cn));
  EXPECT(cr == rank && cn == nranks, "rank %d of %d", cr, cn);

  const snclDataType_t types[] = {snclInt8,   snclUint8,   snclInt32,   snclUint32,
                                  snclInt64,  snclUint64,  snclFloat16, snclFloat32,
                                  snclFloat64, snclBfloat16};
  for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
    check_all_reduce(comm, types[k], snclSum, 1, 1000, 0);
    check_all_reduce(comm, types[k], snclAvg, 1, 333, 1);
  }
  const snclRedOp_t ops[] = {snclSum, snclProd, snclMax, snclMin, snclAvg};
  const snclDataType_t some[] = {snclInt8, snclInt32, snclUint64, snclHalf, snclFloat,
                                 snclDouble, snclBfloat16};
  for (size_t o = 0; o < 5; o++)
    for (size_t k = 0; k < sizeof some / sizeof some[0]; k++)
      check_all_reduce(comm, some[k], ops[o], 1, 257, o % 2);
  check_all_reduce(comm, snclFloat32, snclSum, 1, 300007, 0);
  check_all_reduce(comm, snclInt32, snclSum, 1, 0, 0);

  check_rooted(comm);
  check_gathers(comm);
  check_v(comm);
  check_p2p_and_groups(comm);
  check_premulsum(comm);
  check_split(comm);
  check_streams(comm);
  check_fp8(comm);
  check_registration(comm);
  check_coll_config(comm);
  check_errors(comm);

  /* end in step, then release */
  CHECK(snclBarrier(comm, NULL));
  CHECK(snclCommFinalize(comm));
  CHECK(snclCommDestroy(comm));
  if (failures) {
    fprintf(stderr, "rank %d: %d check(s) failed\n", rank, failures);
    return 1;
  }
  printf("OK rank %d\n", rank);
  return 0;
}
