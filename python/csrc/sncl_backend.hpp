// The "sncl" c10d backend: a c10d::Backend over sncl's C ABI (sncl.h).
//
// Every operation is split in three parts:
//   * prepare, on the calling (Python) thread: argument checks, contiguous
//     staging buffers, the Work object;
//   * issue, on the backend's worker thread: the blocking (NULL-stream)
//     sncl calls;
//   * post, on the worker thread once the sncl calls have returned: copies
//     from staging buffers back into the caller's tensors and local
//     reductions (bitwise operators, see below).
// The worker runs operations one at a time in issue order, so every rank
// runs the same sequence on the communicator; the calling thread returns as
// soon as the operation is queued. Work::wait blocks until the worker has
// finished the operation and rethrows its error (with snclGetLastError's
// text); the Work's future is completed with the output tensors first.
//
// Operations on CUDA tensors (see sncl_cuda.hpp) are issued on the calling
// thread instead, once the worker has drained the operations queued before
// them (so every rank still runs one sequence on the communicator): the
// sncl calls enqueue on the current CUDA stream of the tensors' device, and
// the Work completes through a CUDA event recorded after the enqueue, as
// ProcessGroupNCCL's does: isCompleted() queries the event, wait() and
// synchronize() make the caller's current stream wait on it (the host does
// not block), and the future is a CUDA future marked on that stream.
//
// Between startCoalescing and endCoalescing (batch_isend_irecv, coalescing
// manager) operations are collected into one task that the worker issues
// inside snclGroupStart / snclGroupEnd, so sends and receives progress
// together.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <string>
#include <thread>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "sncl.h"

namespace sncl_torch {

// One operation's work for the worker thread.
struct Step {
  std::function<void()> issue;
  std::function<void()> post; // may be empty
};

// The stream argument of the sncl calls of the operation running on this
// thread: NULL (blocking, host buffers) or the CUDA stream of an operation
// on CUDA tensors.
snclStream_t opStream();

class WorkSncl : public c10d::Work {
 public:
  // profilingTitle ("sncl:<op>", a static string) and inputs: c10d's
  // profiler event, recorded from construction (enqueue) to completion.
  // device: where the operation runs (a CUDA device makes the future a
  // CUDA future, synchronised through events on the operation's stream).
  WorkSncl(
      int rank,
      c10d::OpType opType,
      std::vector<at::Tensor> outputs,
      uint64_t seq,
      const char* profilingTitle = nullptr,
      const std::optional<std::vector<at::Tensor>>& inputs = std::nullopt,
      c10::Device device = c10::Device(c10::kCPU));

  std::vector<at::Tensor> result() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  // On CUDA tensors: whether the operation's event has been reached.
  bool isCompleted() override;
  // On CUDA tensors: rethrows an enqueue error, else makes the current
  // stream of the operation's device wait for the operation (the host does
  // not block; `timeout` does not apply). On CPU tensors: blocks until done.
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  // On CUDA tensors: the current stream waits for the operation.
  void synchronize() override;
  void blockCurrentStream() override;
  uint64_t getSequencenumber() const override;
  // The sender of a receive from any source (recv / irecv without src).
  int sourceRank() const override;
  void setSourceBox(std::shared_ptr<std::atomic<int>> box) {
    srcBox_ = std::move(box);
  }

  // Adds outputs (coalesced works collect those of all their operations).
  void addOutputs(const std::vector<at::Tensor>& outs);
  // Completes the future (value: the output tensors, or the error), then
  // the work.
  void complete(std::exception_ptr error);
  // Operations on CUDA tensors, once enqueued on `stream` (the current
  // stream of the device): records the completion event there and marks
  // the future completed on that stream (or sets the error).
  void completeOnStream(std::exception_ptr error, const c10::Stream& stream);
  // Makes the future a CUDA future on `device` (a coalesced work learns its
  // device from its first operation); a no-op for the CPU.
  void bindDevice(const c10::Device& device);
  const c10::Device& device() const {
    return device_;
  }

