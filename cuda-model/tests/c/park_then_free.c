/*
 * park_then_free: a stream parked on a host-released cuStreamWaitValue32
 * and a cuMemFree on another host thread.
 *
 *   park_then_free free-first     the free runs (and is joined) before the
 *                                 host word is written: on a GPU this hangs
 *                                 for good, since cuMemFree synchronises the
 *                                 device and the parked stream never
 *                                 completes; the model must report
 *                                 "cuda-model: deadlock" and exit 86.
 *   park_then_free release-first  the word is written first: prints "ok".
 *
 * Any unexpected CUresult: the call's name and code on stderr, exit 1.
 */
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                        \
    do {                                                                   \
        CUresult r_ = (call);                                              \
        if (r_ != CUDA_SUCCESS) {                                          \
            fprintf(stderr, "%s failed: CUresult %d\n", #call, (int)r_);   \
            exit(1);                                                       \
        }                                                                  \
    } while (0)

static CUcontext ctx;
static CUdeviceptr buffer;

/* Another host thread: make the context current there and free. */
static void *free_buffer(void *arg) {
    (void)arg;
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuMemFree(buffer));
    return NULL;
}

static void free_on_thread(void) {
    pthread_t t;
    if (pthread_create(&t, NULL, free_buffer, NULL) != 0) {
        fprintf(stderr, "pthread_create failed\n");
        exit(1);
    }
    if (pthread_join(t, NULL) != 0) {
        fprintf(stderr, "pthread_join failed\n");
        exit(1);
    }
}

int main(int argc, char **argv) {
    int free_first;
    if (argc == 2 && strcmp(argv[1], "free-first") == 0) {
        free_first = 1;
    } else if (argc == 2 && strcmp(argv[1], "release-first") == 0) {
        free_first = 0;
    } else {
        fprintf(stderr, "usage: %s free-first|release-first\n", argv[0]);
        return 2;
    }

    CUdevice dev;
    CUstream stream;
    uint32_t *word;
    CUdeviceptr dword;

    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuMemAlloc(&buffer, 1 << 20));
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CHECK(cuMemHostAlloc((void **)&word, sizeof *word, CU_MEMHOSTALLOC_DEVICEMAP));
    __atomic_store_n(word, 0u, __ATOMIC_SEQ_CST);
    CHECK(cuMemHostGetDevicePointer(&dword, word, 0));
    /* Park the stream until the host writes 1. */
    CHECK(cuStreamWaitValue32(stream, dword, 1, CU_STREAM_WAIT_VALUE_GEQ));

    if (free_first) {
        free_on_thread(); /* never returns on a GPU */
        __atomic_store_n(word, 1u, __ATOMIC_SEQ_CST);
    } else {
        __atomic_store_n(word, 1u, __ATOMIC_SEQ_CST);
        free_on_thread();
    }
    CHECK(cuStreamSynchronize(stream));
    printf("ok\n");
    return 0;
}
