// From at::Tensor to the engine: argument checks, dtype mapping, op names,
// submission, and the async handle table (handles.cc). Everything here runs on the
// caller's thread; completion happens on the engine's background thread.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "../core/engine.h"
#include "../core/op_options.h"
#include "handle_table.h"

namespace pybind11 {
class handle;
}

namespace hvd {
namespace torch_layer {

// The Python class raised for a caller's mistake that Horovod reports as a
// RuntimeError (adapter.cc, RefusedError); hvd_torch sets it once at import,
// holding the GIL. Until then those errors are plain ValueErrors.
void setRefusedErrorType(const pybind11::handle& type);

// The engine, or a clear error when init() has not been called.
std::shared_ptr<Engine> requireEngine(const char* op);

DataType toDataType(const at::Tensor& t, const char* op, const std::string& name);

// The user's name, or "allreduce.noname.<n>" with a counter per process set
// (Horovod's rule: ranks that submit unnamed ops in the same order match).
std::string opName(const char* op, const std::string& name, int64_t process_set);
// The torch.distributed backend's names: "c10d.<group>.<sequence number>".
inline constexpr char kC10dNamePrefix[] = "c10d.";
// A name made for one op (opName's for an unnamed op, the c10d backend's): the
// engine gives it no response-cache slot, since it never comes again and the
// cache, which never evicts, would fill with dead names (HOROVOD_CACHE_CAPACITY).
bool singleUseName(const std::string& name);
void resetNameCounter();

// This rank's position in a process set (a clear error when the set does not
// exist or does not contain this rank), and the set's size (on every rank; a
// clear error when the set does not exist).
int64_t processSetRank(int64_t process_set);
int64_t processSetSize(int64_t process_set);
// Collective over every rank (same ranks, same order on each): returns the new id.
int64_t addProcessSet(const std::vector<int64_t>& ranks);
void removeProcessSet(int64_t id);

// What synchronize() needs to finish an async op.
struct Pending {
  std::shared_ptr<Work> work;
  std::string name;
  at::Tensor result;                           // allreduce/broadcast output
  std::shared_ptr<at::Tensor> gathered;        // allgather/alltoall output, allocated late
  at::Tensor copy_back_to;                     // in-place op on a non-contiguous or staged tensor
  Plane plane = Plane::kHost;                  // CUDA tensors: how the result comes back
  int device = -1;
  // The entry's tensors, shared, so that synchronize, holding the GIL, drops
  // the last C++ reference to the input. Dropping a Python-owned tensor from
  // 2 references to 1 decrefs its PyObject under the GIL: on the background
  // thread, that waited for a busy Python thread's switch interval (5 ms).
  std::shared_ptr<void> keep_alive;
};

// The handle table (handle_table.h, handles.cc): ints cross the schema,
// Pending stays here. Every kind of handle (single op, alltoall, group) lives
// in the one table; an unknown handle is a ValueError naming the op.
// SubmitMode::kCallerWaits: the caller waits for it on this thread right
// after, so it may take the thread's slot (kThisThreadsOp).
int64_t addHandle(Pending&& pending, HandleKind kind, SubmitMode mode);
// Any kind; a group is done when every member is.
bool pollHandle(int64_t handle);
HandleKind handleKind(int64_t handle);
// Merges single-op handles (a grouped op's members) into one group handle;
// the member handles are gone.
int64_t groupHandles(const std::vector<int64_t>& members);
// What synchronize returns for a handle of any kind, as Horovod does: one
// tensor; an alltoall's output and the rows received from each rank (int32);
// a group's members' results in order (every member is waited for, then the
// first error raised).
struct Synchronized {
  HandleKind kind = HandleKind::kSingle;
  at::Tensor tensor;                 // kSingle, kAlltoall
  at::Tensor received;               // kAlltoall
  std::vector<at::Tensor> members;   // kGroup
};
// Waits (without holding the GIL), removes the handle, raises the op's error.
Synchronized waitAny(int64_t handle);
// A single op's or an alltoall's output (the synchronize op); a group's
// handle is refused once its members are done.
at::Tensor waitHandle(int64_t handle);
// As waitHandle, also returning the Pending record (e.g. to read first dims).
at::Tensor waitHandle(int64_t handle, Pending* finished);
// Alltoall's result and the rows received from each rank (int32, like Horovod).
std::tuple<at::Tensor, at::Tensor> waitAlltoall(int64_t handle);
// Waits for `work` (driving the engine meanwhile, without the GIL) and
// raises its error.
void waitWork(Engine* engine, Work& work, std::chrono::microseconds spin);
void clearHandles();
// An in-place op writes `t`: bump its version counter, as torch's in-place
// ops do (the dispatcher does not for a custom op), so that autograd refuses
// a saved tensor we overwrote instead of computing a wrong gradient.
void bumpVersion(const at::Tensor& t);
// Membership of a grouped op: negotiated and run with the group's other members.
struct GroupTag {
  std::string name;
  int32_t size = 0;
};

// Submission of each kind; return the handle. Each takes its op's options
// (op_options.h) as the caller built them; `name` "" gets an unnamed op's name.
// `mode` (core/submit_mode.h): kCallerWaits from a blocking kernel, which waits
// for the handle on this thread right after; kGroupMember, with `group`, from
// submitGroup.
int64_t submitAllreduce(const at::Tensor& tensor, bool in_place, const AllreduceOptions& options,
                        const GroupTag* group = nullptr, SubmitMode mode = SubmitMode::kAsync);
// `into` (allgather, reducescatter, alltoall): a contiguous host tensor of the
// input's dtype that the engine writes the result into when the result has
// exactly its number of elements (the c10d backend's caller-given outputs);
// otherwise, or undefined, the engine allocates the output.
int64_t submitAllgather(const at::Tensor& tensor, const AllgatherOptions& options,
                        const GroupTag* group = nullptr, const at::Tensor& into = at::Tensor(),
                        SubmitMode mode = SubmitMode::kAsync);
int64_t submitBroadcast(const at::Tensor& tensor, bool in_place, const BroadcastOptions& options,
                        SubmitMode mode = SubmitMode::kAsync);
// name: "" for an unnamed op's name (barrier.noname.<n>).
int64_t submitBarrier(int64_t process_set, const std::string& name = "",
                      SubmitMode mode = SubmitMode::kAsync);
// join(): blocks until every rank has joined; returns the last rank to join.
int64_t joinAndWait();
int64_t submitReducescatter(const at::Tensor& tensor, const ReducescatterOptions& options,
                            const GroupTag* group = nullptr, const at::Tensor& into = at::Tensor(),
                            SubmitMode mode = SubmitMode::kAsync);

// Grouped submission: member i is named "<name>.<i>" (or gets an unnamed op's
// name); returns one handle per member.
std::vector<int64_t> submitGroup(at::TensorList tensors, bool in_place,
                                 const AllreduceOptions& options);
std::vector<int64_t> submitGroup(at::TensorList tensors, const AllgatherOptions& options);
std::vector<int64_t> submitGroup(at::TensorList tensors, const ReducescatterOptions& options);
// A grouped allreduce of CPU tensors of one dtype runs as one op (a bundle);
// this runs it and waits, without handles (in place: returns no tensors, the
// results are in `tensors`). nullopt: the group does not bundle.
c10::optional<std::vector<at::Tensor>> runBundle(at::TensorList tensors, bool in_place,
                                                 const AllreduceOptions& options);
// splits: rows to send to each rank (undefined: an even split). The handle's
// kind is kAlltoall.
int64_t submitAlltoall(const at::Tensor& tensor, const c10::optional<at::Tensor>& splits,
                       const AlltoallOptions& options, const at::Tensor& into = at::Tensor(),
                       SubmitMode mode = SubmitMode::kAsync);
}  // namespace torch_layer
}  // namespace hvd
