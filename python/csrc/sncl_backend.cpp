// The "sncl" c10d backend over sncl's C ABI; see sncl_backend.hpp.

#include "sncl_backend.hpp"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/extension.h>
#include <pybind11/chrono.h>

namespace sncl_torch {

namespace {

using c10d::ReduceOp;

// A valid pointer for zero-length buffers (sncl rejects NULL buffers).
alignas(16) char kEmpty[16];

void* ptrOf(const at::Tensor& t) {
  void* p = t.defined() ? t.data_ptr() : nullptr;
  return p ? p : static_cast<void*>(kEmpty);
}

size_t nbytesOf(const at::Tensor& t) {
  return static_cast<size_t>(t.numel()) * t.element_size();
}

void checkCpu(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.defined(), "sncl: ", what, " is undefined");
  TORCH_CHECK(
      t.device().is_cpu(),
      "sncl: ",
      what,
      " must be a CPU tensor (got ",
      t.device(),
      "); the GPU path has not landed yet");
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

// One element of `dt` holding `f`, for snclRedOpCreatePreMulSum.
struct Scalar8 {
  alignas(8) unsigned char b[8] = {0};
};

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

std::map<std::string, int>& instanceCounts() {
  static std::map<std::string, int> m;
  return m;
}
std::mutex instanceMu;

} // namespace

// ---------------------------------------------------------------- WorkSncl

WorkSncl::WorkSncl(
    int rank,
    c10d::OpType opType,
    std::vector<at::Tensor> outputs,
    uint64_t seq,
    const char* profilingTitle,
    const std::optional<std::vector<at::Tensor>>& inputs)
    : Work(rank, opType, profilingTitle, inputs),
      outputs_(std::move(outputs)),
      seq_(seq),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()))) {}

std::vector<at::Tensor> WorkSncl::result() {
  return outputs_;
}

c10::intrusive_ptr<c10::ivalue::Future> WorkSncl::getFuture() {
  return future_;
}

uint64_t WorkSncl::getSequencenumber() const {
  return seq_;
}

int WorkSncl::sourceRank() const {
  TORCH_CHECK(
      srcBox_ != nullptr,
      "sncl: sourceRank() is only available on a receive from any source");
  return srcBox_->load();
}

void WorkSncl::addOutputs(const std::vector<at::Tensor>& outs) {
  outputs_.insert(outputs_.end(), outs.begin(), outs.end());
}

void WorkSncl::complete(std::exception_ptr error) {
  // The future first: a caller returning from wait() may read it at once.
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
  finish(error);
}

// -------------------------------------------------------- ProcessGroupSncl

ProcessGroupSncl::ProcessGroupSncl(
    const c10::intrusive_ptr<c10d::Store>& store,
    int rank,
    int size,
    std::chrono::milliseconds timeout,
    const std::string& groupName)
    : c10d::Backend(rank, size),
      store_(store),
      timeout_(timeout),
      groupName_(groupName) {
  TORCH_CHECK(store_, "sncl: no store to bootstrap through");
  int instance = 0;
  {
    std::lock_guard<std::mutex> g(instanceMu);
    instance = instanceCounts()[groupName]++;
  }
  // The store torch passes is already prefixed per group and device; the
  // group name and instance keep keys distinct anyway.
  const std::string key =
      "sncl/uid/" + groupName + "/" + std::to_string(instance);
  snclUniqueId id;
  if (rank == 0) {
    check(snclGetUniqueId(&id), "snclGetUniqueId");
    std::vector<uint8_t> bytes(
        reinterpret_cast<uint8_t*>(id.internal),
        reinterpret_cast<uint8_t*>(id.internal) + sizeof(id.internal));
    store_->set(key, bytes);
  } else {
    auto bytes = store_->get(key);
    TORCH_CHECK(
        bytes.size() == sizeof(id.internal),
        "sncl: the unique id under store key ",
        key,
        " has ",
        bytes.size(),
        " bytes, expected ",
        sizeof(id.internal));
    std::memcpy(id.internal, bytes.data(), bytes.size());
  }
  snclConfig_t cfg = SNCL_CONFIG_INITIALIZER;
  // Settings come from libsncl (environment, else the settings file).
  char setting[256];
  int isSet = 0;
  check(
      snclGetSetting("SNCL_TIMEOUT_MS", setting, sizeof(setting), &isSet),
      "snclGetSetting(SNCL_TIMEOUT_MS)");
  if (!isSet) {
    // The process group's timeout bounds how long an operation may wait
    // for a silent peer (SNCL_TIMEOUT_MS, when set, takes precedence).
    auto ms = timeout.count();
    cfg.timeoutMs = static_cast<int>(std::clamp<int64_t>(ms, 1000, INT_MAX));
  }
  snclComm_t comm = nullptr;
  snclResult_t r = snclCommInitRankConfig(&comm, size, id, rank, &cfg);
  check(r, "snclCommInitRankConfig");
  comm_ = comm;
  check(
      snclGetSetting("SNCL_TORCH_INLINE", setting, sizeof(setting), &isSet),
      "snclGetSetting(SNCL_TORCH_INLINE)");
  if (isSet) {
    inlineDisabled_ = std::string(setting) == "0";
  }
  worker_ = std::thread([this] { workerLoop(); });
  init();
}

