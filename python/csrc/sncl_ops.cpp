// The "sncl" c10d backend's collectives (one wrapper per c10d op) and the
// step builders they share; see sncl_backend.hpp.

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

// ------------------------------------------------------------ step builders

Step ProcessGroupSncl::allreduceStep(
    const at::Tensor& tensor,
    const ReduceOp& rop) {
  checkTensor(tensor, "allreduce tensor");
  Staged s = stageInOut(tensor);
  RedPlan p = planReduce(s.buf, rop);
  Step st;
  if (p.kind == Kind::Bitwise) {
    auto rows = at::empty({size_, s.buf.numel()}, s.buf.options());
    st.issue = [this, buf = s.buf, rows] {
      check(
          snclAllGather(
              ptrOf(buf),
              ptrOf(rows),
              nbytesOf(buf),
              snclUint8,
              comm_,
              opStream()),
          "snclAllGather (bitwise allreduce)");
    };
    st.post = [s, rows, op = p.bitop] {
      bitReduceRows(rows, s.buf, op);
      s.writeBack();
    };
    return st;
  }
  st.issue = [this, buf = s.buf, p] {
    void* b = ptrOf(buf);
    if (p.kind == Kind::PreMul) {
      Scalar8 sc = encodeScalar(p.factor, p.dt);
      snclRedOp_t op;
      check(
          snclRedOpCreatePreMulSum(
              &op, sc.b, p.dt, snclScalarHostImmediate, comm_),
          "snclRedOpCreatePreMulSum");
      snclResult_t r =
          snclAllReduce(b, b, p.count, p.dt, op, comm_, opStream());
      (void)snclRedOpDestroy(op, comm_);
      check(r, "snclAllReduce");
    } else {
      check(
          snclAllReduce(b, b, p.count, p.dt, p.op, comm_, opStream()),
          "snclAllReduce");
    }
  };
  if (s.copyBack) {
    st.post = [s] { s.writeBack(); };
  }
  return st;
}

Step ProcessGroupSncl::allgatherBaseStep(
    const at::Tensor& output,
    const at::Tensor& input) {
  checkTensor(output, "allgather output");
  checkTensor(input, "allgather input");
  checkSameType(input, output, "all_gather_into_tensor");
  TORCH_CHECK(
      output.numel() == input.numel() * size_,
      "sncl: all_gather_into_tensor: the output has ",
      output.numel(),
      " elements, expected world size (",
      size_,
      ") x input (",
      input.numel(),
      ")");
  at::Tensor in = input.contiguous();
  Staged out = stageOut(output);
  Step st;
  st.issue = [this, in, buf = out.buf] {
    check(
        snclAllGather(
            ptrOf(in), ptrOf(buf), nbytesOf(in), snclUint8, comm_, opStream()),
        "snclAllGather");
  };
  if (out.copyBack) {
    st.post = [out] { out.writeBack(); };
  }
  return st;
}

