// Allreduces (blocking, async, grouped), blocking broadcasts, allgathers,
// alltoalls and reducescatters of plain CPU tensors, synchronize and poll,
// from eager Python, without the dispatcher. Calling
// torch.ops.hvd_torch.allreduce_ from Python costs about 2 us before our
// kernel runs (argument matching against the schema, the dispatch-key walk);
// for a 4-byte allreduce that is as much as the collective itself. Where the
// dispatcher would add nothing, these call the same kernel directly.
// Anything else (a tensor subclass, a tensor needing autograd or carrying
// conjugate/negative bits, tracing, a dispatch or torch-function mode,
// inference mode) returns Python's NotImplemented ("not taken", every entry
// alike) and hvd_torch/ops.py calls the torch op. torch.compile never gets
// here: ops.py and grouped.py check is_compiling() first.
#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/extension.h>

#include "../torch/adapter.h"

pybind11::object synchronizeAny(int64_t handle);  // handles.cpp

namespace {

// "Not taken": NotImplemented, which no entry returns as a result (a tensor,
// a tuple, a list, a handle, or None from an in-place op), so the wrapper
// tells the two apart with one `is` test.
pybind11::object notTaken() {
  return pybind11::reinterpret_borrow<pybind11::object>(Py_NotImplemented);
}

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

// The members of a list or tuple, borrowed: no reference count changes. A
// copied at::Tensor whose count goes from 1 to 2 increfs its Python object,
// and the copy's end decrefs it under a GIL acquire: about 50 ns a member,
// most of a small member's cost in a grouped op. The snapshot (a tuple of
// the members) keeps every member alive even if the caller's list changes
// while we wait without the GIL.
class PlainMembers {
 public:
  // Empty when some member (or the thread's state) is not plain.
  explicit PlainMembers(pybind11::handle seq) {
    if (!plainThreadState() || !(PyList_Check(seq.ptr()) || PyTuple_Check(seq.ptr()))) return;
    snapshot_ = pybind11::reinterpret_steal<pybind11::object>(PySequence_Tuple(seq.ptr()));
    if (!snapshot_) throw pybind11::error_already_set();
    const Py_ssize_t n = PyTuple_GET_SIZE(snapshot_.ptr());
    tensors_.reserve(static_cast<size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
      const at::Tensor* t = plainTensor(PyTuple_GET_ITEM(snapshot_.ptr(), i));
      if (t == nullptr) {
        release();
        return;
      }
      tensors_.push_back(c10::MaybeOwnedTraits<at::Tensor>::createBorrow(*t));
    }
    taken_ = true;
  }
  ~PlainMembers() { release(); }
  PlainMembers(const PlainMembers&) = delete;
  PlainMembers& operator=(const PlainMembers&) = delete;

  bool taken() const { return taken_; }
  at::TensorList tensors() const { return tensors_; }

 private:
  void release() {
    for (at::Tensor& t : tensors_) c10::MaybeOwnedTraits<at::Tensor>::destroyBorrow(t);
    tensors_.clear();
  }

