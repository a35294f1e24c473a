#include "message.h"

#include <sstream>

namespace hvd {

namespace {

// A list of int64 lists: a u32 count, then each list as putInt64s writes it.
void putInt64Lists(Writer& w, const std::vector<std::vector<int64_t>>& lists) {
  w.put<uint32_t>(static_cast<uint32_t>(lists.size()));
  for (const auto& values : lists) w.putInt64s(values);
}

std::vector<std::vector<int64_t>> getInt64Lists(Reader& r) {
  std::vector<std::vector<int64_t>> lists(r.getCount(sizeof(uint32_t)));
  for (auto& values : lists) values = r.getInt64s();
  return lists;
}

// An enum's byte off the wire: one of its values [0, last], else a WireError.
// An unknown value must not reach the switches and tables downstream: an
// unknown dtype gave the coordinator's inline reduction a null function.
template <typename E>
E getEnum(Reader& r, E last, const char* what) {
  const uint8_t v = r.get<uint8_t>();
  if (v > static_cast<uint8_t>(last))
    throw WireError(std::string("unknown ") + what + " " + std::to_string(v) +
                    " in control message");
  return static_cast<E>(v);
}

// A shape off the wire: no negative dimension, and every product that
// numElements() and rowElements() form on the way (from the first dimension,
// and from the second) fits in int64, so both are defined for every decoded
// shape (a signed overflow is undefined behaviour, and a size from it garbage).
void checkShape(const int64_t* dims, size_t n) {
  int64_t all = 1;
  int64_t row = 1;
  for (size_t i = 0; i < n; ++i) {
    if (dims[i] < 0) throw WireError("negative dimension in control message");
    if (__builtin_mul_overflow(all, dims[i], &all) ||
        (i > 0 && __builtin_mul_overflow(row, dims[i], &row)))
      throw WireError("shape too large in control message");
  }
}

}  // namespace

ShapeList::ShapeList(std::initializer_list<std::vector<int64_t>> shapes) {
  for (const auto& shape : shapes) add(shape.data(), shape.size());
}

void ShapeList::reserve(size_t shapes, size_t dims) {
  ends_.reserve(shapes);
  dims_.reserve(dims);
}

void ShapeList::add(const int64_t* dims, size_t count) {
  dims_.insert(dims_.end(), dims, dims + count);
  ends_.push_back(dims_.size());
}

std::vector<int64_t> ShapeList::operator[](size_t i) const {
  const size_t begin = i == 0 ? 0 : ends_[i - 1];
  return std::vector<int64_t>(dims_.begin() + begin, dims_.begin() + ends_[i]);
}

void ShapeList::encode(Writer& w) const {
  w.put<uint32_t>(static_cast<uint32_t>(size()));
  size_t begin = 0;
  for (size_t end : ends_) {
    w.put<uint32_t>(static_cast<uint32_t>(end - begin));
    w.append(dims_.data() + begin, (end - begin) * sizeof(int64_t));
    begin = end;
  }
}

ShapeList ShapeList::decode(Reader& r) {
  ShapeList list;
  const uint32_t n = r.getCount(sizeof(uint32_t));
  list.ends_.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    const std::vector<int64_t> dims = r.getInt64s();
    checkShape(dims.data(), dims.size());
    list.add(dims.data(), dims.size());
  }
  return list;
}

