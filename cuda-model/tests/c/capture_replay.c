/*
 * capture_replay: stream capture and graph replay.
 *
 * 1. Captures, on a non-blocking stream in THREAD_LOCAL mode, a
 *    cuMemsetD32Async of a device buffer to 7 and a cuStreamWriteValue32 of
 *    a mapped host word to 5; checks nothing ran during the capture;
 *    instantiates the graph, launches it three times, synchronises and
 *    checks the buffer holds 7s and the word 5.
 * 2. A second capture: cuStreamQuery on the capturing stream must be
 *    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, and cuStreamEndCapture then
 *    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED.
 *
 * Prints "ok" and exits 0; any unexpected CUresult: the call's name and
 * code on stderr, exit 1.
 */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call) EXPECT(call, CUDA_SUCCESS)
#define EXPECT(call, want)                                                 \
    do {                                                                   \
        CUresult r_ = (call);                                              \
        if (r_ != (want)) {                                                \
            fprintf(stderr, "%s: CUresult %d, expected %d\n", #call,       \
                    (int)r_, (int)(want));                                 \
            exit(1);                                                       \
        }                                                                  \
    } while (0)

#define COUNT 1024

int main(void) {
    CUdevice dev;
    CUcontext ctx;
    CUstream stream;
    CUdeviceptr buffer, dword;
    uint32_t *word;
    CUgraph graph;
    CUgraphExec exec;
    static uint32_t host[COUNT];

    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuMemAlloc(&buffer, COUNT * sizeof(uint32_t)));
    CHECK(cuMemsetD32(buffer, 0, COUNT));
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CHECK(cuMemHostAlloc((void **)&word, sizeof *word, CU_MEMHOSTALLOC_DEVICEMAP));
    __atomic_store_n(word, 0u, __ATOMIC_SEQ_CST);
    CHECK(cuMemHostGetDevicePointer(&dword, word, 0));

    /* 1. Capture, then replay three times. */
    CHECK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    CHECK(cuMemsetD32Async(buffer, 7, COUNT, stream));
    CHECK(cuStreamWriteValue32(stream, dword, 5, CU_STREAM_WRITE_VALUE_DEFAULT));
    CHECK(cuStreamEndCapture(stream, &graph));
    if (__atomic_load_n(word, __ATOMIC_SEQ_CST) != 0) {
        fprintf(stderr, "the capture ran its work: word is %u, expected 0\n",
                __atomic_load_n(word, __ATOMIC_SEQ_CST));
        return 1;
    }
    CHECK(cuGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 3; i++) {
        CHECK(cuGraphLaunch(exec, stream));
    }
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuMemcpyDtoH(host, buffer, sizeof host));
    for (int i = 0; i < COUNT; i++) {
        if (host[i] != 7) {
            fprintf(stderr, "buffer[%d] is %u, expected 7\n", i, host[i]);
            return 1;
        }
    }
    if (__atomic_load_n(word, __ATOMIC_SEQ_CST) != 5) {
        fprintf(stderr, "word is %u after replay, expected 5\n",
                __atomic_load_n(word, __ATOMIC_SEQ_CST));
        return 1;
    }
    CHECK(cuGraphExecDestroy(exec));
    CHECK(cuGraphDestroy(graph));

    /* 2. A query during a capture fails and invalidates it. */
    CUgraph bad = NULL;
    CHECK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    CHECK(cuMemsetD32Async(buffer, 9, COUNT, stream));
    EXPECT(cuStreamQuery(stream), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    EXPECT(cuStreamEndCapture(stream, &bad), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    if (bad != NULL) {
        fprintf(stderr, "cuStreamEndCapture of an invalidated capture gave a graph\n");
        return 1;
    }

    CHECK(cuStreamDestroy(stream));
    CHECK(cuMemFreeHost(word));
    CHECK(cuMemFree(buffer));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    printf("ok\n");
    return 0;
}
