/*
 * memcpy_bw.c - single-thread memcpy bandwidth, the physical reference for shm collectives.
 *
 *   cc -O2 -o memcpy_bw bench/memcpy_bw.c
 *   ./memcpy_bw [SIZE_BYTES=67108864] [REPEATS=21]
 *
 * Both buffers are touched first; one untimed copy warms up, then REPEATS copies are timed
 * one by one with CLOCK_MONOTONIC. Output (one line): size_bytes median_us GBps
 * where GBps = size / median time in 1e9 bytes/s (bytes copied, not read+written).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int by_value(const void *pa, const void *pb) {
    double a = *(const double *)pa, b = *(const double *)pb;
    return (a > b) - (a < b);
}

int main(int argc, char **argv) {
    size_t size = argc > 1 ? (size_t)strtoull(argv[1], NULL, 0) : (size_t)64 << 20;
    int repeats = argc > 2 ? atoi(argv[2]) : 21;
    if (size == 0 || repeats < 1) {
        fprintf(stderr, "usage: memcpy_bw [SIZE_BYTES] [REPEATS]\n");
        return 2;
    }
    unsigned char *src = malloc(size), *dst = malloc(size);
    double *t = malloc(sizeof(double) * (size_t)repeats);
    if (!src || !dst || !t) {
        fprintf(stderr, "memcpy_bw: out of memory\n");
        return 2;
    }
    for (size_t i = 0; i < size; i++) src[i] = (unsigned char)(i * 31u);
    memset(dst, 0, size);
    memcpy(dst, src, size);

    unsigned long check = 0;
    for (int r = 0; r < repeats; r++) {
        src[(size_t)r % size] ^= 1u; /* change the source so no copy can be skipped */
        double start = now_s();
        memcpy(dst, src, size);
        t[r] = now_s() - start;
        check += dst[(size_t)r % size];
    }
    qsort(t, (size_t)repeats, sizeof(double), by_value);
    double median = (repeats % 2) ? t[repeats / 2] : 0.5 * (t[repeats / 2 - 1] + t[repeats / 2]);
    printf("%zu %.3f %.4f\n", size, median * 1e6, (double)size / median / 1e9);
    fprintf(stderr, "# checksum %lu\n", check); /* keeps the copies observable */
    return 0;
}
