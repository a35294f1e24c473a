// What ranks tell the coordinator (Request) and what it answers (Response),
// with their wire encoding. See docs/architecture.md, "Negotiation".
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "types.h"
#include "wire.h"

namespace hvd {

// A list of shapes, held flat in two vectors: a bundle's request is built on
// every rank, and copied by the coordinator, at every step, and a vector per
// member made that 7 us instead of 0.4 us for 100 members (a bundle of 100 x
// 1 KiB takes about 35 us in all).
class ShapeList {
 public:
  ShapeList() = default;
  ShapeList(std::initializer_list<std::vector<int64_t>> shapes);

  void reserve(size_t shapes, size_t dims);
  void add(const int64_t* dims, size_t count);
  size_t size() const { return ends_.size(); }
  bool empty() const { return ends_.empty(); }
  // The i-th shape (i < size()).
  std::vector<int64_t> operator[](size_t i) const;
  bool operator==(const ShapeList& o) const { return ends_ == o.ends_ && dims_ == o.dims_; }
  bool operator!=(const ShapeList& o) const { return !(*this == o); }

  // A u32 count, then each shape as Writer::putInt64s writes it.
  void encode(Writer& w) const;
  static ShapeList decode(Reader& r);

 private:
  std::vector<int64_t> dims_;  // every shape's dimensions, in order
  std::vector<size_t> ends_;   // shape i is dims_[ends_[i - 1], ends_[i])
};

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
  // What one type of op carries besides the above. The wire carries only the
  // field of the request's type: a decoded request has the others empty.
  // kAlltoall: rows of the first dimension this rank sends to each rank.
  std::vector<int64_t> send_splits;
  // kAllreduce of a bundle (a grouped allreduce submitted as one op, whose
  // shape is {total elements}): its members' shapes, in order; empty for a
  // plain allreduce.
  ShapeList bundle_shapes;
  // kAddProcessSet: the new set's global ranks, as the caller gave them.
  std::vector<int64_t> set_ranks;
  // kRemoveProcessSet: the set to remove.
  int32_t set_id = 0;
  // Grouped ops: members of one group are negotiated and run as a unit.
  std::string group;       // empty: not grouped
  int32_t group_size = 0;  // members in the group
  // Where the tensor lives on this rank (-1: host, else a CUDA device index;
  // ranks may use different indices) and the plane that moves it.
  int32_t device = -1;
  Plane plane = Plane::kHost;
  // A name made for this one op (an unnamed op's, a torch.distributed op's):
  // it never comes again, so a response-cache slot would only fill the cache.
  bool single_use = false;

  int64_t numElements() const;
  size_t numBytes() const { return static_cast<size_t>(numElements()) * dataTypeSize(dtype); }
  // Elements per first-dimension row (allgather concatenates rows).
  int64_t rowElements() const;
  std::string shapeString() const;
  // "cpu", "cuda:1 (nccl)", "cuda:0 (host-staged)": for error messages.
  std::string deviceString() const;

  bool isBundle() const { return type == OpType::kAllreduce && !bundle_shapes.empty(); }

  void encode(Writer& w) const;
  // Throws WireError for a cut encoding, a count larger than what follows,
  // a value no enum has, a negative dimension or a shape whose element count
  // overflows int64.
  static Request decode(Reader& r);
  bool operator==(const Request& o) const;
  // The fewest bytes an encoding takes (every string and list empty): a
  // count of requests read off the wire is checked against what can follow
  // (Reader::getCount) before anything is allocated for it.
  static constexpr size_t kMinEncodedBytes = 3 + 4 + 4 + 8 + 8 + 4 + 4 + 4 + 4 + 4 + 1 + 1;
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
  // What one type of response carries; as in Request, only the field of the
  // response's type is on the wire.
  // kAllgather: each rank's first dimension (set order), one list per name.
  std::vector<std::vector<int64_t>> rank_first_dims;
  // kAlltoall: every rank's send_splits, one matrix per name, row-major
  // (ranks x ranks in set order): rank s sends [s * ranks + d] rows to rank d.
  std::vector<std::vector<int64_t>> alltoall_splits;
  // kAddProcessSet (kDone): the id the coordinator gave the new set.
  int32_t new_set_id = 0;
  // kJoin (kDone): the rank that joined last.
  int32_t last_joined_rank = -1;
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
  // As Request::kMinEncodedBytes.
  static constexpr size_t kMinEncodedBytes = 2 + 4 + 4 + 4 + 1 + 4 + 4 + 4 + 4;
};

// Ranks may use one name in two process sets at once: tables keyed by name
// (in flight on a rank, waiting at the coordinator) use this key.
std::string tableKey(int32_t process_set, const std::string& name);

}  // namespace hvd
