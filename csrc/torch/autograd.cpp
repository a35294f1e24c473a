// Autograd for the differentiable ops, with Horovod's gradient conventions
// (docs/architecture.md, "Gradients"):
//   allreduce: the gradient is the allreduce of the gradient with the same
//              op and scale factors;
//   allgather: the gradient is the Average-allreduce of the gradient over
//              the process set, narrowed to this rank's rows;
//   broadcast: the gradient is the Average-allreduce of the gradient on the
//              root rank and zero elsewhere;
//   alltoall:  the gradient is the alltoall of the gradient with the splits
//              that were received (it goes back the way the data came);
//   reducescatter: the gradient is the allgather of the gradient times the
//              scale factors, and times the set's size for Sum (Average: no
//              size factor). This is Horovod's rule, kept so results match
//              it; the calculus of the forward alone would give 1 for Sum
//              and 1/size for Average.
// Grouped forms follow the same rules member by member.
// Registered at the Autograd key, so they apply in eager code and in
// TorchScript alike. In-place and async forms are not differentiable (as in
// Horovod): autograd falls through to the kernel.
#include <torch/autograd.h>
#include <torch/library.h>

#include "../core/engine_registry.h"
#include "adapter.h"
#include "op_call.h"

namespace hvd {
namespace torch_layer {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// The ops that forward and backward call through the dispatcher (forward
// below the Autograd key, under its guard; backward from the top, so that a
// gradient of a gradient is tracked too).
struct Ops {
  static c10::OperatorHandle find(const char* name) {
    return c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
  }
  c10::OperatorHandle allreduce = find("hvd_torch::allreduce");
  c10::OperatorHandle allgather = find("hvd_torch::allgather");
  c10::OperatorHandle broadcast = find("hvd_torch::broadcast");
  c10::OperatorHandle alltoall = find("hvd_torch::alltoall");
  c10::OperatorHandle reducescatter = find("hvd_torch::reducescatter");
  c10::OperatorHandle grouped_allreduce = find("hvd_torch::grouped_allreduce");
  c10::OperatorHandle grouped_allgather = find("hvd_torch::grouped_allgather");
  c10::OperatorHandle grouped_reducescatter = find("hvd_torch::grouped_reducescatter");
};

const Ops& ops() {
  static const Ops handles;
  return handles;
}

template <class Options>
at::Tensor callOne(const c10::OperatorHandle& op, const at::Tensor& t, const Options& o) {
  return std::move(callOp(op, o, t).back()).toTensor();
}

template <class Options>
std::vector<at::Tensor> callGrouped(const c10::OperatorHandle& op, at::TensorList ts,
                                    const Options& o) {
  return std::move(callOp(op, o, ts).back()).toTensorVector();
}

std::tuple<at::Tensor, at::Tensor> callAlltoall(const at::Tensor& t,
                                                const c10::optional<at::Tensor>& splits,
                                                const AlltoallOptions& o) {
  torch::jit::Stack out = callOp(ops().alltoall, o, t, splits);
  return {std::move(out[0]).toTensor(), std::move(out[1]).toTensor()};
}

// The forward's options, saved as one value for backward, when a backward
// can run (forward runs with grad mode off, so an input that requires grad is
// the sign); a gradient's op is unnamed.
template <class Options>
void save(AutogradContext* ctx, const Options& o, bool backward_may_run) {
  if (!backward_may_run) return;
  Options unnamed = o;
  unnamed.name.clear();
  ctx->saved_data["options"] = packOptions(unnamed);
}

template <class Options>
Options saved(AutogradContext* ctx) {
  return unpackOptions<Options>(ctx->saved_data["options"]);
}

bool anyRequiresGrad(at::TensorList ts) {
  for (const auto& t : ts)
    if (t.requires_grad()) return true;
  return false;
}

// A gradient op's options: unnamed, over `process_set`, Average and unscaled.
template <class Options>
Options over(int32_t process_set) {
  Options o;
  o.process_set = process_set;
  return o;
}

// Horovod's reducescatter gradient scale: pre * post, times size for Sum.
double reducescatterGradScale(const ReducescatterOptions& o) {
  const Reduction& r = o.reduction;
  return r.prescale * r.postscale *
         (r.op == ReduceOp::kSum ? static_cast<double>(processSetSize(o.process_set)) : 1.0);
}

tensor_list withEmptyArgs(std::vector<at::Tensor> grads, int extra) {
  for (int i = 0; i < extra; ++i) grads.emplace_back();
  return grads;
}

class AllreduceFunction : public torch::autograd::Function<AllreduceFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& t,
                            const AllreduceOptions& o) {
    save(ctx, o, t.requires_grad());
    at::AutoDispatchBelowADInplaceOrView guard;
    return callOne(ops().allreduce, t, o);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    return {callOne(ops().allreduce, grads[0], saved<AllreduceOptions>(ctx)), at::Tensor()};
  }
};

