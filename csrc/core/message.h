// What ranks tell the coordinator (Request) and what it answers (Response),
// with their wire encoding. See docs/architecture.md, "Negotiation".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "types.h"
#include "wire.h"

namespace hvd {

// One rank's description of one named collective.
struct Request {
  OpType type = OpType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce_op = ReduceOp::kAverage;
  int32_t root_rank = 0;
  int32_t process_set = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  std::string name;
  std::vector<int64_t> shape;
  // Alltoall: rows of the first dimension this rank sends to each rank.
  // kAddProcessSet: the new set's global ranks. kRemoveProcessSet: {id}.
  // Allreduce bundle (a grouped allreduce submitted as one op, whose shape is
  // {total elements}): its members' shapes, memberShapes()' encoding.
  std::vector<int64_t> splits;
  // Grouped ops: members of one group are negotiated and run as a unit.
  std::string group;       // empty: not grouped
  int32_t group_size = 0;  // members in the group
  // Where the tensor lives on this rank (-1: host, else a CUDA device index;
  // ranks may use different indices) and the plane that moves it.
  int32_t device = -1;
  Plane plane = Plane::kHost;

  int64_t numElements() const;
  size_t numBytes() const { return static_cast<size_t>(numElements()) * dataTypeSize(dtype); }
  // Elements per first-dimension row (allgather concatenates rows).
  int64_t rowElements() const;
  std::string shapeString() const;
  // "cpu", "cuda:1 (nccl)", "cuda:0 (host-staged)": for error messages.
  std::string deviceString() const;

  // A bundle's member shapes, which splits holds as {count, then each shape's
  // number of dimensions and its dimensions}.
  bool isBundle() const { return type == OpType::kAllreduce && !splits.empty(); }
  std::vector<std::vector<int64_t>> memberShapes() const;

  void encode(Writer& w) const;
  static Request decode(Reader& r);
  bool operator==(const Request& o) const;
};

// A bundle member's name: the group's name and its index ("grads.3").
std::string bundleMemberName(const std::string& group, size_t index);

// The coordinator's verdict for one or more names, executed in the order sent.
struct Response {
  enum Kind : uint8_t {
    kExecute = 0,  // run `type` over `names` (more than one name = fused)
    kInline = 1,   // allreduce done by the coordinator: `inline_result` holds the data
    kError = 2,    // fail `names` with {error_code, error} (the job goes on)
    kDone = 3,     // nothing to move (barrier): complete `names`
  };
  Kind kind = kExecute;
  OpType type = OpType::kAllreduce;
  std::vector<std::string> names;
  // The process set the names belong to: ranks outside it skip the response.
  int32_t process_set = 0;
  // Allgather: first dimension of each rank's tensor, per name (names x ranks).
  // Alltoall: every rank's splits, row-major (ranks x ranks), per name.
  // kAddProcessSet: {{the new set's id}}.
  std::vector<std::vector<int64_t>> first_dims;
  // Cache slot the coordinator assigned to each name (-1 = not cached).
  std::vector<int32_t> cache_ids;
  // kError: what went wrong and its kind; the coordinator's verdicts on what
  // ranks submitted (mismatches, joined ranks) are the callers' mistakes.
  Status::Code error_code = Status::kRefused;
  std::string error;
  std::string inline_result;
  // While some ranks have joined: the ranks that contribute (0 = all), which
  // Average divides by, and each name's request, so a joined rank can take
  // part in the collective with zeros without having submitted it.
  int32_t contributors = 0;
  std::vector<Request> templates;

  Status errorStatus() const { return {error_code, error}; }

  void encode(Writer& w) const;
  static Response decode(Reader& r);
};

// Ranks may use one name in two process sets at once: tables keyed by name
// (in flight on a rank, waiting at the coordinator) use this key.
std::string tableKey(int32_t process_set, const std::string& name);

}  // namespace hvd