  pybind11::object snapshot_;
  std::vector<at::Tensor> tensors_;
  bool taken_ = false;
};

// The allreduce_ op; None once done.
pybind11::object allreduceInPlace(pybind11::handle obj, const std::string& name, int64_t op,
                                  double prescale, double postscale, int64_t process_set) {
  HANDLE_TH_ERRORS
  const at::Tensor* t = plainCpuTensor(obj);
  if (t == nullptr) return notTaken();
  hvd::torch_layer::allreduceBlocking(*t, true, name, op, prescale, postscale, process_set);
  return pybind11::none();
  END_HANDLE_TH_ERRORS_PYBIND
}

// The allreduce op; its result.
pybind11::object allreduce(pybind11::handle obj, const std::string& name, int64_t op,
                           double prescale, double postscale, int64_t process_set) {
  HANDLE_TH_ERRORS
  const at::Tensor* t = plainCpuTensor(obj);
  if (t == nullptr) return notTaken();
  return pybind11::cast(
      hvd::torch_layer::allreduceBlocking(*t, false, name, op, prescale, postscale, process_set));
  END_HANDLE_TH_ERRORS_PYBIND
}

// The allreduce_async / allreduce_async_ ops; the handle. The in-place
// kernel's version bump, as allreduceAsyncInPlace.
pybind11::object allreduceAsync(pybind11::handle obj, bool in_place, const std::string& name,
                                int64_t op, double prescale, double postscale,
                                int64_t process_set) {
  HANDLE_TH_ERRORS
  const at::Tensor* t = plainCpuTensor(obj);
  if (t == nullptr) return notTaken();
  const int64_t handle =
      hvd::torch_layer::submitAllreduce(*t, in_place, name, op, prescale, postscale, process_set);
  if (in_place) hvd::torch_layer::bumpVersion(*t);
  return pybind11::int_(handle);
  END_HANDLE_TH_ERRORS_PYBIND
}

// synchronize() of an engine handle of any kind (the synchronize,
// synchronize_alltoall ops, a group's members); synchronizeAny's result.
pybind11::object synchronizeAsync(int64_t handle) {
  HANDLE_TH_ERRORS
  if (!plainThreadState()) return notTaken();
  return synchronizeAny(handle);
  END_HANDLE_TH_ERRORS_PYBIND
}

// The poll op, for every kind: it reads flags; nothing for the dispatcher to
// do, so it is always taken.
bool pollAsync(int64_t handle) {
  HANDLE_TH_ERRORS
  return hvd::torch_layer::pollHandle(handle);
  END_HANDLE_TH_ERRORS_PYBIND
}

// The broadcast_ op; None once done.
pybind11::object broadcastInPlace(pybind11::handle obj, int64_t root_rank,
                                  const std::string& name, int64_t process_set) {
  HANDLE_TH_ERRORS
  const at::Tensor* t = plainCpuTensor(obj);
  if (t == nullptr) return notTaken();
  hvd::torch_layer::broadcastBlocking(*t, true, root_rank, name, process_set);
  return pybind11::none();
  END_HANDLE_TH_ERRORS_PYBIND
}

// The broadcast op; its result.
pybind11::object broadcast(pybind11::handle obj, int64_t root_rank, const std::string& name,
                           int64_t process_set) {
  HANDLE_TH_ERRORS
  const at::Tensor* t = plainCpuTensor(obj);
  if (t == nullptr) return notTaken();
  return pybind11::cast(
      hvd::torch_layer::broadcastBlocking(*t, false, root_rank, name, process_set));
  END_HANDLE_TH_ERRORS_PYBIND
}

// The allgather op; its result.
pybind11::object allgather(pybind11::handle obj, const std::string& name, int64_t process_set) {
  HANDLE_TH_ERRORS
  const at::Tensor* t = plainCpuTensor(obj);
  if (t == nullptr) return notTaken();
  return pybind11::cast(hvd::torch_layer::allgatherBlocking(*t, name, process_set));
  END_HANDLE_TH_ERRORS_PYBIND
}

// The alltoall op: (output, received splits), or the output alone without
// splits (the caller returns nothing else, so the rows received from each
// rank are not made). `splits`: None or a plain tensor.
pybind11::object alltoall(pybind11::handle obj, pybind11::handle splits, const std::string& name,
                          int64_t process_set) {
  HANDLE_TH_ERRORS
  const at::Tensor* t = plainCpuTensor(obj);
  if (t == nullptr) return notTaken();
  c10::optional<at::Tensor> split_rows;
  if (!splits.is_none()) {
    const at::Tensor* s = plainTensor(splits.ptr());
    if (s == nullptr) return notTaken();
    split_rows = *s;
  } else {
    return pybind11::cast(std::get<0>(
        hvd::torch_layer::alltoallBlocking(*t, split_rows, name, process_set, false)));
  }
  return pybind11::cast(hvd::torch_layer::alltoallBlocking(*t, split_rows, name, process_set));
  END_HANDLE_TH_ERRORS_PYBIND
}

// The reducescatter op; its result.
pybind11::object reducescatter(pybind11::handle obj, const std::string& name, int64_t op,
                               double prescale, double postscale, int64_t process_set) {
  HANDLE_TH_ERRORS
  const at::Tensor* t = plainCpuTensor(obj);
  if (t == nullptr) return notTaken();
  return pybind11::cast(hvd::torch_layer::reducescatterBlocking(*t, name, op, prescale,
                                                                postscale, process_set));
  END_HANDLE_TH_ERRORS_PYBIND
}

// The grouped_allreduce_ op; None once done.
pybind11::object groupedAllreduceInPlace(pybind11::handle tensors, const std::string& name,
                                         int64_t op, double prescale, double postscale,
                                         int64_t process_set) {
  HANDLE_TH_ERRORS
  const PlainMembers members(tensors);
  if (!members.taken()) return notTaken();
  hvd::torch_layer::groupedAllreduceBlocking(members.tensors(), true, name, op, prescale,
                                             postscale, process_set);
  return pybind11::none();
  END_HANDLE_TH_ERRORS_PYBIND
}

// The grouped_allreduce op; its results.
pybind11::object groupedAllreduce(pybind11::handle tensors, const std::string& name, int64_t op,
                                  double prescale, double postscale, int64_t process_set) {
  HANDLE_TH_ERRORS
  const PlainMembers members(tensors);
  if (!members.taken()) return notTaken();
  return pybind11::cast(hvd::torch_layer::groupedAllreduceBlocking(
      members.tensors(), false, name, op, prescale, postscale, process_set));
  END_HANDLE_TH_ERRORS_PYBIND
}

}  // namespace

void registerEagerFastPath(pybind11::module& m) {
  m.def("eager_allreduce_", &allreduceInPlace);
  m.def("eager_allreduce", &allreduce);
  m.def("eager_allreduce_async", &allreduceAsync);
  m.def("eager_synchronize", &synchronizeAsync);
  m.def("eager_poll", &pollAsync);
  m.def("eager_grouped_allreduce_", &groupedAllreduceInPlace);
  m.def("eager_grouped_allreduce", &groupedAllreduce);
  m.def("eager_broadcast_", &broadcastInPlace);
  m.def("eager_broadcast", &broadcast);
  m.def("eager_allgather", &allgather);
  m.def("eager_alltoall", &alltoall);
  m.def("eager_reducescatter", &reducescatter);
}
