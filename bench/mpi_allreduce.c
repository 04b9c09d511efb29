/*
 * mpi_allreduce.c - sncl's side-by-side reference: MPI_Allreduce(MPI_FLOAT, MPI_SUM) timing.
 *
 *   mpicc.openmpi -O2 -o mpi_allreduce bench/mpi_allreduce.c
 *   mpirun.openmpi -np 2 ./mpi_allreduce [-s SECONDS] [-w WARMUP] SIZE [SIZE ...]
 *
 * SIZE is a byte count, optionally suffixed K, M or G (powers of 1024); it must be a
 * multiple of 4 (one float). Defaults: -s 0.5 (time budget per size), -w 5 (warm-up ops).
 *
 * Method, per size:
 *   1. reset the receive buffer, run WARMUP untimed out-of-place all-reduces;
 *   2. calibrate: after a barrier time a few ops one by one, take the slowest rank's median
 *      and derive an iteration count that fills SECONDS (clamped to [MIN_ITERS, MAX_ITERS]);
 *   3. run that many ops, each timed on its own with MPI_Wtime (no barrier between ops);
 *   4. an op's time is the slowest rank's (element-wise MPI_MAX over the per-op arrays);
 *      the median over ops is reported; busbw = 2(n-1)/n * bytes / median;
 *   5. the final receive buffer is checked on every rank against the exact expected sum.
 *
 * Output (stdout, rank 0): comment lines start with '#'; then one line per size:
 *   size_bytes iters median_us min_us busbw_GBps ok|FAIL
 * (GB/s = 1e9 bytes/s). Exit status 3 if any size failed verification.
 */
#include <mpi.h>
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MIN_ITERS = 5, MAX_ITERS = 1000000, CAL_OPS = 5, PATTERN = 7 };

static void die(int rank, const char *msg, const char *arg) {
    if (rank == 0) fprintf(stderr, "mpi_allreduce: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
    MPI_Abort(MPI_COMM_WORLD, 2);
    exit(2);
}

/* "64K" -> 65536; returns 0 on a malformed string. */
static uint64_t parse_size(const char *s) {
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s) return 0;
    switch (toupper((unsigned char)*end)) {
    case 'G': v <<= 10; /* fall through */
    case 'M': v <<= 10; /* fall through */
    case 'K': v <<= 10; end++; break;
    case '\0': break;
    default: return 0;
    }
    if (*end == 'B' || *end == 'b') end++;
    return *end ? 0 : (uint64_t)v;
}

static int by_value(const void *pa, const void *pb) {
    double a = *(const double *)pa, b = *(const double *)pb;
    return (a > b) - (a < b);
}

/* Input of rank r at index i is (r+1) + (i % PATTERN): small integers, so the float sum is
 * exact and every element's expected value is known: n(n+1)/2 + n*(i % PATTERN). */
static void fill_input(float *buf, size_t count, int rank) {
    for (size_t i = 0; i < count; i++) buf[i] = (float)(rank + 1) + (float)(i % PATTERN);
}

