// What gloo users rely on, for the "sncl" backend: profiler titles and
// trace parameters, receive from any source, monitored barrier, sparse
// all-reduce. See sncl_backend.hpp.

#include "sncl_backend.hpp"

#include <chrono>
#include <sstream>
#include <thread>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/ParamCommsUtils.hpp>

namespace sncl_torch {

[[noreturn]] void throwDistBackendError(const std::string& msg) {
  C10_THROW_ERROR(DistBackendError, msg);
}

const char* profilingTitle(c10d::OpType type) {
  using c10d::OpType;
  switch (type) {
    case OpType::BROADCAST:
      return "sncl:broadcast";
    case OpType::ALLREDUCE:
      return "sncl:all_reduce";
    case OpType::ALLREDUCE_COALESCED:
      return "sncl:all_reduce_coalesced";
    case OpType::REDUCE:
      return "sncl:reduce";
    case OpType::ALLGATHER:
      return "sncl:all_gather";
    case OpType::_ALLGATHER_BASE:
      return "sncl:_allgather_base";
    case OpType::ALLGATHER_COALESCED:
      return "sncl:all_gather_coalesced";
    case OpType::ALLGATHER_INTO_TENSOR_COALESCED:
      return "sncl:all_gather_into_tensor_coalesced";
    case OpType::GATHER:
      return "sncl:gather";
    case OpType::SCATTER:
      return "sncl:scatter";
    case OpType::REDUCE_SCATTER:
      return "sncl:reduce_scatter";
    case OpType::_REDUCE_SCATTER_BASE:
      return "sncl:_reduce_scatter_base";
    case OpType::REDUCE_SCATTER_TENSOR_COALESCED:
      return "sncl:reduce_scatter_tensor_coalesced";
    case OpType::ALLTOALL_BASE:
      return "sncl:all_to_all_single";
    case OpType::ALLTOALL:
      return "sncl:all_to_all";
    case OpType::SEND:
      return "sncl:send";
    case OpType::RECV:
      return "sncl:recv";
    case OpType::RECVANYSOURCE:
      return "sncl:recv_anysource";
    case OpType::BARRIER:
      return "sncl:barrier";
    case OpType::COALESCED:
      return "sncl:coalesced";
    default:
      return "sncl:unknown";
  }
}

void ProcessGroupSncl::recordParamComms(
    uint64_t seq,
    const char* name,
    const std::vector<at::Tensor>& inputs,
    const std::vector<at::Tensor>& outputs) {
  auto dtype = at::kByte;
  for (const auto& t : inputs.empty() ? outputs : inputs) {
    if (t.defined()) {
      dtype = t.scalar_type();
      break;
    }
  }
  int64_t inN = 0;
  int64_t outN = 0;
  for (const auto& t : inputs) {
    inN += t.defined() ? t.numel() : 0;
  }
  for (const auto& t : outputs) {
    outN += t.defined() ? t.numel() : 0;
  }
  // The collective's name without the "sncl:" prefix.
  std::string coll = std::string(name).substr(5);
  RECORD_PARAM_COMMS_DATA(
      std::make_tuple(static_cast<int64_t>(seq), false),
      std::make_tuple(groupName_, std::string("sncl")),
      inputs,
      outputs,
      rank_,
      std::move(coll),
      inN,
      outN,
      dtype,
      std::vector<int64_t>(),
      std::vector<int64_t>(),
      -1,
      -1,
      size_);
}

// ------------------------------------------------ receive from any source

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::recvAnysource(
    std::vector<at::Tensor>& tensors,
    int tag) {
  at::NoGradGuard noGrad;
  TORCH_CHECK(tensors.size() == 1, "sncl: recv takes one tensor");
  TORCH_CHECK(
      !coalescing_,
      "sncl: a receive from any source cannot be part of batch_isend_irecv");
  at::Tensor user = tensors[0];
  TORCH_CHECK(user.defined() && user.device().is_cpu() && !user.is_sparse(),
      "sncl: recv tensor must be a dense CPU tensor");
  at::Tensor buf = user.is_contiguous() ? user : at::empty(user.sizes(), user.options());
  auto box = std::make_shared<std::atomic<int>>(-1);
  Step st;
  st.issue = [this, buf, tag, box] {
    int src = -1;
    check(
        snclRecvTagged(
            buf.numel() ? buf.data_ptr() : nullptr,
            static_cast<size_t>(buf.numel()) * buf.element_size(),
            snclUint8,
            SNCL_ANY_SOURCE,
            tag,
            comm_,
            nullptr,
            &src),
        "snclRecvTagged (any source)");
    box->store(src);
  };
  if (!buf.is_same(user)) {
    st.post = [user, buf] { user.copy_(buf); };
  }
  std::vector<Step> steps;
  steps.push_back(std::move(st));
  auto work = submit(c10d::OpType::RECVANYSOURCE, std::move(steps), tensors);
  c10::static_intrusive_pointer_cast<WorkSncl>(work)->setSourceBox(box);
  return work;
}

// ------------------------------------------------------ monitored barrier

void ProcessGroupSncl::monitoredBarrier(
    const c10d::BarrierOptions& opts,
    bool waitAllRanks) {
  using Clock = std::chrono::steady_clock;
  auto timeout = opts.timeout == c10d::kUnsetTimeout ? timeout_ : opts.timeout;
  TORCH_CHECK(store_, "sncl: monitored_barrier after shutdown");
  const std::string base = "sncl/mb/" + groupName_ + "/" +
      std::to_string(++monitoredSeq_) + "/";
  const std::string release = base + "release";
  auto arrive = [&](int r) { return base + "arrive/" + std::to_string(r); };
  const auto ms = timeout.count();
  if (rank_ != 0) {
    store_->set(arrive(rank_), std::vector<uint8_t>{1});
    try {
      store_->wait({release}, timeout);
    } catch (const std::exception& e) {
      throwDistBackendError(c10::str(
          "sncl: Timed out: monitored_barrier on rank ",
          rank_,
          ": rank 0 did not release it within ",
          ms,
          " ms (", e.what(), ")"));
    }
    return;
  }
  // c10d's wording (ProcessGroupGloo), behind "Timed out": a rank that
  // does not arrive in time "failed to pass"; rank 0 whose own time is
  // spent before it waits for the next rank "timed out" itself.
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  auto arrivedBy = [&](int r, Clock::time_point until) {
    for (;;) {
      if (store_->check({arrive(r)})) {
        return true;
      }
      if (Clock::now() >= until) {
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  };
  auto fail = [&](const std::string& what) {
    throwDistBackendError(
        c10::str("sncl: Timed out: monitored_barrier on rank 0: ", what));
  };
  if (waitAllRanks) {
    std::vector<int> missing;
    for (int r = 1; r < size_; ++r) {
      if (!arrivedBy(r, deadline)) {
        missing.push_back(r);
      }
    }
    if (!missing.empty()) {
      std::ostringstream os;
      os << "Ranks ";
      for (size_t i = 0; i < missing.size(); ++i) {
        os << (i ? ", " : "") << missing[i];
      }
      fail(c10::str(os.str(), " failed to pass monitoredBarrier in ", ms, " ms"));
    }
  } else {
    std::vector<int> processed;
    for (int r = 1; r < size_; ++r) {
      if (Clock::now() > deadline) {
        std::ostringstream os;
        if (processed.empty()) {
          os << "No ranks successfully processed in monitoredBarrier.";
        } else {
          os << "Successfully processed ranks: ";
          for (size_t i = 0; i < processed.size(); ++i) {
            os << (i ? ", " : "") << processed[i];
          }
        }
        fail(c10::str(
            "Rank 0 timed out in monitoredBarrier after ", ms, " ms. ", os.str()));
      }
      if (!arrivedBy(r, deadline)) {
        fail(c10::str("Rank ", r, " failed to pass monitoredBarrier in ", ms, " ms"));
      }
      processed.push_back(r);
    }
  }
  for (int r = 1; r < size_; ++r) {
    store_->deleteKey(arrive(r));
  }
  store_->set(release, std::vector<uint8_t>{1});
}

// ---------------------------------------------------- sparse all-reduce

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::allreduce_sparse(
    std::vector<at::Tensor>& tensors,
    const c10d::AllreduceOptions& opts) {
  at::NoGradGuard noGrad;
  TORCH_CHECK(!tensors.empty(), "sncl: allreduce of no tensors");
  TORCH_CHECK(
      opts.reduceOp == c10d::ReduceOp::SUM,
      "sncl: sparse all-reduce supports SUM only");
  for (const auto& t : tensors) {
    TORCH_CHECK(
        t.defined() && t.device().is_cpu() && t.is_sparse(),
        "sncl: sparse all-reduce needs sparse COO CPU tensors");
  }
  auto out = std::make_shared<at::Tensor>();
  Step st;
  st.issue = [this, tensors, out] {
    at::NoGradGuard ng;
    at::Tensor input = tensors[0];
    for (size_t i = 1; i < tensors.size(); ++i) {
      input = input + tensors[i];
    }
    input = input.coalesce();
    const int64_t sd = input.sparse_dim();
    // Metadata: nnz, sparse dims, dense dims, then the sizes (up to 16).
    const int64_t kMeta = 19;
    TORCH_CHECK(input.dim() <= 16, "sncl: sparse all-reduce of more than 16 dims");
    auto meta = at::full({kMeta}, -1, at::kLong);
    auto m = meta.accessor<int64_t, 1>();
    m[0] = input._nnz();
    m[1] = sd;
    m[2] = input.dense_dim();
    for (int64_t d = 0; d < input.dim(); ++d) {
      m[3 + d] = input.size(d);
    }
    auto metas = at::empty({size_, kMeta}, at::kLong);
    check(
        snclAllGather(meta.data_ptr(), metas.data_ptr(), kMeta * 8, snclUint8, comm_, nullptr),
        "snclAllGather (sparse metadata)");
    int64_t maxNnz = 0;
    for (int r = 0; r < size_; ++r) {
      TORCH_CHECK(
          at::equal(metas[r].slice(0, 1), meta.slice(0, 1)),
          "sncl: sparse all-reduce: rank ", r, " has a tensor of another shape "
          "or sparse layout than rank ", rank_);
      maxNnz = std::max(maxNnz, metas[r][0].item<int64_t>());
    }
    auto idx = input._indices().contiguous();
    auto val = input._values().contiguous();
    auto idxPad = at::zeros({sd, maxNnz}, idx.options());
    idxPad.narrow(1, 0, idx.size(1)).copy_(idx);
    auto valShape = val.sizes().vec();
    valShape[0] = maxNnz;
    auto valPad = at::zeros(valShape, val.options());
    valPad.narrow(0, 0, val.size(0)).copy_(val);
    auto idxAll = at::empty({size_, sd, maxNnz}, idx.options());
    auto valShapeAll = valShape;
    valShapeAll.insert(valShapeAll.begin(), size_);
    auto valAll = at::empty(valShapeAll, val.options());
    if (maxNnz > 0) {
      check(
          snclAllGather(idxPad.data_ptr(), idxAll.data_ptr(),
              idxPad.numel() * idxPad.element_size(), snclUint8, comm_, nullptr),
          "snclAllGather (sparse indices)");
      if (valPad.numel() > 0) {
        check(
            snclAllGather(valPad.data_ptr(), valAll.data_ptr(),
                valPad.numel() * valPad.element_size(), snclUint8, comm_, nullptr),
            "snclAllGather (sparse values)");
      }
    }
    // Summed in rank order, then coalesced: ProcessGroupGloo's sequence,
    // so results are bit-identical to gloo's.
    at::Tensor output;
    for (int r = 0; r < size_; ++r) {
      const int64_t n = metas[r][0].item<int64_t>();
      auto part = at::sparse_coo_tensor(
          idxAll[r].narrow(1, 0, n),
          valAll[r].narrow(0, 0, n),
          input.sizes(),
          input.options());
      if (r == 0) {
        output = part;
      } else {
        output += part;
      }
    }
    *out = output.coalesce();
  };
  st.post = [tensors, out] {
    for (const auto& t : tensors) {
      t.copy_(*out);
    }
  };
  std::vector<Step> steps;
  steps.push_back(std::move(st));
  return submit(
      c10d::OpType::ALLREDUCE, std::move(steps), tensors, opts.asyncOp);
}

} // namespace sncl_torch
