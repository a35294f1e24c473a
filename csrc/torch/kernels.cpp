// The kernels: submit to the engine and, for the blocking forms, wait. One
// set serves CPU and CUDA tensors (the adapter picks the data plane from the
// tensor's device), registered under both dispatch keys.
#include <torch/library.h>

#include "adapter.h"

namespace hvd {
namespace torch_layer {
namespace {

at::Tensor allreduce(const at::Tensor& t, c10::string_view name, int64_t op, double pre,
                     double post, int64_t ps) {
  return allreduceBlocking(t, false, std::string(name), op, pre, post, ps);
}

void allreduceInPlace(at::Tensor& t, c10::string_view name, int64_t op, double pre, double post,
                      int64_t ps) {
  allreduceBlocking(t, true, std::string(name), op, pre, post, ps);
}

int64_t allreduceAsync(const at::Tensor& t, c10::string_view name, int64_t op, double pre,
                       double post, int64_t ps) {
  return submitAllreduce(t, false, std::string(name), op, pre, post, ps);
}

int64_t allreduceAsyncInPlace(at::Tensor& t, c10::string_view name, int64_t op, double pre,
                              double post, int64_t ps) {
  const int64_t handle = submitAllreduce(t, true, std::string(name), op, pre, post, ps);
  bumpVersion(t);
  return handle;
}

at::Tensor allgather(const at::Tensor& t, c10::string_view name, int64_t ps) {
  return allgatherBlocking(t, std::string(name), ps);
}

int64_t allgatherAsync(const at::Tensor& t, c10::string_view name, int64_t ps) {
  return submitAllgather(t, std::string(name), ps);
}

at::Tensor broadcast(const at::Tensor& t, int64_t root, c10::string_view name, int64_t ps) {
  return broadcastBlocking(t, false, root, std::string(name), ps);
}

void broadcastInPlace(at::Tensor& t, int64_t root, c10::string_view name, int64_t ps) {
  broadcastBlocking(t, true, root, std::string(name), ps);
}

int64_t broadcastAsync(const at::Tensor& t, int64_t root, c10::string_view name, int64_t ps) {
  return submitBroadcast(t, false, root, std::string(name), ps);
}

int64_t broadcastAsyncInPlace(at::Tensor& t, int64_t root, c10::string_view name, int64_t ps) {
  const int64_t handle = submitBroadcast(t, true, root, std::string(name), ps);
  bumpVersion(t);
  return handle;
}

std::tuple<at::Tensor, at::Tensor> alltoall(const at::Tensor& t,
                                            const c10::optional<at::Tensor>& splits,
                                            c10::string_view name, int64_t ps) {
  return alltoallBlocking(t, splits, std::string(name), ps);
}

int64_t alltoallAsync(const at::Tensor& t, const c10::optional<at::Tensor>& splits,
                      c10::string_view name, int64_t ps) {
  return submitAlltoall(t, splits, std::string(name), ps);
}

std::tuple<at::Tensor, at::Tensor> synchronizeAlltoall(int64_t handle) {
  return waitAlltoall(handle);
}

at::Tensor reducescatter(const at::Tensor& t, c10::string_view name, int64_t op, double pre,
                         double post, int64_t ps) {
  return reducescatterBlocking(t, std::string(name), op, pre, post, ps);
}

int64_t reducescatterAsync(const at::Tensor& t, c10::string_view name, int64_t op, double pre,
                           double post, int64_t ps) {
  return submitReducescatter(t, std::string(name), op, pre, post, ps);
}

// A blocking grouped op: its members as one group handle, every member
// waited for, then the first error raised (handles.cc).
std::vector<at::Tensor> waitAll(const std::vector<int64_t>& handles) {
  return waitAny(groupHandles(handles)).members;
}

std::vector<at::Tensor> groupedAllreduce(at::TensorList ts, c10::string_view name, int64_t op,
                                         double pre, double post, int64_t ps) {
  return groupedAllreduceBlocking(ts, false, std::string(name), op, pre, post, ps);
}

void groupedAllreduceInPlace(at::TensorList ts, c10::string_view name, int64_t op, double pre,
                             double post, int64_t ps) {
  groupedAllreduceBlocking(ts, true, std::string(name), op, pre, post, ps);
}

std::vector<int64_t> groupedAllreduceAsync(at::TensorList ts, c10::string_view name, int64_t op,
                                           double pre, double post, int64_t ps) {
  return submitGroup(GroupedKind::kAllreduce, ts, std::string(name), op, pre, post, ps);
}

std::vector<int64_t> groupedAllreduceAsyncInPlace(at::TensorList ts, c10::string_view name,
                                                  int64_t op, double pre, double post,
                                                  int64_t ps) {
  auto handles = submitGroup(GroupedKind::kAllreduceInPlace, ts, std::string(name), op, pre,
                             post, ps);
  for (const auto& t : ts) bumpVersion(t);
  return handles;
}

std::vector<at::Tensor> groupedAllgather(at::TensorList ts, c10::string_view name, int64_t ps) {
  return waitAll(submitGroup(GroupedKind::kAllgather, ts, std::string(name), 0, 1.0, 1.0, ps));
}

std::vector<int64_t> groupedAllgatherAsync(at::TensorList ts, c10::string_view name, int64_t ps) {
  return submitGroup(GroupedKind::kAllgather, ts, std::string(name), 0, 1.0, 1.0, ps);
}

std::vector<at::Tensor> groupedReducescatter(at::TensorList ts, c10::string_view name,
                                             int64_t op, double pre, double post, int64_t ps) {
  return waitAll(submitGroup(GroupedKind::kReducescatter, ts, std::string(name), op, pre,
                             post, ps));
}

std::vector<int64_t> groupedReducescatterAsync(at::TensorList ts, c10::string_view name,
                                               int64_t op, double pre, double post, int64_t ps) {
  return submitGroup(GroupedKind::kReducescatter, ts, std::string(name), op, pre, post, ps);
}

at::Tensor barrier(int64_t ps) {
  return waitHandle(submitBarrier(ps, "", SubmitMode::kCallerWaits));
}

at::Tensor join(int64_t device) {
  TORCH_CHECK(device == -1 || device >= 0, "hvd_torch.join: device ", device, " is not valid");
  return at::scalar_tensor(joinAndWait(), at::kLong);
}

bool poll(int64_t handle) { return pollHandle(handle); }

at::Tensor synchronize(int64_t handle) { return waitHandle(handle); }

void registerTensorKernels(torch::Library& m) {
  m.impl("allreduce", allreduce);
  m.impl("allreduce_", allreduceInPlace);
  m.impl("allreduce_async", allreduceAsync);
  m.impl("allreduce_async_", allreduceAsyncInPlace);
  m.impl("allgather", allgather);
  m.impl("allgather_async", allgatherAsync);
  m.impl("broadcast", broadcast);
  m.impl("broadcast_", broadcastInPlace);
  m.impl("broadcast_async", broadcastAsync);
  m.impl("broadcast_async_", broadcastAsyncInPlace);
  m.impl("alltoall", alltoall);
  m.impl("reducescatter", reducescatter);
  m.impl("reducescatter_async", reducescatterAsync);
  m.impl("grouped_allreduce", groupedAllreduce);
  m.impl("grouped_allreduce_", groupedAllreduceInPlace);
  m.impl("grouped_allreduce_async", groupedAllreduceAsync);
  m.impl("grouped_allreduce_async_", groupedAllreduceAsyncInPlace);
  m.impl("grouped_allgather", groupedAllgather);
  m.impl("grouped_allgather_async", groupedAllgatherAsync);
  m.impl("grouped_reducescatter", groupedReducescatter);
  m.impl("grouped_reducescatter_async", groupedReducescatterAsync);
  m.impl("alltoall_async", alltoallAsync);
}

}  // namespace

// The blocking forms submit as kCallerWaits: this thread drives the engine
// while it waits, so the submission does not wake the background thread.
at::Tensor allreduceBlocking(const at::Tensor& tensor, bool in_place, const std::string& name,
                             int64_t op, double prescale, double postscale, int64_t process_set) {
  at::Tensor out = waitHandle(submitAllreduce(tensor, in_place, name, op, prescale, postscale,
                                              process_set, nullptr, SubmitMode::kCallerWaits));
  if (in_place) bumpVersion(tensor);
  return out;
}

at::Tensor broadcastBlocking(const at::Tensor& tensor, bool in_place, int64_t root_rank,
                             const std::string& name, int64_t process_set) {
  at::Tensor out = waitHandle(submitBroadcast(tensor, in_place, root_rank, name, process_set,
                                              SubmitMode::kCallerWaits));
  if (in_place) bumpVersion(tensor);
  return out;
}

at::Tensor allgatherBlocking(const at::Tensor& tensor, const std::string& name,
                             int64_t process_set) {
  return waitHandle(submitAllgather(tensor, name, process_set, nullptr, at::Tensor(),
                                    SubmitMode::kCallerWaits));
}

std::tuple<at::Tensor, at::Tensor> alltoallBlocking(const at::Tensor& tensor,
                                                    const c10::optional<at::Tensor>& splits,
                                                    const std::string& name,
                                                    int64_t process_set, bool with_received) {
  const int64_t handle = submitAlltoall(tensor, splits, name, process_set, at::Tensor(),
                                        SubmitMode::kCallerWaits);
  if (!with_received) return {waitHandle(handle), at::Tensor()};
  return waitAlltoall(handle);
}

at::Tensor reducescatterBlocking(const at::Tensor& tensor, const std::string& name, int64_t op,
                                 double prescale, double postscale, int64_t process_set) {
  return waitHandle(submitReducescatter(tensor, name, op, prescale, postscale, process_set,
                                        nullptr, at::Tensor(), SubmitMode::kCallerWaits));
}

std::vector<at::Tensor> groupedAllreduceBlocking(at::TensorList tensors, bool in_place,
                                                 const std::string& name, int64_t op,
                                                 double prescale, double postscale,
                                                 int64_t process_set) {
  auto out = runBundle(tensors, in_place, name, op, prescale, postscale, process_set);
  if (!out) {
    out = waitAll(submitGroup(in_place ? GroupedKind::kAllreduceInPlace : GroupedKind::kAllreduce,
                              tensors, name, op, prescale, postscale, process_set));
  }
  if (in_place)
    for (const auto& t : tensors) bumpVersion(t);
  return std::move(*out);
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