int64_t Request::numElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t Request::rowElements() const {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

std::string Request::shapeString() const {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

std::string Request::deviceString() const {
  if (device < 0) return "cpu";
  return "cuda:" + std::to_string(device) + " (" + planeName(plane) + ")";
}

void Request::encode(Writer& w) const {
  w.put<uint8_t>(static_cast<uint8_t>(type));
  w.put<uint8_t>(static_cast<uint8_t>(dtype));
  w.put<uint8_t>(static_cast<uint8_t>(reduce_op));
  w.put<int32_t>(root_rank);
  w.put<int32_t>(process_set);
  w.put<double>(prescale);
  w.put<double>(postscale);
  w.putString(name);
  w.putInt64s(shape);
  // The type's own field, if it has one (message.h).
  switch (type) {
    case OpType::kAllreduce:
      bundle_shapes.encode(w);
      break;
    case OpType::kAlltoall:
      w.putInt64s(send_splits);
      break;
    case OpType::kAddProcessSet:
      w.putInt64s(set_ranks);
      break;
    case OpType::kRemoveProcessSet:
      w.put<int32_t>(set_id);
      break;
    case OpType::kAllgather:
    case OpType::kBroadcast:
    case OpType::kBarrier:
    case OpType::kReducescatter:
    case OpType::kJoin:
      break;
  }
  w.putString(group);
  w.put<int32_t>(group_size);
  w.put<int32_t>(device);
  w.put<uint8_t>(static_cast<uint8_t>(plane));
  w.put<uint8_t>(single_use ? 1 : 0);
}

Request Request::decode(Reader& r) {
  Request q;
  q.type = getEnum(r, OpType::kRemoveProcessSet, "op type");
  q.dtype = getEnum(r, DataType::kBool, "dtype");
  q.reduce_op = getEnum(r, ReduceOp::kProduct, "reduce op");
  q.root_rank = r.get<int32_t>();
  q.process_set = r.get<int32_t>();
  q.prescale = r.get<double>();
  q.postscale = r.get<double>();
  q.name = r.getString();
  q.shape = r.getInt64s();
  checkShape(q.shape.data(), q.shape.size());
  switch (q.type) {
    case OpType::kAllreduce:
      q.bundle_shapes = ShapeList::decode(r);
      break;
    case OpType::kAlltoall:
      q.send_splits = r.getInt64s();
      break;
    case OpType::kAddProcessSet:
      q.set_ranks = r.getInt64s();
      break;
    case OpType::kRemoveProcessSet:
      q.set_id = r.get<int32_t>();
      break;
    default:  // the other types: nothing more
      break;
  }
  q.group = r.getString();
  q.group_size = r.get<int32_t>();
  q.device = r.get<int32_t>();
  q.plane = getEnum(r, Plane::kDevice, "plane");
  q.single_use = r.get<uint8_t>() != 0;
  return q;
}

bool Request::operator==(const Request& o) const {
  return type == o.type && dtype == o.dtype && reduce_op == o.reduce_op &&
         root_rank == o.root_rank && process_set == o.process_set &&
         prescale == o.prescale && postscale == o.postscale && name == o.name &&
         shape == o.shape && send_splits == o.send_splits &&
         bundle_shapes == o.bundle_shapes && set_ranks == o.set_ranks && set_id == o.set_id &&
         group == o.group && group_size == o.group_size && device == o.device &&
         plane == o.plane && single_use == o.single_use;
}

void Response::encode(Writer& w) const {
  w.put<uint8_t>(kind);
  w.put<uint8_t>(static_cast<uint8_t>(type));
  w.put<uint32_t>(static_cast<uint32_t>(names.size()));
  for (const auto& n : names) w.putString(n);
  w.put<int32_t>(process_set);
  switch (type) {
    case OpType::kAllgather:
      putInt64Lists(w, rank_first_dims);
      break;
    case OpType::kAlltoall:
      putInt64Lists(w, alltoall_splits);
      break;
    case OpType::kAddProcessSet:
      w.put<int32_t>(new_set_id);
      break;
    case OpType::kJoin:
      w.put<int32_t>(last_joined_rank);
      break;
    case OpType::kAllreduce:
    case OpType::kBroadcast:
    case OpType::kBarrier:
    case OpType::kReducescatter:
    case OpType::kRemoveProcessSet:
      break;
  }
  w.put<uint32_t>(static_cast<uint32_t>(cache_ids.size()));
  for (int32_t id : cache_ids) w.put<int32_t>(id);
  w.put<uint8_t>(error_code);
  w.putString(error);
  w.putString(inline_result);
  w.put<int32_t>(contributors);
  w.put<uint32_t>(static_cast<uint32_t>(templates.size()));
  for (const auto& q : templates) q.encode(w);
}

Response Response::decode(Reader& r) {
  Response p;
  p.kind = getEnum(r, kDone, "response kind");
  p.type = getEnum(r, OpType::kRemoveProcessSet, "op type");
  p.names.resize(r.getCount(sizeof(uint32_t)));
  for (auto& n : p.names) n = r.getString();
  p.process_set = r.get<int32_t>();
  switch (p.type) {
    case OpType::kAllgather:
      p.rank_first_dims = getInt64Lists(r);
      break;
    case OpType::kAlltoall:
      p.alltoall_splits = getInt64Lists(r);
      break;
    case OpType::kAddProcessSet:
      p.new_set_id = r.get<int32_t>();
      break;
    case OpType::kJoin:
      p.last_joined_rank = r.get<int32_t>();
      break;
    default:  // the other types: nothing more
      break;
  }
  p.cache_ids.resize(r.getCount(sizeof(int32_t)));
  for (auto& id : p.cache_ids) id = r.get<int32_t>();
  const uint8_t code = r.get<uint8_t>();
  if (!isStatusCode(code)) throw WireError("unknown status code " + std::to_string(code));
  p.error_code = static_cast<Status::Code>(code);
  p.error = r.getString();
  p.inline_result = r.getString();
  p.contributors = r.get<int32_t>();
  p.templates.resize(r.getCount(Request::kMinEncodedBytes));
  for (auto& q : p.templates) q = Request::decode(r);
  return p;
}

std::string bundleMemberName(const std::string& group, size_t index) {
  return group + "." + std::to_string(index);
}

std::string tableKey(int32_t process_set, const std::string& name) {
  // The global set keeps bare names, so jobs without process sets see no change.
  if (process_set == 0) return name;
  return std::to_string(process_set) + "|" + name;
}

}  // namespace hvd