ProcessGroupSncl::~ProcessGroupSncl() {
  try {
    shutdown();
  } catch (...) {
  }
  if (worker_.joinable()) {
    // Only when destroyed on the worker thread itself (from a callback).
    worker_.detach();
  }
}

void ProcessGroupSncl::check(snclResult_t r, const char* what) const {
  if (r == snclSuccess) {
    return;
  }
  const char* detail = snclGetLastError(comm_);
  std::string msg = c10::str(
      "sncl: ",
      what,
      " failed on rank ",
      rank_,
      ": ",
      snclGetErrorString(r),
      (detail && *detail) ? ": " : "",
      (detail && *detail) ? detail : "");
  if (r == snclTimeout) {
    // "Timed out" first, as gloo's and NCCL's timeouts read; sncl's
    // detail names the operation, the timeout and the ranks waited on.
    msg = c10::str(
        "sncl: Timed out: ",
        what,
        " on rank ",
        rank_,
        " (process group timeout ",
        timeout_.count(),
        " ms): ",
        (detail && *detail) ? detail : "no detail");
  }
  C10_THROW_ERROR(DistBackendError, msg);
}

c10::intrusive_ptr<c10d::Backend::Options> ProcessGroupSncl::
    getBackendOptions() {
  auto o = c10::make_intrusive<Options>(timeout_);
  o->group_name = groupName_;
  return o;
}

void ProcessGroupSncl::setTimeout(std::chrono::milliseconds timeout) {
  timeout_ = timeout;
}

uint64_t ProcessGroupSncl::getSequenceNumberForGroup() {
  std::lock_guard<std::mutex> g(mu_);
  return seq_;
}

// ------------------------------------------------------------- the worker

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::submit(
    c10d::OpType type,
    std::vector<Step> steps,
    std::vector<at::Tensor> outputs,
    bool asyncOp,
    std::optional<std::vector<at::Tensor>> inputs,
    const char* title) {
  if (!inputs) {
    inputs = outputs;
  }
  if (coalescing_) {
    for (auto& s : steps) {
      coalesced_.steps.push_back(std::move(s));
    }
    coalesced_.work->addOutputs(outputs);
    return coalesced_.work;
  }
  c10::intrusive_ptr<WorkSncl> work;
  bool runHere = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    TORCH_CHECK(!closed_, "sncl: the process group has been shut down");
    const char* name = title ? title : profilingTitle(type);
    recordParamComms(seq_ + 1, name, *inputs, outputs);
    work = c10::make_intrusive<WorkSncl>(
        rank_, type, std::move(outputs), ++seq_, name, inputs);
    if (!asyncOp && !busy_ && queue_.empty() && !inlineDisabled_) {
      busy_ = true; // the worker waits until this call is done
      runHere = true;
    } else {
      queue_.push_back(Task{std::move(steps), false, work});
    }
  }
  if (runHere) {
    Task task{std::move(steps), false, work};
    std::exception_ptr error = runTask(task);
    {
      std::lock_guard<std::mutex> g(mu_);
      busy_ = false;
    }
    cv_.notify_all();
    work->complete(error);
    return work;
  }
  cv_.notify_one();
  return work;
}

