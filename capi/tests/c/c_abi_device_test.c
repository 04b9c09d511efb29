/*
 * One rank of the C ABI test on device memory, on the emulated device
 * (snclSetDeviceBackend("emu")): collectives on buffers from snclMemAlloc,
 * on the NULL stream (the device's default stream) and on a device stream,
 * plus the errors of the device path. tests/c_abi.rs runs it as 2+
 * processes with SNCL_RANK, SNCL_WORLD_SIZE, SNCL_ROOT and SNCL_SECRET set.
 *
 * Prints "OK rank N" and exits 0 when every check passed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sncl.h"

static int rank, nranks;
static int failures;
/* Running on the CUDA backend (SNCL_TEST_C_BACKEND=cuda) rather than the emulated one. */
static int on_cuda;

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

/* A call that must fail with `code` and a last error containing `text`. */
#define EXPECT_ERROR(call, code, text)                                         \
  do {                                                                         \
    snclResult_t r_ = (call);                                                  \
    const char *m_ = snclGetLastError(NULL);                                   \
    EXPECT(r_ == (code) && strstr(m_, (text)) != NULL,                         \
           "%s returned %d, expected %d with \"%s\": %s", #call, (int)r_,      \
           (int)(code), (text), m_);                                           \
  } while (0)

/* Device copies of host data and back. */
static void *to_device(const void *host, size_t bytes) {
  void *d = NULL;
  CHECK(snclMemAlloc(&d, bytes));
  if (host) CHECK(snclMemcpy(d, host, bytes));
  return d;
}

static float *from_device(const void *dev, size_t n) {
  float *h = malloc(n * sizeof(float) + 1);
  if (!h) exit(4);
  CHECK(snclMemcpy(h, dev, n * sizeof(float)));
  return h;
}

/* Rank r's element i. */
static float val(int r, size_t i) { return (float)((r + 1) * 10 + (int)(i % 7)); }

static float sum_of(size_t i) {
  float s = 0;
  for (int r = 0; r < nranks; r++) s += val(r, i);
  return s;
}

static float *mine(size_t n) {
  float *h = malloc(n * sizeof(float) + 1);
  if (!h) exit(4);
  for (size_t i = 0; i < n; i++) h[i] = val(rank, i);
  return h;
}

static void check_all_reduce(snclComm_t comm, snclStream_t stream, size_t n, int in_place) {
  float *h = mine(n);
  void *send = to_device(h, n * sizeof(float));
  void *recv = in_place ? send : to_device(NULL, n * sizeof(float));
  CHECK(snclAllReduce(send, recv, n, snclFloat, snclSum, comm, stream));
  CHECK(snclStreamSynchronize(stream));
  float *out = from_device(recv, n);
  for (size_t i = 0; i < n; i++)
    EXPECT(out[i] == sum_of(i), "all_reduce n=%zu in_place=%d [%zu] = %g, expected %g", n,
           in_place, i, out[i], sum_of(i));
  free(out);
  free(h);
  if (!in_place) CHECK(snclMemFree(recv));
  CHECK(snclMemFree(send));
}

static void check_int_avg_and_max(snclComm_t comm) {
  const size_t n = 1000;
  int h[1000], out[1000];
  for (size_t i = 0; i < n; i++) h[i] = rank * 4 + (int)i;
  void *d = to_device(h, sizeof h);
  CHECK(snclAllReduce(d, d, n, snclInt32, snclMax, comm, NULL));
  CHECK(snclMemcpy(out, d, sizeof out)); /* after the NULL-stream operation */
  for (size_t i = 0; i < n; i++)
    EXPECT(out[i] == (nranks - 1) * 4 + (int)i, "max [%zu] = %d", i, out[i]);
  CHECK(snclMemcpy(d, h, sizeof h));
  CHECK(snclAllReduce(d, d, n, snclInt32, snclAvg, comm, NULL));
  CHECK(snclMemcpy(out, d, sizeof out));
  for (size_t i = 0; i < n; i++) {
    int s = 0;
    for (int r = 0; r < nranks; r++) s += r * 4 + (int)i;
    EXPECT(out[i] == s / nranks, "avg [%zu] = %d, expected %d", i, out[i], s / nranks);
  }
  CHECK(snclMemFree(d));
}

