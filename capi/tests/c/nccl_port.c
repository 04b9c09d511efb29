/*
 * NCCL's "one device per process" example, ported to sncl by replacing the
 * nccl prefix with sncl (and NCCL with SNCL) and nothing else: the CUDA
 * stream goes to the operations as in NCCL. tests/c_abi.rs compiles it as
 * C and as C++ with -Wall -Wextra -Werror against include/sncl.h and a
 * stand-in for cuda_runtime.h (tests/c/cuda_stub); it is not linked there.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_runtime.h"
#include "sncl.h"

#define CUDACHECK(cmd)                                                         \
  do {                                                                         \
    cudaError_t e = cmd;                                                       \
    if (e != cudaSuccess) {                                                    \
      printf("Failed: Cuda error %s:%d '%s'\n", __FILE__, __LINE__,            \
             cudaGetErrorString(e));                                           \
      exit(EXIT_FAILURE);                                                      \
    }                                                                          \
  } while (0)

#define SNCLCHECK(cmd)                                                         \
  do {                                                                         \
    snclResult_t r = cmd;                                                      \
    if (r != snclSuccess) {                                                    \
      printf("Failed, SNCL error %s:%d '%s'\n", __FILE__, __LINE__,            \
             snclGetErrorString(r));                                           \
      exit(EXIT_FAILURE);                                                      \
    }                                                                          \
  } while (0)

static int run(int myRank, int nRanks, int localRank, snclUniqueId id) {
  int size = 32 * 1024 * 1024;
  float *sendbuff, *recvbuff;
  cudaStream_t s;

  CUDACHECK(cudaSetDevice(localRank));
  CUDACHECK(cudaMalloc((void **)&sendbuff, size * sizeof(float)));
  CUDACHECK(cudaMalloc((void **)&recvbuff, size * sizeof(float)));
  CUDACHECK(cudaMemset(sendbuff, 1, size * sizeof(float)));
  CUDACHECK(cudaStreamCreate(&s));

  snclComm_t comm;
  SNCLCHECK(snclCommInitRank(&comm, nRanks, id, myRank));

  /* collectives on the application's CUDA stream, as with NCCL */
  SNCLCHECK(snclAllReduce((const void *)sendbuff, (void *)recvbuff, size, snclFloat, snclSum,
                          comm, s));
  SNCLCHECK(snclBroadcast(sendbuff, recvbuff, size, snclFloat, 0, comm, s));
  SNCLCHECK(snclReduceScatter(sendbuff, recvbuff, size / nRanks, snclFloat, snclAvg, comm, s));
  SNCLCHECK(snclAllGather(sendbuff, recvbuff, size / nRanks, snclFloat, comm, s));
  SNCLCHECK(snclGroupStart());
  SNCLCHECK(snclSend(sendbuff, size, snclFloat, (myRank + 1) % nRanks, comm, s));
  SNCLCHECK(snclRecv(recvbuff, size, snclFloat, (myRank + nRanks - 1) % nRanks, comm, s));
  SNCLCHECK(snclGroupEnd());

  /* a driver-API stream converts the same way */
  CUstream cu = s;
  SNCLCHECK(snclBcast(recvbuff, size, snclFloat, 0, comm, cu));
  /* and so does the default stream */
  SNCLCHECK(snclAllReduce(sendbuff, recvbuff, size, snclFloat, snclMax, comm, 0));

  void *buf = NULL;
  SNCLCHECK(snclMemAlloc(&buf, 1 << 20));
#if SNCL_VERSION_CODE >= SNCL_VERSION(2, 19, 0)
  /* user buffer registration, behind NCCL's usual version guard */
  void *handle = NULL;
  SNCLCHECK(snclCommRegister(comm, buf, 1 << 20, &handle));
  SNCLCHECK(snclCommDeregister(comm, handle));
#endif
  SNCLCHECK(snclMemFree(buf));

  CUDACHECK(cudaStreamSynchronize(s));
  snclResult_t async;
  SNCLCHECK(snclCommGetAsyncError(comm, &async));
  CUDACHECK(cudaFree(sendbuff));
  CUDACHECK(cudaFree(recvbuff));
  CUDACHECK(cudaStreamDestroy(s));
  SNCLCHECK(snclCommFinalize(comm));
  SNCLCHECK(snclCommDestroy(comm));
  printf("[MPI Rank %d] Success\n", myRank);
  return async == snclSuccess ? 0 : 1;
}

int main(int argc, char *argv[]) {
  int myRank = argc > 1 ? atoi(argv[1]) : 0, nRanks = argc > 2 ? atoi(argv[2]) : 1;
  snclUniqueId id;
  memset(&id, 0, sizeof id); /* NCCL's example broadcasts it with MPI */
  if (myRank == 0) SNCLCHECK(snclGetUniqueId(&id));
  return run(myRank, nRanks, myRank, id);
}
