#include "message.h"

#include <algorithm>
#include <sstream>

namespace hvd {

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
  w.putInt64s(splits);
  w.putString(group);
  w.put<int32_t>(group_size);
  w.put<int32_t>(device);
  w.put<uint8_t>(static_cast<uint8_t>(plane));
}

Request Request::decode(Reader& r) {
  Request q;
  q.type = static_cast<OpType>(r.get<uint8_t>());
  q.dtype = static_cast<DataType>(r.get<uint8_t>());
  q.reduce_op = static_cast<ReduceOp>(r.get<uint8_t>());
  q.root_rank = r.get<int32_t>();
  q.process_set = r.get<int32_t>();
  q.prescale = r.get<double>();
  q.postscale = r.get<double>();
  q.name = r.getString();
  q.shape = r.getInt64s();
  q.splits = r.getInt64s();
  q.group = r.getString();
  q.group_size = r.get<int32_t>();
  q.device = r.get<int32_t>();
  q.plane = static_cast<Plane>(r.get<uint8_t>());
  return q;
}

bool Request::operator==(const Request& o) const {
  return type == o.type && dtype == o.dtype && reduce_op == o.reduce_op &&
         root_rank == o.root_rank && process_set == o.process_set &&
         prescale == o.prescale && postscale == o.postscale && name == o.name &&
         shape == o.shape && splits == o.splits && group == o.group &&
         group_size == o.group_size && device == o.device && plane == o.plane;
}

void Response::encode(Writer& w) const {
  w.put<uint8_t>(kind);
  w.put<uint8_t>(static_cast<uint8_t>(type));
  w.put<uint32_t>(static_cast<uint32_t>(names.size()));
  for (const auto& n : names) w.putString(n);
  w.put<int32_t>(process_set);
  w.put<uint32_t>(static_cast<uint32_t>(first_dims.size()));
  for (const auto& dims : first_dims) {
    w.put<uint32_t>(static_cast<uint32_t>(dims.size()));
    for (int64_t d : dims) w.put<int64_t>(d);
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
  p.kind = static_cast<Kind>(r.get<uint8_t>());
  p.type = static_cast<OpType>(r.get<uint8_t>());
  p.names.resize(r.getCount(sizeof(uint32_t)));
  for (auto& n : p.names) n = r.getString();
  p.process_set = r.get<int32_t>();
  p.first_dims.resize(r.getCount(sizeof(uint32_t)));
  for (auto& dims : p.first_dims) {
    dims.resize(r.getCount(sizeof(int64_t)));
    for (auto& d : dims) d = r.get<int64_t>();
  }
  p.cache_ids.resize(r.getCount(sizeof(int32_t)));
  for (auto& id : p.cache_ids) id = r.get<int32_t>();
  const uint8_t code = r.get<uint8_t>();
  if (!isStatusCode(code)) throw WireError("unknown status code " + std::to_string(code));
  p.error_code = static_cast<Status::Code>(code);
  p.error = r.getString();
  p.inline_result = r.getString();
  p.contributors = r.get<int32_t>();
  p.templates.resize(r.getCount(1));
  for (auto& q : p.templates) q = Request::decode(r);
  return p;
}

std::vector<std::vector<int64_t>> Request::memberShapes() const {
  std::vector<std::vector<int64_t>> shapes;
  if (splits.empty()) return shapes;
  size_t at = 1;
  for (int64_t i = 0; i < splits[0] && at < splits.size(); ++i) {
    const size_t rank = static_cast<size_t>(splits[at++]);
    const size_t end = std::min(splits.size(), at + rank);
    shapes.emplace_back(splits.begin() + at, splits.begin() + end);
    at = end;
  }
  return shapes;
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