static int check_output(const float *buf, size_t count, int nranks) {
    const float base = (float)nranks * (float)(nranks + 1) / 2.0f;
    for (size_t i = 0; i < count; i++)
        if (buf[i] != base + (float)nranks * (float)(i % PATTERN)) return 0;
    return 1;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, nranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);

    double seconds = 0.5;
    int warmup = 5, opt;
    while ((opt = getopt(argc, argv, "s:w:")) != -1) {
        if (opt == 's') seconds = atof(optarg);
        else if (opt == 'w') warmup = atoi(optarg);
        else die(rank, "usage: mpi_allreduce [-s SECONDS] [-w WARMUP] SIZE [SIZE ...]", NULL);
    }
    int nsizes = argc - optind;
    if (nsizes < 1 || seconds <= 0 || warmup < 0)
        die(rank, "usage: mpi_allreduce [-s SECONDS] [-w WARMUP] SIZE [SIZE ...]", NULL);
    uint64_t *sizes = calloc((size_t)nsizes, sizeof *sizes);
    uint64_t largest = 0;
    for (int k = 0; k < nsizes; k++) {
        sizes[k] = parse_size(argv[optind + k]);
        if (sizes[k] == 0 || sizes[k] % sizeof(float) != 0 || sizes[k] / sizeof(float) > INT32_MAX)
            die(rank, "bad size (need a positive multiple of 4 bytes)", argv[optind + k]);
        if (sizes[k] > largest) largest = sizes[k];
    }

    float *in = NULL, *out = NULL;
    if (posix_memalign((void **)&in, 4096, largest) || posix_memalign((void **)&out, 4096, largest))
        die(rank, "out of memory", NULL);
    fill_input(in, largest / sizeof(float), rank); /* also faults every page in */
    memset(out, 0, largest);

    if (rank == 0) {
        char lib[MPI_MAX_LIBRARY_VERSION_STRING];
        int len;
        MPI_Get_library_version(lib, &len);
        lib[strcspn(lib, "\n")] = '\0';
        printf("# library: %s\n", lib);
        printf("# ranks %d, warmup %d, seconds/size %.3f, op MPI_Allreduce float sum out-of-place\n",
               nranks, warmup, seconds);
        printf("# size_bytes iters median_us min_us busbw_GBps ok\n");
        fflush(stdout);
    }

    int any_fail = 0;
    for (int k = 0; k < nsizes; k++) {
        const uint64_t bytes = sizes[k];
        const int count = (int)(bytes / sizeof(float));

        memset(out, 0xff, bytes); /* NaN sentinel: a skipped reduction cannot pass the check */
        for (int w = 0; w < warmup; w++)
            MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);

        double cal[CAL_OPS];
        MPI_Barrier(MPI_COMM_WORLD);
        for (int c = 0; c < CAL_OPS; c++) {
            double start = MPI_Wtime();
            MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            cal[c] = MPI_Wtime() - start;
        }
        qsort(cal, CAL_OPS, sizeof(double), by_value);
        double mine = cal[CAL_OPS / 2], slowest; /* median: one stray slow op must not count */
        MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        double want = slowest > 0 ? seconds / slowest : (double)MAX_ITERS;
        int iters = want < MIN_ITERS ? MIN_ITERS : want > MAX_ITERS ? MAX_ITERS : (int)want;

        double *op_time = malloc(sizeof(double) * (size_t)iters);
        double *op_max = malloc(sizeof(double) * (size_t)iters);
        if (!op_time || !op_max) die(rank, "out of memory", NULL);

        memset(out, 0xff, bytes);
        MPI_Barrier(MPI_COMM_WORLD);
        for (int it = 0; it < iters; it++) {
            double start = MPI_Wtime();
            MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            op_time[it] = MPI_Wtime() - start;
        }
        MPI_Reduce(op_time, op_max, iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

        int good = check_output(out, (size_t)count, nranks), all_good;
        MPI_Allreduce(&good, &all_good, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (!all_good) any_fail = 1;

        if (rank == 0) {
            qsort(op_max, (size_t)iters, sizeof(double), by_value);
            double median = (iters % 2) ? op_max[iters / 2]
                                        : 0.5 * (op_max[iters / 2 - 1] + op_max[iters / 2]);
            double busbw = 2.0 * (nranks - 1) / nranks * (double)bytes / median / 1e9;
            printf("%llu %d %.3f %.3f %.4f %s\n", (unsigned long long)bytes, iters, median * 1e6,
                   op_max[0] * 1e6, busbw, all_good ? "ok" : "FAIL");
            fflush(stdout);
        }
        free(op_time);
        free(op_max);
    }

    free(in);
    free(out);
    free(sizes);
    MPI_Finalize();
    return any_fail ? 3 : 0;
}