class AllgatherFunction : public torch::autograd::Function<AllgatherFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& t,
                            const AllgatherOptions& o) {
    ctx->saved_data["rows"] = t.dim() == 0 ? int64_t{1} : t.size(0);
    ctx->saved_data["scalar"] = t.dim() == 0;
    save(ctx, o, t.requires_grad());
    at::AutoDispatchBelowADInplaceOrView guard;
    return callOne(ops().allgather, t, o);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const int64_t rows = ctx->saved_data["rows"].toInt();
    const int32_t ps = saved<AllgatherOptions>(ctx).process_set;
    at::Tensor summed = callOne(ops().allreduce, grads[0], over<AllreduceOptions>(ps));
    // Ranks may contribute different row counts: gather them to find ours.
    at::Tensor counts =
        callOne(ops().allgather, at::full({1}, rows, at::kLong), over<AllgatherOptions>(ps));
    const int64_t rank = processSetRank(ps);
    const int64_t offset = counts.narrow(0, 0, rank).sum().item<int64_t>();
    at::Tensor g = summed.narrow(0, offset, rows);
    if (ctx->saved_data["scalar"].toBool()) g = g.reshape({});
    return {g, at::Tensor()};
  }
};

class BroadcastFunction : public torch::autograd::Function<BroadcastFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& t,
                            const BroadcastOptions& o) {
    save(ctx, o, t.requires_grad());
    at::AutoDispatchBelowADInplaceOrView guard;
    return callOne(ops().broadcast, t, o);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto o = saved<BroadcastOptions>(ctx);
    at::Tensor g = callOne(ops().allreduce, grads[0], over<AllreduceOptions>(o.process_set));
    // root is a global rank, also in a process set (Horovod's convention).
    if (currentEngine()->topology().rank != o.root_rank) g = g.zero_();
    return {g, at::Tensor()};
  }
};

class ReducescatterFunction : public torch::autograd::Function<ReducescatterFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& t,
                            const ReducescatterOptions& o) {
    ctx->saved_data["scale"] = reducescatterGradScale(o);
    save(ctx, o, t.requires_grad());
    at::AutoDispatchBelowADInplaceOrView guard;
    return callOne(ops().reducescatter, t, o);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const int32_t ps = saved<ReducescatterOptions>(ctx).process_set;
    at::Tensor g = callOne(ops().allgather, grads[0].contiguous(), over<AllgatherOptions>(ps));
    return {g.mul(ctx->saved_data["scale"].toDouble()), at::Tensor()};
  }
};

// Grouped ops: the members' gradients follow the single-tensor rules above,
// and travel as one group too. Backward returns one gradient per member, then
// none for the options.
class GroupedAllreduceFunction : public torch::autograd::Function<GroupedAllreduceFunction> {
 public:
  static tensor_list forward(AutogradContext* ctx, at::TensorList ts,
                             const AllreduceOptions& o) {
    save(ctx, o, anyRequiresGrad(ts));
    at::AutoDispatchBelowADInplaceOrView guard;
    return callGrouped(ops().grouped_allreduce, ts, o);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    return withEmptyArgs(
        callGrouped(ops().grouped_allreduce, grads, saved<AllreduceOptions>(ctx)), 1);
  }
};

class GroupedReducescatterFunction
    : public torch::autograd::Function<GroupedReducescatterFunction> {
 public:
  static tensor_list forward(AutogradContext* ctx, at::TensorList ts,
                             const ReducescatterOptions& o) {
    ctx->saved_data["scale"] = reducescatterGradScale(o);
    save(ctx, o, anyRequiresGrad(ts));
    at::AutoDispatchBelowADInplaceOrView guard;
    return callGrouped(ops().grouped_reducescatter, ts, o);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    for (auto& g : grads) g = g.contiguous();
    const int32_t ps = saved<ReducescatterOptions>(ctx).process_set;
    auto gathered = callGrouped(ops().grouped_allgather, grads, over<AllgatherOptions>(ps));
    for (auto& g : gathered) g = g.mul(ctx->saved_data["scale"].toDouble());
    return withEmptyArgs(std::move(gathered), 1);
  }
};

