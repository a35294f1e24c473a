// The kernel of every op that takes options, as a runner (op_call.h): one
// function per op and form, `R run(inputs..., const Options&)`. The same
// runners serve the dispatcher's CPU and CUDA kernels (kernels.cpp) and the
// eager entries that skip the dispatcher (csrc/python/eager_fast_path.cpp);
// forEachKernel is the one table of them, by schema name.
//
// Blocking forms drive the engine on the caller's thread while they wait,
// without the GIL; in-place forms bump the tensor's version (adapter.h).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "../core/op_options.h"

namespace hvd {
namespace torch_layer {
namespace kernel {

at::Tensor allreduce(const at::Tensor& t, const AllreduceOptions& o);
void allreduceInPlace(const at::Tensor& t, const AllreduceOptions& o);
int64_t allreduceAsync(const at::Tensor& t, const AllreduceOptions& o);
int64_t allreduceAsyncInPlace(const at::Tensor& t, const AllreduceOptions& o);
at::Tensor allgather(const at::Tensor& t, const AllgatherOptions& o);
int64_t allgatherAsync(const at::Tensor& t, const AllgatherOptions& o);
at::Tensor broadcast(const at::Tensor& t, const BroadcastOptions& o);
void broadcastInPlace(const at::Tensor& t, const BroadcastOptions& o);
int64_t broadcastAsync(const at::Tensor& t, const BroadcastOptions& o);
int64_t broadcastAsyncInPlace(const at::Tensor& t, const BroadcastOptions& o);
std::tuple<at::Tensor, at::Tensor> alltoall(const at::Tensor& t,
                                            const c10::optional<at::Tensor>& splits,
                                            const AlltoallOptions& o);
int64_t alltoallAsync(const at::Tensor& t, const c10::optional<at::Tensor>& splits,
                      const AlltoallOptions& o);
at::Tensor reducescatter(const at::Tensor& t, const ReducescatterOptions& o);
int64_t reducescatterAsync(const at::Tensor& t, const ReducescatterOptions& o);
std::vector<at::Tensor> groupedAllreduce(at::TensorList ts, const AllreduceOptions& o);
void groupedAllreduceInPlace(at::TensorList ts, const AllreduceOptions& o);
std::vector<int64_t> groupedAllreduceAsync(at::TensorList ts, const AllreduceOptions& o);
std::vector<int64_t> groupedAllreduceAsyncInPlace(at::TensorList ts, const AllreduceOptions& o);
std::vector<at::Tensor> groupedAllgather(at::TensorList ts, const AllgatherOptions& o);
std::vector<int64_t> groupedAllgatherAsync(at::TensorList ts, const AllgatherOptions& o);
std::vector<at::Tensor> groupedReducescatter(at::TensorList ts, const ReducescatterOptions& o);
std::vector<int64_t> groupedReducescatterAsync(at::TensorList ts, const ReducescatterOptions& o);

// alltoall without splits for a caller that returns the output alone (the
// eager entry): the rows received from each rank are not made.
at::Tensor alltoallOutput(const at::Tensor& t, const AlltoallOptions& o);

}  // namespace kernel

// A runner as a type, so that a table row can instantiate templates on it.
template <auto F>
struct Kernel {
  static constexpr auto run = F;
};

// Every op with options: v(schema name, Kernel<&runner>{}), in ops.cpp's order.
template <class V>
void forEachKernel(V&& v) {
  v("allreduce", Kernel<&kernel::allreduce>{});
  v("allreduce_", Kernel<&kernel::allreduceInPlace>{});
  v("allreduce_async", Kernel<&kernel::allreduceAsync>{});
  v("allreduce_async_", Kernel<&kernel::allreduceAsyncInPlace>{});
  v("allgather", Kernel<&kernel::allgather>{});
  v("allgather_async", Kernel<&kernel::allgatherAsync>{});
  v("broadcast", Kernel<&kernel::broadcast>{});
  v("broadcast_", Kernel<&kernel::broadcastInPlace>{});
  v("broadcast_async", Kernel<&kernel::broadcastAsync>{});
  v("broadcast_async_", Kernel<&kernel::broadcastAsyncInPlace>{});
  v("reducescatter", Kernel<&kernel::reducescatter>{});
  v("reducescatter_async", Kernel<&kernel::reducescatterAsync>{});
  v("grouped_allreduce", Kernel<&kernel::groupedAllreduce>{});
  v("grouped_allreduce_", Kernel<&kernel::groupedAllreduceInPlace>{});
  v("grouped_allreduce_async", Kernel<&kernel::groupedAllreduceAsync>{});
  v("grouped_allreduce_async_", Kernel<&kernel::groupedAllreduceAsyncInPlace>{});
  v("grouped_allgather", Kernel<&kernel::groupedAllgather>{});
  v("grouped_allgather_async", Kernel<&kernel::groupedAllgatherAsync>{});
  v("grouped_reducescatter", Kernel<&kernel::groupedReducescatter>{});
  v("grouped_reducescatter_async", Kernel<&kernel::groupedReducescatterAsync>{});
  v("alltoall", Kernel<&kernel::alltoall>{});
  v("alltoall_async", Kernel<&kernel::alltoallAsync>{});
}

// Holds every op of the table to its schema (op_call.h, schemaMismatch):
// throws naming the first op whose schema and options disagree. hvd_torch's
// import calls it, once every TORCH_LIBRARY block of the extension has run.
void checkOpSchemas();
// Why the schema `schema` (its text) would not fit the kernel of the table
// named `op`; "" when it fits. For the tests of the import check.
std::string optionsMismatch(const std::string& op, const std::string& schema);

}  // namespace torch_layer
}  // namespace hvd
