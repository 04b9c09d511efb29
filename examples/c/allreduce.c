/*
 * A minimal sncl program in C: 4 ranks (processes) all-reduce a vector.
 *
 * Rank 0 makes the unique id and the other ranks inherit it through fork();
 * a real job passes the 128 bytes of snclUniqueId to its ranks out of band
 * (MPI_Bcast, a file), or sets SNCL_ROOT=host:port and SNCL_SECRET=<32 hex
 * digits> on every rank so that each computes the same id itself.
 *
 * Build and run from the repository root:
 *
 *   cargo build
 *   cc -I include examples/c/allreduce.c -L target/debug -lsncl \
 *      -Wl,-rpath,"$PWD/target/debug" -o target/allreduce
 *   target/allreduce 4
 *
 * (Link target/debug/libsncl.a instead for a static binary; it then also
 * needs -lpthread -ldl -lm.)
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sncl.h"

#define CHECK(call)                                                        \
  do {                                                                     \
    snclResult_t r_ = (call);                                              \
    if (r_ != snclSuccess) {                                               \
      fprintf(stderr, "%s failed: %s: %s\n", #call, snclGetErrorString(r_), \
              snclGetLastError(NULL));                                     \
      exit(1);                                                             \
    }                                                                      \
  } while (0)

int main(int argc, char **argv) {
  int nranks = argc > 1 ? atoi(argv[1]) : 4;
  if (nranks < 1) return 2;

  snclUniqueId id;
  CHECK(snclGetUniqueId(&id)); /* rank 0's store will listen at its root */

  int rank = 0;
  for (int r = 1; r < nranks; r++) {
    pid_t pid = fork();
    if (pid < 0) return 2;
    if (pid == 0) {
      rank = r;
      break;
    }
  }

  snclComm_t comm;
  CHECK(snclCommInitRank(&comm, nranks, id, rank));

  enum { N = 1 << 20 };
  float *buf = malloc(N * sizeof(float));
  if (!buf) return 2;
  for (int i = 0; i < N; i++) buf[i] = (float)(rank + 1);

  /* In place (sendbuff == recvbuff); a NULL stream returns when done. */
  CHECK(snclAllReduce(buf, buf, N, snclFloat, snclSum, comm, NULL));

  float want = (float)nranks * (float)(nranks + 1) / 2.0f;
  int bad = 0;
  for (int i = 0; i < N; i++) bad += buf[i] != want;
  printf("rank %d: buf[0] = %g (want %g), %d wrong\n", rank, buf[0], want, bad);

  free(buf);
  CHECK(snclCommDestroy(comm));

  if (rank == 0) {
    int status;
    while (wait(&status) > 0)
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) bad = 1;
  }
  return bad != 0;
}
