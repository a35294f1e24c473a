// The "hvd" torch.distributed backend (c10d_backend.h): each c10d collective
// becomes one of our engine's ops (adapter.h's submit* functions, the path
// hvd.allreduce takes), and a completion thread turns the engine's results
// into the c10d Work's future.
//
// How c10d's collectives map onto ours (docs/torch_distributed.md):
//   allreduce, allreduce_coalesced (one bundle) -> allreduce in place
//   broadcast                                   -> broadcast in place
//   allgather, _allgather_base, gather           -> allgather (gather: the root keeps it)
//   _reduce_scatter_base, reduce_scatter         -> reducescatter of [size, n] rows
//   alltoall_base (row splits), alltoall, scatter -> alltoall with splits
//   reduce                                       -> allreduce (the root keeps it)
//   barrier                                      -> barrier
// send/recv have no engine op (the coordinator negotiates collectives only) and
// raise NotImplementedError naming the op.
#include "c10d_backend.h"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "../core/engine_registry.h"
#include "adapter.h"

namespace hvd {
namespace torch_layer {
namespace {

constexpr const char* kPrefix = "hvd backend (torch.distributed): ";

// The devices a Work's future is aware of: none for a CPU op (a plain
// future), the op's GPU for a CUDA op. A CUDA-aware future records an event
// on the completing thread's current stream when it completes, and its
// wait() and callbacks make the consumer's current stream wait on it.
std::vector<c10::Device> futureDevices(const c10::Device& device) {
  if (device.is_cpu()) return {};
  return {device};
}

// A c10d Work completed by the backend's completion thread through its future.
// Any thread may wait on it or chain callbacks to its future.
class HvdWork : public c10d::Work {
 public:
  HvdWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, const c10::Device& device)
      : c10d::Work(rank, type),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()), futureDevices(device))) {}

  bool isCompleted() override { return future_->completed(); }
  bool isSuccess() const override { return future_->completed() && !future_->hasError(); }
  std::exception_ptr exception() const override { return future_->exception_ptr(); }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  // torch releases the GIL around Work.wait. A timeout ends in an error, as
  // Gloo's does; the op itself keeps running (the engine's stall check and
  // peer-failure detection end a collective that can never finish). For a
  // CUDA op, as NCCL's Work: the host waits until the engine is done, and the
  // caller's current stream is ordered after the result (future_->wait()).
  bool wait(std::chrono::milliseconds timeout) override {
    if (timeout > std::chrono::milliseconds(0)) {
      const auto deadline = std::chrono::steady_clock::now() + timeout;
      auto pause = std::chrono::microseconds(20);
      while (!future_->completed()) {
        if (std::chrono::steady_clock::now() >= deadline) {
          C10_THROW_ERROR(DistBackendError,
                          c10::str(kPrefix, "Work.wait timed out after ", timeout.count(),
                                   " ms; the collective is still pending"));
        }
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(1000));
      }
    }
    future_->wait();
    if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
    return true;
  }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// The completion thread: finishes jobs in submission order (every rank
// submits a group's collectives in the same order, so the head of the queue
// is never waiting on a later one), then completes their futures. A CUDA
// job runs with one side stream of its GPU current: waiting for the engine
// orders that stream after the result (device_io.h's finishOutput), the
// copies into the caller's outputs run on it, and the job's CUDA-aware
// future records its completion there.
//
// The thread is detached, not joined: a job's callbacks and its tensors'
// release may need the GIL, which whoever destroys the backend (the main
// thread in destroy_process_group, or DDP's reducer being freed) may hold;
// joining there deadlocked. Once stopped, the thread finishes the jobs it has
// (the engine completes or fails every op it was given) and ends; it shares
// the queue's state, so the backend may go first.
class Completer {
 public:
  struct Job {
    std::function<void()> finish;                       // waits for the engine, copies outputs
    c10::intrusive_ptr<c10::ivalue::Future> future;     // null: nobody waits (a refusal's stand-in)
    std::vector<at::Tensor> value;
    c10::Device device = c10::Device(c10::kCPU);        // the op's GPU, for a CUDA op
  };

