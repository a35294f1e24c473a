// The handle table's Python face: what hvd.synchronize() returns for each
// kind of handle, the kind itself (for the path through the torch ops, which
// hvd_torch/handles.py takes under tracing or a dispatch mode), and grouping
// a grouped op's member handles into the one int Horovod returns.
#include <torch/csrc/Exceptions.h>
#include <torch/extension.h>

#include "../torch/adapter.h"

using hvd::torch_layer::HandleKind;

// Waits for a handle of any kind (the GIL released while it waits): a tensor;
// an alltoall's (output, received_splits); a group's list of results.
pybind11::object synchronizeAny(int64_t handle) {
  hvd::torch_layer::Synchronized s = hvd::torch_layer::waitAny(handle);
  switch (s.kind) {
    case HandleKind::kAlltoall:
      return pybind11::make_tuple(s.tensor, s.received);
    case HandleKind::kGroup:
      return pybind11::cast(s.members);
    case HandleKind::kSingle:
      break;
  }
  return pybind11::cast(s.tensor);
}

void registerHandles(pybind11::module& m) {
  pybind11::enum_<HandleKind>(m, "HandleKind")
      .value("single", HandleKind::kSingle)
      .value("alltoall", HandleKind::kAlltoall)
      .value("group", HandleKind::kGroup);
  m.def("handle_kind", [](int64_t handle) {
    HANDLE_TH_ERRORS
    return hvd::torch_layer::handleKind(handle);
    END_HANDLE_TH_ERRORS_PYBIND
  });
  m.def("group_handles", [](const std::vector<int64_t>& members) {
    HANDLE_TH_ERRORS
    return hvd::torch_layer::groupHandles(members);
    END_HANDLE_TH_ERRORS_PYBIND
  }, "One handle for a grouped op's member handles (which are gone).");
  m.def("synchronize_handle", [](int64_t handle) {
    HANDLE_TH_ERRORS
    return synchronizeAny(handle);
    END_HANDLE_TH_ERRORS_PYBIND
  }, "synchronize() of an engine handle of any kind, without the torch ops.");
}
