// sncl_host_codec.cpp: sncl's codec kernels (sncl_codec.cu) compiled for the
// host (with SNCL_HOST_EMU and the shim in sncl_host_emu.h), behind a small
// C API that the device crate's emulated backend and tests call. Kernels are
// found by their ABI names, the same names NVRTC's output is searched for.
#ifndef SNCL_HOST_EMU
#error "build with -DSNCL_HOST_EMU"
#endif

#include "sncl_codec.cu"

#include <cstring>

namespace {

typedef void (*SnclCodecFn)(SnclCodecArgs);

struct CodecEntry {
  const char* name;
  SnclCodecFn fn;
  bool block;  // a block kernel: one call per block (sncl_host_launch_blocks)
};

#define SNCL_CODEC_ENTRY(name) {"sncl_codec_" #name, &sncl_codec_##name, false},
#define SNCL_CODEC_BLOCK_ENTRY(name) {"sncl_codec_" #name, &sncl_codec_##name, true},

const CodecEntry kCodecKernels[] = {SNCL_FOR_EACH_CODEC_KERNEL(SNCL_CODEC_ENTRY)
                                        SNCL_FOR_EACH_CODEC_BLOCK_KERNEL(SNCL_CODEC_BLOCK_ENTRY)};

}  // namespace

extern "C" {

// sizeof(SnclCodecArgs), for the caller's layout check.
unsigned long long sncl_host_codec_args_size(void) { return sizeof(SnclCodecArgs); }

// The most threads per block a block kernel takes, for the caller's check.
unsigned int sncl_host_codec_block_threads(void) { return SNCL_CODEC_BLOCK_THREADS; }

// Runs codec kernel `name` over a grid x block launch. Returns 0, -1 for an
// unknown kernel, -2 for an empty launch shape, bad nsrcs, or a block
// kernel with more than SNCL_CODEC_BLOCK_THREADS threads per block.
int sncl_host_codec(const char* name, const SnclCodecArgs* args, unsigned int grid,
                    unsigned int block) {
  const CodecEntry* entry = nullptr;
  for (const CodecEntry& e : kCodecKernels) {
    if (std::strcmp(e.name, name) == 0) entry = &e;
  }
  if (entry == nullptr) return -1;
  if (grid == 0 || block == 0 || args->nsrcs < 1 || args->nsrcs > SNCL_CODEC_MAX_SRCS) return -2;
  if (entry->block && block > SNCL_CODEC_BLOCK_THREADS) return -2;
  const SnclCodecArgs a = *args;
  const SnclCodecFn fn = entry->fn;
  if (entry->block) {
    sncl_host_launch_blocks(grid, block, [&] { fn(a); });
  } else {
    sncl_host_launch(grid, block, [&] { fn(a); });
  }
  return 0;
}

}  // extern "C"