Step ProcessGroupSncl::reduceScatterBaseStep(
    const at::Tensor& output,
    const at::Tensor& input,
    const ReduceOp& rop) {
  checkTensor(output, "reduce_scatter output");
  checkTensor(input, "reduce_scatter input");
  checkSameType(input, output, "reduce_scatter_tensor");
  TORCH_CHECK(
      input.numel() == output.numel() * size_,
      "sncl: reduce_scatter_tensor: the input has ",
      input.numel(),
      " elements, expected world size (",
      size_,
      ") x output (",
      output.numel(),
      ")");
  at::Tensor in = input.contiguous();
  Staged out = stageOut(output);
  RedPlan p = planReduce(out.buf, rop);
  Step st;
  if (p.kind == Kind::Bitwise) {
    // Block j of every rank goes to rank j, which reduces them locally.
    auto rows = at::empty({size_, out.buf.numel()}, out.buf.options());
    st.issue = [this, in, rows, blockBytes = nbytesOf(out.buf)] {
      check(
          snclAlltoAll(
              ptrOf(in),
              ptrOf(rows),
              blockBytes,
              snclUint8,
              comm_,
              opStream()),
          "snclAlltoAll (bitwise reduce_scatter)");
    };
    st.post = [out, rows, op = p.bitop] {
      bitReduceRows(rows, out.buf, op);
      out.writeBack();
    };
    return st;
  }
  st.issue = [this, in, buf = out.buf, p] {
    if (p.kind == Kind::PreMul) {
      Scalar8 sc = encodeScalar(p.factor, p.dt);
      snclRedOp_t op;
      check(
          snclRedOpCreatePreMulSum(
              &op, sc.b, p.dt, snclScalarHostImmediate, comm_),
          "snclRedOpCreatePreMulSum");
      snclResult_t r = snclReduceScatter(
          ptrOf(in), ptrOf(buf), p.count, p.dt, op, comm_, opStream());
      (void)snclRedOpDestroy(op, comm_);
      check(r, "snclReduceScatter");
    } else {
      check(
          snclReduceScatter(
              ptrOf(in), ptrOf(buf), p.count, p.dt, p.op, comm_, opStream()),
          "snclReduceScatter");
    }
  };
  if (out.copyBack) {
    st.post = [out] { out.writeBack(); };
  }
  return st;
}

