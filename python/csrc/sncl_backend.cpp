// The "sncl" c10d backend over sncl's C ABI; see sncl_backend.hpp.

#include <pthread.h>
#include "sncl_backend.hpp"
#include "sncl_cuda.hpp"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <torch/extension.h>
#include <pybind11/chrono.h>

namespace sncl_torch {

namespace {

std::map<std::string, int>& instanceCounts() {
  static std::map<std::string, int> m;
  return m;
}
std::mutex instanceMu;

// The stream of the operation running on this thread (see opStream).
thread_local snclStream_t tlsOpStream = nullptr;

// Sets tlsOpStream for a scope.
class OpStreamScope {
 public:
  explicit OpStreamScope(snclStream_t s) : prev_(tlsOpStream) {
    tlsOpStream = s;
  }
  ~OpStreamScope() {
    tlsOpStream = prev_;
  }
  OpStreamScope(const OpStreamScope&) = delete;
  OpStreamScope& operator=(const OpStreamScope&) = delete;

 private:
  snclStream_t prev_;
};

c10::intrusive_ptr<c10::ivalue::Future> makeFuture(const c10::Device& d) {
  std::vector<c10::Device> devices;
  if (!d.is_cpu()) {
    devices.push_back(d);
  }
  return c10::make_intrusive<c10::ivalue::Future>(
      c10::ListType::create(c10::TensorType::get()), std::move(devices));
}

// The current stream of `d` (c10's device-generic interface).
c10::Stream currentStream(const c10::Device& d) {
  return c10::impl::VirtualGuardImpl(d.type()).getStream(d);
}

} // namespace

snclStream_t opStream() {
  return tlsOpStream;
}

// ---------------------------------------------------------------- WorkSncl

WorkSncl::WorkSncl(
    int rank,
    c10d::OpType opType,
    std::vector<at::Tensor> outputs,
    uint64_t seq,
    const char* profilingTitle,
    const std::optional<std::vector<at::Tensor>>& inputs,
    c10::Device device)
    : Work(rank, opType, profilingTitle, inputs),
      outputs_(std::move(outputs)),
      seq_(seq),
      future_(makeFuture(device)),
      device_(device) {}

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

bool WorkSncl::isCompleted() {
  if (!event_) {
    return c10d::Work::isCompleted();
  }
  return event_->query();
}

bool WorkSncl::wait(std::chrono::milliseconds timeout) {
  if (!event_) {
    // CPU operations, and CUDA ones that failed to enqueue (rethrown).
    return c10d::Work::wait(timeout);
  }
  synchronize();
  return true;
}

void WorkSncl::synchronize() {
  if (event_) {
    event_->block(currentStream(device_));
  }
}

void WorkSncl::blockCurrentStream() {
  if (event_) {
    synchronize();
  } else {
    c10d::Work::blockCurrentStream();
  }
}

void WorkSncl::bindDevice(const c10::Device& device) {
  if (device_ != device) {
    device_ = device;
    future_ = makeFuture(device);
  }
}

void WorkSncl::completeOnStream(
    std::exception_ptr error,
    const c10::Stream& stream) {
  if (error) {
    complete(error);
    return;
  }
  auto ev = std::make_unique<c10::Event>(device_.type());
  ev->record(stream);
  event_ = std::move(ev);
  // With `stream` current (it is: the operation ran on the current
  // stream), the future records its own events there: callbacks and
  // waiters are ordered after the operation.
  c10::StreamGuard guard(stream);
  future_->markCompleted(c10::IValue(outputs_));
  finish(nullptr);
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

namespace {

// Throws DistBackendError when `r` is not success: the call, the rank and
// sncl's explanation (of `comm`, or the thread's last error when NULL);
// a timeout reads "Timed out" first, as gloo's and NCCL's do.
void throwIfFailed(
    snclResult_t r,
    const char* what,
    int rank,
    std::chrono::milliseconds timeout,
    snclComm_t comm) {
  if (r == snclSuccess) {
    return;
  }
  const char* detail = snclGetLastError(comm);
  std::string msg = c10::str(
      "sncl: ",
      what,
      " failed on rank ",
      rank,
      ": ",
      snclGetErrorString(r),
      (detail && *detail) ? ": " : "",
      (detail && *detail) ? detail : "");
  if (r == snclTimeout) {
    // sncl's detail names the operation, the timeout and the ranks
    // waited on.
    msg = c10::str(
        "sncl: Timed out: ",
        what,
        " on rank ",
        rank,
        " (process group timeout ",
        timeout.count(),
        " ms): ",
        (detail && *detail) ? detail : "no detail");
  }
  C10_THROW_ERROR(DistBackendError, msg);
}

// The configuration of a new communicator of a group with `timeout`;
// `deterministic` 0 or 1 sets snclConfig_t::deterministic (-1: the
// environment's SNCL_DETERMINISTIC decides).
snclConfig_t configFor(
    std::chrono::milliseconds timeout,
    int rank,
    int deterministic) {
  snclConfig_t cfg = SNCL_CONFIG_INITIALIZER;
  if (deterministic >= 0) {
    cfg.deterministic = deterministic;
  }
  // Settings come from libsncl (environment, else the settings file).
  char setting[256];
  int isSet = 0;
  throwIfFailed(
      snclGetSetting("SNCL_TIMEOUT_MS", setting, sizeof(setting), &isSet),
      "snclGetSetting(SNCL_TIMEOUT_MS)",
      rank,
      timeout,
      nullptr);
  if (!isSet) {
    // The process group's timeout bounds how long an operation may wait
    // for a silent peer (SNCL_TIMEOUT_MS, when set, takes precedence).
    auto ms = timeout.count();
    cfg.timeoutMs = static_cast<int>(std::clamp<int64_t>(ms, 1000, INT_MAX));
  }
  return cfg;
}

// Rank 0 makes the unique id and publishes it in the store; the others
// read it; then every rank joins.
snclComm_t bootstrapComm(
    const c10::intrusive_ptr<c10d::Store>& store,
    int rank,
    int size,
    std::chrono::milliseconds timeout,
    const std::string& groupName,
    int deterministic) {
  TORCH_CHECK(store, "sncl: no store to bootstrap through");
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
    throwIfFailed(snclGetUniqueId(&id), "snclGetUniqueId", rank, timeout, nullptr);
    std::vector<uint8_t> bytes(
        reinterpret_cast<uint8_t*>(id.internal),
        reinterpret_cast<uint8_t*>(id.internal) + sizeof(id.internal));
    store->set(key, bytes);
  } else {
    auto bytes = store->get(key);
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
  snclConfig_t cfg = configFor(timeout, rank, deterministic);
  snclComm_t comm = nullptr;
  throwIfFailed(
      snclCommInitRankConfig(&comm, size, id, rank, &cfg),
      "snclCommInitRankConfig",
      rank,
      timeout,
      nullptr);
  return comm;
}

} // namespace

ProcessGroupSncl::ProcessGroupSncl(
    const c10::intrusive_ptr<c10d::Store>& store,
    int rank,
    int size,
    std::chrono::milliseconds timeout,
    const std::string& groupName,
    int deterministic)
    : ProcessGroupSncl(
          bootstrapComm(store, rank, size, timeout, groupName, deterministic),
          store,
          rank,
          size,
          timeout,
          groupName,
          deterministic) {}

ProcessGroupSncl::ProcessGroupSncl(
    snclComm_t comm,
    const c10::intrusive_ptr<c10d::Store>& store,
    int rank,
    int size,
    std::chrono::milliseconds timeout,
    const std::string& groupName,
    int deterministic)
    : c10d::Backend(rank, size),
      store_(store),
      timeout_(timeout),
      groupName_(groupName),
      deterministic_(deterministic) {
  comm_ = comm;
  char setting[256];
  int isSet = 0;
  check(
      snclGetSetting("SNCL_TORCH_INLINE", setting, sizeof(setting), &isSet),
      "snclGetSetting(SNCL_TORCH_INLINE)");
  if (isSet) {
    inlineDisabled_ = std::string(setting) == "0";
  }
  worker_ = std::thread([this] { workerLoop(); });
  init();
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupSncl::split(
    const c10::intrusive_ptr<c10d::Store>& store,
    const std::vector<int>& ranks,
    const c10::intrusive_ptr<c10d::Backend::Options>& opts) {
  auto it = std::find(ranks.begin(), ranks.end(), rank_);
  if (it == ranks.end()) {
    return nullptr; // not in the new group (c10d: NON_GROUP_MEMBER)
  }
  const int groupRank = static_cast<int>(it - ranks.begin());
  auto timeout = opts ? opts->timeout : timeout_;
  std::string name = opts && !opts->group_name.empty()
      ? opts->group_name
      : groupName_ + ":split";
  return c10::make_intrusive<ProcessGroupSncl>(
      store, groupRank, static_cast<int>(ranks.size()), timeout, name, deterministic_);
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupSncl::shrink(
    const std::vector<int64_t>& ranksToExclude,
    int shrinkFlags,
    const c10::intrusive_ptr<c10d::Backend::Options>& optsOverride) {
  TORCH_CHECK(
      shrinkFlags == SNCL_SHRINK_DEFAULT || shrinkFlags == SNCL_SHRINK_ABORT,
      "sncl: shrink flags ",
      shrinkFlags,
      ": expected SHRINK_DEFAULT (0) or SHRINK_ABORT (1)");
  std::vector<int> exclude;
  for (auto r : ranksToExclude) {
    TORCH_CHECK(
        r >= 0 && r < size_ && r != rank_,
        "sncl: shrink on rank ",
        rank_,
        ": cannot exclude rank ",
        r,
        " of a group of ",
        size_,
        " (an excluded rank does not call shrink)");
    exclude.push_back(static_cast<int>(r));
  }
  snclComm_t parent = comm_.load();
  TORCH_CHECK(parent, "sncl: shrink of a process group that was shut down or aborted");
  auto timeout = optsOverride ? optsOverride->timeout : timeout_;
  snclConfig_t cfg = configFor(timeout, rank_, deterministic_);
  snclComm_t child = nullptr;
  snclResult_t r;
  if (shrinkFlags == SNCL_SHRINK_DEFAULT) {
    // What this group queued runs first (sncl then waits for what it was
    // given); the worker stays idle while the communicator shrinks.
    {
      std::unique_lock<std::mutex> lk(mu_);
      claimIdle(lk, "sncl:shrink");
    }
    r = snclCommShrink(
        parent, exclude.data(), static_cast<int>(exclude.size()), &child, &cfg, shrinkFlags);
    releaseBusy();
  } else {
    // The operations in flight fail (sncl aborts the parent first).
    r = snclCommShrink(
        parent, exclude.data(), static_cast<int>(exclude.size()), &child, &cfg, shrinkFlags);
  }
  check(r, "snclCommShrink");
  int newRank = -1, newSize = -1;
  check(snclCommUserRank(child, &newRank), "snclCommUserRank");
  check(snclCommCount(child, &newSize), "snclCommCount");
  std::string name = optsOverride && !optsOverride->group_name.empty()
      ? optsOverride->group_name
      : groupName_ + ":shrink:" + std::to_string(++shrinks_);
  return c10::make_intrusive<ProcessGroupSncl>(
      child, store_, newRank, newSize, timeout, name, deterministic_);
}

void ProcessGroupSncl::callWhenIdle(
    const char* name,
    snclResult_t (*call)(snclComm_t)) {
  snclComm_t c = comm_.load();
  TORCH_CHECK(c, "sncl: ", name, " on a process group that was shut down or aborted");
  {
    std::unique_lock<std::mutex> lk(mu_);
    claimIdle(lk, name);
  }
  snclResult_t r = call(c);
  releaseBusy();
  check(r, name);
}

void ProcessGroupSncl::suspend() {
  callWhenIdle("snclCommSuspend", [](snclComm_t c) {
    return snclCommSuspend(c, SNCL_SUSPEND_MEM);
  });
}

void ProcessGroupSncl::resume() {
  callWhenIdle("snclCommResume", snclCommResume);
}

std::string ProcessGroupSncl::dumpFlightRecorder() {
  snclComm_t c = comm_.load();
  TORCH_CHECK(
      c, "sncl: dump_flight_recorder of a process group that was shut down or aborted");
  char path[4096] = {0};
  check(
      snclCommDumpFlightRecorder(c, path, sizeof(path)),
      "snclCommDumpFlightRecorder");
  return std::string(path);
}

std::unordered_map<std::string, uint64_t> ProcessGroupSncl::getMemoryStats() {
  snclComm_t c = comm_.load();
  TORCH_CHECK(c, "sncl: memory_stats of a process group that was shut down or aborted");
  snclMemStats_t st{};
  check(snclCommMemStats(c, &st), "snclCommMemStats");
  const uint64_t total =
      st.hostBytes + st.pinnedBytes + st.sharedBytes + st.deviceBytes;
  return {
      {"suspend", st.releasableBytes},
      {"suspended", st.suspendedBytes},
      {"persist", total - st.releasableBytes},
      {"total", total},
      {"host", st.hostBytes},
      {"pinned", st.pinnedBytes},
      {"shared", st.sharedBytes},
      {"device", st.deviceBytes},
      {"mapped", st.mappedBytes},
      {"fifo", st.fifoBytes},
      {"staging", st.stagingBytes},
      {"registration_cache", st.registrationCacheBytes},
      {"scratch", st.scratchBytes},
      {"windows", st.windowBytes},
      {"flight_recorder", st.flightRecorderBytes},
      {"device_staging", st.deviceStagingBytes},
      {"connected_peers", static_cast<uint64_t>(st.connectedPeers)},
  };
}

ProcessGroupSncl::~ProcessGroupSncl() {
  try {
    shutdown();
  } catch (...) {
  }
  {
    // Queued operations hold their own reference to their feedback.
    std::lock_guard<std::mutex> g(feedbackMu_);
    for (auto& kv : feedback_) {
      (void)snclErrorFeedbackDestroy(kv.second);
    }
    feedback_.clear();
  }
  if (worker_.joinable()) {
    // Only when destroyed on the worker thread itself (from a callback).
    worker_.detach();
  }
}

snclErrorFeedback_t ProcessGroupSncl::feedbackFor(int64_t key) {
  std::lock_guard<std::mutex> g(feedbackMu_);
  auto it = feedback_.find(key);
  if (it != feedback_.end()) {
    return it->second;
  }
  snclErrorFeedback_t fb = nullptr;
  check(snclErrorFeedbackCreate(&fb), "snclErrorFeedbackCreate");
  feedback_.emplace(key, fb);
  return fb;
}

void ProcessGroupSncl::check(snclResult_t r, const char* what) const {
  throwIfFailed(r, what, rank_, timeout_, comm_);
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

c10::Device ProcessGroupSncl::deviceOf(
    const std::vector<at::Tensor>& a,
    const std::vector<at::Tensor>& b,
    const char* name) const {
  std::optional<c10::Device> dev;
  for (const auto* v : {&a, &b}) {
    for (const auto& t : *v) {
      if (!t.defined()) {
        continue;
      }
      if (!dev) {
        dev = t.device();
      } else if (*dev != t.device()) {
        C10_THROW_ERROR(
            DistBackendError,
            c10::str(
                "sncl: ",
                name,
                " on rank ",
                rank_,
                ": tensors on ",
                *dev,
                " and on ",
                t.device(),
                "; all tensors of one operation must be on one device (the "
                "CPU or one CUDA device)"));
      }
    }
  }
  if (dev && !dev->is_cpu() && !dev->is_cuda()) {
    C10_THROW_ERROR(
        DistBackendError,
        c10::str(
            "sncl: ",
            name,
            " on rank ",
            rank_,
            ": tensors on ",
            *dev,
            "; sncl takes CPU and CUDA tensors"));
  }
  return dev.value_or(c10::Device(c10::kCPU));
}

void ProcessGroupSncl::claimIdle(
    std::unique_lock<std::mutex>& lk,
    const char* name) {
  // The worker may be running an earlier CPU operation, bounded by sncl's
  // own timeout; a margin over the group's timeout covers its error path.
  const auto limit = timeout_ + std::chrono::seconds(5);
  const bool idle = cv_.wait_for(
      lk, limit, [this] { return closed_ || (!busy_ && queue_.empty()); });
  TORCH_CHECK(!closed_, "sncl: the process group has been shut down");
  if (!idle) {
    C10_THROW_ERROR(
        DistBackendError,
        c10::str(
            "sncl: Timed out: ",
            name,
            " on rank ",
            rank_,
            ": the operations queued before it did not finish within ",
            limit.count(),
            " ms (process group timeout + 5 s)"));
  }
  busy_ = true;
}

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
  const char* name = title ? title : profilingTitle(type);
  // The caller's tag (sncl_torch.tag): the worker issues the operation
  // under it (runTask).
  uint64_t tag = 0;
  (void)snclGetThreadTag(&tag);
  const c10::Device dev = deviceOf(outputs, *inputs, name);
  if (dev.is_cuda() && !cudaBuilt()) {
    // Throws the explanation at the call, not at wait().
    (void)currentDeviceStream(
        dev, c10::str("sncl: ", name, " on rank ", rank_));
  }
  if (coalescing_) {
    if (coalesced_.steps.empty() && coalesced_.tensors.empty()) {
      coalesced_.device = dev;
      coalesced_.work->bindDevice(dev);
    } else if (coalesced_.device != dev) {
      C10_THROW_ERROR(
          DistBackendError,
          c10::str(
              "sncl: ",
              name,
              " on rank ",
              rank_,
              ": a coalesced group mixes ",
              coalesced_.device,
              " and ",
              dev,
              " tensors"));
    }
    for (auto& s : steps) {
      coalesced_.steps.push_back(std::move(s));
    }
    coalesced_.tag = tag;
    if (dev.is_cuda()) {
      coalesced_.tensors.insert(
          coalesced_.tensors.end(), outputs.begin(), outputs.end());
      coalesced_.tensors.insert(
          coalesced_.tensors.end(), inputs->begin(), inputs->end());
    }
    coalesced_.work->addOutputs(outputs);
    return coalesced_.work;
  }
  c10::intrusive_ptr<WorkSncl> work;
  bool runHere = false;
  {
    std::unique_lock<std::mutex> lk(mu_);
    TORCH_CHECK(!closed_, "sncl: the process group has been shut down");
    if (dev.is_cuda()) {
      // Issued here, on the caller's stream, after what is queued.
      claimIdle(lk, name);
    }
    recordParamComms(seq_ + 1, name, *inputs, outputs);
    work = c10::make_intrusive<WorkSncl>(
        rank_, type, outputs, ++seq_, name, inputs, dev);
    if (dev.is_cuda()) {
      runHere = true;
    } else if (!asyncOp && !busy_ && queue_.empty() && !inlineDisabled_) {
      busy_ = true; // the worker waits until this call is done
      runHere = true;
    } else {
      queue_.push_back(Task{std::move(steps), false, work});
      queue_.back().tag = tag;
    }
  }
  if (runHere && dev.is_cuda()) {
    Task task{std::move(steps), false, work, dev, std::move(outputs)};
    task.tensors.insert(task.tensors.end(), inputs->begin(), inputs->end());
    task.tag = tag;
    return runOnStream(std::move(task), name);
  }
  if (runHere) {
    Task task{std::move(steps), false, work};
    task.tag = tag;
    std::exception_ptr error = runTask(task);
    releaseBusy();
    work->complete(error);
    return work;
  }
  workCv_.notify_one();
  return work;
}

void ProcessGroupSncl::releaseBusy() {
  bool queued;
  {
    std::lock_guard<std::mutex> g(mu_);
    busy_ = false;
    queued = !queue_.empty();
  }
  cv_.notify_all();
  if (queued) {
    workCv_.notify_one();
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSncl::runOnStream(
    Task task,
    const char* name) {
  std::exception_ptr error;
  std::optional<c10::Stream> stream;
  try {
    c10::DeviceGuard guard(task.device);
    DeviceStream ds = currentDeviceStream(
        task.device, c10::str("sncl: ", name, " on rank ", rank_));
    stream = ds.stream;
    OpStreamScope scope(ds.handle);
    error = runTask(task);
    if (!error) {
      recordStreams(task.tensors, ds.stream);
    }
  } catch (...) {
    error = std::current_exception();
  }
  task.tensors.clear();
  releaseBusy();
  if (error || !stream) {
    task.work->complete(error);
  } else {
    task.work->completeOnStream(nullptr, *stream);
  }
  return task.work;
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
  bool closed = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    closed = closed_;
  }
  if (closed) {
    // Aborted or shut down inside the coalescing region (as
    // _abort_process_group does): ends quietly. Nothing coalesced: a
    // completed work; operations coalesced: they fail on wait().
    Task task = std::move(coalesced_);
    coalesced_ = Task{};
    if (task.steps.empty()) {
      work->complete(nullptr);
    } else {
      try {
        C10_THROW_ERROR(
            DistBackendError,
            "sncl: the process group was aborted or shut down before its coalesced "
            "operations ran");
      } catch (...) {
        work->complete(std::current_exception());
      }
    }
    return work;
  }
  if (coalesced_.device.is_cuda()) {
    Task task = std::move(coalesced_);
    coalesced_ = Task{};
    {
      std::unique_lock<std::mutex> lk(mu_);
      TORCH_CHECK(!closed_, "sncl: the process group has been shut down");
      claimIdle(lk, "sncl:coalesced");
    }
    return runOnStream(std::move(task), "sncl:coalesced");
  }
  {
    std::lock_guard<std::mutex> g(mu_);
    TORCH_CHECK(!closed_, "sncl: the process group has been shut down");
    queue_.push_back(std::move(coalesced_));
  }
  coalesced_ = Task{};
  workCv_.notify_one();
  return work;
}

void ProcessGroupSncl::workerLoop() {
  // Named so that tools (and python/tests/test_ops.py) can find it.
  pthread_setname_np(pthread_self(), "sncl-torch-wrk");
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lk(mu_);
      workCv_.wait(lk, [this] { return (stop_ || !queue_.empty()) && !busy_; });
      if (queue_.empty()) {
        return;
      }
      task = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    std::exception_ptr error = runTask(task);
    releaseBusy(); // a CUDA operation may wait for the worker to idle
    // Completion callbacks (future.then) run here, with the communicator
    // free: a callback may issue further operations.
    task.work->complete(error);
  }
}

std::exception_ptr ProcessGroupSncl::runTask(Task& task) {
  // Output copies write into leaf tensors that may require grad.
  at::NoGradGuard noGrad;
  // The operations carry the tag of the thread that submitted them.
  uint64_t callerTag = 0;
  (void)snclSetThreadTag(task.tag, &callerTag);
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
  (void)snclSetThreadTag(callerTag, nullptr);
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
  workCv_.notify_all();
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

// ------------------------------------------------------------------ factory

c10::intrusive_ptr<c10d::Backend> createProcessGroupSncl(
    const c10::intrusive_ptr<c10d::Store>& store,
    int rank,
    int size,
    std::chrono::duration<float> timeout,
    const std::string& groupName,
    int deterministic) {
  TORCH_CHECK(
      deterministic >= -1 && deterministic <= 1,
      "sncl: Options.deterministic must be True, False or None");
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
  return c10::make_intrusive<ProcessGroupSncl>(
      store, rank, size, ms, groupName, deterministic);
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
      py::arg("deterministic") = -1,
      py::call_guard<py::gil_scoped_release>(),
      "Creates this rank's sncl backend, bootstrapping through the store.");
  m.def(
      "_all_reduce_compressed",
      [](c10d::Backend* backend,
         at::Tensor tensor,
         const std::string& codec,
         bool average,
         int64_t feedbackKey) -> c10::intrusive_ptr<c10d::Work> {
        auto* pg = dynamic_cast<sncl_torch::ProcessGroupSncl*>(backend);
        TORCH_CHECK(
            pg != nullptr,
            "sncl: all_reduce_compressed needs a group whose CPU backend is "
            "sncl, got ",
            backend ? backend->getBackendName() : std::string("None"));
        return pg->allreduceCompressed(tensor, codec, average, feedbackKey);
      },
      py::arg("backend"),
      py::arg("tensor"),
      py::arg("codec"),
      py::arg("average"),
      py::arg("feedback_key") = -1,
      py::call_guard<py::gil_scoped_release>(),
      "In-place compressed all-reduce of a contiguous float32 CPU tensor on "
      "an sncl backend; returns the Work.");
  m.def(
      "_cuda_built",
      &sncl_torch::cudaBuilt,
      "Whether this extension was built with CUDA support (CUDA tensors).");
  m.def(
      "version",
      [] {
        int v = 0;
        snclGetVersion(&v);
        return v;
      },
      "SNCL_VERSION_CODE of the linked libsncl (the NCCL API version it mirrors).");
  m.def(
      "_dump_flight_recorder",
      [](c10d::Backend* backend) {
        auto* pg = dynamic_cast<sncl_torch::ProcessGroupSncl*>(backend);
        TORCH_CHECK(
            pg != nullptr,
            "sncl: dump_flight_recorder needs a group whose CPU backend is "
            "sncl, got ",
            backend ? backend->getBackendName() : std::string("None"));
        return pg->dumpFlightRecorder();
      },
      py::arg("backend"),
      "Dumps this rank's flight recorder into SNCL_DEBUG_DUMP_DIR; returns "
      "the file's path.");
  m.def(
      "_tag_of",
      [](const std::string& name) {
        uint64_t tag = 0;
        snclResult_t r = snclTagOfName(name.c_str(), &tag);
        TORCH_CHECK(
            r == snclSuccess, "sncl: snclTagOfName: ", snclGetLastError(nullptr));
        return tag;
      },
      py::arg("name"),
      "The tag of a name (snclTagOfName: a stable 64-bit hash, remembered so "
      "traces print the name).");
  m.def(
      "_set_thread_tag",
      [](uint64_t tag) {
        uint64_t previous = 0;
        snclResult_t r = snclSetThreadTag(tag, &previous);
        TORCH_CHECK(
            r == snclSuccess, "sncl: snclSetThreadTag: ", snclGetLastError(nullptr));
        return previous;
      },
      py::arg("tag"),
      "Sets the calling thread's tag (0: none) for the operations it issues "
      "next; returns the one it replaces.");
}
