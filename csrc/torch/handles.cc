// The adapter's one handle table (handle_table.h) over Pending: adding,
// polling, grouping and waiting for every kind of handle. Callers' threads
// only; the engine's background thread completes the works, never the table.
#include <ATen/ATen.h>

#include <exception>

#include "../core/engine_registry.h"
#include "adapter.h"
#include "device_io.h"

namespace hvd {
namespace torch_layer {
namespace {

HandleTable<Pending> table;

using Record = HandleTable<Pending>::Record;

Record take(int64_t handle) {
  Record r;
  TORCH_CHECK_VALUE(table.take(handle, &r), "hvd_torch.synchronize: unknown handle ", handle,
                    " (already synchronized, or from before a shutdown)");
  return r;
}

std::chrono::microseconds callerSpin(const Engine* engine) {
  return engine ? engine->config().caller_spin : std::chrono::microseconds(0);
}

// The op's output once its work is done; raises the op's error.
at::Tensor finish(Engine* engine, Pending& p) {
  waitWork(engine, *p.work, callerSpin(engine));
  at::Tensor out = p.gathered ? *p.gathered : p.result;
  if (p.plane != Plane::kHost) {
    out = finishOutput(out, p.plane, p.device, p.work->deviceDone(), p.copy_back_to);
  } else if (p.copy_back_to.defined()) {
    p.copy_back_to.copy_(out);
    out = p.copy_back_to;
  }
  return out;
}

// Every member is waited for even if one fails, so none is left behind with
// its tensors lent to the engine; then the first error is raised.
std::vector<at::Tensor> finishAll(Engine* engine, std::vector<Pending>& members) {
  std::vector<at::Tensor> out;
  out.reserve(members.size());
  std::exception_ptr first_error;
  for (Pending& p : members) {
    try {
      out.push_back(finish(engine, p));
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
  return out;
}

// The rows received from each rank, as Horovod returns them (int32).
at::Tensor receivedRows(const Work& work) {
  const auto& rows = work.rankRows();
  at::Tensor received = at::empty({static_cast<int64_t>(rows.size())}, at::kInt);
  int32_t* data = received.data_ptr<int32_t>();
  for (size_t i = 0; i < rows.size(); ++i) data[i] = static_cast<int32_t>(rows[i]);
  return received;
}

}  // namespace

int64_t addHandle(Pending&& pending, HandleKind kind, SubmitMode mode) {
  return mode == SubmitMode::kCallerWaits ? table.addBlocking(std::move(pending), kind)
                                          : table.add(std::move(pending), kind);
}

bool pollHandle(int64_t handle) {
  bool done = false;
  TORCH_CHECK_VALUE(table.poll(handle, &done), "hvd_torch.poll: unknown handle ", handle,
                    " (already synchronized, or from before a shutdown)");
  if (!done) {
    // A deferred op (core/lane.h) progresses only once sent on.
    if (auto engine = currentEngine()) engine->flushDeferred();
  }
  return done;
}

HandleKind handleKind(int64_t handle) {
  HandleKind kind = HandleKind::kSingle;
  TORCH_CHECK_VALUE(table.kind(handle, &kind), "hvd_torch.synchronize: unknown handle ", handle,
                    " (already synchronized, or from before a shutdown)");
  return kind;
}

int64_t groupHandles(const std::vector<int64_t>& members) {
  int64_t group = 0;
  TORCH_CHECK_VALUE(table.group(members, &group), "hvd_torch: cannot group handles ", members,
                    ": each must be a single op's handle, given once, not yet synchronized");
  return group;
}

Synchronized waitAny(int64_t handle) {
  Record r = take(handle);
  auto engine = currentEngine();
  Synchronized s;
  s.kind = r.kind;
  if (r.kind == HandleKind::kGroup) {
    s.members = finishAll(engine.get(), r.members);
    return s;
  }
  s.tensor = finish(engine.get(), r.op);
  if (r.kind == HandleKind::kAlltoall) s.received = receivedRows(*r.op.work);
  return s;
}

at::Tensor waitHandle(int64_t handle, Pending* finished) {
  Record r = take(handle);
  auto engine = currentEngine();
  if (r.kind == HandleKind::kGroup) {
    finishAll(engine.get(), r.members);
    TORCH_CHECK_VALUE(false, "hvd_torch.synchronize: handle ", handle,
                      " is a group's (its members are done now); hvd.synchronize() returns "
                      "the list of their results");
  }
  at::Tensor out = finish(engine.get(), r.op);
  if (finished != nullptr) *finished = std::move(r.op);
  return out;
}

at::Tensor waitHandle(int64_t handle) { return waitHandle(handle, nullptr); }

std::tuple<at::Tensor, at::Tensor> waitAlltoall(int64_t handle) {
  Synchronized s = waitAny(handle);
  TORCH_CHECK_VALUE(s.kind == HandleKind::kAlltoall, "hvd_torch.synchronize_alltoall: handle ",
                    handle, " is not an alltoall handle");
  return {s.tensor, s.received};
}

void clearHandles() { table.clear(); }

}  // namespace torch_layer
}  // namespace hvd