static void check_gather_scatter(snclComm_t comm, snclStream_t stream) {
  const size_t n = 513;
  float *h = mine(n);
  /* all_gather: block r of recv is rank r's data */
  void *send = to_device(h, n * sizeof(float));
  void *all = to_device(NULL, nranks * n * sizeof(float));
  CHECK(snclAllGather(send, all, n, snclFloat, comm, stream));
  CHECK(snclStreamSynchronize(stream));
  float *out = from_device(all, nranks * n);
  for (int r = 0; r < nranks; r++)
    for (size_t i = 0; i < n; i++)
      EXPECT(out[r * n + i] == val(r, i), "all_gather [%d][%zu] = %g", r, i, out[r * n + i]);
  free(out);
  /* reduce_scatter of the gathered blocks, each scaled by its block index:
   * block b summed over ranks = nranks * val(b, i) */
  CHECK(snclReduceScatter(all, send, n, snclFloat, snclSum, comm, stream));
  CHECK(snclStreamSynchronize(stream));
  out = from_device(send, n);
  for (size_t i = 0; i < n; i++)
    EXPECT(out[i] == nranks * val(rank, i), "reduce_scatter [%zu] = %g, expected %g", i, out[i],
           nranks * val(rank, i));
  free(out);
  CHECK(snclMemFree(all));
  CHECK(snclMemFree(send));
  free(h);
}

static void check_rooted(snclComm_t comm, snclStream_t stream) {
  const size_t n = 777;
  int root = nranks - 1;
  float *h = mine(n);
  void *d = to_device(h, n * sizeof(float));
  CHECK(snclBroadcast(d, d, n, snclFloat, root, comm, stream));
  CHECK(snclStreamSynchronize(stream));
  float *out = from_device(d, n);
  for (size_t i = 0; i < n; i++)
    EXPECT(out[i] == val(root, i), "broadcast [%zu] = %g", i, out[i]);
  free(out);
  CHECK(snclMemcpy(d, h, n * sizeof(float)));
  void *r = to_device(NULL, n * sizeof(float));
  CHECK(snclReduce(d, rank == 0 ? r : NULL, n, snclFloat, snclSum, 0, comm, NULL));
  if (rank == 0) {
    out = from_device(r, n);
    for (size_t i = 0; i < n; i++)
      EXPECT(out[i] == sum_of(i), "reduce [%zu] = %g, expected %g", i, out[i], sum_of(i));
    free(out);
  }
  CHECK(snclMemFree(r));
  CHECK(snclMemFree(d));
  free(h);
}

/* Errors of the device path: all local (rejected before anything is sent),
 * so the ranks stay in step and the communicator stays usable. */
