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

namespace hvd {
namespace torch_layer {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

at::Tensor callAllreduce(const at::Tensor& t, c10::string_view name, int64_t op, double pre,
                         double post, int64_t ps) {
  static auto handle = c10::Dispatcher::singleton()
                           .findSchemaOrThrow("hvd_torch::allreduce", "")
                           .typed<at::Tensor(const at::Tensor&, c10::string_view, int64_t, double,
                                             double, int64_t)>();
  return handle.call(t, name, op, pre, post, ps);
}

at::Tensor callAllgather(const at::Tensor& t, c10::string_view name, int64_t ps) {
  static auto handle = c10::Dispatcher::singleton()
                           .findSchemaOrThrow("hvd_torch::allgather", "")
                           .typed<at::Tensor(const at::Tensor&, c10::string_view, int64_t)>();
  return handle.call(t, name, ps);
}

at::Tensor callBroadcast(const at::Tensor& t, int64_t root, c10::string_view name, int64_t ps) {
  static auto handle =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("hvd_torch::broadcast", "")
          .typed<at::Tensor(const at::Tensor&, int64_t, c10::string_view, int64_t)>();
  return handle.call(t, root, name, ps);
}

std::tuple<at::Tensor, at::Tensor> callAlltoall(const at::Tensor& t,
                                                const c10::optional<at::Tensor>& splits,
                                                c10::string_view name, int64_t ps) {
  static auto handle = c10::Dispatcher::singleton()
                           .findSchemaOrThrow("hvd_torch::alltoall", "")
                           .typed<std::tuple<at::Tensor, at::Tensor>(
                               const at::Tensor&, const c10::optional<at::Tensor>&,
                               c10::string_view, int64_t)>();
  return handle.call(t, splits, name, ps);
}

constexpr int64_t kAverage = 0;
constexpr int64_t kSum = 1;

// Horovod's reducescatter gradient scale: pre * post, times size for Sum.
double reducescatterGradScale(int64_t op, double pre, double post, int64_t ps) {
  return pre * post * (op == kSum ? static_cast<double>(processSetSize(ps)) : 1.0);
}

class AllreduceFunction : public torch::autograd::Function<AllreduceFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& t, c10::string_view name,
                            int64_t op, double pre, double post, int64_t ps) {
    ctx->saved_data["op"] = op;
    ctx->saved_data["pre"] = pre;
    ctx->saved_data["post"] = post;
    ctx->saved_data["ps"] = ps;
    at::AutoDispatchBelowADInplaceOrView guard;
    return callAllreduce(t, name, op, pre, post, ps);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    at::Tensor g = callAllreduce(grads[0], "", ctx->saved_data["op"].toInt(),
                                 ctx->saved_data["pre"].toDouble(),
                                 ctx->saved_data["post"].toDouble(), ctx->saved_data["ps"].toInt());
    return {g, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class AllgatherFunction : public torch::autograd::Function<AllgatherFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& t, c10::string_view name,
                            int64_t ps) {
    ctx->saved_data["rows"] = t.dim() == 0 ? int64_t{1} : t.size(0);
    ctx->saved_data["scalar"] = t.dim() == 0;
    ctx->saved_data["ps"] = ps;
    at::AutoDispatchBelowADInplaceOrView guard;
    return callAllgather(t, name, ps);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const int64_t rows = ctx->saved_data["rows"].toInt();
    const int64_t ps = ctx->saved_data["ps"].toInt();
    at::Tensor summed = callAllreduce(grads[0], "", kAverage, 1.0, 1.0, ps);
    // Ranks may contribute different row counts: gather them to find ours.
    at::Tensor counts = callAllgather(at::full({1}, rows, at::kLong), "", ps);
    const int64_t rank = processSetRank(ps);
    const int64_t offset = counts.narrow(0, 0, rank).sum().item<int64_t>();
    at::Tensor g = summed.narrow(0, offset, rows);
    if (ctx->saved_data["scalar"].toBool()) g = g.reshape({});
    return {g, at::Tensor(), at::Tensor()};
  }
};

class BroadcastFunction : public torch::autograd::Function<BroadcastFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& t, int64_t root,
                            c10::string_view name, int64_t ps) {
    ctx->saved_data["root"] = root;
    ctx->saved_data["ps"] = ps;
    at::AutoDispatchBelowADInplaceOrView guard;
    return callBroadcast(t, root, name, ps);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    at::Tensor g = callAllreduce(grads[0], "", kAverage, 1.0, 1.0, ctx->saved_data["ps"].toInt());
    // root is a global rank, also in a process set (Horovod's convention).
    if (currentEngine()->topology().rank != ctx->saved_data["root"].toInt()) g = g.zero_();
    return {g, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class ReducescatterFunction : public torch::autograd::Function<ReducescatterFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& t, c10::string_view name,
                            int64_t op, double pre, double post, int64_t ps) {
    ctx->saved_data["scale"] = reducescatterGradScale(op, pre, post, ps);
    ctx->saved_data["ps"] = ps;
    static auto handle = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("hvd_torch::reducescatter", "")
                             .typed<at::Tensor(const at::Tensor&, c10::string_view, int64_t,
                                               double, double, int64_t)>();
    at::AutoDispatchBelowADInplaceOrView guard;
    return handle.call(t, name, op, pre, post, ps);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    at::Tensor g = callAllgather(grads[0].contiguous(), "", ctx->saved_data["ps"].toInt());
    g = g.mul(ctx->saved_data["scale"].toDouble());
    return {g, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor reducescatterAutograd(const at::Tensor& t, c10::string_view name, int64_t op,
                                 double pre, double post, int64_t ps) {
  return ReducescatterFunction::apply(t, name, op, pre, post, ps);
}

using GroupedReduceSig = std::vector<at::Tensor>(at::TensorList, c10::string_view, int64_t, double,
                                                 double, int64_t);

std::vector<at::Tensor> callGrouped(const char* op, at::TensorList ts, c10::string_view name,
                                    int64_t reduce_op, double pre, double post, int64_t ps) {
  auto handle = c10::Dispatcher::singleton()
                    .findSchemaOrThrow(op, "")
                    .typed<GroupedReduceSig>();
  return handle.call(ts, name, reduce_op, pre, post, ps);
}

std::vector<at::Tensor> callGroupedAllgather(at::TensorList ts, int64_t ps) {
  static auto handle =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("hvd_torch::grouped_allgather", "")
          .typed<std::vector<at::Tensor>(at::TensorList, c10::string_view, int64_t)>();
  return handle.call(ts, "", ps);
}

tensor_list withEmptyArgs(std::vector<at::Tensor> grads, int extra) {
  for (int i = 0; i < extra; ++i) grads.emplace_back();
  return grads;
}

// Grouped ops: the members' gradients follow the single-tensor rules above,
// and travel as one group too.
class GroupedAllreduceFunction : public torch::autograd::Function<GroupedAllreduceFunction> {
 public:
  static tensor_list forward(AutogradContext* ctx, at::TensorList ts, c10::string_view name,
                             int64_t op, double pre, double post, int64_t ps) {
    ctx->saved_data["op"] = op;
    ctx->saved_data["pre"] = pre;
    ctx->saved_data["post"] = post;
    ctx->saved_data["ps"] = ps;
    at::AutoDispatchBelowADInplaceOrView guard;
    return callGrouped("hvd_torch::grouped_allreduce", ts, name, op, pre, post, ps);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    return withEmptyArgs(
        callGrouped("hvd_torch::grouped_allreduce", grads, "", ctx->saved_data["op"].toInt(),
                    ctx->saved_data["pre"].toDouble(), ctx->saved_data["post"].toDouble(),
                    ctx->saved_data["ps"].toInt()),
        5);
  }
};

class GroupedReducescatterFunction
    : public torch::autograd::Function<GroupedReducescatterFunction> {
 public:
  static tensor_list forward(AutogradContext* ctx, at::TensorList ts, c10::string_view name,
                             int64_t op, double pre, double post, int64_t ps) {
    ctx->saved_data["scale"] = reducescatterGradScale(op, pre, post, ps);
    ctx->saved_data["ps"] = ps;
    at::AutoDispatchBelowADInplaceOrView guard;
    return callGrouped("hvd_torch::grouped_reducescatter", ts, name, op, pre, post, ps);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    for (auto& g : grads) g = g.contiguous();
    auto gathered = callGroupedAllgather(grads, ctx->saved_data["ps"].toInt());
    for (auto& g : gathered) g = g.mul(ctx->saved_data["scale"].toDouble());
    return withEmptyArgs(std::move(gathered), 5);
  }
};

class GroupedAllgatherFunction : public torch::autograd::Function<GroupedAllgatherFunction> {
 public:
  static tensor_list forward(AutogradContext* ctx, at::TensorList ts, c10::string_view name,
                             int64_t ps) {
    std::vector<int64_t> rows;
    for (const auto& t : ts) rows.push_back(t.dim() == 0 ? 1 : t.size(0));
    ctx->saved_data["rows"] = rows;
    ctx->saved_data["ps"] = ps;
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto handle =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("hvd_torch::grouped_allgather", "")
            .typed<std::vector<at::Tensor>(at::TensorList, c10::string_view, int64_t)>();
    return handle.call(ts, name, ps);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto rows = ctx->saved_data["rows"].toIntVector();
    const int64_t ps = ctx->saved_data["ps"].toInt();
    auto summed = callGrouped("hvd_torch::grouped_allreduce", grads, "", kAverage, 1.0, 1.0, ps);
    // Every rank's row count per member, to find where this rank's rows start.
    at::Tensor mine = at::tensor(rows, at::kLong).view({1, static_cast<int64_t>(rows.size())});
    at::Tensor all = callAllgather(mine, "", ps);
    const int64_t rank = processSetRank(ps);
    std::vector<at::Tensor> out;
    for (size_t i = 0; i < rows.size(); ++i) {
      const int64_t offset = all.narrow(0, 0, rank).select(1, static_cast<int64_t>(i)).sum().item<int64_t>();
      out.push_back(summed[i].narrow(0, offset, rows[i]));
    }
    return withEmptyArgs(std::move(out), 2);
  }
};

std::vector<at::Tensor> groupedAllreduceAutograd(at::TensorList ts, c10::string_view name,
                                                 int64_t op, double pre, double post, int64_t ps) {
  return GroupedAllreduceFunction::apply(ts, name, op, pre, post, ps);
}

std::vector<at::Tensor> groupedReducescatterAutograd(at::TensorList ts, c10::string_view name,
                                                     int64_t op, double pre, double post,
                                                     int64_t ps) {
  return GroupedReducescatterFunction::apply(ts, name, op, pre, post, ps);
}

std::vector<at::Tensor> groupedAllgatherAutograd(at::TensorList ts, c10::string_view name,
                                                 int64_t ps) {
  return GroupedAllgatherFunction::apply(ts, name, ps);
}

// alltoall: the gradient goes back the way the data came, i.e. an alltoall
// of the gradient with the received splits (Horovod's rule).
class AlltoallFunction : public torch::autograd::Function<AlltoallFunction> {
 public:
  static tensor_list forward(AutogradContext* ctx, const at::Tensor& t,
                             const c10::optional<at::Tensor>& splits, c10::string_view name,
                             int64_t ps) {
    ctx->saved_data["ps"] = ps;
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [out, received] = callAlltoall(t, splits, name, ps);
    ctx->saved_data["received"] = received;
    ctx->mark_non_differentiable({received});
    return {out, received};
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    at::Tensor received = ctx->saved_data["received"].toTensor();
    at::Tensor g = std::get<0>(callAlltoall(grads[0], received, "", ctx->saved_data["ps"].toInt()));
    return {g, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> alltoallAutograd(const at::Tensor& t,
                                                    const c10::optional<at::Tensor>& splits,
                                                    c10::string_view name, int64_t ps) {
  auto out = AlltoallFunction::apply(t, splits, name, ps);
  return {out[0], out[1]};
}

at::Tensor allreduceAutograd(const at::Tensor& t, c10::string_view name, int64_t op, double pre,
                             double post, int64_t ps) {
  return AllreduceFunction::apply(t, name, op, pre, post, ps);
}

at::Tensor allgatherAutograd(const at::Tensor& t, c10::string_view name, int64_t ps) {
  return AllgatherFunction::apply(t, name, ps);
}

at::Tensor broadcastAutograd(const at::Tensor& t, int64_t root, c10::string_view name, int64_t ps) {
  return BroadcastFunction::apply(t, root, name, ps);
}

}  // namespace

TORCH_LIBRARY_IMPL(hvd_torch, Autograd, m) {
  m.impl("allreduce", allreduceAutograd);
  m.impl("allgather", allgatherAutograd);
  m.impl("broadcast", broadcastAutograd);
  m.impl("alltoall", alltoallAutograd);
  m.impl("reducescatter", reducescatterAutograd);
  m.impl("grouped_allreduce", groupedAllreduceAutograd);
  m.impl("grouped_allgather", groupedAllgatherAutograd);
  m.impl("grouped_reducescatter", groupedReducescatterAutograd);
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
