// Every op with options (csrc/torch/kernels.h, forEachKernel) of plain CPU
// tensors, synchronize and poll, from eager Python, without the dispatcher:
// _C.eager_<op>(the op's arguments, in its schema's order). Calling
// torch.ops.hvd_torch.allreduce_ from Python costs about 2 us before our
// kernel runs (argument matching against the schema, the dispatch-key walk);
// for a 4-byte allreduce that is as much as the collective itself. Where the
// dispatcher would add nothing, these call the same runner directly, one
// generic entry per runner that parses the arguments into the op's options
// through their field list (csrc/core/op_options.h). Anything else (a tensor
// subclass, a tensor needing autograd or carrying conjugate/negative bits,
// tracing, a dispatch or torch-function mode, inference mode) returns Python's
// NotImplemented ("not taken", every entry alike) and the wrapper's call
// helper (hvd_torch/op_call.py) calls the torch op. torch.compile never gets
// here: the helper checks is_compiling() first.
#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/extension.h>

#include <deque>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../torch/adapter.h"
#include "../torch/kernels.h"
#include "../torch/op_call.h"

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

// The members of a list or tuple, borrowed: no reference count changes. A
// copied at::Tensor whose count goes from 1 to 2 increfs its Python object,
// and the copy's end decrefs it under a GIL acquire: about 50 ns a member,
// most of a small member's cost in a grouped op. The snapshot (a tuple of
// the members) keeps every member alive even if the caller's list changes
// while we wait without the GIL.
class PlainMembers {
 public:
  // Empty when some member is not plain (the caller checked the thread's state).
  explicit PlainMembers(pybind11::handle seq) {
    if (!(PyList_Check(seq.ptr()) || PyTuple_Check(seq.ptr()))) return;
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

// ---- arguments: Python objects -> runner inputs and options. Anything
// unexpected is "not taken": the torch op then parses it and says what is wrong.

bool fromPython(PyObject* obj, std::string& out) {
  if (!PyUnicode_Check(obj)) return false;
  Py_ssize_t size = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(obj, &size);
  if (utf8 == nullptr) {
    PyErr_Clear();
    return false;
  }
  out.assign(utf8, static_cast<size_t>(size));
  return true;
}

bool fromPython(PyObject* obj, double& out) {
  if (PyFloat_CheckExact(obj)) {
    out = PyFloat_AS_DOUBLE(obj);
    return true;
  }
  if (!PyLong_CheckExact(obj)) return false;
  out = PyLong_AsDouble(obj);
  if (out == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  return true;
}

// An int of the member's range (an IntEnum's too; not a bool).
template <class Limit>
bool intFromPython(PyObject* obj, int64_t& out) {
  if (!PyLong_Check(obj) || PyBool_Check(obj)) return false;
  int overflow = 0;
  out = PyLong_AsLongLongAndOverflow(obj, &overflow);
  if (out == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  return overflow == 0 && out >= std::numeric_limits<Limit>::min() &&
         out <= std::numeric_limits<Limit>::max();
}

bool fromPython(PyObject* obj, int32_t& out) {
  int64_t v = 0;
  if (!intFromPython<int32_t>(obj, v)) return false;
  out = static_cast<int32_t>(v);
  return true;
}

bool fromPython(PyObject* obj, hvd::ReduceOp& out) {
  int64_t v = 0;
  if (!intFromPython<std::underlying_type_t<hvd::ReduceOp>>(obj, v)) return false;
  out = static_cast<hvd::ReduceOp>(v);
  return true;
}

// The options from the arguments after the inputs, in schema order; missing
// trailing ones keep their defaults, which are the schema's (checkOpSchemas).
template <class Options>
bool optionsFromPython(PyObject* const* args, Py_ssize_t n, Options& o) {
  Py_ssize_t i = 0;
  bool ok = true;
  hvd::fields(o, [&](const char*, auto& member) {
    if (ok && i < n) ok = fromPython(args[i++], member);
  });
  return ok && i == n;
}

// A runner's input from its Python object; taken() false: not plain.
template <class In>
struct PyInput;

template <>
struct PyInput<const at::Tensor&> {
  explicit PyInput(PyObject* obj) : t(plainTensor(obj)) {}
  bool taken() const { return t != nullptr; }
  const at::Tensor& get() const { return *t; }
  const at::Tensor* t;
};

template <>
struct PyInput<at::TensorList> {
  explicit PyInput(PyObject* obj) : members(obj) {}
  bool taken() const { return members.taken(); }
  at::TensorList get() const { return members.tensors(); }
  PlainMembers members;
};

template <>
struct PyInput<const c10::optional<at::Tensor>&> {
  explicit PyInput(PyObject* obj) {
    if (obj == Py_None) return;
    const at::Tensor* s = plainTensor(obj);
    if (s == nullptr) {
      plain = false;
      return;
    }
    t = *s;
  }
  bool taken() const { return plain; }
  const c10::optional<at::Tensor>& get() const { return t; }
  c10::optional<at::Tensor> t;
  bool plain = true;
};

// ---- results -> Python (new references)

PyObject* toPython(at::Tensor&& t) { return THPVariable_Wrap(std::move(t)); }
PyObject* toPython(int64_t v) { return PyLong_FromLongLong(v); }

PyObject* toPython(std::tuple<at::Tensor, at::Tensor>&& r) {
  return pybind11::cast(std::move(r)).release().ptr();
}

PyObject* toPython(std::vector<at::Tensor>&& ts) {
  return pybind11::cast(std::move(ts)).release().ptr();
}

PyObject* toPython(std::vector<int64_t>&& vs) {
  return pybind11::cast(std::move(vs)).release().ptr();
}

// ---- the one entry, per runner (hvd::torch_layer::forEachKernel)

template <auto F>
constexpr bool isAlltoall() {
  using Alltoall = decltype(&hvd::torch_layer::kernel::alltoall);
  if constexpr (std::is_same<decltype(F), Alltoall>::value) {
    return F == &hvd::torch_layer::kernel::alltoall;
  } else {
    return false;
  }
}

template <auto F, size_t... I>
PyObject* runEager(PyObject* const* args, Py_ssize_t nargs, std::index_sequence<I...>) {
  using T = hvd::torch_layer::RunnerTraits<decltype(F)>;
  constexpr Py_ssize_t kInputs = static_cast<Py_ssize_t>(T::kInputs);
  if (nargs < kInputs || !plainThreadState()) return notTaken().release().ptr();
  const std::tuple<PyInput<typename T::template Input<I>>...> inputs{args[I]...};
  if (!(std::get<I>(inputs).taken() && ...)) return notTaken().release().ptr();
  typename T::Options options;
  if (!optionsFromPython(args + kInputs, nargs - kInputs, options)) {
    return notTaken().release().ptr();
  }
  if constexpr (isAlltoall<F>()) {
    // Without splits the caller returns the output alone: the rows received
    // from each rank are not made.
    if (!std::get<1>(inputs).get().has_value()) {
      return toPython(hvd::torch_layer::kernel::alltoallOutput(std::get<0>(inputs).get(), options));
    }
  }
  if constexpr (std::is_void<typename T::Result>::value) {
    F(std::get<I>(inputs).get()..., options);
    Py_RETURN_NONE;
  } else {
    return toPython(F(std::get<I>(inputs).get()..., options));
  }
}

// eager_<op>(inputs..., options...): the op's arguments in its schema's order
// (trailing ones may be left out for their defaults); the op's result, None
// for an in-place op, or NotImplemented when not taken.
template <auto F>
PyObject* eager(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  return runEager<F>(args, nargs,
                     std::make_index_sequence<hvd::torch_layer::RunnerTraits<decltype(F)>::kInputs>{});
  END_HANDLE_TH_ERRORS
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

}  // namespace

void registerEagerFastPath(pybind11::module& m) {
  // Raw METH_FASTCALL functions: pybind11's overload dispatch and casts cost
  // more than the parsing here. The method definitions live as long as the
  // module (Python keeps pointers to them).
  static std::deque<PyMethodDef> defs;
  static std::deque<std::string> names;
  hvd::torch_layer::forEachKernel([&](const char* op, auto k) {
    names.push_back(std::string("eager_") + op);
    defs.push_back({names.back().c_str(),
                    reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(
                        &eager<decltype(k)::run>)),
                    METH_FASTCALL, "The torch op's eager fast path (eager_fast_path.cpp)."});
    PyObject* fn = PyCFunction_NewEx(&defs.back(), nullptr, m.attr("__name__").ptr());
    if (fn == nullptr) throw pybind11::error_already_set();
    m.add_object(names.back().c_str(), pybind11::reinterpret_steal<pybind11::object>(fn));
  });
  m.def("eager_synchronize", &synchronizeAsync);
  m.def("eager_poll", &pollAsync);
}