  Completer() : state_(std::make_shared<State>()) {
    std::thread([state = state_] { run(*state); }).detach();
  }
  ~Completer() {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->stop = true;
    }
    state_->cv.notify_one();
  }

  void push(Job job) {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->jobs.push_back(std::move(job));
    }
    state_->cv.notify_one();
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Job> jobs;
    bool stop = false;
    std::vector<c10::Stream> streams;  // the completion thread's own
  };

  static void run(State& state) {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(state.mu);
        state.cv.wait(lock, [&] { return state.stop || !state.jobs.empty(); });
        if (state.jobs.empty()) return;  // stopping, and every job is done
        job = std::move(state.jobs.front());
        state.jobs.pop_front();
      }
      c10::OptionalStreamGuard on_side_stream;
      if (!job.device.is_cpu()) on_side_stream.reset_stream(sideStream(state, job.device));
      try {
        job.finish();
      } catch (...) {
        if (job.future) job.future->setErrorIfNeeded(std::current_exception());
        continue;
      }
      // Runs the future's callbacks (a DDP comm hook's `then`) on this thread.
      if (job.future) job.future->markCompleted(c10::IValue(std::move(job.value)));
    }
  }

  // This thread's stream on `device`, taken from torch's pool once per device.
  static c10::Stream sideStream(State& state, const c10::Device& device) {
    for (const c10::Stream& s : state.streams) {
      if (s.device() == device) return s;
    }
    c10::impl::VirtualGuardImpl impl(device.type());
    state.streams.push_back(impl.getStreamFromGlobalPool(device));
    return state.streams.back();
  }

  std::shared_ptr<State> state_;
};


const char* reduceOpName(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM: return "SUM";
    case c10d::ReduceOp::AVG: return "AVG";
    case c10d::ReduceOp::PRODUCT: return "PRODUCT";
    case c10d::ReduceOp::MIN: return "MIN";
    case c10d::ReduceOp::MAX: return "MAX";
    case c10d::ReduceOp::BAND: return "BAND";
    case c10d::ReduceOp::BOR: return "BOR";
    case c10d::ReduceOp::BXOR: return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "UNUSED";
  }
}

// Our reduction (Horovod's op, a prescale factor) for a c10d ReduceOp.
Reduction reduction(const c10d::ReduceOp& r, const char* what, bool sum_or_average_only) {
  switch (r.op_) {
    case c10d::ReduceOp::SUM: return {ReduceOp::kSum};
    case c10d::ReduceOp::AVG: return {ReduceOp::kAverage};
    case c10d::ReduceOp::PREMUL_SUM: {
      // NCCLPreMulSumSupplement: torch 2.11's name, an alias of PreMulSumSupplement since.
      auto* factor = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(r.supplement_.get());
      TORCH_CHECK_VALUE(factor != nullptr, kPrefix, what, ": ReduceOp.PREMUL_SUM without a factor");
      const double f = factor->tensor_factor.defined()
                           ? factor->tensor_factor.to(at::kCPU, at::kDouble).item<double>()
                           : factor->double_factor;
      return {ReduceOp::kSum, f};
    }
    default: break;
  }
  if (!sum_or_average_only) {
    switch (r.op_) {
      case c10d::ReduceOp::MIN: return {ReduceOp::kMin};
      case c10d::ReduceOp::MAX: return {ReduceOp::kMax};
      case c10d::ReduceOp::PRODUCT: return {ReduceOp::kProduct};
      default: break;
    }
  }
  TORCH_CHECK_NOT_IMPLEMENTED(false, kPrefix, what, " does not support ReduceOp.",
                              reduceOpName(r.op_), " (supported: ",
                              sum_or_average_only ? "SUM, AVG, PREMUL_SUM"
                                                  : "SUM, AVG, MIN, MAX, PRODUCT, PREMUL_SUM",
                              ")");
  return {};  // not reached
}

