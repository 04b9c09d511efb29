// The "sncl" c10d backend's all-to-all, point-to-point, compressed
// all-reduce and barrier wrappers; see sncl_backend.hpp.

#include "sncl_backend.hpp"
#include "sncl_helpers.hpp"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace sncl_torch {

namespace {

// Element counts per rank from torch split sizes (in rows of dim 0), as
// bytes, with displacements.
void splitBytes(
    const at::Tensor& t,
    const std::vector<int64_t>& splits,
    int size,
    const char* what,
    std::vector<size_t>& counts,
    std::vector<size_t>& displs) {
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  const size_t rowBytes = rows == 0 ? 0 : nbytesOf(t) / rows;
  counts.assign(size, 0);
  displs.assign(size, 0);
  if (splits.empty()) {
    TORCH_CHECK(
        rows % size == 0,
        "sncl: all_to_all_single: the ",
        what,
        "'s first dimension (",
        rows,
        ") is not divisible by the world size (",
        size,
        ")");
    for (int i = 0; i < size; ++i) {
      counts[i] = rowBytes * (rows / size);
      displs[i] = counts[i] * i;
    }
    return;
  }
  TORCH_CHECK(
      static_cast<int>(splits.size()) == size,
      "sncl: all_to_all_single: ",
      what,
      " split sizes have ",
      splits.size(),
      " entries, expected ",
      size);
  int64_t sum = 0;
  for (int i = 0; i < size; ++i) {
    TORCH_CHECK(splits[i] >= 0, "sncl: negative split size");
    counts[i] = rowBytes * splits[i];
    displs[i] = rowBytes * sum;
    sum += splits[i];
  }
  TORCH_CHECK(
      sum == rows,
      "sncl: all_to_all_single: ",
      what,
      " split sizes sum to ",
      sum,
      ", the tensor has ",
      rows,
      " rows");
}

} // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::all_to_all_single(
    at::Tensor& outputBuffer,
    at::Tensor& inputBuffer,
    std::vector<int64_t>& outputSplitSizes,
    std::vector<int64_t>& inputSplitSizes,
    const c10d::AllToAllOptions& opts) {
  at::NoGradGuard noGrad;
  checkTensor(outputBuffer, "all_to_all output");
  checkTensor(inputBuffer, "all_to_all input");
  checkSameType(inputBuffer, outputBuffer, "all_to_all_single");
  at::Tensor in = inputBuffer.contiguous();
  Staged out = stageOut(outputBuffer);
  Step st;
  if (outputSplitSizes.empty() && inputSplitSizes.empty()) {
    TORCH_CHECK(
        in.numel() == out.buf.numel() && in.numel() % size_ == 0,
        "sncl: all_to_all_single: input and output must have the same size, "
        "divisible by the world size");
    st.issue = [this, in, buf = out.buf] {
      check(
          snclAlltoAll(
              ptrOf(in),
              ptrOf(buf),
              nbytesOf(in) / size_,
              snclUint8,
              comm_,
              opStream()),
          "snclAlltoAll");
    };
  } else {
    std::vector<size_t> sc, sd, rc, rd;
    splitBytes(in, inputSplitSizes, size_, "input", sc, sd);
    splitBytes(out.buf, outputSplitSizes, size_, "output", rc, rd);
    st.issue = [this, in, buf = out.buf, sc, sd, rc, rd] {
      check(
          snclAlltoAllV(
              ptrOf(in),
              sc.data(),
              sd.data(),
              ptrOf(buf),
              rc.data(),
              rd.data(),
              snclUint8,
              comm_,
              opStream()),
          "snclAlltoAllV");
    };
  }
  if (out.copyBack) {
    st.post = [out] { out.writeBack(); };
  }
  std::vector<Step> steps;
  steps.push_back(std::move(st));
  return submit(
      c10d::OpType::ALLTOALL_BASE, std::move(steps), {outputBuffer}, opts.asyncOp,
      std::vector<at::Tensor>{inputBuffer});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::alltoall_base(
    at::Tensor& outputBuffer,
    at::Tensor& inputBuffer,
    std::vector<int64_t>& outputSplitSizes,
    std::vector<int64_t>& inputSplitSizes,
    const c10d::AllToAllOptions& opts) {
  return all_to_all_single(
      outputBuffer, inputBuffer, outputSplitSizes, inputSplitSizes, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::alltoall(
    std::vector<at::Tensor>& outputTensors,
    std::vector<at::Tensor>& inputTensors,
    const c10d::AllToAllOptions& opts) {
  at::NoGradGuard noGrad;
  TORCH_CHECK(
      static_cast<int>(outputTensors.size()) == size_ &&
          static_cast<int>(inputTensors.size()) == size_,
      "sncl: alltoall needs ",
      size_,
      " input and output tensors");
  std::vector<at::Tensor> ins;
  std::vector<Staged> outs;
  for (int j = 0; j < size_; ++j) {
    checkTensor(inputTensors[j], "alltoall input");
    checkTensor(outputTensors[j], "alltoall output");
    checkSameType(inputTensors[j], outputTensors[j], "alltoall");
    ins.push_back(inputTensors[j].contiguous());
    outs.push_back(stageOut(outputTensors[j]));
  }
  Step st;
  st.issue = [this, ins, outs] {
    // Sends and receives of one exchange progress together in a group
    // (nested inside the coalescing group, if any).
    check(snclGroupStart(), "snclGroupStart");
    try {
      for (int j = 0; j < size_; ++j) {
        check(
            snclSend(
                ptrOf(ins[j]),
                nbytesOf(ins[j]),
                snclUint8,
                j,
                comm_,
                opStream()),
            "snclSend");
        check(
            snclRecv(
                ptrOf(outs[j].buf),
                nbytesOf(outs[j].buf),
                snclUint8,
                j,
                comm_,
                opStream()),
            "snclRecv");
      }
    } catch (...) {
      (void)snclGroupEnd();
      throw;
    }
    check(snclGroupEnd(), "snclGroupEnd (alltoall)");
  };
  st.post = [outs] {
    for (auto& o : outs) {
      o.writeBack();
    }
  };
  std::vector<Step> steps;
  steps.push_back(std::move(st));
  return submit(
      c10d::OpType::ALLTOALL, std::move(steps), outputTensors, opts.asyncOp, inputTensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::send(
    std::vector<at::Tensor>& tensors,
    int dstRank,
    int tag) {
  at::NoGradGuard noGrad;
  TORCH_CHECK(tensors.size() == 1, "sncl: send takes one tensor");
  TORCH_CHECK(
      dstRank >= 0 && dstRank < size_,
      "sncl: send to rank ",
      dstRank,
      " out of range");
  checkTensor(tensors[0], "send tensor");
  at::Tensor in = tensors[0].contiguous();
  Step st;
  // Outside batch_isend_irecv, messages carry their tag (snclSendTagged),
  // so receives match by tag and may come from any source; inside it the
  // group's sends and receives pair up in order (snclSend / snclRecv).
  if (coalescing_) {
    st.issue = [this, in, dstRank] {
      check(
          snclSend(
              ptrOf(in), nbytesOf(in), snclUint8, dstRank, comm_, opStream()),
          "snclSend");
    };
  } else {
    st.issue = [this, in, dstRank, tag] {
      check(
          snclSendTagged(
              ptrOf(in), nbytesOf(in), snclUint8, dstRank, tag, comm_, opStream()),
          "snclSendTagged");
    };
  }
  std::vector<Step> steps;
  steps.push_back(std::move(st));
  return submit(c10d::OpType::SEND, std::move(steps), tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::recv(
    std::vector<at::Tensor>& tensors,
    int srcRank,
    int tag) {
  at::NoGradGuard noGrad;
  TORCH_CHECK(tensors.size() == 1, "sncl: recv takes one tensor");
  TORCH_CHECK(
      srcRank >= 0 && srcRank < size_,
      "sncl: recv from rank ",
      srcRank,
      " out of range");
  checkTensor(tensors[0], "recv tensor");
  Staged out = stageOut(tensors[0]);
  Step st;
  if (coalescing_) {
    st.issue = [this, buf = out.buf, srcRank] {
      check(
          snclRecv(
              ptrOf(buf), nbytesOf(buf), snclUint8, srcRank, comm_, opStream()),
          "snclRecv");
    };
  } else {
    st.issue = [this, buf = out.buf, srcRank, tag] {
      check(
          snclRecvTagged(
              ptrOf(buf),
              nbytesOf(buf),
              snclUint8,
              srcRank,
              tag,
              comm_,
              opStream(),
              nullptr),
          "snclRecvTagged");
    };
  }
  if (out.copyBack) {
    st.post = [out] { out.writeBack(); };
  }
  std::vector<Step> steps;
  steps.push_back(std::move(st));
  return submit(c10d::OpType::RECV, std::move(steps), tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::allreduceCompressed(
    at::Tensor& tensor,
    const std::string& codec,
    bool average,
    int64_t feedbackKey) {
  at::NoGradGuard noGrad;
  checkCpu(tensor, "all_reduce_compressed tensor");
  TORCH_CHECK(
      tensor.scalar_type() == at::kFloat,
      "sncl: all_reduce_compressed supports float32 tensors only, got ",
      tensor.scalar_type());
  TORCH_CHECK(
      tensor.is_contiguous(),
      "sncl: all_reduce_compressed needs a contiguous tensor");
  TORCH_CHECK(
      !coalescing_,
      "sncl: all_reduce_compressed cannot be coalesced");
  Step st;
  st.issue = [this, buf = tensor, codec, average, feedbackKey] {
    void* b = ptrOf(buf);
    snclErrorFeedback_t fb = feedbackKey >= 0 ? feedbackFor(feedbackKey) : nullptr;
    check(
        snclAllReduceCompressedFeedback(
            b,
            b,
            static_cast<size_t>(buf.numel()),
            snclFloat32,
            average ? snclAvg : snclSum,
            codec.c_str(),
            fb,
            comm_,
            opStream()),
        "snclAllReduceCompressedFeedback");
  };
  std::vector<Step> steps;
  steps.push_back(std::move(st));
  return submit(
      c10d::OpType::ALLREDUCE,
      std::move(steps),
      {tensor},
      true,
      std::nullopt,
      "sncl:all_reduce_compressed");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::barrier(
    const c10d::BarrierOptions& opts) {
  Step st;
  st.issue = [this] { check(snclBarrier(comm_, opStream()), "snclBarrier"); };
  std::vector<Step> steps;
  steps.push_back(std::move(st));
  return submit(c10d::OpType::BARRIER, std::move(steps), {}, opts.asyncOp);
}

} // namespace sncl_torch