 private:
  std::vector<at::Tensor> outputs_;
  uint64_t seq_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::shared_ptr<std::atomic<int>> srcBox_;
  c10::Device device_;
  // Set once an operation on CUDA tensors is enqueued without error.
  std::unique_ptr<c10::Event> event_;
};

class ProcessGroupSncl : public c10d::Backend {
 public:
  struct Options : c10d::Backend::Options {
    explicit Options(std::chrono::milliseconds timeout = kBackendDefaultTimeout)
        : c10d::Backend::Options("sncl", timeout) {}
    c10::intrusive_ptr<c10d::Backend::Options> clone() const override {
      return c10::make_intrusive<Options>(*this);
    }
  };

  // `deterministic`: 0 or 1 sets sncl's deterministic mode for this group
  // and the groups split or shrunk from it; -1 leaves it to the
  // environment (SNCL_DETERMINISTIC).
  ProcessGroupSncl(
      const c10::intrusive_ptr<c10d::Store>& store,
      int rank,
      int size,
      std::chrono::milliseconds timeout,
      const std::string& groupName,
      int deterministic = -1);
  // Adopts `comm` (made by a split or a shrink of another group's
  // communicator), which has `size` ranks, this one `rank`.
  ProcessGroupSncl(
      snclComm_t comm,
      const c10::intrusive_ptr<c10d::Store>& store,
      int rank,
      int size,
      std::chrono::milliseconds timeout,
      const std::string& groupName,
      int deterministic = -1);
  ~ProcessGroupSncl() override;

  // dist.split_group: every rank of this group calls split with the ranks
  // (of this group) of its new group; each new group bootstraps through
  // the store torch namespaces for it. A rank in none gets no backend.
  bool supportsSplitting() const override {
    return true;
  }
  c10::intrusive_ptr<c10d::Backend> split(
      const c10::intrusive_ptr<c10d::Store>& store,
      const std::vector<int>& ranks,
      const c10::intrusive_ptr<c10d::Backend::Options>& opts) override;
  // dist.shrink_group: the ranks that stay call shrink (snclCommShrink);
  // SHRINK_ABORT (1) aborts the operations in flight first, SHRINK_DEFAULT
  // (0) lets the queued ones finish.
  bool supportsShrinking() const override {
    return true;
  }
  c10::intrusive_ptr<c10d::Backend> shrink(
      const std::vector<int64_t>& ranksToExclude,
      int shrinkFlags,
      const c10::intrusive_ptr<c10d::Backend::Options>& optsOverride) override;

  // Backend.suspend / resume / memory_stats (NCCL's memory offload, the
  // same names as ProcessGroupNCCL's): once the operations queued before
  // it ran, suspend releases the communicator's peer buffers
  // (snclCommSuspend), resume connects again (snclCommResume); every rank
  // calls each, like a collective. getMemoryStats: NCCL's four keys
  // ("suspend": bytes a suspend would release, "suspended", "persist",
  // "total") and sncl's bytes by purpose and residence (snclCommMemStats).
  void suspend() override;
  void resume() override;
  std::unordered_map<std::string, uint64_t> getMemoryStats() override;
  // This rank's flight recorder (its last operations, with their tags) as
  // a JSON-lines file in SNCL_DEBUG_DUMP_DIR; returns the file's path
  // (snclCommDumpFlightRecorder). Waits for no operation.
  std::string dumpFlightRecorder();