static void check_errors(snclComm_t comm) {
  const size_t n = 16;
  float host[16] = {0};
  void *d = to_device(host, sizeof host);

  snclStream_t hs;
  CHECK(snclStreamCreate(&hs));
  EXPECT_ERROR(snclAllReduce(d, d, n, snclFloat, snclSum, comm, hs), snclInvalidUsage,
               "host stream");
  CHECK(snclStreamDestroy(hs));

  /* host buffers with a handle that is not a sncl host stream */
  EXPECT_ERROR(snclAllReduce(host, host, n, snclFloat, snclSum, comm, (snclStream_t)0x1234),
               snclInvalidArgument, "host memory");
  /* mixed host and device buffers */
  EXPECT_ERROR(snclAllReduce(d, host, n, snclFloat, snclSum, comm, NULL), snclInvalidArgument,
               "host memory");

  /* a device pointer of another device than the communicator's (the
   * emulated backend has any number of devices; a one-GPU machine has
   * one) */
  if (!on_cuda) {
    void *other = NULL;
    CHECK(snclSetDevice(1));
    CHECK(snclMemAlloc(&other, sizeof host));
    snclStream_t s1;
    CHECK(snclDeviceStreamCreate(&s1));
    CHECK(snclSetDevice(0));
    EXPECT_ERROR(snclAllReduce(other, other, n, snclFloat, snclSum, comm, NULL), snclInvalidArgument,
                 "another device");
    /* a stream of another device */
    EXPECT_ERROR(snclAllReduce(d, d, n, snclFloat, snclSum, comm, s1), snclInvalidArgument,
                 "device 1");
    EXPECT_ERROR(snclMemcpy(d, other, sizeof host), snclInvalidArgument, "one device");
    CHECK(snclStreamDestroy(s1));
    CHECK(snclMemFree(other));

    /* a freed pointer (CUDA cannot tell a freed pointer from host memory) */
    void *gone = to_device(host, sizeof host);
    CHECK(snclMemFree(gone));
    EXPECT_ERROR(snclAllReduce(gone, gone, n, snclFloat, snclSum, comm, NULL), snclInvalidArgument,
                 "not live device memory");
    EXPECT_ERROR(snclMemFree(gone), snclInvalidArgument, "snclMemAlloc");
  }

  /* point-to-point on device memory: a peer out of range, a device
     buffer too short for the count (checked against its allocation) */
  EXPECT_ERROR(snclSend(d, n, snclFloat, nranks, comm, NULL), snclInvalidArgument, "peer");
  EXPECT_ERROR(snclRecv(d, n * 1000, snclFloat, (rank + 1) % nranks, comm, NULL),
               snclInvalidArgument, "bytes");
  /* premultiplied sums are not on the device path */
  float two = 2.0f;
  snclRedOp_t premul;
  CHECK(snclRedOpCreatePreMulSum(&premul, &two, snclFloat, snclScalarHostImmediate, comm));
  EXPECT_ERROR(snclAllReduce(d, d, n, snclFloat, premul, comm, NULL), snclInvalidArgument,
               "not supported");
  CHECK(snclRedOpDestroy(premul, comm));
  /* another backend once one is in use */
  EXPECT_ERROR(snclSetDeviceBackend(on_cuda ? "emu" : "cuda"), snclInvalidUsage,
               on_cuda ? "already cuda" : "already emu");
  CHECK(snclMemFree(d));
}

/* Window registration (snclCommWindowRegister, as NCCL 2.27's): all_reduce
 * inside the window, at the same offset on every rank, runs the direct
 * kernel (snclCommDirectCount counts it); outside it, version 1; bad input
 * is refused with a clear error. */
static void check_windows(snclComm_t comm, snclStream_t stream) {
  const size_t n = 5000;
  const size_t bytes = 2 * n * sizeof(float) + 256;
  void *buf = to_device(NULL, bytes);
  snclWindow_t win = NULL, w2 = NULL;
  CHECK(snclCommWindowRegister(comm, buf, bytes, &win, SNCL_WIN_COLL_SYMMETRIC));
  EXPECT(win != NULL, "no window handle");
  uint64_t one0 = 0, two0 = 0, one1 = 0, two1 = 0;
  CHECK(snclCommDirectCount(comm, &one0, &two0));
  float *h = mine(n);
  char *in = (char *)buf + 64, *out = in + n * sizeof(float);
  /* in place, on a device stream */
  CHECK(snclMemcpy(in, h, n * sizeof(float)));
  CHECK(snclAllReduce(in, in, n, snclFloat, snclSum, comm, stream));
  CHECK(snclStreamSynchronize(stream));
  float *got = from_device(in, n);
  for (size_t i = 0; i < n; i++)
    EXPECT(got[i] == sum_of(i), "window all_reduce in place [%zu] = %g, expected %g", i, got[i],
           sum_of(i));
  free(got);
  /* out of place within the window, on the NULL stream */
  CHECK(snclMemcpy(in, h, n * sizeof(float)));
  CHECK(snclAllReduce(in, out, n, snclFloat, snclSum, comm, NULL));
  got = from_device(out, n);
  for (size_t i = 0; i < n; i++)
    EXPECT(got[i] == sum_of(i), "window all_reduce out of place [%zu] = %g, expected %g", i,
           got[i], sum_of(i));
  free(got);
  CHECK(snclCommDirectCount(comm, &one1, &two1));
  EXPECT(one1 + two1 == one0 + two0 + 2, "direct kernels %llu+%llu -> %llu+%llu, expected 2 more",
         (unsigned long long)one0, (unsigned long long)two0, (unsigned long long)one1,
         (unsigned long long)two1);
  /* outside the window: version 1, still right */
  check_all_reduce(comm, stream, 1000, 1);
  CHECK(snclCommDirectCount(comm, &one0, &two0));
  EXPECT(one0 + two0 == one1 + two1, "an all_reduce outside the window ran directly");

  /* bad input: nothing collective happens, the communicator stays usable */
  void *other = to_device(NULL, 4096);
  EXPECT_ERROR(snclCommWindowRegister(comm, other, 0, &w2, SNCL_WIN_DEFAULT), snclInvalidArgument,
               "size is 0");
  EXPECT_ERROR(snclCommWindowRegister(comm, (char *)buf + 128, 64, &w2, SNCL_WIN_DEFAULT),
               snclInvalidArgument, "overlap");
  EXPECT_ERROR(snclCommWindowRegister(comm, (char *)other + 64, 64, &w2, SNCL_WIN_DEFAULT),
               snclInvalidArgument, "not the start");
  EXPECT_ERROR(snclCommWindowRegister(comm, other, 8192, &w2, SNCL_WIN_DEFAULT),
               snclInvalidArgument, "not the start");
  EXPECT_ERROR(snclCommWindowRegister(comm, other, 64, &w2, 7), snclInvalidArgument, "winFlags");
  EXPECT_ERROR(snclCommWindowRegister(comm, other, 64, NULL, SNCL_WIN_DEFAULT),
               snclInvalidArgument, "win is NULL");
  EXPECT_ERROR(snclMemFree(buf), snclInvalidUsage, "snclCommWindowDeregister");
  CHECK(snclCommWindowDeregister(comm, win));
  EXPECT_ERROR(snclCommWindowDeregister(comm, win), snclInvalidArgument, "deregistered already");
  EXPECT(strstr(snclGetLastError(comm), "deregistered already") != NULL,
         "the communicator's last error: %s", snclGetLastError(comm));
  CHECK(snclMemFree(other));
  CHECK(snclMemFree(buf));
  free(h);
}

