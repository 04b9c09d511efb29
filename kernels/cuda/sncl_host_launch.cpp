// sncl_host_launch.cpp: sncl's device kernels compiled for the host (with
// SNCL_HOST_EMU and the shim in sncl_host_emu.h), behind a small C API that
// the device crate's emulated backend calls. Kernels are found by their
// ABI names, the same names NVRTC's output is searched for.
#ifndef SNCL_HOST_EMU
#error "build with -DSNCL_HOST_EMU"
#endif

#include "sncl_reduce.cu"
#include "sncl_direct.cu"

#include <cstring>

namespace {

typedef void (*SnclReduceCopyFn)(SnclReduceCopyArgs);
typedef void (*SnclDivideFn)(void*, unsigned long long, unsigned long long);
typedef void (*SnclDirectFn)(SnclDirectArgs);

struct ReduceEntry {
  const char* name;
  SnclReduceCopyFn fn;
};
struct DirectEntry {
  const char* name;
  SnclDirectFn fn;
};
struct DivideEntry {
  const char* name;
  SnclDivideFn fn;
};

#define SNCL_REDUCE_ENTRY(dt, op) {"sncl_reduce_copy_" #dt "_" #op, &sncl_reduce_copy_##dt##_##op},
#define SNCL_DIVIDE_ENTRY(dt) {"sncl_divide_" #dt, &sncl_divide_##dt},

const ReduceEntry kReduceKernels[] = {SNCL_FOR_EACH_REDUCE_KERNEL(SNCL_REDUCE_ENTRY)};
const DivideEntry kDivideKernels[] = {SNCL_FOR_EACH_DTYPE(SNCL_DIVIDE_ENTRY)};

#define SNCL_DIRECT_ENTRY(dt, op) \
  {"sncl_direct_all_reduce_" #dt "_" #op, &sncl_direct_all_reduce_##dt##_##op},
const DirectEntry kDirectKernels[] = {SNCL_FOR_EACH_DIRECT_KERNEL(SNCL_DIRECT_ENTRY)};

template <typename Entry, unsigned long N>
auto find(const Entry (&table)[N], const char* name) -> decltype(table[0].fn) {
  for (const Entry& e : table) {
    if (std::strcmp(e.name, name) == 0) return e.fn;
  }
  return nullptr;
}

}  // namespace

extern "C" {

// sizeof(SnclReduceCopyArgs), for the caller's layout check.
unsigned long long sncl_host_reduce_copy_args_size(void) { return sizeof(SnclReduceCopyArgs); }

// Runs reduce-copy kernel `name` over a grid x block launch. Returns 0, -1
// for an unknown kernel, -2 for an empty launch shape or bad nsrcs/ndsts.
int sncl_host_reduce_copy(const char* name, const SnclReduceCopyArgs* args, unsigned int grid,
                          unsigned int block) {
  const SnclReduceCopyFn fn = find(kReduceKernels, name);
  if (fn == nullptr) return -1;
  if (grid == 0 || block == 0 || args->nsrcs < 1 || args->nsrcs > SNCL_MAX_ARGS ||
      args->ndsts < 1 || args->ndsts > SNCL_MAX_ARGS) {
    return -2;
  }
  const SnclReduceCopyArgs a = *args;
  sncl_host_launch(grid, block, [&] { fn(a); });
  return 0;
}

// Runs divide kernel `name` over a grid x block launch. Returns 0, -1 for an
// unknown kernel, -2 for an empty launch shape.
int sncl_host_divide(const char* name, void* data, unsigned long long count,
                     unsigned long long divisor, unsigned int grid, unsigned int block) {
  const SnclDivideFn fn = find(kDivideKernels, name);
  if (fn == nullptr) return -1;
  if (grid == 0 || block == 0) return -2;
  sncl_host_launch(grid, block, [&] { fn(data, count, divisor); });
  return 0;
}

// sizeof(SnclDirectArgs), for the caller's layout check.
unsigned long long sncl_host_direct_args_size(void) { return sizeof(SnclDirectArgs); }

// Runs direct all-reduce kernel `name` over a grid x block launch (blocks
// one after the other, each block's phases over its threads; the kernel
// waits on its peers' processes through the flags). Returns 0, -1 for an
// unknown kernel, -2 for a bad launch shape or bad arguments.
static bool sncl_host_direct_args_ok(const SnclDirectArgs* args, unsigned int grid,
                                     unsigned int block) {
  return !(grid == 0 || grid > SNCL_DIRECT_MAX_BLOCKS || block == 0 || args->nranks < 2 ||
           args->nranks > SNCL_DIRECT_MAX_RANKS || args->rank < 0 ||
           args->rank >= args->nranks || args->algo < 1 || args->algo > 3 ||
           (args->algo == 3 && (args->source == nullptr || args->coll != SNCL_DIRECT_COLL_ALL_REDUCE)) ||
           (args->algo == 1 && args->in_place && args->scratch == nullptr && args->source == nullptr) ||
           ((args->source == nullptr) != (args->result == nullptr)) ||
           args->coll < SNCL_DIRECT_COLL_ALL_REDUCE || args->coll > SNCL_DIRECT_COLL_SCATTER ||
           (args->coll != SNCL_DIRECT_COLL_ALL_REDUCE && args->source == nullptr) ||
           args->root < 0 || args->root >= args->nranks);
}

int sncl_host_direct(const char* name, const SnclDirectArgs* args, unsigned int grid,
                     unsigned int block) {
  const SnclDirectFn fn = find(kDirectKernels, name);
  if (fn == nullptr) return -1;
  if (!sncl_host_direct_args_ok(args, grid, block)) return -2;
  const SnclDirectArgs a = *args;
  sncl_host_launch_blocks(grid, block, [&] { fn(a); });
  return 0;
}

// Runs block `b` alone of direct all-reduce kernel `name` (the strict driver
// model runs each block on a thread of its own). Returns as sncl_host_direct,
// and -2 also for b >= grid.
int sncl_host_direct_block(const char* name, const SnclDirectArgs* args, unsigned int grid,
                           unsigned int block, unsigned int b) {
  const SnclDirectFn fn = find(kDirectKernels, name);
  if (fn == nullptr) return -1;
  if (!sncl_host_direct_args_ok(args, grid, block) || b >= grid) return -2;
  const SnclDirectArgs a = *args;
  sncl_host_launch_one_block(grid, block, b, [&] { fn(a); });
  return 0;
}

}  // extern "C"