  const std::string getBackendName() const override {
    return "sncl";
  }
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override;
  bool supportsCoalescing() const override {
    return true;
  }
  void setTimeout(std::chrono::milliseconds timeout) override;
  uint64_t getSequenceNumberForGroup() override;

  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts =
          c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(
      std::vector<at::Tensor>& tensors,
      const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputTensors,
      std::vector<at::Tensor>& inputTensors,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> all_gather_single(
      at::Tensor& outputBuffer,
      at::Tensor& inputBuffer,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& outputBuffer,
      at::Tensor& inputBuffer,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputTensorLists,
      std::vector<at::Tensor>& inputTensors,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> all_gather_single_coalesced(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> gather(
      std::vector<std::vector<at::Tensor>>& outputTensors,
      std::vector<at::Tensor>& inputTensors,
      const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> gather_single(
      at::Tensor& outputBuffer,
      at::Tensor& inputBuffer,
      const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> gather_into_tensor(
      at::Tensor& outputBuffer,
      at::Tensor& inputBuffer,
      const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> scatter(
      std::vector<at::Tensor>& outputTensors,
      std::vector<std::vector<at::Tensor>>& inputTensors,
      const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputTensors,
      std::vector<std::vector<at::Tensor>>& inputTensors,
      const c10d::ReduceScatterOptions& opts =
          c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single(
      at::Tensor& outputBuffer,
      at::Tensor& inputBuffer,
      const c10d::ReduceScatterOptions& opts =
          c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& outputBuffer,
      at::Tensor& inputBuffer,
      const c10d::ReduceScatterOptions& opts =
          c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single_coalesced(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts =
          c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts =
          c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> all_to_all_single(
      at::Tensor& outputBuffer,
      at::Tensor& inputBuffer,
      std::vector<int64_t>& outputSplitSizes,
      std::vector<int64_t>& inputSplitSizes,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(
      at::Tensor& outputBuffer,
      at::Tensor& inputBuffer,
      std::vector<int64_t>& outputSplitSizes,
      std::vector<int64_t>& inputSplitSizes,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor>& outputTensors,
      std::vector<at::Tensor>& inputTensors,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> send(
      std::vector<at::Tensor>& tensors,
      int dstRank,
      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(
      std::vector<at::Tensor>& tensors,
      int srcRank,
      int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(
      const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;

  // sncl_extras.cpp: what gloo users rely on.
  // Receives one message with `tag` from any rank (snclRecvTagged with
  // SNCL_ANY_SOURCE); Work::sourceRank tells which.
  c10::intrusive_ptr<c10d::Work> recvAnysource(
      std::vector<at::Tensor>& tensors,
      int tag) override;
  // c10d's monitored barrier over the group's store: rank 0 waits for every
  // rank's arrival within the timeout and names the ranks that did not
  // arrive (all with waitAllRanks); the others wait for rank 0's release.
  void monitoredBarrier(
      const c10d::BarrierOptions& opts = c10d::BarrierOptions(),
      bool waitAllRanks = false) override;
  // Sparse COO all-reduce (sum), as gloo: indices and values gathered from
  // every rank, summed in rank order, coalesced.
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;

  // sncl extension: in-place compressed all-reduce (snclAllReduceCompressed)
  // of a contiguous float32 CPU tensor, sum or average, with a codec spec
  // ("int8", "fp16", "bf16", "topk:0.01", ...). Runs on the worker like the
  // other operations; not allowed while coalescing. `feedbackKey` >= 0
  // names a tensor (a DDP bucket's index) whose error feedback this group
  // keeps between calls (snclAllReduceCompressedFeedback); -1: none.
  c10::intrusive_ptr<c10d::Work> allreduceCompressed(
      at::Tensor& tensor,
      const std::string& codec,
      bool average,
      int64_t feedbackKey = -1);

  // Lets queued operations finish, stops the worker, destroys the
  // communicator. Idempotent.
  void shutdown() override;
  // Fails queued operations, aborts the communicator (operations in flight
  // fail on every rank), stops the worker. Idempotent.
  void abort() override;

 private:
  struct Task {
    std::vector<Step> steps;
    bool group = false;
    c10::intrusive_ptr<WorkSncl> work;
    // Operations on CUDA tensors: the device, and the tensors whose memory
    // the stream uses (recordStream).
    c10::Device device = c10::Device(c10::kCPU);
    std::vector<at::Tensor> tensors;
    // The submitting thread's tag (snclGetThreadTag), issued under.
    uint64_t tag = 0;
  };

  // Queues `steps` as one operation (or adds them to the coalesced task).
  // A synchronous call (asyncOp false: the caller waits at once) runs on
  // the calling thread when the worker is idle and nothing is queued,
  // which saves two thread hand-offs per operation.
  // `inputs` (default: the outputs) give the profiler event its shapes;
  // `title` overrides the "sncl:<op>" name derived from `type`.
  c10::intrusive_ptr<c10d::Work> submit(
      c10d::OpType type,
      std::vector<Step> steps,
      std::vector<at::Tensor> outputs,
      bool asyncOp = true,
      std::optional<std::vector<at::Tensor>> inputs = std::nullopt,
      const char* title = nullptr);
  void workerLoop();
  // Runs a task on CUDA tensors on the calling thread, on the current
  // stream of its device, once the worker has drained what was queued
  // before it (the caller has set busy_); completes its work on the stream.
  c10::intrusive_ptr<c10d::Work> runOnStream(Task task, const char* name);
  // Waits (under `lk`, at most the process group's timeout) until no task
  // runs or is queued, then claims the communicator (busy_).
  void claimIdle(std::unique_lock<std::mutex>& lk, const char* name);
  // Ends the running task (busy_ = false) and wakes who waits for that:
  // idle waiters always, the worker only when tasks are queued.
  void releaseBusy();
  // Runs `call` on the communicator once the group is idle (claimIdle),
  // as `name`; throws with sncl's explanation when it fails.
  void callWhenIdle(const char* name, snclResult_t (*call)(snclComm_t));
  // The communication parameters torch's traces record (record_param_comms,
  // as ProcessGroupGloo does), for an operation about to be queued.
  void recordParamComms(
      uint64_t seq,
      const char* name,
      const std::vector<at::Tensor>& inputs,
      const std::vector<at::Tensor>& outputs);
  // Runs a task's steps; returns its error (the caller completes the work).
  std::exception_ptr runTask(Task& task);
  void stopWorker(bool drain);
  // The device of an operation's tensors (CPU, or one CUDA device); throws
  // when they are on several devices.
  c10::Device deviceOf(
      const std::vector<at::Tensor>& a,
      const std::vector<at::Tensor>& b,
      const char* name) const;

  // Throws DistBackendError with sncl's explanation when r is not success.
  void check(snclResult_t r, const char* what) const;

  // Step builders shared by several entry points.
  Step allreduceStep(const at::Tensor& tensor, const c10d::ReduceOp& op);
  Step allgatherBaseStep(const at::Tensor& output, const at::Tensor& input);
  Step reduceScatterBaseStep(
      const at::Tensor& output,
      const at::Tensor& input,
      const c10d::ReduceOp& op);

  c10::intrusive_ptr<c10d::Store> store_; // alive as long as the comm
  std::chrono::milliseconds timeout_;
  std::string groupName_;
  // Atomic: abort() clears it while the worker may be reading it, so that
  // later calls fail cleanly instead of using a released handle.
  std::atomic<snclComm_t> comm_{nullptr};

  std::mutex mu_;
  // Callers waiting for the group to go idle (claimIdle): notified when a
  // task ends.
  std::condition_variable cv_;
  // The worker waiting for a task: notified only when one is queued (or at
  // stop), so that an operation run inline on the caller's thread does not
  // wake it (a futex wake and two context switches per call, most of a
  // small all-reduce's time).
  std::condition_variable workCv_;
  std::deque<Task> queue_;
  bool stop_ = false;
  bool busy_ = false; // a task is running (worker or inline)
  bool inlineDisabled_ = false; // SNCL_TORCH_INLINE=0: always the worker
  bool closed_ = false; // shutdown or abort has run
  std::thread worker_;

  // Coalescing (touched by the calling thread only).
  bool coalescing_ = false;
  Task coalesced_;

  uint64_t seq_ = 0;
  uint64_t monitoredSeq_ = 0; // monitored barriers so far (same on all ranks)
  uint64_t shrinks_ = 0; // shrinks of this group (names the new groups)
  // snclConfig_t::deterministic for this group's communicators and those
  // split or shrunk from it (-1: SNCL_DETERMINISTIC decides).
  int deterministic_ = -1;
  // Error feedback of the compressed all-reduce, per feedback key (made on
  // the worker at a key's first use, destroyed with the group).
  std::mutex feedbackMu_;
  std::unordered_map<int64_t, snclErrorFeedback_t> feedback_;
  // The handle of `key`, made on first use.
  snclErrorFeedback_t feedbackFor(int64_t key);
};

// "sncl:<op>" for an operation type (static strings, for the profiler).
const char* profilingTitle(c10d::OpType type);
// Throws DistBackendError with `msg`.
[[noreturn]] void throwDistBackendError(const std::string& msg);

// The factory Python calls (through sncl_torch._create_backend).
c10::intrusive_ptr<c10d::Backend> createProcessGroupSncl(
    const c10::intrusive_ptr<c10d::Store>& store,
    int rank,
    int size,
    std::chrono::duration<float> timeout,
    const std::string& groupName,
    int deterministic);

} // namespace sncl_torch
