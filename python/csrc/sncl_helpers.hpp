// Helpers of the "sncl" c10d backend's operations: tensor checks and
// staging, dtype mapping, reduction planning.

#pragma once

#include <cstddef>
#include <optional>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "sncl.h"

namespace sncl_torch {

using c10d::ReduceOp;

// The data pointer of `t`, or a valid pointer for zero-length buffers
// (sncl rejects NULL buffers).
void* ptrOf(const at::Tensor& t);
size_t nbytesOf(const at::Tensor& t);
// Throws unless `t` is a defined, dense CPU or CUDA tensor (the backend
// checks that all tensors of an operation share one device).
void checkTensor(const at::Tensor& t, const char* what);
// Throws unless `t` is a defined, dense CPU tensor (the operations sncl
// runs on host memory only).
void checkCpu(const at::Tensor& t, const char* what);
// Throws unless `a` and `b` have the same dtype.
void checkSameType(const at::Tensor& a, const at::Tensor& b, const char* op);

// A contiguous buffer standing for a caller's tensor: the tensor itself
// when contiguous, else a staging copy written back by `writeBack`.
struct Staged {
  at::Tensor user;
  at::Tensor buf;
  bool copyBack = false;

  void writeBack() const {
    if (copyBack) {
      user.copy_(buf);
    }
  }
};

Staged stageInOut(const at::Tensor& t);
Staged stageOut(const at::Tensor& t);

// The sncl data type of a torch dtype, if there is one.
std::optional<snclDataType_t> snclType(at::ScalarType st);
const char* opName(ReduceOp::RedOpType op);

// How a reduction runs.
enum class Kind {
  Builtin, // one sncl operator
  PreMul, // snclRedOpCreatePreMulSum
  Bitwise, // BAND / BOR / BXOR: gather the inputs, reduce locally (the C
           // ABI has no bitwise operators)
};

struct RedPlan {
  Kind kind = Kind::Builtin;
  snclRedOp_t op = snclSum;
  snclDataType_t dt = snclUint8;
  size_t count = 0; // elements of dt
  ReduceOp::RedOpType bitop = ReduceOp::BAND;
  double factor = 1.0;
};

RedPlan planReduce(const at::Tensor& t, const ReduceOp& rop);

// One element of `dt` holding `f`, for snclRedOpCreatePreMulSum.
struct Scalar8 {
  alignas(8) unsigned char b[8] = {0};
};

Scalar8 encodeScalar(double f, snclDataType_t dt);

// rows: [n, numel] gathered inputs; out: the numel-element result.
void bitReduceRows(
    const at::Tensor& rows,
    const at::Tensor& out,
    ReduceOp::RedOpType op);

} // namespace sncl_torch
