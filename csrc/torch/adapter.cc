#include "adapter.h"

#include <pybind11/pybind11.h>
#include <torch/csrc/Exceptions.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "../core/engine_registry.h"
#include "device_io.h"
#include "host_output.h"

namespace hvd {
namespace torch_layer {

namespace {

// Unnamed ops count per process set: ranks outside a set must not advance
// the counter the set's members use, or their later global ops' names differ.
std::mutex names_mu;
std::unordered_map<int64_t, int64_t> name_counters;

// The Python class of RefusedError; null until hvd_torch registers it. Read
// and written with the GIL held (registration at import; python_type() from
// torch's translation of the exception into a Python error).
PyObject* refused_error_type = nullptr;

// A caller's mistake that Horovod reports as a RuntimeError: ranks that
// disagree (its synchronize() raises HorovodInternalError), an op a collective
// does not support. torch's error translation (HANDLE_TH_ERRORS, and its
// pybind11 translator for torch.ops and our module's functions) raises a
// torch::PyTorchError as the Python type it names: here
// hvd_torch.exceptions.RefusedError, a subclass of both ValueError and
// RuntimeError, so that `except ValueError` and Horovod users'
// `except RuntimeError` both catch it, while it stays out of elastic's
// HorovodInternalError retry path. TorchScript's interpreter turns it into a
// RuntimeError, as it does every error.
struct RefusedError : torch::PyTorchError {
  using torch::PyTorchError::PyTorchError;
  PyObject* python_type() override {
    return refused_error_type != nullptr ? refused_error_type : PyExc_ValueError;
  }
};

// How an op's failure crosses to Python, decided by its kind, never by text
// (hvd_torch/error_translation.py maps the types; docs/errors.md):
//   caller's mistake seen by this rank (Status::kInvalidArgument, argument
//     checks) -> c10::ValueError -> ValueError;
//   caller's mistake seen across ranks (Status::kRefused) -> RefusedError ->
//     hvd_torch.exceptions.RefusedError (a ValueError and a RuntimeError);
//   peer failure or shutdown -> c10::DistNetworkError -> HorovodInternalError
//     (elastic training restores and retries on it);
//   broken invariant (Status::kInternal) -> c10::Error -> RuntimeError naming a bug.
[[noreturn]] void throwStatus(const Status& status) {
  switch (status.code) {
    case Status::kInvalidArgument:
      TORCH_CHECK_VALUE(false, status.message);
    case Status::kRefused:
      throw RefusedError(status.message);
    case Status::kPeerFailure:
    case Status::kShutdown:
      C10_THROW_ERROR(DistNetworkError, status.message);
    default:
      TORCH_CHECK(false, "hvd_torch internal error (a bug in hvd-torch, please report it): ",
                  status.message);
  }
}

// The set's ranks; a clear error when it does not exist.
std::vector<int> requireSet(const Engine& engine, int64_t process_set, const char* op,
                            const std::string& name) {
  std::vector<int> ranks;
  if (!engine.processSets().find(static_cast<int32_t>(process_set), &ranks)) {
    std::vector<int> ids;
    for (int32_t id : engine.processSets().ids()) ids.push_back(id);
    TORCH_CHECK_VALUE(false, "hvd_torch.", op, " '", name, "': process set ", process_set,
                " does not exist (registered: ", rankList(ids),
                "); register it with hvd.add_process_set() on every rank first");
  }
  return ranks;
}

// The set's ranks; a clear error when it does not exist or lacks this rank.
std::vector<int> requireMember(const Engine& engine, int64_t process_set, const char* op,
                               const std::string& name) {
  std::vector<int> ranks = requireSet(engine, process_set, op, name);
  TORCH_CHECK_VALUE(indexIn(ranks, engine.topology().rank) >= 0, "hvd_torch.", op, " '", name,
              "': rank ", engine.topology().rank, " is not in process set ", process_set,
              " (ranks ", rankList(ranks), ")");
  return ranks;
}

// requireMember for ops that need only the check, not the ranks.
void checkMember(const Engine& engine, int64_t process_set, const char* op,
                 const std::string& name) {
  if (!engine.processSets().contains(static_cast<int32_t>(process_set), engine.topology().rank))
    requireMember(engine, process_set, op, name);
}

Request baseRequest(OpType type, const at::Tensor& t, DataType dtype, const std::string& name,
                    int64_t process_set, const GroupTag* group = nullptr) {
  Request q;
  if (group != nullptr) {
    q.group = group->name;
    q.group_size = group->size;
  }
  q.type = type;
  q.dtype = dtype;
  q.name = name;
  q.process_set = static_cast<int32_t>(process_set);
  q.shape.assign(t.sizes().begin(), t.sizes().end());
  return q;
}

}  // namespace

std::shared_ptr<Engine> requireEngine(const char* op) {
  auto engine = currentEngine();
  TORCH_CHECK_VALUE(engine != nullptr, "hvd_torch.", op,
              " was called before hvd_torch.init(): call hvd.init() first");
  return engine;
}

c10::optional<DataType> dataTypeOf(at::ScalarType type) {
  switch (type) {
    case at::kByte: return DataType::kUInt8;
    case at::kChar: return DataType::kInt8;
    case at::kShort: return DataType::kInt16;
    case at::kInt: return DataType::kInt32;
    case at::kLong: return DataType::kInt64;
    case at::kHalf: return DataType::kFloat16;
    case at::kBFloat16: return DataType::kBFloat16;
    case at::kFloat: return DataType::kFloat32;
    case at::kDouble: return DataType::kFloat64;
    case at::kBool: return DataType::kBool;
    default: return c10::nullopt;
  }
}

DataType toDataType(const at::Tensor& t, const char* op, const std::string& name) {
  const c10::optional<DataType> dtype = dataTypeOf(t.scalar_type());
  TORCH_CHECK_VALUE(dtype.has_value(), "hvd_torch.", op, " '", name, "': unsupported dtype ",
                    t.scalar_type(), "; supported: uint8, int8, int16, int32, int64, float16, "
                    "bfloat16, float32, float64, bool");
  return *dtype;
}

std::string opName(const char* op, const std::string& name, int64_t process_set) {
  // A user's name is negotiated as given (not prefixed with the op, unlike
  // Horovod), so ranks that run different ops under one name get a clear
  // "mismatched operations" error instead of waiting for each other forever.
  if (!name.empty()) return name;
  std::lock_guard<std::mutex> lock(names_mu);
  return std::string(op) + ".noname." + std::to_string(name_counters[process_set]++);
}

bool singleUseName(const std::string& name) {
  if (name.rfind(kC10dNamePrefix, 0) == 0) return true;
  // opName's "<op>.noname.<n>", and not a user's name that merely contains it
  // (DistributedOptimizer's "allreduce.allreduce.noname.<i>" recurs every step).
  const size_t mark = name.find(".noname.");
  if (mark == std::string::npos || name.find('.') != mark) return false;
  const size_t digits = mark + 8;
  return digits < name.size() &&
         name.find_first_not_of("0123456789", digits) == std::string::npos;
}

void resetNameCounter() {
  std::lock_guard<std::mutex> lock(names_mu);
  name_counters.clear();
}

int64_t processSetRank(int64_t process_set) {
  auto engine = requireEngine("process set rank");
  return indexIn(requireMember(*engine, process_set, "process set", ""), engine->topology().rank);
}

int64_t processSetSize(int64_t process_set) {
  auto engine = requireEngine("process set size");
  // Every rank knows every set's ranks (registration is a collective), so a
  // set's size is an answer for non-members too, as in Horovod.
  return static_cast<int64_t>(requireSet(*engine, process_set, "process set", "").size());
}

void setRefusedErrorType(const pybind11::handle& type) {
  Py_XINCREF(type.ptr());
  Py_XDECREF(refused_error_type);
  refused_error_type = type.ptr();
}

void bumpVersion(const at::Tensor& t) {
  if (!t.is_inference()) t.unsafeGetTensorImpl()->bump_version();
}

void waitWork(Engine* engine, Work& work, std::chrono::microseconds spin) {
  if (work.done()) {
    // Done already (the fast lane ran it on this thread): nothing to wait for.
    const Status status = work.wait();
    if (!status.ok()) throwStatus(status);
    return;
  }
  Status status;
  // A blocking wait must not hold the GIL: other Python threads (data
  // loaders, the elastic driver) keep running while we wait on peers.
  // While it would spin anyway, this thread runs the engine's work itself.
  auto driveThenWait = [&] {
    if (engine) engine->drive(work);
    return work.wait(spin);
  };
  if (Py_IsInitialized() && PyGILState_Check()) {
    pybind11::gil_scoped_release no_gil;
    status = driveThenWait();
  } else {
    status = driveThenWait();
  }
  if (!status.ok()) throwStatus(status);
}

namespace {

// The engine's view of `tensor` (device_io.h): the request says where it
// lives, the entry waits for its producer, the pending op how to return it.
EngineInput takeInput(const at::Tensor& tensor, DataType dtype, const char* op,
                      const std::string& name, Entry& e, Pending& p) {
  EngineInput in = prepareInput(tensor, dtype, op, name);
  e.request.device = in.device;
  e.request.plane = in.plane;
  e.ready = in.ready;
  p.plane = in.plane;
  p.device = in.device;
  return in;
}

// Output of the input's shape (allreduce, broadcast): a new tensor, or the
// input itself for in-place ops (copied back into `tensor` when the input was
// a contiguous or host-staged copy of it). A staged input is our own pinned
// copy, so the engine writes the result over it.
void bindSameShapeOutput(const at::Tensor& tensor, const EngineInput& in, bool in_place,
                         SubmitMode mode, Entry& e, Pending& p) {
  const at::Tensor& input = in.tensor;
  at::Tensor output = in_place || in.plane == Plane::kStaged ? input
                      : in.plane == Plane::kHost          ? hostOutput(input.sizes(), input.options())
                                                          : at::empty_like(input);
  lendToEngine(output, in);
  if (in_place && !input.is_same(tensor)) p.copy_back_to = tensor;
  p.result = output;
  e.input = input.data_ptr();
  e.output = output.data_ptr();
  // A blocking op's caller holds its host tensor until the op is done, and
  // waitHandle holds `p.result`: no reference needed, nor its PyObject's
  // incref and decref (about 200 instructions of a 4-byte allreduce).
  if (mode == SubmitMode::kCallerWaits && in.plane == Plane::kHost && input.is_same(tensor))
    return;
  e.keep_alive = std::make_shared<std::pair<at::Tensor, at::Tensor>>(input, output);
}

// Output whose row count the engine learns late (allgather, alltoall,
// reducescatter): allocated on the background thread, read by synchronize.
// `into` (adapter.h): used when the result has exactly its elements; the
// caller holds it until the op completes.
void bindRowsOutput(const EngineInput& in, Entry& e, Pending& p,
                    const at::Tensor& into = at::Tensor()) {
  auto out = std::make_shared<at::Tensor>();
  const at::Tensor& input = in.tensor;
  std::vector<int64_t> row_shape(input.sizes().begin() + 1, input.sizes().end());
  e.input = input.data_ptr();
  at::Tensor target;
  if (into.defined() && in.plane == Plane::kHost && into.device().is_cpu() &&
      into.is_contiguous() && into.scalar_type() == input.scalar_type()) {
    target = into;
  }
  e.allocate = [out, row_shape, in, target](int64_t rows) {
    std::vector<int64_t> shape{rows};
    shape.insert(shape.end(), row_shape.begin(), row_shape.end());
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    *out = target.defined() && target.numel() == numel ? target.view(shape)
                                                        : engineEmpty(shape, in);
    return out->data_ptr();
  };
  e.keep_alive = std::make_shared<at::Tensor>(input);
  p.gathered = out;
}

// kGroupMember: submitGroup wakes the engine once for all members.
int64_t enqueue(Engine& engine, Entry e, Pending p, SubmitMode mode,
                HandleKind kind = HandleKind::kSingle) {
  TORCH_INTERNAL_ASSERT(e.request.group.empty() == (mode != SubmitMode::kGroupMember),
                        "a grouped op's members, and only they, are submitted as kGroupMember");
  p.name = e.request.name;
  p.keep_alive = e.keep_alive;
  e.request.single_use = singleUseName(e.request.name);
  try {
    p.work = engine.enqueue(std::move(e), mode);
  } catch (const DuplicateName& dup) {
    TORCH_CHECK_VALUE(false, "hvd_torch.", dup.what());
  }
  return addHandle(std::move(p), kind, mode);
}

}  // namespace

namespace {

// An allreduce's op and scaling, as Horovod accepts them.
void checkReduction(const char* what, const std::string& name, DataType dtype,
                    const Reduction& r) {
  TORCH_CHECK_VALUE(r.op == ReduceOp::kAverage || r.op == ReduceOp::kSum ||
                        r.op == ReduceOp::kMin || r.op == ReduceOp::kMax ||
                        r.op == ReduceOp::kProduct,
                    "hvd_torch.", what, " '", name, "': unsupported reduce op ",
                    static_cast<int>(r.op),
                    " (Average=0, Sum=1, Min=3, Max=4, Product=5; Adasum=2 runs in eager Python only: ",
                    "hvd.allreduce and grouped_allreduce in all forms, and DistributedOptimizer)");
  TORCH_CHECK_VALUE(dtype != DataType::kBool || (r.op != ReduceOp::kAverage && r.prescale == 1.0 &&
                                                 r.postscale == 1.0),
                    "hvd_torch.", what, " '", name,
                    "': bool tensors support Sum/Max (or) and Min/Product (and), without scaling");
}

// The negotiated part of a reduction, into the request.
void setReduction(Request& q, const Reduction& r) {
  q.reduce_op = r.op;
  q.prescale = r.prescale;
  q.postscale = r.postscale;
}

// The caller's label for an accepted op (AllreduceOptions::timeline_label):
// a zero-length event on the op's row of the timeline, recorded from this
// thread. Only rank 0's timeline records; other ranks' labels show nowhere.
void markTimeline(Engine& engine, const std::string& label, const Request& q) {
  if (label.empty() || !engine.timeline().active()) return;
  engine.timeline().tick(timelineRow(q.process_set, q.type, q.name), label);
}

}  // namespace

int64_t submitAllreduce(const at::Tensor& tensor, bool in_place, const AllreduceOptions& o,
                        const GroupTag* group, SubmitMode mode) {
  auto engine = requireEngine("allreduce");
  const std::string name = opName("allreduce", o.name, o.process_set);
  checkMember(*engine, o.process_set, "allreduce", name);
  DataType dtype = toDataType(tensor, "allreduce", name);
  checkReduction("allreduce", name, dtype, o.reduction);
  Entry e;
  Pending p;
  e.request = baseRequest(OpType::kAllreduce, tensor, dtype, name, o.process_set, group);
  setReduction(e.request, o.reduction);
  const EngineInput in = takeInput(tensor, dtype, "allreduce", name, e, p);
  bindSameShapeOutput(tensor, in, in_place, mode, e, p);
  markTimeline(*engine, o.timeline_label, e.request);
  return enqueue(*engine, std::move(e), std::move(p), mode);
}

int64_t submitAllgather(const at::Tensor& tensor, const AllgatherOptions& o,
                        const GroupTag* group, const at::Tensor& into, SubmitMode mode) {
  auto engine = requireEngine("allgather");
  const std::string name = opName("allgather", o.name, o.process_set);
  checkMember(*engine, o.process_set, "allgather", name);
  DataType dtype = toDataType(tensor, "allgather", name);
  // A 0-d tensor gathers as one row per rank, like Horovod.
  const at::Tensor rows = tensor.dim() == 0 ? tensor.reshape({1}) : tensor;
  Entry e;
  Pending p;
  e.request = baseRequest(OpType::kAllgather, rows, dtype, name, o.process_set, group);
  bindRowsOutput(takeInput(rows, dtype, "allgather", name, e, p), e, p, into);
  return enqueue(*engine, std::move(e), std::move(p), mode);
}

int64_t submitBroadcast(const at::Tensor& tensor, bool in_place, const BroadcastOptions& o,
                        SubmitMode mode) {
  auto engine = requireEngine("broadcast");
  const std::string name = opName("broadcast", o.name, o.process_set);
  const std::vector<int> members = requireMember(*engine, o.process_set, "broadcast", name);
  const int32_t root_rank = o.root_rank;
  DataType dtype = toDataType(tensor, "broadcast", name);
  const int size = engine->topology().size;
  TORCH_CHECK_VALUE(root_rank >= 0 && root_rank < size, "hvd_torch.broadcast '", name, "': root_rank ",
              root_rank, " is out of range for ", size, " ranks");
  // Horovod's convention: root_rank is a global rank, which must be in the set.
  TORCH_CHECK_VALUE(indexIn(members, root_rank) >= 0, "hvd_torch.broadcast '", name,
              "': root_rank ", root_rank, " is not in process set ", o.process_set, " (ranks ",
              rankList(members), ")");
  Entry e;
  Pending p;
  e.request = baseRequest(OpType::kBroadcast, tensor, dtype, name, o.process_set);
  e.request.root_rank = root_rank;
  const EngineInput in = takeInput(tensor, dtype, "broadcast", name, e, p);
  bindSameShapeOutput(tensor, in, in_place, mode, e, p);
  return enqueue(*engine, std::move(e), std::move(p), mode);
}

int64_t submitAlltoall(const at::Tensor& tensor, const c10::optional<at::Tensor>& splits,
                       const AlltoallOptions& o, const at::Tensor& into, SubmitMode mode) {
  auto engine = requireEngine("alltoall");
  const std::string name = opName("alltoall", o.name, o.process_set);
  const std::vector<int> members = requireMember(*engine, o.process_set, "alltoall", name);
  DataType dtype = toDataType(tensor, "alltoall", name);
  TORCH_CHECK_VALUE(tensor.dim() >= 1, "hvd_torch.alltoall '", name,
              "': the tensor needs at least one dimension to split");
  // Splits count the ranks of the process set.
  const int size = static_cast<int>(members.size());
  const int64_t rows = tensor.size(0);
  std::vector<int64_t> send;
  if (splits.has_value() && splits->defined()) {
    TORCH_CHECK_VALUE(at::isIntegralType(splits->scalar_type(), /*includeBool=*/false),
                      "hvd_torch.alltoall '", name, "': splits must be an integer tensor, got ",
                      splits->scalar_type());
    const at::Tensor s = splits->to(at::kLong).contiguous();
    TORCH_CHECK_VALUE(s.dim() == 1 && s.numel() == size, "hvd_torch.alltoall '", name,
                "': splits must be a 1-D tensor with one entry per rank (", size, "), got shape ",
                splits->sizes());
    send.assign(s.data_ptr<int64_t>(), s.data_ptr<int64_t>() + size);
    int64_t total = 0;
    for (int64_t v : send) {
      TORCH_CHECK_VALUE(v >= 0, "hvd_torch.alltoall '", name, "': negative split ", v);
      total += v;
    }
    TORCH_CHECK_VALUE(total == rows, "hvd_torch.alltoall '", name, "': splits sum to ", total,
                " but the tensor's first dimension is ", rows);
  } else {
    TORCH_CHECK_VALUE(rows % size == 0, "hvd_torch.alltoall '", name, "': without splits the first ",
                "dimension (", rows, ") must be divisible by the number of ranks (", size, ")");
    send.assign(size, rows / size);
  }
  Entry e;
  Pending p;
  e.request = baseRequest(OpType::kAlltoall, tensor, dtype, name, o.process_set);
  e.request.send_splits = send;
  bindRowsOutput(takeInput(tensor, dtype, "alltoall", name, e, p), e, p, into);
  return enqueue(*engine, std::move(e), std::move(p), mode, HandleKind::kAlltoall);
}

int64_t submitReducescatter(const at::Tensor& tensor, const ReducescatterOptions& o,
                            const GroupTag* group, const at::Tensor& into, SubmitMode mode) {
  auto engine = requireEngine("reducescatter");
  const std::string name = opName("reducescatter", o.name, o.process_set);
  requireMember(*engine, o.process_set, "reducescatter", name);
  DataType dtype = toDataType(tensor, "reducescatter", name);
  const Reduction& r = o.reduction;
  // Horovod refuses other ops (Adasum among them) with a RuntimeError.
  if (r.op != ReduceOp::kAverage && r.op != ReduceOp::kSum) {
    throw RefusedError(c10::str("hvd_torch.reducescatter '", name, "': unsupported reduce op ",
                                static_cast<int>(r.op),
                                " (Average=0 and Sum=1 are supported, as in Horovod)"));
  }
  TORCH_CHECK_VALUE(tensor.dim() >= 1, "hvd_torch.reducescatter '", name,
              "': the tensor needs at least one dimension to scatter");
  TORCH_CHECK_VALUE(dtype != DataType::kBool || (r.op != ReduceOp::kAverage && r.prescale == 1.0 &&
                                                 r.postscale == 1.0),
              "hvd_torch.reducescatter '", name, "': bool tensors support Sum only, unscaled");
  Entry e;
  Pending p;
  e.request = baseRequest(OpType::kReducescatter, tensor, dtype, name, o.process_set, group);
  setReduction(e.request, r);
  bindRowsOutput(takeInput(tensor, dtype, "reducescatter", name, e, p), e, p, into);
  return enqueue(*engine, std::move(e), std::move(p), mode);
}

namespace {

// A grouped allreduce of CPU tensors of one dtype as one op (a bundle): one
// name to negotiate, one entry and one completion for the whole group instead
// of one per member, which is most of a small tensor's cost. Each member
// keeps its own handle (and output), all on the bundle's work.
bool bundles(at::TensorList tensors) {
  if (tensors.size() < 2) return false;
  for (const auto& t : tensors) {
    if (!t.device().is_cpu() || t.scalar_type() != tensors[0].scalar_type()) return false;
  }
  return true;
}

struct Bundle {
  std::shared_ptr<Work> work;
  std::vector<Pending> members;  // each member's output, on `work`
};

// kCallerWaits: the caller holds `tensors` until the bundle completes, so
// in-place members already contiguous need no handle, and no member needs a
// reference to the caller's own tensor.
// `group`: the bundle's name (opName's, for an unnamed group).
Bundle enqueueBundle(Engine& engine, at::TensorList tensors, bool in_place,
                     const std::string& group, const AllreduceOptions& o, SubmitMode mode) {
  const bool caller_waits = mode == SubmitMode::kCallerWaits;
  const char* what = "grouped_allreduce";
  const DataType dtype = toDataType(tensors[0], what, group);
  checkReduction(what, group, dtype, o.reduction);
  Entry e;
  e.request.type = OpType::kAllreduce;
  e.request.dtype = dtype;
  e.request.name = group;
  e.request.process_set = o.process_set;
  setReduction(e.request, o.reduction);
  std::vector<Pending> members;
  members.reserve(tensors.size());
  e.parts.reserve(tensors.size());
  auto owned = std::make_shared<std::vector<at::Tensor>>();
  owned->reserve(in_place ? (caller_waits ? 0 : tensors.size()) : 2 * tensors.size());
  ShapeList& shapes = e.request.bundle_shapes;
  shapes.reserve(tensors.size(), 2 * tensors.size());
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& tensor = tensors[i];
    shapes.add(tensor.sizes().data(), tensor.sizes().size());
    if (in_place && caller_waits && tensor.is_contiguous()) {
      void* data = tensor.data_ptr();
      e.parts.push_back({data, data, static_cast<size_t>(tensor.numel())});
      total += tensor.numel();
      continue;
    }
    const at::Tensor input = tensor.contiguous();
    const at::Tensor output = in_place ? input : hostOutput(input.sizes(), input.options());
    Pending p;
    p.result = output;
    if (in_place && !input.is_same(tensor)) p.copy_back_to = tensor;
    e.parts.push_back({input.data_ptr(), output.data_ptr(), static_cast<size_t>(input.numel())});
    if (!(caller_waits && input.is_same(tensor))) owned->push_back(input);
    if (!in_place) owned->push_back(output);
    total += input.numel();
    members.push_back(std::move(p));
  }
  e.request.shape = {total};
  e.keep_alive = owned;
  // The last member's synchronize drops the inputs, holding the GIL (Pending::keep_alive).
  if (!caller_waits && !members.empty()) members.back().keep_alive = owned;
  markTimeline(engine, o.timeline_label, e.request);
  Bundle bundle;
  try {
    e.request.single_use = singleUseName(e.request.name);
    bundle.work = engine.enqueue(std::move(e), mode);
  } catch (const DuplicateName& dup) {
    TORCH_CHECK_VALUE(false, "hvd_torch.", dup.what());
  }
  for (Pending& p : members) p.work = bundle.work;
  bundle.members = std::move(members);
  return bundle;
}

enum class GroupedKind { kAllreduce, kAllgather, kReducescatter };

const char* groupedWhat(GroupedKind kind) {
  return kind == GroupedKind::kAllgather       ? "grouped_allgather"
         : kind == GroupedKind::kReducescatter ? "grouped_reducescatter"
                                               : "grouped_allreduce";
}

// Checks every member before submitting any: a half-submitted group would
// wait forever for its missing members.
std::shared_ptr<Engine> checkGroup(GroupedKind kind, at::TensorList tensors,
                                   const std::string& name, int64_t process_set) {
  const char* what = groupedWhat(kind);
  TORCH_CHECK_VALUE(!tensors.empty(), "hvd_torch.", what, ": the group has no tensors");
  const std::string prefix = std::string(what) + " member ";
  std::string member;  // one buffer for every member's name: no allocation per member
  for (size_t i = 0; i < tensors.size(); ++i) {
    // The common case checked without a name (a member's costs add up).
    const at::Tensor& t = tensors[i];
    if (t.device().is_cpu() && dataTypeOf(t.scalar_type()) &&
        (kind != GroupedKind::kReducescatter || t.dim() >= 1)) {
      continue;
    }
    member.assign(prefix).append(std::to_string(i));
    toDataType(tensors[i], what, member);
    checkDevice(tensors[i], what, member);
    TORCH_CHECK_VALUE(kind != GroupedKind::kReducescatter || tensors[i].dim() >= 1, "hvd_torch.",
                      what, " '", member, "': the tensor needs at least one dimension to scatter");
  }
  auto engine = requireEngine(what);
  requireMember(*engine, process_set, what, name);
  return engine;
}

// A group's members, each submitted by `submit(tensor, member's options,
// group tag)` with the group's options under the member's name.
template <class Options, class Submit>
std::vector<int64_t> submitMembers(GroupedKind kind, at::TensorList tensors, const Options& o,
                                   Submit submit) {
  const char* what = groupedWhat(kind);
  auto engine = checkGroup(kind, tensors, o.name, o.process_set);
  GroupTag group{opName(what, o.name, o.process_set), static_cast<int32_t>(tensors.size())};
  std::vector<int64_t> handles;
  // Members are queued without waking the engine; one wake-up takes them all.
  struct WakeAtEnd {
    Engine& engine;
    ~WakeAtEnd() { engine.wake(); }
  } wake_at_end{*engine};
  Options member = o;
  for (size_t i = 0; i < tensors.size(); ++i) {
    member.name = o.name.empty() ? "" : o.name + "." + std::to_string(i);
    handles.push_back(submit(tensors[i], member, &group));
  }
  return handles;
}

}  // namespace

std::vector<int64_t> submitGroup(at::TensorList tensors, bool in_place,
                                 const AllreduceOptions& o) {
  if (bundles(tensors)) {
    const char* what = groupedWhat(GroupedKind::kAllreduce);
    auto engine = checkGroup(GroupedKind::kAllreduce, tensors, o.name, o.process_set);
    Bundle bundle = enqueueBundle(*engine, tensors, in_place,
                                  opName(what, o.name, o.process_set), o, SubmitMode::kAsync);
    std::vector<int64_t> handles;
    for (Pending& p : bundle.members)
      handles.push_back(addHandle(std::move(p), HandleKind::kSingle, SubmitMode::kAsync));
    return handles;
  }
  return submitMembers(GroupedKind::kAllreduce, tensors, o,
                       [in_place](const at::Tensor& t, const AllreduceOptions& member,
                                  const GroupTag* group) {
                         return submitAllreduce(t, in_place, member, group,
                                                SubmitMode::kGroupMember);
                       });
}

std::vector<int64_t> submitGroup(at::TensorList tensors, const AllgatherOptions& o) {
  return submitMembers(GroupedKind::kAllgather, tensors, o,
                       [](const at::Tensor& t, const AllgatherOptions& member,
                          const GroupTag* group) {
                         return submitAllgather(t, member, group, at::Tensor(),
                                                SubmitMode::kGroupMember);
                       });
}

std::vector<int64_t> submitGroup(at::TensorList tensors, const ReducescatterOptions& o) {
  return submitMembers(GroupedKind::kReducescatter, tensors, o,
                       [](const at::Tensor& t, const ReducescatterOptions& member,
                          const GroupTag* group) {
                         return submitReducescatter(t, member, group, at::Tensor(),
                                                    SubmitMode::kGroupMember);
                       });
}

c10::optional<std::vector<at::Tensor>> runBundle(at::TensorList tensors, bool in_place,
                                                 const AllreduceOptions& o) {
  if (!bundles(tensors)) return c10::nullopt;
  auto engine = checkGroup(GroupedKind::kAllreduce, tensors, o.name, o.process_set);
  Bundle bundle = enqueueBundle(*engine, tensors, in_place,
                                opName("grouped_allreduce", o.name, o.process_set), o,
                                SubmitMode::kCallerWaits);
  waitWork(engine.get(), *bundle.work, engine->config().caller_spin);
  if (in_place) {  // members holds only the non-contiguous ones; the results are in `tensors`
    for (Pending& p : bundle.members)
      if (p.copy_back_to.defined()) p.copy_back_to.copy_(p.result);
    return std::vector<at::Tensor>{};
  }
  std::vector<at::Tensor> out;
  out.reserve(bundle.members.size());
  for (Pending& p : bundle.members) {
    if (p.copy_back_to.defined()) p.copy_back_to.copy_(p.result);
    out.push_back(p.copy_back_to.defined() ? p.copy_back_to : p.result);
  }
  return out;
}

int64_t joinAndWait() {
  auto engine = requireEngine("join");
  Entry e;
  e.request.type = OpType::kJoin;
  e.request.dtype = DataType::kUInt8;
  e.request.name = "join";
  Pending p;
  p.result = at::zeros({}, at::kLong);
  Pending done;
  waitHandle(enqueue(*engine, std::move(e), std::move(p), SubmitMode::kAsync), &done);
  return done.work->lastJoinedRank();
}

int64_t submitBarrier(int64_t process_set, const std::string& name, SubmitMode mode) {
  auto engine = requireEngine("barrier");
  requireMember(*engine, process_set, "barrier", name);
  Entry e;
  e.request.type = OpType::kBarrier;
  e.request.dtype = DataType::kUInt8;
  e.request.name = opName("barrier", name, process_set);
  e.request.process_set = static_cast<int32_t>(process_set);
  Pending p;
  p.result = at::zeros({}, at::kLong);
  return enqueue(*engine, std::move(e), std::move(p), mode);
}

namespace {

// Registry changes run on the global set like an op, and wait for it.
// `change`: the request's type and its set_ranks or set_id. Returns the
// added set's id (-1 for a removal).
int64_t changeProcessSets(Request change, const char* what) {
  auto engine = requireEngine(what);
  Entry e;
  e.request = std::move(change);
  e.request.dtype = DataType::kUInt8;
  e.request.name = opName(what, "", 0);
  Pending p;
  p.result = at::zeros({}, at::kLong);
  Pending done;
  waitHandle(enqueue(*engine, std::move(e), std::move(p), SubmitMode::kAsync), &done);
  return done.work->newSetId();
}

}  // namespace

int64_t addProcessSet(const std::vector<int64_t>& ranks) {
  Request add;
  add.type = OpType::kAddProcessSet;
  add.set_ranks = ranks;
  return changeProcessSets(std::move(add), "add_process_set");
}

void removeProcessSet(int64_t id) {
  Request remove;
  remove.type = OpType::kRemoveProcessSet;
  remove.set_id = static_cast<int32_t>(id);
  changeProcessSets(std::move(remove), "remove_process_set");
}

}  // namespace torch_layer
}  // namespace hvd