class HvdBackend : public c10d::Backend {
 public:
  HvdBackend(int rank, int size, int64_t process_set, std::vector<int64_t> global_ranks,
             std::string group_name)
      : c10d::Backend(rank, size),
        process_set_(process_set),
        global_ranks_(std::move(global_ranks)),
        group_name_(std::move(group_name)) {}

  const std::string getBackendName() const override { return "hvd"; }

  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    const char* what = "all_reduce";
    const std::string name = nextName();
    return refusingOnError(name, [&] {
      at::Tensor t = single(tensors, what);
      const int64_t h =
          submitAllreduce(t, true, reducing<AllreduceOptions>(name, opts.reduceOp, what, false));
      return launch(c10d::OpType::ALLREDUCE, t.device(), {t}, [h] { waitHandle(h); });
    });
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    const char* what = "all_reduce_coalesced";
    const std::string name = nextName();
    return refusingOnError(name, [&] {
      TORCH_CHECK_VALUE(!tensors.empty(), kPrefix, what, ": no tensors");
      for (const auto& t : tensors) {
        checkTensor(t, what);
        TORCH_CHECK_VALUE(t.scalar_type() == tensors[0].scalar_type(), kPrefix, what,
                          ": every tensor must have one dtype, got ", tensors[0].scalar_type(),
                          " and ", t.scalar_type());
      }
      const auto options = reducing<AllreduceOptions>(name, opts.reduceOp, what, false);
      if (tensors.size() == 1) {
        const int64_t h = submitAllreduce(tensors[0], true, options);
        return launch(c10d::OpType::ALLREDUCE_COALESCED, tensors[0].device(), tensors,
                      [h] { waitHandle(h); });
      }
      // Tensors of one dtype: one engine op (a bundle), named `name`.
      std::vector<int64_t> handles = submitGroup(tensors, true, options);
      for (const auto& t : tensors) bumpVersion(t);
      return launch(c10d::OpType::ALLREDUCE_COALESCED, tensors[0].device(), tensors, [handles] {
        for (int64_t h : handles) waitHandle(h);
      });
    });
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    const char* what = "broadcast";
    const std::string name = nextName();
    return refusingOnError(name, [&] {
      at::Tensor t = single(tensors, what);
      const int64_t root = globalRank(opts.rootRank, what);
      auto options = named<BroadcastOptions>(name);
      options.root_rank = static_cast<int32_t>(root);
      const int64_t h = submitBroadcast(t, true, options);
      return launch(c10d::OpType::BROADCAST, t.device(), {t}, [h] { waitHandle(h); });
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    const char* what = "reduce";
    const std::string name = nextName();
    return refusingOnError(name, [&] {
      at::Tensor t = single(tensors, what);
      globalRank(opts.rootRank, what);
      const auto options = reducing<AllreduceOptions>(name, opts.reduceOp, what, false);
      // The root reduces in place; the others into a copy, so their tensor is unchanged.
      const bool root = opts.rootRank == getRank();
      at::Tensor target = root ? t : t.clone();
      const int64_t h = submitAllreduce(target, true, options);
      return launch(c10d::OpType::REDUCE, t.device(), {t}, [h, target] { waitHandle(h); });
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    const char* what = "all_gather";
    const std::string name = nextName();
    return refusingOnError(name, [&] {
      at::Tensor in = single(inputs, what);
      TORCH_CHECK_VALUE(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                        kPrefix, what, ": expected one list of ", getSize(),
                        " output tensors (one per rank)");
      std::vector<at::Tensor> outs = outputs[0];
      for (const auto& o : outs) checkOutput(o, in, what);
      // Flattened, so ranks may gather tensors of different shapes (each
      // output says what its rank sends).
      const int64_t h = submitAllgather(in.reshape({-1}), named<AllgatherOptions>(name));
      return launch(c10d::OpType::ALLGATHER, in.device(), outs, [h, outs, name] {
        Pending p;
        at::Tensor gathered = waitHandle(h, &p);
        scatterRows(gathered, p.work->rankRows(), outs, "all_gather", name);
      });
    });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override {
    const char* what = "all_gather_into_tensor";
    const std::string name = nextName();
    return refusingOnError(name, [&] {
      checkTensor(input, what);
      checkOutput(output, input, what);
      TORCH_CHECK_VALUE(output.numel() == input.numel() * getSize(), kPrefix, what,
                        ": the output has ", output.numel(), " elements, expected the input's ",
                        input.numel(), " times ", getSize(), " ranks");
      const int64_t h =
          submitAllgather(input.reshape({-1}), named<AllgatherOptions>(name), nullptr,
                          into(output, input));
      at::Tensor out = output;
      return launch(c10d::OpType::_ALLGATHER_BASE, input.device(), {output}, [h, out, name] {
        at::Tensor gathered = waitHandle(h);
        copyFlat(gathered, out, "all_gather_into_tensor", name);
      });
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    TORCH_CHECK_VALUE(outputs.size() == inputs.size(), kPrefix,
                      "all_gather_into_tensor_coalesced: ", outputs.size(), " outputs for ",
                      inputs.size(), " inputs");
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (size_t i = 0; i < inputs.size(); ++i) {
      works.push_back(_allgather_base(outputs[i], inputs[i], opts));
    }
    return all(c10d::OpType::_ALLGATHER_BASE, deviceOf(inputs), outputs, std::move(works));
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    const char* what = "gather";
    const std::string name = nextName();
    return refusingOnError(name, [&] {
      at::Tensor in = single(inputs, what);
      globalRank(opts.rootRank, what);
      const bool root = opts.rootRank == getRank();
      std::vector<at::Tensor> outs;
      if (root) {
        TORCH_CHECK_VALUE(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                          kPrefix, what, ": the root expects one list of ", getSize(),
                          " output tensors");
        outs = outputs[0];
        for (const auto& o : outs) checkOutput(o, in, what);
      } else {
        TORCH_CHECK_VALUE(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()), kPrefix,
                          what, ": only the root (rank ", opts.rootRank, ") passes outputs");
      }
      // Every rank receives every input (an allgather): gather moves more bytes
      // than it needs to, and is correct.
      const int64_t h = submitAllgather(in.reshape({-1}), named<AllgatherOptions>(name));
      return launch(c10d::OpType::GATHER, in.device(), outs, [h, outs, name, root] {
        Pending p;
        at::Tensor gathered = waitHandle(h, &p);
        if (root) scatterRows(gathered, p.work->rankRows(), outs, "gather", name);
      });
    });
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    const char* what = "scatter";
    const std::string name = nextName();
    return refusingOnError(name, [&] {
      at::Tensor out = single(outputs, what);
      globalRank(opts.rootRank, what);
      const bool root = opts.rootRank == getRank();
      // An alltoall in which only the root sends: rank i gets its tensor's
      // elements from the root and nothing from the others.
      std::vector<int64_t> splits(getSize(), 0);
      at::Tensor send;
      if (root) {
        TORCH_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                          kPrefix, what, ": the root expects one list of ", getSize(),
                          " input tensors");
        std::vector<at::Tensor> flat;
        for (size_t i = 0; i < inputs[0].size(); ++i) {
          checkOutput(inputs[0][i], out, what);
          flat.push_back(inputs[0][i].reshape({-1}));
          splits[i] = inputs[0][i].numel();
        }
        send = at::cat(flat);
      } else {
        TORCH_CHECK_VALUE(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()), kPrefix,
                          what, ": only the root (rank ", opts.rootRank, ") passes inputs");
        send = at::empty({0}, out.options());
      }
      const int64_t h =
          submitAlltoall(send, at::tensor(splits, at::kLong), named<AlltoallOptions>(name));
      return launch(c10d::OpType::SCATTER, out.device(), {out}, [h, out, name] {
        auto received = waitAlltoall(h);
        copyFlat(std::get<0>(received), out, "scatter", name);
      });
    });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    const char* what = "reduce_scatter_tensor";
    const std::string name = nextName();
    return refusingOnError(name, [&] {
      checkTensor(input, what);
      checkOutput(output, input, what);
      TORCH_CHECK_VALUE(input.numel() == output.numel() * getSize(), kPrefix, what,
                        ": the input has ", input.numel(), " elements, expected the output's ",
                        output.numel(), " times ", getSize(), " ranks");
      return reduceScatterRows(input.reshape({getSize(), output.numel()}), output, opts, what,
                               name, c10d::OpType::_REDUCE_SCATTER_BASE);
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    const char* what = "reduce_scatter";
    const std::string name = nextName();
    return refusingOnError(name, [&] {
      at::Tensor out = single(outputs, what);
      TORCH_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                        kPrefix, what, ": expected one list of ", getSize(), " input tensors");
      std::vector<at::Tensor> rows;
      for (const auto& t : inputs[0]) {
        checkOutput(t, out, what);
        TORCH_CHECK_VALUE(t.numel() == out.numel(), kPrefix, what, ": every input must have the ",
                          "output's ", out.numel(), " elements, got ", t.numel());
        rows.push_back(t.reshape({-1}));
      }
      return reduceScatterRows(at::stack(rows), out, opts, what, name,
                               c10d::OpType::REDUCE_SCATTER);
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    TORCH_CHECK_VALUE(outputs.size() == inputs.size(), kPrefix,
                      "reduce_scatter_tensor_coalesced: ", outputs.size(), " outputs for ",
                      inputs.size(), " inputs");
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (size_t i = 0; i < inputs.size(); ++i)
      works.push_back(_reduce_scatter_base(outputs[i], inputs[i], opts));
    // COALESCED: torch 2.11 has no REDUCE_SCATTER_TENSOR_COALESCED.
    return all(c10d::OpType::COALESCED, deviceOf(inputs), outputs, std::move(works));
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions&) override {
    const char* what = "all_to_all_single";
    const std::string name = nextName();
    return refusingOnError(name, [&] {
      checkTensor(input, what);
      checkOutput(output, input, what);
      TORCH_CHECK_VALUE(input.dim() >= 1 && output.dim() >= 1, kPrefix, what,
                        ": the tensors need at least one dimension to split");
      TORCH_CHECK_VALUE(input_splits.empty() || static_cast<int>(input_splits.size()) == getSize(),
                        kPrefix, what, ": input_split_sizes has ", input_splits.size(),
                        " entries for ", getSize(), " ranks");
      TORCH_CHECK_VALUE(
          output_splits.empty() || static_cast<int>(output_splits.size()) == getSize(), kPrefix,
          what, ": output_split_sizes has ", output_splits.size(), " entries for ", getSize(),
          " ranks");
      c10::optional<at::Tensor> splits;
      if (!input_splits.empty()) splits = at::tensor(input_splits, at::kLong);
      const int64_t h =
          submitAlltoall(input, splits, named<AlltoallOptions>(name), into(output, input));
      at::Tensor out = output;
      std::vector<int64_t> expected = output_splits;
      const c10::Device device = input.device();
      return launch(c10d::OpType::ALLTOALL_BASE, device, {output}, [h, out, expected, name] {
        auto received = waitAlltoall(h);
        const at::Tensor rows = std::get<1>(received);
        if (!expected.empty()) {
          for (size_t i = 0; i < expected.size(); ++i) {
            TORCH_CHECK_VALUE(rows[i].item<int64_t>() == expected[i], kPrefix,
                              "all_to_all_single '", name, "': rank ", i, " sent ",
                              rows[i].item<int64_t>(), " rows, output_split_sizes[", i,
                              "] expects ", expected[i]);
          }
        }
        copyFlat(std::get<0>(received), out, "all_to_all_single", name);
      });
    });
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions&) override {
    const char* what = "all_to_all";
    const std::string name = nextName();
    return refusingOnError(name, [&] {
      TORCH_CHECK_VALUE(static_cast<int>(inputs.size()) == getSize() &&
                            static_cast<int>(outputs.size()) == getSize(),
                        kPrefix, what, ": expected ", getSize(),
                        " input and output tensors (one per rank), got ", inputs.size(), " and ",
                        outputs.size());
      // Each tensor travels flattened, so shapes may differ per pair of ranks.
      std::vector<at::Tensor> flat;
      std::vector<int64_t> splits;
      for (const auto& t : inputs) {
        checkTensor(t, what);
        checkOutput(t, inputs[0], what);
        flat.push_back(t.reshape({-1}));
        splits.push_back(t.numel());
      }
      for (const auto& o : outputs) checkOutput(o, inputs[0], what);
      const int64_t h =
          submitAlltoall(at::cat(flat), at::tensor(splits, at::kLong), named<AlltoallOptions>(name));
      std::vector<at::Tensor> outs = outputs;
      return launch(c10d::OpType::ALLTOALL, inputs[0].device(), outs, [h, outs, name] {
        auto received = waitAlltoall(h);
        const at::Tensor rows = std::get<1>(received).to(at::kLong);
        const int64_t* row = rows.data_ptr<int64_t>();
        std::vector<int64_t> dims(row, row + rows.numel());
        scatterRows(std::get<0>(received), dims, outs, "all_to_all", name);
      });
    });
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    requireRunningEngine();
    const std::string name = nextName();
    const int64_t h = submitBarrier(process_set_, name);
    return launch(c10d::OpType::BARRIER, c10::Device(c10::kCPU), {}, [h] { waitHandle(h); });
  }

  // destroy_process_group(), on the group over every rank: wait until every
  // rank has come this far. The engine's process sets share rank 0's
  // coordinator and every rank's engine, so a rank that finished early and
  // shut its engine down (at exit) failed the collectives other ranks were
  // still running in subgroups without it (a 2x2 DeviceMesh's HSDP: one pair
  // gathering its full tensors while the other had exited). torch asks every
  // rank to call destroy_process_group; one that never does holds the others
  // for at most kShutdownWait, then they go on (with a warning).
  void shutdown() override {
    if (process_set_ != 0 || shut_down_ || currentEngine() == nullptr) return;
    shut_down_ = true;
    try {
      auto work = barrier(c10d::BarrierOptions());
      if (Py_IsInitialized() && PyGILState_Check()) {
        pybind11::gil_scoped_release no_gil;
        work->wait(kShutdownWait);
      } else {
        work->wait(kShutdownWait);
      }
    } catch (const c10::Error& e) {
      // A peer that died or already shut down: nothing left to wait for. One line,
      // not torch's C++ backtrace: the cause is the peer, not this frame.
      warnBarrierFailed(e.what_without_backtrace());
    } catch (const std::exception& e) {
      warnBarrierFailed(e.what());
    }
  }

  static void warnBarrierFailed(const char* why) {
    std::fprintf(stderr, "[hvd_torch] WARNING: %sdestroy_process_group's barrier: %s\n",
                 kPrefix, why);
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>&, int, int) override {
    pointToPoint("send");
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>&, int, int) override {
    pointToPoint("recv");
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>&, int) override {
    pointToPoint("recv (from any source)");
  }

 private:
  std::string nextName() {
    return kC10dNamePrefix + group_name_ + "." + std::to_string(seq_++);
  }

  // The group outlives the engine when hvd.shutdown() runs first: say so, on
  // every rank, instead of the hvd ops' "call hvd.init() first".
  void requireRunningEngine() const {
    TORCH_CHECK(currentEngine() != nullptr, kPrefix, "the hvd engine of process group '",
                group_name_, "' was shut down (hvd.shutdown()); call "
                "dist.destroy_process_group() and create the group again");
  }

  [[noreturn]] void pointToPoint(const char* what) {
    TORCH_CHECK_NOT_IMPLEMENTED(
        false, kPrefix, "dist.", what, " (point-to-point) is not supported: the hvd engine ",
        "negotiates collectives only. For point-to-point traffic create a Gloo group beside it, "
        "e.g. p2p = dist.new_group(backend=\"gloo\"), and pass group=p2p");
  }

  // Runs `submit`; if it refuses the call on this rank (a caller's mistake
  // seen only here), submits a barrier under the same name first, so the
  // other ranks, which submitted the real op under that name, get the
  // engine's "mismatched operations" error instead of waiting forever.
  template <class Submit>
  c10::intrusive_ptr<c10d::Work> refusingOnError(const std::string& name, Submit submit) {
    requireRunningEngine();
    try {
      return submit();
    } catch (const c10::Error&) {
      try {
        const int64_t h = submitBarrier(process_set_, name);
        completer_.push({[h] { waitHandle(h); }, nullptr, {}});
      } catch (...) {
        // The op itself reached the engine (its own name is taken), or the
        // engine is gone: the caller's error says what happened.
      }
      throw;
    }
  }

  // `device`: where the op's tensors are (the CPU, or this rank's GPU).
  c10::intrusive_ptr<c10d::Work> launch(c10d::OpType type, const c10::Device& device,
                                        std::vector<at::Tensor> outputs,
                                        std::function<void()> finish) {
    auto work = c10::make_intrusive<HvdWork>(getRank(), type, outputs, device);
    completer_.push({std::move(finish), work->getFuture(), std::move(outputs), device});
    return work;
  }

  // One Work for several: completes when they all have (the first error wins).
  c10::intrusive_ptr<c10d::Work> all(c10d::OpType type, const c10::Device& device,
                                     std::vector<at::Tensor> outputs,
                                     std::vector<c10::intrusive_ptr<c10d::Work>> works) {
    return launch(type, device, std::move(outputs), [works] {
      for (const auto& w : works) w->wait();
    });
  }

  static c10::Device deviceOf(const std::vector<at::Tensor>& tensors) {
    return tensors.empty() ? c10::Device(c10::kCPU) : tensors[0].device();
  }

  at::Tensor single(const std::vector<at::Tensor>& tensors, const char* what) const {
    TORCH_CHECK_VALUE(tensors.size() == 1, kPrefix, what, " takes one tensor per call, got ",
                      tensors.size());
    checkTensor(tensors[0], what);
    return tensors[0];
  }

  static void checkTensor(const at::Tensor& t, const char* what) {
    TORCH_CHECK_VALUE(t.defined(), kPrefix, what, ": undefined tensor");
    TORCH_CHECK_VALUE(t.layout() == at::kStrided, kPrefix, what, ": ", t.layout(),
                      " tensors are not supported (dense tensors only)");
    // A CUDA tensor on another GPU than this rank's, or in a build without
    // CUDA, is refused by the engine's submission (device_io.h), naming the op.
    TORCH_CHECK_VALUE(t.device().is_cpu() || t.device().is_cuda(), kPrefix, what,
                      ": tensor on ", t.device(), "; the hvd backend moves CPU and CUDA tensors");
  }

  static void checkOutput(const at::Tensor& o, const at::Tensor& in, const char* what) {
    checkTensor(o, what);
    TORCH_CHECK_VALUE(o.scalar_type() == in.scalar_type(), kPrefix, what, ": dtype ",
                      o.scalar_type(), " differs from the input's ", in.scalar_type());
    TORCH_CHECK_VALUE(o.device() == in.device(), kPrefix, what, ": a tensor on ", o.device(),
                      " beside one on ", in.device(), " (every tensor of a call on one device)");
  }

  // The options of one of this group's ops: its name, our process set.
  template <class Options>
  Options named(const std::string& name) const {
    Options o;
    o.name = name;
    o.process_set = static_cast<int32_t>(process_set_);
    return o;
  }

  // And the reduction for c10d's op (reduction()).
  template <class Options>
  Options reducing(const std::string& name, const c10d::ReduceOp& op, const char* what,
                   bool sum_or_average_only) const {
    Options o = named<Options>(name);
    o.reduction = reduction(op, what, sum_or_average_only);
    return o;
  }

  int64_t globalRank(int64_t group_rank, const char* what) const {
    TORCH_CHECK_VALUE(group_rank >= 0 && group_rank < getSize(), kPrefix, what, ": root rank ",
                      group_rank, " is not in [0, ", getSize(), ")");
    return global_ranks_.empty() ? group_rank : global_ranks_[group_rank];
  }

  c10::intrusive_ptr<c10d::Work> reduceScatterRows(const at::Tensor& rows, at::Tensor& output,
                                                   const c10d::ReduceScatterOptions& opts,
                                                   const char* what, const std::string& name,
                                                   c10d::OpType type) {
    // One row per rank: Horovod's split gives rank i row i.
    const int64_t h =
        submitReducescatter(rows, reducing<ReducescatterOptions>(name, opts.reduceOp, what, true),
                            nullptr, into(output, rows));
    at::Tensor out = output;
    std::string op = what;
    return launch(type, output.device(), {output}, [h, out, op, name] {
      copyFlat(waitHandle(h), out, op.c_str(), name);
    });
  }

  // The output the engine may write the result into directly: not when it
  // shares memory with the input (FSDP2 gathers from a slice of its output),
  // where the engine would read what it is writing.
  static at::Tensor into(const at::Tensor& output, const at::Tensor& input) {
    return output.is_alias_of(input) ? at::Tensor() : output;
  }

  // The engine's result into the caller's tensor, element for element.
  static void copyFlat(const at::Tensor& result, const at::Tensor& out, const char* what,
                       const std::string& name) {
    TORCH_CHECK_VALUE(result.numel() == out.numel(), kPrefix, what, " '", name, "': received ",
                      result.numel(), " elements for an output of ", out.numel(),
                      " (the ranks passed tensors of different sizes)");
    // The engine wrote straight into a contiguous output (submit*'s `into`).
    if (result.data_ptr() == out.data_ptr()) return;
    out.copy_(result.reshape(out.sizes()));
  }

  // A flat result of `counts[i]` elements from rank i into outs[i].
  static void scatterRows(const at::Tensor& result, const std::vector<int64_t>& counts,
                          const std::vector<at::Tensor>& outs, const char* what,
                          const std::string& name) {
    const at::Tensor flat = result.reshape({-1});
    int64_t offset = 0;
    for (size_t i = 0; i < outs.size() && i < counts.size(); ++i) {
      TORCH_CHECK_VALUE(counts[i] == outs[i].numel(), kPrefix, what, " '", name, "': rank ", i,
                        " sent ", counts[i], " elements, its output tensor has ",
                        outs[i].numel());
      outs[i].copy_(flat.narrow(0, offset, counts[i]).view(outs[i].sizes()));
      offset += counts[i];
    }
  }

  const int64_t process_set_;
  const std::vector<int64_t> global_ranks_;
  const std::string group_name_;
  std::atomic<uint64_t> seq_{0};
  bool shut_down_ = false;
  static constexpr std::chrono::milliseconds kShutdownWait{60000};
  Completer completer_;
};

}  // namespace

c10::intrusive_ptr<c10d::Backend> makeC10dBackend(int group_rank, int group_size,
                                                  int64_t process_set,
                                                  std::vector<int64_t> global_ranks,
                                                  std::string group_name) {
  auto engine = currentEngine();
  TORCH_CHECK(engine != nullptr, kPrefix, "the hvd engine is not running: call hvd.init() "
              "(dist.init_process_group(\"hvd\") does it for you)");
  return c10::make_intrusive<HvdBackend>(group_rank, group_size, process_set,
                                         std::move(global_ranks), std::move(group_name));
}

}  // namespace torch_layer
}  // namespace hvd
