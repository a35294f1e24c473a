// Plain data the engine speaks in: dtypes, reduce ops, op kinds, status.
// No torch here: the torch layer maps at::ScalarType onto DataType.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace hvd {

// Values are part of the wire format (requests carry them): append only.
enum class DataType : uint8_t {
  kUInt8 = 0,
  kInt8 = 1,
  kInt16 = 2,
  kInt32 = 3,
  kInt64 = 4,
  kFloat16 = 5,
  kBFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBool = 9,
};

// Horovod's numbering (horovod/common/message.h), so users' ints mean the same.
enum class ReduceOp : uint8_t {
  kAverage = 0,
  kSum = 1,
  kAdasum = 2,
  kMin = 3,
  kMax = 4,
  kProduct = 5,
};

enum class OpType : uint8_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kBarrier = 3,
  kAlltoall = 4,
  kReducescatter = 5,
  kJoin = 6,
  // Registry changes, negotiated over the global set like any op so that
  // every rank applies them at the same point of the one execution order.
  kAddProcessSet = 7,
  kRemoveProcessSet = 8,
};

// Which data plane moves an operation's bytes on this rank. Part of the wire
// format (requests carry it, so ranks that disagree get a clear error).
enum class Plane : uint8_t {
  kHost = 0,    // CPU tensors: Gloo
  kStaged = 1,  // CUDA tensors copied through pinned host memory: Gloo
  kDevice = 2,  // CUDA tensors in place on the GPU: NCCL
};
const char* planeName(Plane plane);

// Reducescatter's split of the first dimension (Horovod's rule): every rank
// gets rows / size rows, and the first rows % size ranks one more.
struct RowSlice {
  int64_t offset;
  int64_t rows;
};
RowSlice reducescatterSlice(int64_t rows, int size, int rank);

size_t dataTypeSize(DataType dtype);
const char* dataTypeName(DataType dtype);
const char* reduceOpName(ReduceOp op);
const char* opTypeName(OpType op);
bool isFloatingPoint(DataType dtype);

// Outcome of an operation. kInvalidArgument is the caller's mistake seen by
// this rank alone (the job can go on); kRefused is a caller's mistake the
// coordinator found by comparing the ranks' requests (ranks that disagree, an
// op on a set being removed, an op other ranks' join() rules out): the job
// goes on too, but Horovod reports these from synchronize() as a RuntimeError,
// so the torch layer raises them as one as well (docs/errors.md); kPeerFailure
// means a peer or the network is gone (re-init needed); kShutdown means the
// engine stopped before the op ran; kInternal means an invariant of hvd-torch
// itself broke (a bug to report, not a reason to retry).
struct Status {
  enum Code : uint8_t {
    kOk = 0,
    kInvalidArgument = 1,
    kPeerFailure = 2,
    kShutdown = 3,
    kInternal = 4,
    kRefused = 5
  };
  Code code = kOk;
  std::string message;

  bool ok() const { return code == kOk; }
  static Status Ok() { return {}; }
  static Status invalidArgument(std::string msg) { return {kInvalidArgument, std::move(msg)}; }
  static Status refused(std::string msg) { return {kRefused, std::move(msg)}; }
  static Status peerFailure(std::string msg) { return {kPeerFailure, std::move(msg)}; }
  static Status shutdown(std::string msg) { return {kShutdown, std::move(msg)}; }
  static Status internal(std::string msg) { return {kInternal, std::move(msg)}; }
};

// Thrown on the background thread when an invariant breaks; the engine fails
// every pending op with Status::kInternal instead of a peer failure.
struct InternalError : std::logic_error {
  using std::logic_error::logic_error;
};

// Thrown on the thread that holds the engine's baton by a failure whose kind
// is known: a connection or a data plane that broke (transportFailure), or
// rank 0's abort, which carries the kind rank 0 failed with. The engine fails
// every pending op with `status`; any other exception there is a bug
// (Status::kInternal), never taken for a dead peer.
struct StatusError : std::runtime_error {
  explicit StatusError(Status s) : std::runtime_error(s.message), status(std::move(s)) {}
  Status status;
};

inline StatusError transportFailure(std::string msg) {
  return StatusError(Status::peerFailure(std::move(msg)));
}

// A status code read off the wire: known codes only (a WireError otherwise).
bool isStatusCode(uint8_t code);

}  // namespace hvd
