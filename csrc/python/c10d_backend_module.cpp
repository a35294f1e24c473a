// _C.c10d_backend: hvd_torch/distributed.py's creator for the "hvd"
// torch.distributed backend (csrc/torch/c10d_backend.h). Its own file because
// c10d's headers bring ::shutdown (sys/socket.h) beside module.cpp's.
#include <torch/extension.h>

#include "../torch/c10d_backend.h"

void registerC10dBackend(pybind11::module& m) {
  // torch.distributed registers the returned type: import it first.
  m.def("c10d_backend", &hvd::torch_layer::makeC10dBackend, pybind11::arg("group_rank"),
        pybind11::arg("group_size"), pybind11::arg("process_set"),
        pybind11::arg("global_ranks"), pybind11::arg("group_name"),
        "A torch.distributed backend (c10d::Backend) on the running engine.");
}
