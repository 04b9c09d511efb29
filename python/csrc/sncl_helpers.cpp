// Helpers of the "sncl" c10d backend's operations; see sncl_helpers.hpp.

#include "sncl_helpers.hpp"

#include <cstring>

#include <c10/util/Exception.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>

namespace sncl_torch {

namespace {

// A valid pointer for zero-length buffers (sncl rejects NULL buffers).
alignas(16) char kEmpty[16];

} // namespace

void* ptrOf(const at::Tensor& t) {
  void* p = t.defined() ? t.data_ptr() : nullptr;
  return p ? p : static_cast<void*>(kEmpty);
}

size_t nbytesOf(const at::Tensor& t) {
  return static_cast<size_t>(t.numel()) * t.element_size();
}

void checkTensor(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.defined(), "sncl: ", what, " is undefined");
  TORCH_CHECK(
      t.device().is_cpu() || t.device().is_cuda(),
      "sncl: ",
      what,
      " must be a CPU or CUDA tensor (got ",
      t.device(),
      ")");
  TORCH_CHECK(
      t.layout() == at::kStrided, "sncl: ", what, " must be a dense tensor");
}

void checkCpu(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.defined(), "sncl: ", what, " is undefined");
  TORCH_CHECK(
      t.device().is_cpu(),
      "sncl: ",
      what,
      " must be a CPU tensor (got ",
      t.device(),
      "): this operation runs on host memory only");
  TORCH_CHECK(
      t.layout() == at::kStrided, "sncl: ", what, " must be a dense tensor");
}

void checkSameType(const at::Tensor& a, const at::Tensor& b, const char* op) {
  TORCH_CHECK(
      a.scalar_type() == b.scalar_type(),
      "sncl: ",
      op,
      ": input and output dtypes differ (",
      a.scalar_type(),
      " vs ",
      b.scalar_type(),
      ")");
}

// In/out buffers (allreduce, broadcast): staging copies carry the data in.
Staged stageInOut(const at::Tensor& t) {
  if (t.is_contiguous()) {
    return {t, t, false};
  }
  return {t, t.contiguous(), true};
}

// Output-only buffers.
Staged stageOut(const at::Tensor& t) {
  if (t.is_contiguous()) {
    return {t, t, false};
  }
  return {t, at::empty(t.sizes(), t.options()), true};
}

std::optional<snclDataType_t> snclType(at::ScalarType st) {
  switch (st) {
    case at::kChar:
      return snclInt8;
    case at::kByte:
    case at::kBool:
      return snclUint8;
    case at::kInt:
      return snclInt32;
    case at::kUInt32:
      return snclUint32;
    case at::kLong:
      return snclInt64;
    case at::kUInt64:
      return snclUint64;
    case at::kHalf:
      return snclFloat16;
    case at::kFloat:
      return snclFloat32;
    case at::kDouble:
      return snclFloat64;
    case at::kBFloat16:
      return snclBfloat16;
    // OCP fp8 as NCCL 2.24 (torch's *_fnuz variants are another encoding:
    // refused).
    case at::kFloat8_e4m3fn:
      return snclFloat8e4m3;
    case at::kFloat8_e5m2:
      return snclFloat8e5m2;
    default:
      return std::nullopt;
  }
}

const char* opName(ReduceOp::RedOpType op) {
  switch (op) {
    case ReduceOp::SUM:
      return "SUM";
    case ReduceOp::AVG:
      return "AVG";
    case ReduceOp::PRODUCT:
      return "PRODUCT";
    case ReduceOp::MIN:
      return "MIN";
    case ReduceOp::MAX:
      return "MAX";
    case ReduceOp::BAND:
      return "BAND";
    case ReduceOp::BOR:
      return "BOR";
    case ReduceOp::BXOR:
      return "BXOR";
    case ReduceOp::PREMUL_SUM:
      return "PREMUL_SUM";
    default:
      return "UNKNOWN";
  }
}

