// The CUDA side of the "sncl" c10d backend, behind an interface free of
// CUDA headers: the rest of the backend compiles the same against CPU-only
// and CUDA builds of torch.
//
// An operation on CUDA tensors runs on the current CUDA stream of its
// tensors' device: the sncl calls get that stream (a cudaStream_t is a
// `struct CUstream_st *`, which snclStream_t is or converts to through a
// cast), the Work records a CUDA event on it after the enqueue, and the
// tensors' memory is marked in use by that stream in torch's caching
// allocator (recordStream) so that freeing them early is safe.
//
// The CUDA code is compiled only when setup.py defines SNCL_TORCH_CUDA (it
// does when torch has CUDA and the CUDA runtime headers are found); without
// it, an operation on CUDA tensors fails with a clear error.
#pragma once

#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include "sncl.h"

namespace sncl_torch {

// Whether this extension was built with CUDA support.
bool cudaBuilt();

// A CUDA stream as torch sees it and as sncl's calls take it.
struct DeviceStream {
  c10::Stream stream;
  snclStream_t handle;
};

// The current CUDA stream of `device`. `what` (the rank and operation)
// heads the error raised when the extension was built without CUDA.
DeviceStream currentDeviceStream(
    const c10::Device& device,
    const std::string& what);

// Marks the memory of every CUDA tensor in `tensors` as in use by `stream`
// (the caching allocator then reuses it only once the stream has passed
// this point), so callers may free the tensors before the operation ends.
void recordStreams(
    const std::vector<at::Tensor>& tensors,
    const c10::Stream& stream);

} // namespace sncl_torch