// ------------------------------------------------------------- operations

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::broadcast(
    std::vector<at::Tensor>& tensors,
    const c10d::BroadcastOptions& opts) {
  at::NoGradGuard noGrad;
  TORCH_CHECK(!tensors.empty(), "sncl: broadcast of no tensors");
  TORCH_CHECK(
      opts.rootRank >= 0 && opts.rootRank < size_,
      "sncl: broadcast root ",
      opts.rootRank,
      " out of range");
  std::vector<Step> steps;
  for (auto& t : tensors) {
    checkTensor(t, "broadcast tensor");
    Staged s = stageInOut(t);
    Step st;
    st.issue = [this, buf = s.buf, root = static_cast<int>(opts.rootRank)] {
      void* b = ptrOf(buf);
      check(
          snclBroadcast(
              b, b, nbytesOf(buf), snclUint8, root, comm_, opStream()),
          "snclBroadcast");
    };
    if (s.copyBack) {
      st.post = [s] { s.writeBack(); };
    }
    steps.push_back(std::move(st));
  }
  return submit(c10d::OpType::BROADCAST, std::move(steps), tensors, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::allreduce(
    std::vector<at::Tensor>& tensors,
    const c10d::AllreduceOptions& opts) {
  at::NoGradGuard noGrad;
  TORCH_CHECK(!tensors.empty(), "sncl: allreduce of no tensors");
  if (tensors[0].defined() && tensors[0].is_sparse()) {
    return allreduce_sparse(tensors, opts);
  }
  TORCH_CHECK(
      !opts.sparseIndices.has_value(),
      "sncl: sparse allreduce is not supported");
  std::vector<Step> steps;
  for (auto& t : tensors) {
    steps.push_back(allreduceStep(t, opts.reduceOp));
  }
  return submit(c10d::OpType::ALLREDUCE, std::move(steps), tensors, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::allreduce_coalesced(
    std::vector<at::Tensor>& tensors,
    const c10d::AllreduceCoalescedOptions& opts) {
  at::NoGradGuard noGrad;
  std::vector<Step> steps;
  for (auto& t : tensors) {
    steps.push_back(allreduceStep(t, opts.reduceOp));
  }
  return submit(c10d::OpType::ALLREDUCE_COALESCED, std::move(steps), tensors, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::reduce(
    std::vector<at::Tensor>& tensors,
    const c10d::ReduceOptions& opts) {
  at::NoGradGuard noGrad;
  TORCH_CHECK(tensors.size() == 1, "sncl: reduce takes one tensor");
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(
      root >= 0 && root < size_, "sncl: reduce root ", root, " out of range");
  checkTensor(tensors[0], "reduce tensor");
  Staged s = stageInOut(tensors[0]);
  RedPlan p = planReduce(s.buf, opts.reduceOp);
  Step st;
  if (p.kind == Kind::Bitwise) {
    at::Tensor rows;
    if (rank_ == root) {
      rows = at::empty({size_, s.buf.numel()}, s.buf.options());
    }
    st.issue = [this, buf = s.buf, rows, root] {
      check(
          snclGather(
              ptrOf(buf),
              rows.defined() ? ptrOf(rows) : nullptr,
              nbytesOf(buf),
              snclUint8,
              root,
              comm_,
              opStream()),
          "snclGather (bitwise reduce)");
    };
    if (rank_ == root) {
      st.post = [s, rows, op = p.bitop] {
        bitReduceRows(rows, s.buf, op);
        s.writeBack();
      };
    }
  } else {
    // Only the root receives (in place); the others' tensors stay as they
    // were.
    st.issue = [this, buf = s.buf, p, root, isRoot = rank_ == root] {
      void* b = ptrOf(buf);
      void* r = isRoot ? b : nullptr;
      if (p.kind == Kind::PreMul) {
        Scalar8 sc = encodeScalar(p.factor, p.dt);
        snclRedOp_t op;
        check(
            snclRedOpCreatePreMulSum(
                &op, sc.b, p.dt, snclScalarHostImmediate, comm_),
            "snclRedOpCreatePreMulSum");
        snclResult_t res =
            snclReduce(b, r, p.count, p.dt, op, root, comm_, opStream());
        (void)snclRedOpDestroy(op, comm_);
        check(res, "snclReduce");
      } else {
        check(
            snclReduce(b, r, p.count, p.dt, p.op, root, comm_, opStream()),
            "snclReduce");
      }
    };
    if (s.copyBack && rank_ == root) {
      st.post = [s] { s.writeBack(); };
    }
  }
  std::vector<Step> steps;
  steps.push_back(std::move(st));
  return submit(c10d::OpType::REDUCE, std::move(steps), tensors, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::allgather(
    std::vector<std::vector<at::Tensor>>& outputTensors,
    std::vector<at::Tensor>& inputTensors,
    const c10d::AllgatherOptions& opts) {
  at::NoGradGuard noGrad;
  TORCH_CHECK(
      inputTensors.size() == 1 && outputTensors.size() == 1,
      "sncl: allgather takes one input tensor and one output list");
  auto& outs = outputTensors[0];
  TORCH_CHECK(
      static_cast<int>(outs.size()) == size_,
      "sncl: allgather needs ",
      size_,
      " output tensors, got ",
      outs.size());
  checkTensor(inputTensors[0], "allgather input");
  at::Tensor in = inputTensors[0].contiguous();
  bool even = true;
  for (auto& o : outs) {
    checkTensor(o, "allgather output");
    checkSameType(in, o, "allgather");
    even = even && o.numel() == in.numel();
  }
  TORCH_CHECK(
      outs[rank_].numel() == in.numel(),
      "sncl: allgather: this rank's output has ",
      outs[rank_].numel(),
      " elements but its input ",
      in.numel());
  std::vector<size_t> counts(size_), displs(size_);
  int64_t total = 0;
  for (int i = 0; i < size_; ++i) {
    counts[i] = nbytesOf(outs[i]);
    displs[i] = static_cast<size_t>(total) * in.element_size();
    total += outs[i].numel();
  }
  at::Tensor flat = at::empty({total}, in.options());
  Step st;
  st.issue = [this, in, flat, even, counts, displs] {
    if (even) {
      check(
          snclAllGather(
              ptrOf(in),
              ptrOf(flat),
              nbytesOf(in),
              snclUint8,
              comm_,
              opStream()),
          "snclAllGather");
    } else {
      check(
          snclAllGatherV(
              ptrOf(in),
              ptrOf(flat),
              counts.data(),
              displs.data(),
              snclUint8,
              comm_,
              opStream()),
          "snclAllGatherV");
    }
  };
  st.post = [outs, flat] {
    int64_t off = 0;
    for (auto& o : outs) {
      o.copy_(flat.narrow(0, off, o.numel()).view(o.sizes()));
      off += o.numel();
    }
  };
  std::vector<Step> steps;
  steps.push_back(std::move(st));
  return submit(
      c10d::OpType::ALLGATHER, std::move(steps), outs, opts.asyncOp, inputTensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::all_gather_single(
    at::Tensor& outputBuffer,
    at::Tensor& inputBuffer,
    const c10d::AllgatherOptions& opts) {
  at::NoGradGuard noGrad;
  std::vector<Step> steps;
  steps.push_back(allgatherBaseStep(outputBuffer, inputBuffer));
  return submit(
      c10d::OpType::_ALLGATHER_BASE, std::move(steps), {outputBuffer}, opts.asyncOp,
      std::vector<at::Tensor>{inputBuffer});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::_allgather_base(
    at::Tensor& outputBuffer,
    at::Tensor& inputBuffer,
    const c10d::AllgatherOptions& opts) {
  return all_gather_single(outputBuffer, inputBuffer, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputTensorLists,
    std::vector<at::Tensor>& inputTensors,
    const c10d::AllgatherOptions& opts) {
  // outputTensorLists[r][j] receives rank r's inputTensors[j].
  TORCH_CHECK(
      static_cast<int>(outputTensorLists.size()) == size_,
      "sncl: allgather_coalesced needs one output list per rank");
  at::NoGradGuard noGrad;
  std::vector<Step> steps;
  std::vector<at::Tensor> all;
  for (size_t j = 0; j < inputTensors.size(); ++j) {
    std::vector<at::Tensor> outs;
    for (int r = 0; r < size_; ++r) {
      TORCH_CHECK(
          outputTensorLists[r].size() == inputTensors.size(),
          "sncl: allgather_coalesced: output list ",
          r,
          " has the wrong length");
      outs.push_back(outputTensorLists[r][j]);
      all.push_back(outputTensorLists[r][j]);
    }
    at::Tensor inC = inputTensors[j].contiguous();
    for (auto& t : outs) {
      checkTensor(t, "allgather_coalesced output");
      checkSameType(inC, t, "allgather_coalesced");
      TORCH_CHECK(
          t.numel() == inC.numel(),
          "sncl: allgather_coalesced: output sizes differ from the input");
    }
    at::Tensor flat = at::empty({inC.numel() * size_}, inC.options());
    Step st;
    st.issue = [this, inC, flat] {
      check(
          snclAllGather(
              ptrOf(inC),
              ptrOf(flat),
              nbytesOf(inC),
              snclUint8,
              comm_,
              opStream()),
          "snclAllGather");
    };
    st.post = [outs, flat, n = inC.numel()] {
      for (size_t r = 0; r < outs.size(); ++r) {
        outs[r].copy_(flat.narrow(0, r * n, n).view(outs[r].sizes()));
      }
    };
    steps.push_back(std::move(st));
  }
  return submit(
      c10d::OpType::ALLGATHER_COALESCED, std::move(steps), all, opts.asyncOp, inputTensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::all_gather_single_coalesced(
    std::vector<at::Tensor>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  at::NoGradGuard noGrad;
  TORCH_CHECK(
      outputs.size() == inputs.size(),
      "sncl: allgather_into_tensor_coalesced: ",
      outputs.size(),
      " outputs for ",
      inputs.size(),
      " inputs");
  std::vector<Step> steps;
  for (size_t i = 0; i < inputs.size(); ++i) {
    steps.push_back(allgatherBaseStep(outputs[i], inputs[i]));
  }
  return submit(
      c10d::OpType::ALLGATHER_INTO_TENSOR_COALESCED, std::move(steps), outputs, opts.asyncOp,
      inputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::
    allgather_into_tensor_coalesced(
        std::vector<at::Tensor>& outputs,
        std::vector<at::Tensor>& inputs,
        const c10d::AllgatherOptions& opts) {
  return all_gather_single_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::gather(
    std::vector<std::vector<at::Tensor>>& outputTensors,
    std::vector<at::Tensor>& inputTensors,
    const c10d::GatherOptions& opts) {
  at::NoGradGuard noGrad;
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(
      root >= 0 && root < size_, "sncl: gather root ", root, " out of range");
  TORCH_CHECK(inputTensors.size() == 1, "sncl: gather takes one input tensor");
  checkTensor(inputTensors[0], "gather input");
  at::Tensor in = inputTensors[0].contiguous();
  std::vector<at::Tensor> outs;
  at::Tensor flat;
  if (rank_ == root) {
    TORCH_CHECK(
        outputTensors.size() == 1 &&
            static_cast<int>(outputTensors[0].size()) == size_,
        "sncl: gather needs ",
        size_,
        " output tensors on the root");
    outs = outputTensors[0];
    for (auto& o : outs) {
      checkTensor(o, "gather output");
      checkSameType(in, o, "gather");
      TORCH_CHECK(
          o.numel() == in.numel(),
          "sncl: gather: output and input sizes differ");
    }
    flat = at::empty({in.numel() * size_}, in.options());
  } else {
    TORCH_CHECK(
        outputTensors.empty() || outputTensors[0].empty(),
        "sncl: gather: only the root takes output tensors");
  }
  Step st;
  st.issue = [this, in, flat, root] {
    check(
        snclGather(
            ptrOf(in),
            flat.defined() ? ptrOf(flat) : nullptr,
            nbytesOf(in),
            snclUint8,
            root,
            comm_,
            opStream()),
        "snclGather");
  };
  if (rank_ == root) {
    st.post = [outs, flat, n = in.numel()] {
      for (size_t r = 0; r < outs.size(); ++r) {
        outs[r].copy_(flat.narrow(0, r * n, n).view(outs[r].sizes()));
      }
    };
  }
  std::vector<Step> steps;
  steps.push_back(std::move(st));
  return submit(
      c10d::OpType::GATHER, std::move(steps), outs, opts.asyncOp, inputTensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::gather_single(
    at::Tensor& outputBuffer,
    at::Tensor& inputBuffer,
    const c10d::GatherOptions& opts) {
  at::NoGradGuard noGrad;
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(
      root >= 0 && root < size_, "sncl: gather root ", root, " out of range");
  checkTensor(inputBuffer, "gather input");
  at::Tensor in = inputBuffer.contiguous();
  Staged out;
  std::vector<at::Tensor> outs;
  if (rank_ == root) {
    checkTensor(outputBuffer, "gather output");
    checkSameType(in, outputBuffer, "gather_into_tensor");
    TORCH_CHECK(
        outputBuffer.numel() == in.numel() * size_,
        "sncl: gather_into_tensor: the output must hold world size x input");
    out = stageOut(outputBuffer);
    outs.push_back(outputBuffer);
  }
  Step st;
  st.issue = [this, in, buf = out.buf, root] {
    check(
        snclGather(
            ptrOf(in),
            buf.defined() ? ptrOf(buf) : nullptr,
            nbytesOf(in),
            snclUint8,
            root,
            comm_,
            opStream()),
        "snclGather");
  };
  if (out.copyBack) {
    st.post = [out] { out.writeBack(); };
  }
  std::vector<Step> steps;
  steps.push_back(std::move(st));
  return submit(
      c10d::OpType::GATHER, std::move(steps), outs, opts.asyncOp,
      std::vector<at::Tensor>{inputBuffer});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::gather_into_tensor(
    at::Tensor& outputBuffer,
    at::Tensor& inputBuffer,
    const c10d::GatherOptions& opts) {
  return gather_single(outputBuffer, inputBuffer, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::scatter(
    std::vector<at::Tensor>& outputTensors,
    std::vector<std::vector<at::Tensor>>& inputTensors,
    const c10d::ScatterOptions& opts) {
  at::NoGradGuard noGrad;
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(
      root >= 0 && root < size_, "sncl: scatter root ", root, " out of range");
  TORCH_CHECK(
      outputTensors.size() == 1, "sncl: scatter takes one output tensor");
  checkTensor(outputTensors[0], "scatter output");
  Staged out = stageOut(outputTensors[0]);
  const int64_t n = out.buf.numel();
  at::Tensor flat;
  if (rank_ == root) {
    TORCH_CHECK(
        inputTensors.size() == 1 &&
            static_cast<int>(inputTensors[0].size()) == size_,
        "sncl: scatter needs ",
        size_,
        " input tensors on the root");
    flat = at::empty({n * size_}, out.buf.options());
    for (int r = 0; r < size_; ++r) {
      auto& t = inputTensors[0][r];
      checkTensor(t, "scatter input");
      checkSameType(t, out.buf, "scatter");
      TORCH_CHECK(
          t.numel() == n, "sncl: scatter: input and output sizes differ");
      flat.narrow(0, r * n, n).copy_(t.reshape({-1}));
    }
  } else {
    TORCH_CHECK(
        inputTensors.empty() || inputTensors[0].empty(),
        "sncl: scatter: only the root takes input tensors");
  }
  Step st;
  st.issue = [this, flat, buf = out.buf, root] {
    check(
        snclScatter(
            flat.defined() ? ptrOf(flat) : nullptr,
            ptrOf(buf),
            nbytesOf(buf),
            snclUint8,
            root,
            comm_,
            opStream()),
        "snclScatter");
  };
  if (out.copyBack) {
    st.post = [out] { out.writeBack(); };
  }
  std::vector<Step> steps;
  steps.push_back(std::move(st));
  std::vector<at::Tensor> ins;
  if (!inputTensors.empty()) {
    ins = inputTensors[0];
  }
  return submit(
      c10d::OpType::SCATTER, std::move(steps), outputTensors, opts.asyncOp, ins);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::reduce_scatter(
    std::vector<at::Tensor>& outputTensors,
    std::vector<std::vector<at::Tensor>>& inputTensors,
    const c10d::ReduceScatterOptions& opts) {
  at::NoGradGuard noGrad;
  TORCH_CHECK(
      outputTensors.size() == 1 && inputTensors.size() == 1,
      "sncl: reduce_scatter takes one output tensor and one input list");
  auto& ins = inputTensors[0];
  TORCH_CHECK(
      static_cast<int>(ins.size()) == size_,
      "sncl: reduce_scatter needs ",
      size_,
      " input tensors, got ",
      ins.size());
  at::Tensor output = outputTensors[0];
  checkTensor(output, "reduce_scatter output");
  bool even = true;
  for (auto& t : ins) {
    checkTensor(t, "reduce_scatter input");
    checkSameType(t, output, "reduce_scatter");
    even = even && t.numel() == output.numel();
  }
  std::vector<Step> steps;
  if (even) {
    const int64_t n = output.numel();
    at::Tensor flat = at::empty({n * size_}, output.options());
    for (int r = 0; r < size_; ++r) {
      flat.narrow(0, r * n, n).copy_(ins[r].reshape({-1}));
    }
    steps.push_back(reduceScatterBaseStep(output, flat, opts.reduceOp));
  } else {
    // Uneven blocks: one reduce per rank, block j to rank j.
    TORCH_CHECK(
        ins[rank_].numel() == output.numel(),
        "sncl: reduce_scatter: this rank's block and the output differ in "
        "size");
    Staged out = stageOut(output);
    for (int j = 0; j < size_; ++j) {
      at::Tensor src = ins[j].contiguous();
      RedPlan p = planReduce(src, opts.reduceOp);
      Step st;
      if (p.kind == Kind::Bitwise) {
        at::Tensor rows;
        if (j == rank_) {
          rows = at::empty({size_, src.numel()}, src.options());
        }
        st.issue = [this, src, rows, j] {
          check(
              snclGather(
                  ptrOf(src),
                  rows.defined() ? ptrOf(rows) : nullptr,
                  nbytesOf(src),
                  snclUint8,
                  j,
                  comm_,
                  opStream()),
              "snclGather (bitwise reduce_scatter)");
        };
        if (j == rank_) {
          st.post = [out, rows, op = p.bitop] {
            bitReduceRows(rows, out.buf, op);
            out.writeBack();
          };
        }
      } else {
        at::Tensor dst = j == rank_ ? out.buf : at::Tensor();
        st.issue = [this, src, dst, p, j] {
          void* d = dst.defined() ? ptrOf(dst) : nullptr;
          if (p.kind == Kind::PreMul) {
            Scalar8 sc = encodeScalar(p.factor, p.dt);
            snclRedOp_t op;
            check(
                snclRedOpCreatePreMulSum(
                    &op, sc.b, p.dt, snclScalarHostImmediate, comm_),
                "snclRedOpCreatePreMulSum");
            snclResult_t r = snclReduce(
                ptrOf(src), d, p.count, p.dt, op, j, comm_, opStream());
            (void)snclRedOpDestroy(op, comm_);
            check(r, "snclReduce");
          } else {
            check(
                snclReduce(
                    ptrOf(src), d, p.count, p.dt, p.op, j, comm_, opStream()),
                "snclReduce");
          }
        };
        if (j == rank_ && out.copyBack) {
          st.post = [out] { out.writeBack(); };
        }
      }
      steps.push_back(std::move(st));
    }
  }
  return submit(
      c10d::OpType::REDUCE_SCATTER, std::move(steps), outputTensors, opts.asyncOp,
      inputTensors[0]);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::reduce_scatter_single(
    at::Tensor& outputBuffer,
    at::Tensor& inputBuffer,
    const c10d::ReduceScatterOptions& opts) {
  at::NoGradGuard noGrad;
  std::vector<Step> steps;
  steps.push_back(
      reduceScatterBaseStep(outputBuffer, inputBuffer, opts.reduceOp));
  return submit(
      c10d::OpType::_REDUCE_SCATTER_BASE, std::move(steps), {outputBuffer}, opts.asyncOp,
      std::vector<at::Tensor>{inputBuffer});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::_reduce_scatter_base(
    at::Tensor& outputBuffer,
    at::Tensor& inputBuffer,
    const c10d::ReduceScatterOptions& opts) {
  return reduce_scatter_single(outputBuffer, inputBuffer, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::
    reduce_scatter_single_coalesced(
        std::vector<at::Tensor>& outputs,
        std::vector<at::Tensor>& inputs,
        const c10d::ReduceScatterOptions& opts) {
  at::NoGradGuard noGrad;
  TORCH_CHECK(
      outputs.size() == inputs.size(),
      "sncl: reduce_scatter_tensor_coalesced: ",
      outputs.size(),
      " outputs for ",
      inputs.size(),
      " inputs");
  std::vector<Step> steps;
  for (size_t i = 0; i < inputs.size(); ++i) {
    steps.push_back(reduceScatterBaseStep(outputs[i], inputs[i], opts.reduceOp));
  }
  return submit(
      c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, std::move(steps), outputs, opts.asyncOp,
      inputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::
    reduce_scatter_tensor_coalesced(
        std::vector<at::Tensor>& outputs,
        std::vector<at::Tensor>& inputs,
        const c10d::ReduceScatterOptions& opts) {
  return reduce_scatter_single_coalesced(outputs, inputs, opts);
}

} // namespace sncl_torch
