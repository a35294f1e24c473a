// The kernels: submit to the engine and, for the blocking forms, wait. One
// set serves CPU and CUDA tensors (the adapter picks the data plane from the
// tensor's device), registered under both dispatch keys.
#include "kernels.h"

#include <torch/csrc/jit/frontend/function_schema_parser.h>
#include <torch/library.h>

#include "adapter.h"
#include "op_call.h"

namespace hvd {
namespace torch_layer {
namespace {

// The blocking forms submit as kCallerWaits: this thread drives the engine
// while it waits, so the submission does not wake the background thread.
constexpr SubmitMode kWaits = SubmitMode::kCallerWaits;

// A blocking grouped op: its members as one group handle, every member
// waited for, then the first error raised (handles.cc).
std::vector<at::Tensor> waitAll(const std::vector<int64_t>& handles) {
  return waitAny(groupHandles(handles)).members;
}

at::Tensor allreduceBlocking(const at::Tensor& tensor, bool in_place, const AllreduceOptions& o) {
  at::Tensor out = waitHandle(submitAllreduce(tensor, in_place, o, nullptr, kWaits));
  if (in_place) bumpVersion(tensor);
  return out;
}

at::Tensor broadcastBlocking(const at::Tensor& tensor, bool in_place, const BroadcastOptions& o) {
  at::Tensor out = waitHandle(submitBroadcast(tensor, in_place, o, kWaits));
  if (in_place) bumpVersion(tensor);
  return out;
}

// `with_received` false: the second tensor (rows received from each rank) is
// left undefined.
std::tuple<at::Tensor, at::Tensor> alltoallBlocking(const at::Tensor& tensor,
                                                    const c10::optional<at::Tensor>& splits,
                                                    const AlltoallOptions& o,
                                                    bool with_received) {
  const int64_t handle = submitAlltoall(tensor, splits, o, at::Tensor(), kWaits);
  if (!with_received) return {waitHandle(handle), at::Tensor()};
  return waitAlltoall(handle);
}

std::vector<at::Tensor> groupedAllreduceBlocking(at::TensorList tensors, bool in_place,
                                                 const AllreduceOptions& o) {
  auto out = runBundle(tensors, in_place, o);
  if (!out) out = waitAll(submitGroup(tensors, in_place, o));
  if (in_place)
    for (const auto& t : tensors) bumpVersion(t);
  return std::move(*out);
}

}  // namespace

namespace kernel {

at::Tensor allreduce(const at::Tensor& t, const AllreduceOptions& o) {
  return allreduceBlocking(t, false, o);
}

void allreduceInPlace(const at::Tensor& t, const AllreduceOptions& o) {
  allreduceBlocking(t, true, o);
}

int64_t allreduceAsync(const at::Tensor& t, const AllreduceOptions& o) {
  return submitAllreduce(t, false, o);
}

int64_t allreduceAsyncInPlace(const at::Tensor& t, const AllreduceOptions& o) {
  const int64_t handle = submitAllreduce(t, true, o);
  bumpVersion(t);
  return handle;
}

at::Tensor allgather(const at::Tensor& t, const AllgatherOptions& o) {
  return waitHandle(submitAllgather(t, o, nullptr, at::Tensor(), kWaits));
}

int64_t allgatherAsync(const at::Tensor& t, const AllgatherOptions& o) {
  return submitAllgather(t, o);
}

at::Tensor broadcast(const at::Tensor& t, const BroadcastOptions& o) {
  return broadcastBlocking(t, false, o);
}

void broadcastInPlace(const at::Tensor& t, const BroadcastOptions& o) {
  broadcastBlocking(t, true, o);
}

int64_t broadcastAsync(const at::Tensor& t, const BroadcastOptions& o) {
  return submitBroadcast(t, false, o);
}

int64_t broadcastAsyncInPlace(const at::Tensor& t, const BroadcastOptions& o) {
  const int64_t handle = submitBroadcast(t, true, o);
  bumpVersion(t);
  return handle;
}

std::tuple<at::Tensor, at::Tensor> alltoall(const at::Tensor& t,
                                            const c10::optional<at::Tensor>& splits,
                                            const AlltoallOptions& o) {
  return alltoallBlocking(t, splits, o, true);
}

at::Tensor alltoallOutput(const at::Tensor& t, const AlltoallOptions& o) {
  return std::get<0>(alltoallBlocking(t, c10::nullopt, o, false));
}

int64_t alltoallAsync(const at::Tensor& t, const c10::optional<at::Tensor>& splits,
                      const AlltoallOptions& o) {
  return submitAlltoall(t, splits, o);
}

at::Tensor reducescatter(const at::Tensor& t, const ReducescatterOptions& o) {
  return waitHandle(submitReducescatter(t, o, nullptr, at::Tensor(), kWaits));
}

int64_t reducescatterAsync(const at::Tensor& t, const ReducescatterOptions& o) {
  return submitReducescatter(t, o);
}

std::vector<at::Tensor> groupedAllreduce(at::TensorList ts, const AllreduceOptions& o) {
  return groupedAllreduceBlocking(ts, false, o);
}

void groupedAllreduceInPlace(at::TensorList ts, const AllreduceOptions& o) {
  groupedAllreduceBlocking(ts, true, o);
}

std::vector<int64_t> groupedAllreduceAsync(at::TensorList ts, const AllreduceOptions& o) {
  return submitGroup(ts, false, o);
}

std::vector<int64_t> groupedAllreduceAsyncInPlace(at::TensorList ts, const AllreduceOptions& o) {
  auto handles = submitGroup(ts, true, o);
  for (const auto& t : ts) bumpVersion(t);
  return handles;
}

std::vector<at::Tensor> groupedAllgather(at::TensorList ts, const AllgatherOptions& o) {
  return waitAll(submitGroup(ts, o));
}

std::vector<int64_t> groupedAllgatherAsync(at::TensorList ts, const AllgatherOptions& o) {
  return submitGroup(ts, o);
}

std::vector<at::Tensor> groupedReducescatter(at::TensorList ts, const ReducescatterOptions& o) {
  return waitAll(submitGroup(ts, o));
}

std::vector<int64_t> groupedReducescatterAsync(at::TensorList ts, const ReducescatterOptions& o) {
  return submitGroup(ts, o);
}

}  // namespace kernel

namespace {

at::Tensor barrier(int64_t ps) {
  return waitHandle(submitBarrier(ps, "", kWaits));
}

at::Tensor join(int64_t device) {
  TORCH_CHECK(device == -1 || device >= 0, "hvd_torch.join: device ", device, " is not valid");
  return at::scalar_tensor(joinAndWait(), at::kLong);
}

bool poll(int64_t handle) { return pollHandle(handle); }

at::Tensor synchronize(int64_t handle) { return waitHandle(handle); }

std::tuple<at::Tensor, at::Tensor> synchronizeAlltoall(int64_t handle) {
  return waitAlltoall(handle);
}

// Boxed: the dispatcher hands its stack to the runner as it is (no unboxing
// into C++ arguments and back); op_call.h reads the options off it.
void registerTensorKernels(torch::Library& m) {
  forEachKernel([&](const char* name, auto k) { m.impl(name, boxed<decltype(k)::run>()); });
}

}  // namespace

namespace {

std::string mismatchOf(const std::string& op, const c10::FunctionSchema& schema) {
  std::string why;
  bool found = false;
  forEachKernel([&](const char* name, auto k) {
    if (op != name) return;
    found = true;
    why = schemaMismatch<decltype(k)::run>(schema);
  });
  TORCH_CHECK_VALUE(found, "hvd_torch: no kernel named ", op);
  return why;
}

}  // namespace

void checkOpSchemas() {
  forEachKernel([](const char* name, auto) {
    const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(
        (std::string("hvd_torch::") + name).c_str(), "");
    const std::string why = mismatchOf(name, op.schema());
    TORCH_CHECK(why.empty(), "hvd_torch internal error (a bug in hvd-torch, please report it): ",
                "the schema ", op.schema(), " and its options (csrc/core/op_options.h) disagree: ",
                why);
  });
}

std::string optionsMismatch(const std::string& op, const std::string& schema) {
  return mismatchOf(op, torch::jit::parseSchema(schema));
}

TORCH_LIBRARY_IMPL(hvd_torch, CPU, m) { registerTensorKernels(m); }

#ifdef HVD_TORCH_WITH_CUDA
TORCH_LIBRARY_IMPL(hvd_torch, CUDA, m) { registerTensorKernels(m); }
#endif


// Ops without a tensor argument have no dispatch key to select a backend:
// a composite kernel serves every key (and autograd has nothing to track).
// Explicit, not implicit: an implicit composite runs above the Python key, so
// a tracer (FakeTensorMode, torch.compile) would run the real barrier or join
// while tracing; an explicit one lets it reach the fake kernels
// (hvd_torch/compile_contract.py).
TORCH_LIBRARY_IMPL(hvd_torch, CompositeExplicitAutograd, m) {
  m.impl("barrier", barrier);
  m.impl("poll", poll);
  m.impl("synchronize", synchronize);
  m.impl("join", join);
  m.impl("synchronize_alltoall", synchronizeAlltoall);
}

}  // namespace torch_layer
}  // namespace hvd