/* Buffer registration (snclCommRegister, as NCCL's: local, a hint): an
 * operation on a registered buffer is right; a registered snclMemAlloc
 * allocation cannot be freed; handles are checked. */
static void check_registration(snclComm_t comm, snclStream_t stream) {
  const size_t n = 3000;
  void *buf = to_device(NULL, n * sizeof(float));
  void *handle = NULL, *h2 = NULL;
  CHECK(snclCommRegister(comm, buf, n * sizeof(float), &handle));
  EXPECT(handle != NULL, "no registration handle");
  float *h = mine(n);
  CHECK(snclMemcpy(buf, h, n * sizeof(float)));
  CHECK(snclAllReduce(buf, buf, n, snclFloat, snclSum, comm, stream));
  CHECK(snclStreamSynchronize(stream));
  float *got = from_device(buf, n);
  for (size_t i = 0; i < n; i++)
    EXPECT(got[i] == sum_of(i), "registered all_reduce [%zu] = %g, expected %g", i, got[i],
           sum_of(i));
  free(got);
  EXPECT_ERROR(snclCommRegister(comm, buf, n * sizeof(float) + 4096, &h2), snclInvalidArgument,
               "run past the snclMemAlloc allocation");
  EXPECT_ERROR(snclMemFree(buf), snclInvalidUsage, "snclCommDeregister");
  CHECK(snclCommDeregister(comm, handle));
  EXPECT_ERROR(snclCommDeregister(comm, handle), snclInvalidArgument, "not a live registration");
  CHECK(snclMemFree(buf));
  free(h);
}

/* snclSend / snclRecv on device memory: a ring shift in a group (the
 * send and receive progress together), an all-to-all written as a loop of
 * sends and receives with the one to self (PyTorch's all_to_all), and a
 * transfer larger than the staging, on a device stream. */
