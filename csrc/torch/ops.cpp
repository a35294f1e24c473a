// Every hvd_torch operator schema, in one place: this is public API (see
// docs/architecture.md, "Operator schemas"). Defaults follow Horovod: Average,
// no scaling, the global process set (id 0), an auto-generated name.
//
// Functional ops are CONSERVATIVE for alias analysis: they talk to other
// ranks, so the TorchScript optimizer must never merge, reorder or drop two
// identical calls. In-place ops declare their mutation (FROM_SCHEMA), which
// pins them just as firmly, and return nothing: a custom op's output may not
// alias an input under torch.compile, so the Python wrapper returns the tensor.
#include <torch/library.h>

TORCH_LIBRARY(hvd_torch, m) {
  auto def = [&](const char* schema) {
    m.def(torch::schema(schema, c10::AliasAnalysisKind::CONSERVATIVE));
  };
  auto defMutating = [&](const char* schema) {
    m.def(torch::schema(schema, c10::AliasAnalysisKind::FROM_SCHEMA));
  };
  // op: Average=0, Sum=1, Min=3, Max=4, Product=5 (Horovod's numbering).
  // timeline_label: this rank's label for the op on rank 0's timeline (kept
  // local, never negotiated; csrc/core/op_options.h).
  def("allreduce(Tensor tensor, str name=\"\", int op=0, float prescale_factor=1.0, "
      "float postscale_factor=1.0, int process_set_id=0, str timeline_label=\"\") -> Tensor");
  defMutating("allreduce_(Tensor(a!) tensor, str name=\"\", int op=0, float prescale_factor=1.0, "
              "float postscale_factor=1.0, int process_set_id=0, str timeline_label=\"\") -> ()");
  def("allreduce_async(Tensor tensor, str name=\"\", int op=0, float prescale_factor=1.0, "
      "float postscale_factor=1.0, int process_set_id=0, str timeline_label=\"\") -> int");
  defMutating("allreduce_async_(Tensor(a!) tensor, str name=\"\", int op=0, float prescale_factor=1.0, "
      "float postscale_factor=1.0, int process_set_id=0, str timeline_label=\"\") -> int");
  def("allgather(Tensor tensor, str name=\"\", int process_set_id=0) -> Tensor");
  def("allgather_async(Tensor tensor, str name=\"\", int process_set_id=0) -> int");
  def("broadcast(Tensor tensor, int root_rank=0, str name=\"\", int process_set_id=0) -> Tensor");
  defMutating("broadcast_(Tensor(a!) tensor, int root_rank=0, str name=\"\", int process_set_id=0) -> ()");
  def("broadcast_async(Tensor tensor, int root_rank=0, str name=\"\", int process_set_id=0) -> int");
  defMutating("broadcast_async_(Tensor(a!) tensor, int root_rank=0, str name=\"\", "
      "int process_set_id=0) -> int");
  // Reduces over all ranks and returns this rank's rows of the result: rows /
  // size each, the first rows % size ranks one more (Horovod's split).
  def("reducescatter(Tensor tensor, str name=\"\", int op=0, float prescale_factor=1.0, "
      "float postscale_factor=1.0, int process_set_id=0) -> Tensor");
  def("reducescatter_async(Tensor tensor, str name=\"\", int op=0, float prescale_factor=1.0, "
      "float postscale_factor=1.0, int process_set_id=0) -> int");
  // Grouped forms: the members are negotiated and run as one unit (all or
  // none); member i is named "<name>.<i>".
  def("grouped_allreduce(Tensor[] tensors, str name=\"\", int op=0, float prescale_factor=1.0, "
      "float postscale_factor=1.0, int process_set_id=0, str timeline_label=\"\") -> Tensor[]");
  defMutating("grouped_allreduce_(Tensor(a!)[] tensors, str name=\"\", int op=0, "
              "float prescale_factor=1.0, float postscale_factor=1.0, int process_set_id=0, "
              "str timeline_label=\"\") -> ()");
  def("grouped_allreduce_async(Tensor[] tensors, str name=\"\", int op=0, "
      "float prescale_factor=1.0, float postscale_factor=1.0, int process_set_id=0, "
      "str timeline_label=\"\") -> int[]");
  defMutating("grouped_allreduce_async_(Tensor(a!)[] tensors, str name=\"\", int op=0, "
              "float prescale_factor=1.0, float postscale_factor=1.0, int process_set_id=0, "
              "str timeline_label=\"\") -> int[]");
  def("grouped_allgather(Tensor[] tensors, str name=\"\", int process_set_id=0) -> Tensor[]");
  def("grouped_allgather_async(Tensor[] tensors, str name=\"\", int process_set_id=0) -> int[]");
  def("grouped_reducescatter(Tensor[] tensors, str name=\"\", int op=0, "
      "float prescale_factor=1.0, float postscale_factor=1.0, int process_set_id=0) -> Tensor[]");
  def("grouped_reducescatter_async(Tensor[] tensors, str name=\"\", int op=0, "
      "float prescale_factor=1.0, float postscale_factor=1.0, int process_set_id=0) -> int[]");
  // Returns the received tensor and the rows received from each rank (int32).
  // splits: rows to send to each rank; None splits the first dimension evenly.
  def("alltoall(Tensor tensor, Tensor? splits=None, str name=\"\", int process_set_id=0) -> "
      "(Tensor, Tensor)");
  def("alltoall_async(Tensor tensor, Tensor? splits=None, str name=\"\", int process_set_id=0) "
      "-> int");
  def("synchronize_alltoall(int handle) -> (Tensor, Tensor)");
  // Returns a tensor so that a tracer cannot drop the call.
  def("barrier(int process_set_id=0) -> Tensor");
  // This rank has no more data: until every rank has joined, it takes part in
  // the others' allreduces with zeros. Returns the last rank to join.
  def("join(int device=-1) -> Tensor");
  // Async completion. synchronize returns the op's result (for in-place ops
  // the tensor that was passed in); it raises the op's error on every rank.
  def("poll(int handle) -> bool");
  def("synchronize(int handle) -> Tensor");
}
