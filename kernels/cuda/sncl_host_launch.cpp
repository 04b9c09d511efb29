// sncl_host_launch.cpp: sncl's device kernels compiled for the host (with
// SNCL_HOST_EMU and the shim in sncl_host_emu.h), behind a small C API that
// the device crate's emulated backend calls. Kernels are found by their
// ABI names, the same names NVRTC's output is searched for.
#ifndef SNCL_HOST_EMU
#error "build with -DSNCL_HOST_EMU"
#endif

#include "sncl_reduce.cu"

#include <cstring>

namespace {

typedef void (*SnclReduceCopyFn)(SnclReduceCopyArgs);
typedef void (*SnclDivideFn)(void*, unsigned long long, unsigned long long);

struct ReduceEntry {
  const char* name;
  SnclReduceCopyFn fn;
};
struct DivideEntry {
  const char* name;
  SnclDivideFn fn;
};

#define SNCL_REDUCE_ENTRY(dt, op) {"sncl_reduce_copy_" #dt "_" #op, &sncl_reduce_copy_##dt##_##op},
#define SNCL_DIVIDE_ENTRY(dt) {"sncl_divide_" #dt, &sncl_divide_##dt},

const ReduceEntry kReduceKernels[] = {SNCL_FOR_EACH_REDUCE_KERNEL(SNCL_REDUCE_ENTRY)};
const DivideEntry kDivideKernels[] = {SNCL_FOR_EACH_DTYPE(SNCL_DIVIDE_ENTRY)};

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

}  // extern "C"