static void check_send_recv(snclComm_t comm, snclStream_t stream) {
  const size_t n = 300001; /* 1.2 MB: several segments of the staging */
  const int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  float *h = mine(n);
  void *send = to_device(h, n * sizeof(float));
  void *recv = to_device(NULL, n * sizeof(float));
  CHECK(snclGroupStart());
  CHECK(snclSend(send, n, snclFloat, next, comm, stream));
  CHECK(snclRecv(recv, n, snclFloat, prev, comm, stream));
  CHECK(snclGroupEnd());
  CHECK(snclStreamSynchronize(stream));
  float *out = from_device(recv, n);
  for (size_t i = 0; i < n; i++)
    EXPECT(out[i] == val(prev, i), "ring [%zu] = %g, expected %g", i, out[i], val(prev, i));
  free(out);

  const size_t block = 1001;
  float *blocks = malloc(block * nranks * sizeof(float));
  if (!blocks) exit(4);
  for (int p = 0; p < nranks; p++)
    for (size_t i = 0; i < block; i++) blocks[p * block + i] = val(rank, p * 1000 + i);
  void *a2a_send = to_device(blocks, block * nranks * sizeof(float));
  void *a2a_recv = to_device(NULL, block * nranks * sizeof(float));
  CHECK(snclGroupStart());
  for (int p = 0; p < nranks; p++) {
    CHECK(snclSend((char *)a2a_send + p * block * sizeof(float), block, snclFloat, p, comm,
                   stream));
    CHECK(snclRecv((char *)a2a_recv + p * block * sizeof(float), block, snclFloat, p, comm,
                   stream));
  }
  CHECK(snclGroupEnd());
  CHECK(snclStreamSynchronize(stream));
  float *got = from_device(a2a_recv, block * nranks);
  for (int p = 0; p < nranks; p++)
    for (size_t i = 0; i < block; i++)
      EXPECT(got[p * block + i] == val(p, rank * 1000 + i), "alltoall from %d [%zu] = %g", p, i,
             got[p * block + i]);
  free(got);
  free(blocks);
  /* A send to self outside a group cannot complete: refused. */
  EXPECT_ERROR(snclSend(send, 4, snclFloat, rank, comm, stream), snclInvalidArgument,
               "itself");
  /* Two streams for one communicator in one group: refused at the call. */
  snclStream_t other;
  CHECK(snclDeviceStreamCreate(&other));
  CHECK(snclGroupStart());
  CHECK(snclSend(send, 4, snclFloat, next, comm, stream));
  EXPECT_ERROR(snclRecv(recv, 4, snclFloat, prev, comm, other), snclInvalidArgument,
               "one stream");
  CHECK(snclRecv(recv, 4, snclFloat, prev, comm, stream));
  CHECK(snclGroupEnd());
  CHECK(snclStreamSynchronize(stream));
  CHECK(snclStreamDestroy(other));
  CHECK(snclMemFree(a2a_recv));
  CHECK(snclMemFree(a2a_send));
  CHECK(snclMemFree(recv));
  CHECK(snclMemFree(send));
  free(h);
}

/* snclAllGatherV and snclAlltoAllV on device memory (point-to-point groups
 * underneath): uneven blocks with gaps, checked element by element. */
static void check_v_on_device(snclComm_t comm, snclStream_t stream) {
  size_t n = (size_t)nranks;
  size_t counts[8] = {0}, displs[8] = {0}, total = 0;
  for (size_t q = 0; q < n; q++) {
    counts[q] = 1000 * (q + 1) + 1;
    displs[q] = total + 3;
    total += counts[q] + 3;
  }
  float *h = mine(counts[rank]);
  void *s = to_device(h, counts[rank] * sizeof(float));
  void *r = to_device(NULL, total * sizeof(float));
  CHECK(snclAllGatherV(s, r, counts, displs, snclFloat, comm, stream));
  CHECK(snclStreamSynchronize(stream));
  float *out = from_device(r, total);
  for (size_t q = 0; q < n; q++)
    for (size_t k = 0; k < counts[q]; k++)
      EXPECT(out[displs[q] + k] == val((int)q, k), "all_gatherv from %zu [%zu] = %g", q, k,
             out[displs[q] + k]);
  free(out);
  free(h);
  CHECK(snclMemFree(r));
  CHECK(snclMemFree(s));

  size_t sc[8] = {0}, sd[8] = {0}, rc[8] = {0}, rd[8] = {0}, st = 0, rt = 0;
  for (size_t j = 0; j < n; j++) {
    sc[j] = ((size_t)rank + j) % 3 * 500;  /* some blocks are empty */
    sd[j] = st;
    st += sc[j];
    rc[j] = (j + (size_t)rank) % 3 * 500;
    rd[j] = rt;
    rt += rc[j];
  }
  float *a = malloc(st * sizeof(float) + 4);
  if (!a) exit(4);
  for (size_t j = 0; j < n; j++)
    for (size_t k = 0; k < sc[j]; k++) a[sd[j] + k] = val(rank, j * 10000 + k);
  void *da = to_device(a, st * sizeof(float) + 4);
  void *db = to_device(NULL, rt * sizeof(float) + 4);
  CHECK(snclAlltoAllV(da, sc, sd, db, rc, rd, snclFloat, comm, stream));
  CHECK(snclStreamSynchronize(stream));
  float *b = from_device(db, rt);
  for (size_t j = 0; j < n; j++)
    for (size_t k = 0; k < rc[j]; k++)
      EXPECT(b[rd[j] + k] == val((int)j, (size_t)rank * 10000 + k), "alltoallv from %zu [%zu]",
             j, k);
  free(b);
  free(a);
  CHECK(snclMemFree(db));
  CHECK(snclMemFree(da));
}