class GroupedAllgatherFunction : public torch::autograd::Function<GroupedAllgatherFunction> {
 public:
  static tensor_list forward(AutogradContext* ctx, at::TensorList ts,
                             const AllgatherOptions& o) {
    std::vector<int64_t> rows;
    for (const auto& t : ts) rows.push_back(t.dim() == 0 ? 1 : t.size(0));
    ctx->saved_data["rows"] = rows;
    save(ctx, o, anyRequiresGrad(ts));
    at::AutoDispatchBelowADInplaceOrView guard;
    return callGrouped(ops().grouped_allgather, ts, o);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto rows = ctx->saved_data["rows"].toIntVector();
    const int32_t ps = saved<AllgatherOptions>(ctx).process_set;
    auto summed = callGrouped(ops().grouped_allreduce, grads, over<AllreduceOptions>(ps));
    // Every rank's row count per member, to find where this rank's rows start.
    at::Tensor mine = at::tensor(rows, at::kLong).view({1, static_cast<int64_t>(rows.size())});
    at::Tensor all = callOne(ops().allgather, mine, over<AllgatherOptions>(ps));
    const int64_t rank = processSetRank(ps);
    std::vector<at::Tensor> out;
    for (size_t i = 0; i < rows.size(); ++i) {
      const int64_t offset = all.narrow(0, 0, rank).select(1, static_cast<int64_t>(i)).sum().item<int64_t>();
      out.push_back(summed[i].narrow(0, offset, rows[i]));
    }
    return withEmptyArgs(std::move(out), 1);
  }
};

// alltoall: the gradient goes back the way the data came, i.e. an alltoall
// of the gradient with the received splits (Horovod's rule).
class AlltoallFunction : public torch::autograd::Function<AlltoallFunction> {
 public:
  static tensor_list forward(AutogradContext* ctx, const at::Tensor& t,
                             const c10::optional<at::Tensor>& splits, const AlltoallOptions& o) {
    save(ctx, o, t.requires_grad());
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [out, received] = callAlltoall(t, splits, o);
    ctx->saved_data["received"] = received;
    ctx->mark_non_differentiable({received});
    return {out, received};
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    at::Tensor received = ctx->saved_data["received"].toTensor();
    at::Tensor g = std::get<0>(callAlltoall(grads[0], received, saved<AlltoallOptions>(ctx)));
    return {g, at::Tensor(), at::Tensor()};
  }
};

// The Autograd key's runners (op_call.h), boxed as the kernels are.
at::Tensor allreduceAutograd(const at::Tensor& t, const AllreduceOptions& o) {
  return AllreduceFunction::apply(t, o);
}

at::Tensor allgatherAutograd(const at::Tensor& t, const AllgatherOptions& o) {
  return AllgatherFunction::apply(t, o);
}

at::Tensor broadcastAutograd(const at::Tensor& t, const BroadcastOptions& o) {
  return BroadcastFunction::apply(t, o);
}

at::Tensor reducescatterAutograd(const at::Tensor& t, const ReducescatterOptions& o) {
  return ReducescatterFunction::apply(t, o);
}

std::tuple<at::Tensor, at::Tensor> alltoallAutograd(const at::Tensor& t,
                                                    const c10::optional<at::Tensor>& splits,
                                                    const AlltoallOptions& o) {
  auto out = AlltoallFunction::apply(t, splits, o);
  return {out[0], out[1]};
}

std::vector<at::Tensor> groupedAllreduceAutograd(at::TensorList ts, const AllreduceOptions& o) {
  return GroupedAllreduceFunction::apply(ts, o);
}

std::vector<at::Tensor> groupedAllgatherAutograd(at::TensorList ts, const AllgatherOptions& o) {
  return GroupedAllgatherFunction::apply(ts, o);
}

std::vector<at::Tensor> groupedReducescatterAutograd(at::TensorList ts,
                                                     const ReducescatterOptions& o) {
  return GroupedReducescatterFunction::apply(ts, o);
}

}  // namespace

TORCH_LIBRARY_IMPL(hvd_torch, Autograd, m) {
  m.impl("allreduce", boxed<&allreduceAutograd>());
  m.impl("allgather", boxed<&allgatherAutograd>());
  m.impl("broadcast", boxed<&broadcastAutograd>());
  m.impl("alltoall", boxed<&alltoallAutograd>());
  m.impl("reducescatter", boxed<&reducescatterAutograd>());
  m.impl("grouped_allreduce", boxed<&groupedAllreduceAutograd>());
  m.impl("grouped_allgather", boxed<&groupedAllgatherAutograd>());
  m.impl("grouped_reducescatter", boxed<&groupedReducescatterAutograd>());
  for (const char* op : {"allreduce_", "allreduce_async", "allreduce_async_", "allgather_async",
                         "broadcast_", "broadcast_async", "broadcast_async_", "alltoall_async",
                         "reducescatter_async", "grouped_allreduce_", "grouped_allreduce_async",
                         "grouped_allreduce_async_", "grouped_allgather_async",
                         "grouped_reducescatter_async"}) {
    m.impl(op, torch::CppFunction::makeFallthrough());
  }
}

}  // namespace torch_layer
}  // namespace hvd
