// Blocking allreduces (single and grouped) of plain CPU tensors from eager
// Python, without the dispatcher. Calling torch.ops.hvd_torch.allreduce_ from Python costs about
// 2 us before our kernel runs (argument matching against the schema, the
// dispatch-key walk); for a 4-byte allreduce that is as much as the collective
// itself. Where the dispatcher would add nothing, these call the same kernel
// directly. Anything else (a tensor subclass, a tensor needing autograd or
// carrying conjugate/negative bits, tracing, a dispatch or torch-function
// mode, inference mode) returns "not taken" and hvd_torch/ops.py calls the
// torch op. torch.compile never gets here: ops.py and grouped.py check
// is_compiling() first.
#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/extension.h>

#include "../torch/adapter.h"

namespace {

// Nothing on this thread that the dispatcher would honour.
bool plainThreadState() {
  return !torch::jit::tracer::isTracing() && !c10::InferenceMode::is_enabled() &&
         !c10::impl::TorchDispatchModeTLS::any_modes_set() &&
         !at::impl::torch_function_mode_enabled() &&
         c10::impl::tls_local_dispatch_key_set().included_ == c10::default_included_set;
}

// The tensor, when the dispatcher would do nothing for it but run our kernel.
const at::Tensor* plainTensor(PyObject* obj) {
  if (Py_TYPE(obj) != reinterpret_cast<PyTypeObject*>(THPVariableClass)) return nullptr;
  const at::Tensor& t = THPVariable_Unpack(obj);
  static const c10::DispatchKeySet plain = at::empty({1}).key_set();
  if (t.key_set() != plain || t.requires_grad()) return nullptr;
  return &t;
}

const at::Tensor* plainCpuTensor(pybind11::handle obj) {
  return plainThreadState() ? plainTensor(obj.ptr()) : nullptr;
}

// Every member of a list or tuple, when all are plain; false otherwise.
bool plainCpuTensors(pybind11::handle seq, std::vector<at::Tensor>& out) {
  if (!plainThreadState() || !(PyList_Check(seq.ptr()) || PyTuple_Check(seq.ptr()))) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
  PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
  out.reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    const at::Tensor* t = plainTensor(items[i]);
    if (t == nullptr) return false;
    out.push_back(*t);
  }
  return true;
}

// The allreduce_ op; false when not taken.
bool allreduceInPlace(pybind11::handle obj, const std::string& name, int64_t op, double prescale,
                      double postscale, int64_t process_set) {
  HANDLE_TH_ERRORS
  const at::Tensor* t = plainCpuTensor(obj);
  if (t == nullptr) return false;
  hvd::torch_layer::allreduceBlocking(*t, true, name, op, prescale, postscale, process_set);
  return true;
  END_HANDLE_TH_ERRORS_PYBIND
}

// The allreduce op; None when not taken.
pybind11::object allreduce(pybind11::handle obj, const std::string& name, int64_t op,
                           double prescale, double postscale, int64_t process_set) {
  HANDLE_TH_ERRORS
  const at::Tensor* t = plainCpuTensor(obj);
  if (t == nullptr) return pybind11::none();
  return pybind11::cast(
      hvd::torch_layer::allreduceBlocking(*t, false, name, op, prescale, postscale, process_set));
  END_HANDLE_TH_ERRORS_PYBIND
}

// The grouped_allreduce_ op; false when not taken.
bool groupedAllreduceInPlace(pybind11::handle tensors, const std::string& name, int64_t op,
                             double prescale, double postscale, int64_t process_set) {
  HANDLE_TH_ERRORS
  std::vector<at::Tensor> ts;
  if (!plainCpuTensors(tensors, ts)) return false;
  hvd::torch_layer::groupedAllreduceBlocking(ts, true, name, op, prescale, postscale, process_set);
  return true;
  END_HANDLE_TH_ERRORS_PYBIND
}

// The grouped_allreduce op; None when not taken.
pybind11::object groupedAllreduce(pybind11::handle tensors, const std::string& name, int64_t op,
                                  double prescale, double postscale, int64_t process_set) {
  HANDLE_TH_ERRORS
  std::vector<at::Tensor> ts;
  if (!plainCpuTensors(tensors, ts)) return pybind11::none();
  return pybind11::cast(hvd::torch_layer::groupedAllreduceBlocking(ts, false, name, op, prescale,
                                                                   postscale, process_set));
  END_HANDLE_TH_ERRORS_PYBIND
}

}  // namespace

void registerEagerFastPath(pybind11::module& m) {
  m.def("eager_allreduce_", &allreduceInPlace);
  m.def("eager_allreduce", &allreduce);
  m.def("eager_grouped_allreduce_", &groupedAllreduceInPlace);
  m.def("eager_grouped_allreduce", &groupedAllreduce);
}
