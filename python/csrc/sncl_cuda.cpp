// The CUDA side of the "sncl" c10d backend; see sncl_cuda.hpp.

#include "sncl_cuda.hpp"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#ifdef SNCL_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace sncl_torch {

bool cudaBuilt() {
#ifdef SNCL_TORCH_CUDA
  return true;
#else
  return false;
#endif
}

DeviceStream currentDeviceStream(
    const c10::Device& device,
    const std::string& what) {
#ifdef SNCL_TORCH_CUDA
  TORCH_CHECK(
      device.is_cuda() && device.has_index(),
      what,
      ": expected a CUDA device with an index, got ",
      device);
  c10::cuda::CUDAStream s = c10::cuda::getCurrentCUDAStream(device.index());
  // cudaStream_t and snclStream_t are both pointers to an opaque struct
  // (`struct CUstream_st *` once sncl.h takes CUDA streams, sncl's host
  // stream type before): the cast compiles against either header.
  return DeviceStream{
      s.unwrap(), reinterpret_cast<snclStream_t>(s.stream())};
#else
  TORCH_CHECK(
      false,
      what,
      ": got tensors on ",
      device,
      ", but this sncl_torch was built without CUDA support (torch had no "
      "CUDA, or no CUDA runtime headers were found at install time; see "
      "python/README.md); reinstall it against a CUDA build of torch");
#endif
}

void recordStreams(
    const std::vector<at::Tensor>& tensors,
    const c10::Stream& stream) {
  c10::impl::VirtualGuardImpl impl(stream.device_type());
  for (const auto& t : tensors) {
    if (!t.defined() || t.device() != stream.device() ||
        !t.has_storage()) {
      continue;
    }
    const c10::DataPtr& ptr = t.storage().data_ptr();
    if (ptr.get() != nullptr) {
      impl.recordDataPtrOnStream(ptr, stream);
    }
  }
}

} // namespace sncl_torch