int main(void) {
  const char *r = getenv("SNCL_RANK"), *n = getenv("SNCL_WORLD_SIZE");
  if (!r || !n) {
    fprintf(stderr, "set SNCL_RANK, SNCL_WORLD_SIZE, SNCL_ROOT and SNCL_SECRET\n");
    return 1;
  }
  rank = atoi(r);
  nranks = atoi(n);
  if (nranks < 2 || nranks > 8) {
    fprintf(stderr, "SNCL_WORLD_SIZE must be 2..8\n");
    return 1;
  }
  /* SNCL_TEST_C_BACKEND=cuda runs the same checks on a GPU (gpu-check). */
  const char *want = getenv("SNCL_TEST_C_BACKEND");
  on_cuda = want && strcmp(want, "cuda") == 0;
  snclResult_t backend = snclSetDeviceBackend(on_cuda ? "cuda" : "emu");
  if (backend != snclSuccess && !on_cuda && strstr(snclGetLastError(NULL), "no `emu` feature")) {
    /* libsncl built without the emulated device (a build of the sncl
     * package alone; the workspace build has it): nothing to test. */
    printf("SKIP rank %d: %s\n", rank, snclGetLastError(NULL));
    return 77;
  }
  CHECK(backend);
  CHECK(snclSetDevice(0));
  int dev = -1;
  CHECK(snclGetDevice(&dev));
  EXPECT(dev == 0, "current device %d", dev);

  snclUniqueId id;
  CHECK(snclGetUniqueId(&id));
  snclConfig_t cfg = SNCL_CONFIG_INITIALIZER;
  cfg.timeoutMs = 60000;
  snclComm_t comm;
  CHECK(snclCommInitRankConfig(&comm, nranks, id, rank, &cfg));

  /* ncclCommCuDevice: the thread's current device before any device
     collective, the bound one after (both device 0 here). */
  int cu_device = -1;
  CHECK(snclCommCuDevice(comm, &cu_device));
  EXPECT(cu_device == 0, "snclCommCuDevice before: %d", cu_device);
  EXPECT(snclCommCuDevice(comm, NULL) == snclInvalidArgument, "NULL device accepted");

  snclStream_t stream;
  CHECK(snclDeviceStreamCreate(&stream));
  check_all_reduce(comm, NULL, 1000, 0);
  cu_device = -1;
  CHECK(snclCommCuDevice(comm, &cu_device));
  EXPECT(cu_device == 0, "snclCommCuDevice after: %d", cu_device);
  check_all_reduce(comm, stream, 1000, 1);
  check_all_reduce(comm, stream, 100003, 0);
  check_all_reduce(comm, NULL, 0, 0);
  check_int_avg_and_max(comm);
  check_gather_scatter(comm, stream);
  check_rooted(comm, stream);
  check_errors(comm);
  check_windows(comm, stream);
  check_registration(comm, stream);
  check_send_recv(comm, stream);
  check_v_on_device(comm, stream);
  /* still usable after the rejected calls */
  check_all_reduce(comm, stream, 4096, 1);

  snclResult_t state = snclInternalError;
  CHECK(snclCommGetAsyncError(comm, &state));
  EXPECT(state == snclSuccess, "async error %d", (int)state);
  CHECK(snclStreamDestroy(stream));
  CHECK(snclCommFinalize(comm));
  CHECK(snclCommDestroy(comm));
  if (failures) {
    fprintf(stderr, "rank %d: %d check(s) failed\n", rank, failures);
    return 1;
  }
  printf("OK rank %d\n", rank);
  return 0;
}