// `t` is the (contiguous) buffer the reduction runs on; count is its size.
RedPlan planReduce(const at::Tensor& t, const ReduceOp& rop) {
  RedPlan p;
  at::ScalarType st = t.scalar_type();
  const bool isBool = st == at::kBool;
  size_t count = static_cast<size_t>(t.numel());
  if (at::isComplexType(st)) {
    TORCH_CHECK(
        rop.op_ == ReduceOp::SUM || rop.op_ == ReduceOp::AVG ||
            rop.op_ == ReduceOp::PREMUL_SUM,
        "sncl: complex tensors support SUM, AVG and PREMUL_SUM only, not ",
        opName(rop.op_));
    st = c10::toRealValueType(st);
    count *= 2;
  }
  p.count = count;
  switch (rop.op_) {
    case ReduceOp::SUM:
      p.op = isBool ? snclMax : snclSum; // logical or
      break;
    case ReduceOp::PRODUCT:
      p.op = isBool ? snclMin : snclProd; // logical and
      break;
    case ReduceOp::MIN:
      p.op = snclMin;
      break;
    case ReduceOp::MAX:
      p.op = snclMax;
      break;
    case ReduceOp::AVG:
      TORCH_CHECK(!isBool, "sncl: AVG is not defined on bool tensors");
      p.op = snclAvg;
      break;
    case ReduceOp::PREMUL_SUM: {
      TORCH_CHECK(
          at::isFloatingType(st),
          "sncl: PREMUL_SUM needs a floating-point tensor, got ",
          t.scalar_type());
      auto* sup =
          dynamic_cast<c10d::PreMulSumSupplement*>(rop.supplement_.get());
      TORCH_CHECK(sup, "sncl: PREMUL_SUM without its scaling factor");
      p.factor = sup->tensor_factor.defined()
          ? sup->tensor_factor.to(at::kCPU).item<double>()
          : sup->double_factor;
      p.kind = Kind::PreMul;
      break;
    }
    case ReduceOp::BAND:
    case ReduceOp::BOR:
    case ReduceOp::BXOR:
      TORCH_CHECK(
          at::isIntegralType(st, /*includeBool=*/true),
          "sncl: ",
          opName(rop.op_),
          " needs an integer or bool tensor, got ",
          t.scalar_type());
      if (isBool && rop.op_ == ReduceOp::BAND) {
        p.op = snclMin;
      } else if (isBool && rop.op_ == ReduceOp::BOR) {
        p.op = snclMax;
      } else {
        p.kind = Kind::Bitwise;
        p.bitop = rop.op_;
        return p; // runs on bytes: any integer width
      }
      break;
    default:
      TORCH_CHECK(false, "sncl: unsupported reduce op ", opName(rop.op_));
  }
  auto dt = snclType(st);
  TORCH_CHECK(
      dt.has_value(),
      "sncl: reductions do not support dtype ",
      t.scalar_type(),
      " (supported: int8, uint8, int32, uint32, int64, uint64, float16, "
      "bfloat16, float32, float64, bool, complex)");
  p.dt = *dt;
  return p;
}

Scalar8 encodeScalar(double f, snclDataType_t dt) {
  Scalar8 s;
  switch (dt) {
    case snclFloat32: {
      float v = static_cast<float>(f);
      std::memcpy(s.b, &v, sizeof v);
      break;
    }
    case snclFloat64:
      std::memcpy(s.b, &f, sizeof f);
      break;
    case snclFloat16: {
      c10::Half v(static_cast<float>(f));
      std::memcpy(s.b, &v.x, sizeof v.x);
      break;
    }
    case snclBfloat16: {
      c10::BFloat16 v(static_cast<float>(f));
      std::memcpy(s.b, &v.x, sizeof v.x);
      break;
    }
    case snclFloat8e4m3: {
      c10::Float8_e4m3fn v(static_cast<float>(f));
      std::memcpy(s.b, &v.x, sizeof v.x);
      break;
    }
    case snclFloat8e5m2: {
      c10::Float8_e5m2 v(static_cast<float>(f));
      std::memcpy(s.b, &v.x, sizeof v.x);
      break;
    }
    default: {
      int64_t v = static_cast<int64_t>(f); // little endian: low bytes first
      std::memcpy(s.b, &v, sizeof v);
    }
  }
  return s;
}

// rows: [n, numel] gathered inputs; out: the numel-element result.
void bitReduceRows(
    const at::Tensor& rows,
    const at::Tensor& out,
    ReduceOp::RedOpType op) {
  auto flat = out.view({-1});
  flat.copy_(rows[0]);
  for (int64_t r = 1; r < rows.size(0); ++r) {
    switch (op) {
      case ReduceOp::BAND:
        flat.bitwise_and_(rows[r]);
        break;
      case ReduceOp::BOR:
        flat.bitwise_or_(rows[r]);
        break;
      default:
        flat.bitwise_xor_(rows[r]);
    }
  }
}

} // namespace sncl_torch