void ProcessGroupSncl::startCoalescing() {
  TORCH_CHECK(!coalescing_, "sncl: startCoalescing called twice");
  uint64_t seq;
  {
    std::lock_guard<std::mutex> g(mu_);
    seq = ++seq_;
  }
  coalesced_ = Task{
      {},
      true,
      c10::make_intrusive<WorkSncl>(
          rank_,
          c10d::OpType::COALESCED,
          std::vector<at::Tensor>{},
          seq,
          profilingTitle(c10d::OpType::COALESCED))};
  coalescing_ = true;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::endCoalescing() {
  TORCH_CHECK(coalescing_, "sncl: endCoalescing without startCoalescing");
  coalescing_ = false;
  auto work = coalesced_.work;
  {
    std::lock_guard<std::mutex> g(mu_);
    TORCH_CHECK(!closed_, "sncl: the process group has been shut down");
    queue_.push_back(std::move(coalesced_));
  }
  coalesced_ = Task{};
  cv_.notify_one();
  return work;
}

void ProcessGroupSncl::workerLoop() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [this] { return (stop_ || !queue_.empty()) && !busy_; });
      if (queue_.empty()) {
        return;
      }
      task = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    std::exception_ptr error = runTask(task);
    {
      std::lock_guard<std::mutex> g(mu_);
      busy_ = false;
    }
    // Completion callbacks (future.then) run here, with the communicator
    // free: a callback may issue further operations.
    task.work->complete(error);
  }
}

std::exception_ptr ProcessGroupSncl::runTask(Task& task) {
  // Output copies write into leaf tensors that may require grad.
  at::NoGradGuard noGrad;
  std::exception_ptr error;
  try {
    if (task.group && !task.steps.empty()) {
      check(snclGroupStart(), "snclGroupStart");
      try {
        for (auto& s : task.steps) {
          s.issue();
        }
      } catch (...) {
        (void)snclGroupEnd();
        throw;
      }
      check(snclGroupEnd(), "snclGroupEnd");
    } else {
      for (auto& s : task.steps) {
        s.issue();
      }
    }
    for (auto& s : task.steps) {
      if (s.post) {
        s.post();
      }
    }
  } catch (...) {
    error = std::current_exception();
  }
  // Release the tensors the steps hold before completing.
  task.steps.clear();
  return error;
}

void ProcessGroupSncl::stopWorker(bool drain) {
  std::deque<Task> dropped;
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
    if (!drain) {
      dropped.swap(queue_);
    }
  }
  cv_.notify_all();
  for (auto& t : dropped) {
    t.steps.clear();
    try {
      C10_THROW_ERROR(
          DistBackendError, "sncl: the process group was aborted");
    } catch (...) {
      t.work->complete(std::current_exception());
    }
  }
}

void ProcessGroupSncl::shutdown() {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (closed_) {
      return;
    }
    closed_ = true;
  }
  stopWorker(/*drain=*/true);
  if (worker_.joinable()) {
    if (worker_.get_id() == std::this_thread::get_id()) {
      return; // from a completion callback: the destructor finishes up
    }
    worker_.join();
  }
  if (snclComm_t c = comm_.exchange(nullptr)) {
    (void)snclCommDestroy(c);
  }
  store_.reset();
}

void ProcessGroupSncl::abort() {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (closed_) {
      return;
    }
    closed_ = true;
  }
  stopWorker(/*drain=*/false);
  // Makes an operation in flight fail here and on the peers.
  if (snclComm_t c = comm_.exchange(nullptr)) {
    (void)snclCommAbort(c);
  }
  if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) {
    worker_.join();
  }
  store_.reset();
}

// ------------------------------------------------------------ step builders

Step ProcessGroupSncl::allreduceStep(
    const at::Tensor& tensor,
    const ReduceOp& rop) {
  checkCpu(tensor, "allreduce tensor");
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
              nullptr),
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
          snclAllReduce(b, b, p.count, p.dt, op, comm_, nullptr);
      (void)snclRedOpDestroy(op, comm_);
      check(r, "snclAllReduce");
    } else {
      check(
          snclAllReduce(b, b, p.count, p.dt, p.op, comm_, nullptr),
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
  checkCpu(output, "allgather output");
  checkCpu(input, "allgather input");
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
            ptrOf(in), ptrOf(buf), nbytesOf(in), snclUint8, comm_, nullptr),
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
  checkCpu(output, "reduce_scatter output");
  checkCpu(input, "reduce_scatter input");
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
              nullptr),
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
          ptrOf(in), ptrOf(buf), p.count, p.dt, op, comm_, nullptr);
      (void)snclRedOpDestroy(op, comm_);
      check(r, "snclReduceScatter");
    } else {
      check(
          snclReduceScatter(
              ptrOf(in), ptrOf(buf), p.count, p.dt, p.op, comm_, nullptr),
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
    checkCpu(t, "broadcast tensor");
    Staged s = stageInOut(t);
    Step st;
    st.issue = [this, buf = s.buf, root = static_cast<int>(opts.rootRank)] {
      void* b = ptrOf(buf);
      check(
          snclBroadcast(
              b, b, nbytesOf(buf), snclUint8, root, comm_, nullptr),
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
  checkCpu(tensors[0], "reduce tensor");
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
              nullptr),
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
            snclReduce(b, r, p.count, p.dt, op, root, comm_, nullptr);
        (void)snclRedOpDestroy(op, comm_);
        check(res, "snclReduce");
      } else {
        check(
            snclReduce(b, r, p.count, p.dt, p.op, root, comm_, nullptr),
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
  checkCpu(inputTensors[0], "allgather input");
  at::Tensor in = inputTensors[0].contiguous();
  bool even = true;
  for (auto& o : outs) {
    checkCpu(o, "allgather output");
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
              nullptr),
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
              nullptr),
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
  return submit(c10d::OpType::ALLGATHER, std::move(steps), outs, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::all_gather_single(
    at::Tensor& outputBuffer,
    at::Tensor& inputBuffer,
    const c10d::AllgatherOptions& opts) {
  at::NoGradGuard noGrad;
  std::vector<Step> steps;
  steps.push_back(allgatherBaseStep(outputBuffer, inputBuffer));
  return submit(
      c10d::OpType::_ALLGATHER_BASE, std::move(steps), {outputBuffer}, opts.asyncOp);
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
      checkCpu(t, "allgather_coalesced output");
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
              nullptr),
          "snclAllGather");
    };
    st.post = [outs, flat, n = inC.numel()] {
      for (size_t r = 0; r < outs.size(); ++r) {
        outs[r].copy_(flat.narrow(0, r * n, n).view(outs[r].sizes()));
      }
    };
    steps.push_back(std::move(st));
  }
  return submit(c10d::OpType::ALLGATHER_COALESCED, std::move(steps), all, opts.asyncOp);
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
      c10d::OpType::ALLGATHER_INTO_TENSOR_COALESCED, std::move(steps), outputs, opts.asyncOp);
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
  checkCpu(inputTensors[0], "gather input");
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
      checkCpu(o, "gather output");
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
            nullptr),
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
  return submit(c10d::OpType::GATHER, std::move(steps), outs, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::gather_single(
    at::Tensor& outputBuffer,
    at::Tensor& inputBuffer,
    const c10d::GatherOptions& opts) {
  at::NoGradGuard noGrad;
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(
      root >= 0 && root < size_, "sncl: gather root ", root, " out of range");
  checkCpu(inputBuffer, "gather input");
  at::Tensor in = inputBuffer.contiguous();
  Staged out;
  std::vector<at::Tensor> outs;
  if (rank_ == root) {
    checkCpu(outputBuffer, "gather output");
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
            nullptr),
        "snclGather");
  };
  if (out.copyBack) {
    st.post = [out] { out.writeBack(); };
  }
  std::vector<Step> steps;
  steps.push_back(std::move(st));
  return submit(c10d::OpType::GATHER, std::move(steps), outs, opts.asyncOp);
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
  checkCpu(outputTensors[0], "scatter output");
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
      checkCpu(t, "scatter input");
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
            nullptr),
        "snclScatter");
  };
  if (out.copyBack) {
    st.post = [out] { out.writeBack(); };
  }
  std::vector<Step> steps;
  steps.push_back(std::move(st));
  return submit(c10d::OpType::SCATTER, std::move(steps), outputTensors, opts.asyncOp);
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
  checkCpu(output, "reduce_scatter output");
  bool even = true;
  for (auto& t : ins) {
    checkCpu(t, "reduce_scatter input");
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
                  nullptr),
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
                ptrOf(src), d, p.count, p.dt, op, j, comm_, nullptr);
            (void)snclRedOpDestroy(op, comm_);
            check(r, "snclReduce");
          } else {
            check(
                snclReduce(
                    ptrOf(src), d, p.count, p.dt, p.op, j, comm_, nullptr),
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
  return submit(c10d::OpType::REDUCE_SCATTER, std::move(steps), outputTensors, opts.asyncOp);
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
      c10d::OpType::_REDUCE_SCATTER_BASE, std::move(steps), {outputBuffer}, opts.asyncOp);
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
      c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, std::move(steps), outputs, opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::
    reduce_scatter_tensor_coalesced(
        std::vector<at::Tensor>& outputs,
        std::vector<at::Tensor>& inputs,
        const c10d::ReduceScatterOptions& opts) {
  return reduce_scatter_single_coalesced(outputs, inputs, opts);
}

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
  checkCpu(outputBuffer, "all_to_all output");
  checkCpu(inputBuffer, "all_to_all input");
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
              nullptr),
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
              nullptr),
          "snclAlltoAllV");
    };
  }
  if (out.copyBack) {
    st.post = [out] { out.writeBack(); };
  }
  std::vector<Step> steps;
  steps.push_back(std::move(st));
  return submit(c10d::OpType::ALLTOALL_BASE, std::move(steps), {outputBuffer}, opts.asyncOp);
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
    checkCpu(inputTensors[j], "alltoall input");
    checkCpu(outputTensors[j], "alltoall output");
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
                nullptr),
            "snclSend");
        check(
            snclRecv(
                ptrOf(outs[j].buf),
                nbytesOf(outs[j].buf),
                snclUint8,
                j,
                comm_,
                nullptr),
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
  return submit(c10d::OpType::ALLTOALL, std::move(steps), outputTensors, opts.asyncOp);
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
  checkCpu(tensors[0], "send tensor");
  at::Tensor in = tensors[0].contiguous();
  Step st;
  // Outside batch_isend_irecv, messages carry their tag (snclSendTagged),
  // so receives match by tag and may come from any source; inside it the
  // group's sends and receives pair up in order (snclSend / snclRecv).
  if (coalescing_) {
    st.issue = [this, in, dstRank] {
      check(
          snclSend(
              ptrOf(in), nbytesOf(in), snclUint8, dstRank, comm_, nullptr),
          "snclSend");
    };
  } else {
    st.issue = [this, in, dstRank, tag] {
      check(
          snclSendTagged(
              ptrOf(in), nbytesOf(in), snclUint8, dstRank, tag, comm_, nullptr),
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
  checkCpu(tensors[0], "recv tensor");
  Staged out = stageOut(tensors[0]);
  Step st;
  if (coalescing_) {
    st.issue = [this, buf = out.buf, srcRank] {
      check(
          snclRecv(
              ptrOf(buf), nbytesOf(buf), snclUint8, srcRank, comm_, nullptr),
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
              nullptr,
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
    bool average) {
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
  st.issue = [this, buf = tensor, codec, average] {
    void* b = ptrOf(buf);
    check(
        snclAllReduceCompressed(
            b,
            b,
            static_cast<size_t>(buf.numel()),
            snclFloat32,
            average ? snclAvg : snclSum,
            codec.c_str(),
            comm_,
            nullptr),
        "snclAllReduceCompressed");
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
  st.issue = [this] { check(snclBarrier(comm_, nullptr), "snclBarrier"); };
  std::vector<Step> steps;
  steps.push_back(std::move(st));
  return submit(c10d::OpType::BARRIER, std::move(steps), {}, opts.asyncOp);
}

// ------------------------------------------------------------------ factory

c10::intrusive_ptr<c10d::Backend> createProcessGroupSncl(
    const c10::intrusive_ptr<c10d::Store>& store,
    int rank,
    int size,
    std::chrono::duration<float> timeout,
    const std::string& groupName) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
  return c10::make_intrusive<ProcessGroupSncl>(
      store, rank, size, ms, groupName);
}

} // namespace sncl_torch

namespace py = pybind11;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "The sncl c10d backend (C++ over sncl's C ABI)";
  m.def(
      "_create_backend",
      &sncl_torch::createProcessGroupSncl,
      py::arg("store"),
      py::arg("rank"),
      py::arg("size"),
      py::arg("timeout"),
      py::arg("group_name"),
      py::call_guard<py::gil_scoped_release>(),
      "Creates this rank's sncl backend, bootstrapping through the store.");
  m.def(
      "_all_reduce_compressed",
      [](c10d::Backend* backend,
         at::Tensor tensor,
         const std::string& codec,
         bool average) -> c10::intrusive_ptr<c10d::Work> {
        auto* pg = dynamic_cast<sncl_torch::ProcessGroupSncl*>(backend);
        TORCH_CHECK(
            pg != nullptr,
            "sncl: all_reduce_compressed needs a group whose CPU backend is "
            "sncl, got ",
            backend ? backend->getBackendName() : std::string("None"));
        return pg->allreduceCompressed(tensor, codec, average);
      },
      py::arg("backend"),
      py::arg("tensor"),
      py::arg("codec"),
      py::arg("average"),
      py::call_guard<py::gil_scoped_release>(),
      "In-place compressed all-reduce of a contiguous float32 CPU tensor on "
      "an sncl backend; returns the Work.");
  m.def(
      "version",
      [] {
        int v = 0;
        snclGetVersion(&v);
        return v;
      },
      "SNCL_VERSION_CODE of the linked libsncl.");
}
