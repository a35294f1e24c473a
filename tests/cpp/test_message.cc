// Request and Response wire encoding (csrc/core/message.h): every field
// survives a round trip, and a frame that is cut short or carries an absurd
// count throws WireError instead of reading past the end.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "check.h"
#include "core/message.h"
#include "core/response_cache.h"

using namespace hvd;

namespace {

Request sampleRequest() {
  Request q;
  q.type = OpType::kBroadcast;
  q.dtype = DataType::kBFloat16;
  q.reduce_op = ReduceOp::kProduct;
  q.root_rank = 3;
  q.process_set = 7;
  q.prescale = 0.25;
  q.postscale = -1e300;
  q.name = "grad/layer.0/weight";
  q.shape = {2, 0, 5, int64_t{1} << 40};
  q.device = 1;
  q.plane = Plane::kDevice;
  return q;
}

std::string encode(const Request& q) {
  Writer w;
  q.encode(w);
  return std::move(w.buffer());
}

std::string encode(const Response& p) {
  Writer w;
  p.encode(w);
  return std::move(w.buffer());
}

Request decodeRequest(const std::string& bytes) {
  Reader r(bytes);
  return Request::decode(r);
}

Response decodeResponse(const std::string& bytes) {
  Reader r(bytes);
  return Response::decode(r);
}

// Decodes what `m` encodes, checking that the decoder read every byte.
template <typename Message>
Message roundTrip(const Message& m) {
  std::string bytes = encode(m);
  Reader r(bytes);
  Message back = Message::decode(r);
  CHECK(r.done());
  return back;
}

void checkSameResponse(const Response& a, const Response& b) {
  CHECK_EQ(a.kind, b.kind);
  CHECK_EQ(a.type, b.type);
  CHECK_EQ(a.names, b.names);
  CHECK_EQ(a.rank_first_dims, b.rank_first_dims);
  CHECK_EQ(a.alltoall_splits, b.alltoall_splits);
  CHECK_EQ(a.new_set_id, b.new_set_id);
  CHECK_EQ(a.last_joined_rank, b.last_joined_rank);
  CHECK_EQ(a.cache_ids, b.cache_ids);
  CHECK_EQ(a.error_code, b.error_code);
  CHECK_EQ(a.error, b.error);
  CHECK_EQ(a.inline_result, b.inline_result);
  CHECK_EQ(a.contributors, b.contributors);
  CHECK_EQ(a.templates.size(), b.templates.size());
  for (size_t i = 0; i < a.templates.size() && i < b.templates.size(); ++i)
    CHECK(a.templates[i] == b.templates[i]);
}

// One request per type that carries a payload of its own, each set.
std::vector<Request> requestsWithPayloads() {
  Request bundle = sampleRequest();
  bundle.type = OpType::kAllreduce;
  bundle.shape = {11};
  bundle.bundle_shapes = {{2, 3}, {}, {4}, {int64_t{1} << 33}};
  Request a2a = sampleRequest();
  a2a.type = OpType::kAlltoall;
  a2a.send_splits = {3, 0, int64_t{1} << 36};
  a2a.single_use = true;  // and the flag every type carries
  Request add;
  add.type = OpType::kAddProcessSet;
  add.name = "add_process_set.0";
  add.set_ranks = {0, 2, 5};
  Request remove;
  remove.type = OpType::kRemoveProcessSet;
  remove.name = "remove_process_set.0";
  remove.set_id = 0x12345678;
  return {bundle, a2a, add, remove};
}

// One response per type that carries a payload of its own, each set.
std::vector<Response> responsesWithPayloads() {
  Response gather;
  gather.type = OpType::kAllgather;
  gather.names = {"a", "bb"};
  gather.rank_first_dims = {{1, 0, 3}, {int64_t{1} << 35, 2, 2}};
  gather.cache_ids = {0, -1};
  Response a2a;
  a2a.type = OpType::kAlltoall;
  a2a.names = {"x"};
  a2a.alltoall_splits = {{1, 2, 3, 0}};  // 2 ranks: rank 0 sends 1, 2; rank 1 sends 3, 0
  a2a.cache_ids = {7};
  Response add;
  add.kind = Response::kDone;
  add.type = OpType::kAddProcessSet;
  add.names = {"add_process_set.0"};
  add.new_set_id = 0x7654321;
  Response join;
  join.kind = Response::kDone;
  join.type = OpType::kJoin;
  join.names = {"join"};
  join.last_joined_rank = 0x1234;
  return {gather, a2a, add, join};
}

// Runs `body` in a child process whose address space is capped at `limit`
// bytes, so an allocation sized by a corrupt count fails quickly instead of
// taking the machine's memory. Returns the child's exit code.
int inChildWithMemoryLimit(size_t limit, int (*body)()) {
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    rlimit lim{limit, limit};
    setrlimit(RLIMIT_AS, &lim);
    _exit(body());
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

// 0: WireError, 1: decoded without error, 2: std::bad_alloc, 3: other.
template <typename Decode>
int classify(Decode decode) {
  try {
    decode();
    return 1;
  } catch (const WireError&) {
    return 0;
  } catch (const std::bad_alloc&) {
    return 2;
  } catch (...) {
    return 3;
  }
}

}  // namespace

TEST(request_round_trip_keeps_every_field) {
  Request q = sampleRequest();
  std::string bytes = encode(q);
  Reader r(bytes);
  Request back = Request::decode(r);
  CHECK(r.done());
  CHECK(back == q);
  CHECK_EQ(back.type, q.type);
  CHECK_EQ(back.dtype, q.dtype);
  CHECK_EQ(back.reduce_op, q.reduce_op);
  CHECK_EQ(back.root_rank, 3);
  CHECK_EQ(back.process_set, 7);
  CHECK_EQ(back.prescale, 0.25);
  CHECK_EQ(back.postscale, -1e300);
  CHECK_EQ(back.name, q.name);
  CHECK_EQ(back.shape, q.shape);
  CHECK_EQ(back.device, q.device);
  CHECK_EQ(back.plane, q.plane);
}

TEST(request_device_and_plane_round_trip_and_compare) {
  Request q = sampleRequest();
  q.device = 3;
  q.plane = Plane::kStaged;
  Request back = decodeRequest(encode(q));
  CHECK(back == q);
  CHECK_EQ(back.device, 3);
  CHECK_EQ(back.plane, Plane::kStaged);
  CHECK_EQ(back.deviceString(), std::string("cuda:3 (host-staged)"));
  Request cpu = q;
  cpu.device = -1;
  cpu.plane = Plane::kHost;
  CHECK(!(cpu == q));
  CHECK_EQ(cpu.deviceString(), std::string("cpu"));
}

TEST(request_round_trip_scalar_and_every_enum_value) {
  for (uint8_t t = 0; t <= static_cast<uint8_t>(OpType::kBarrier); ++t) {
    for (uint8_t d = 0; d <= static_cast<uint8_t>(DataType::kBool); ++d) {
      for (uint8_t o = 0; o <= static_cast<uint8_t>(ReduceOp::kProduct); ++o) {
        Request q;
        q.type = static_cast<OpType>(t);
        q.dtype = static_cast<DataType>(d);
        q.reduce_op = static_cast<ReduceOp>(o);
        q.name = "";  // empty name and scalar shape are legal
        q.shape = {};
        Request back = decodeRequest(encode(q));
        CHECK(back == q);
      }
    }
  }
}

TEST(request_operator_eq_sees_each_field) {
  const Request a = sampleRequest();
  Request b = a;
  CHECK(a == b);
  b = a;
  b.type = OpType::kAllgather;
  CHECK(!(a == b));
  b = a;
  b.dtype = DataType::kFloat16;
  CHECK(!(a == b));
  b = a;
  b.reduce_op = ReduceOp::kSum;
  CHECK(!(a == b));
  b = a;
  b.root_rank = 0;
  CHECK(!(a == b));
  b = a;
  b.process_set = 0;
  CHECK(!(a == b));
  b = a;
  b.prescale = 0.5;
  CHECK(!(a == b));
  b = a;
  b.postscale = 1.0;
  CHECK(!(a == b));
  b = a;
  b.name = "other";
  CHECK(!(a == b));
  b = a;
  b.shape.pop_back();
  CHECK(!(a == b));
}

TEST(request_sizes_and_shape_string) {
  Request q;
  q.dtype = DataType::kFloat64;
  q.shape = {3, 4, 5};
  CHECK_EQ(q.numElements(), 60);
  CHECK_EQ(q.numBytes(), 480u);
  CHECK_EQ(q.rowElements(), 20);
  CHECK_EQ(q.shapeString(), "[3, 4, 5]");
  q.shape = {};
  CHECK_EQ(q.numElements(), 1);  // a scalar holds one element
  CHECK_EQ(q.rowElements(), 1);
  CHECK_EQ(q.shapeString(), "[]");
  q.shape = {7, 0};
  CHECK_EQ(q.numElements(), 0);
  CHECK_EQ(q.rowElements(), 0);
}

TEST(a_bundle_is_an_allreduce_with_member_shapes) {
  Request q;
  q.name = "grads";
  CHECK(!q.isBundle());
  q.bundle_shapes = {{2, 3}, {}, {4}};  // [2, 3], a scalar, [4]
  q.shape = {11};
  CHECK(q.isBundle());
  const ShapeList& shapes = q.bundle_shapes;
  CHECK_EQ(shapes.size(), size_t{3});
  CHECK_EQ(shapes[0], (std::vector<int64_t>{2, 3}));
  CHECK(shapes[1].empty());
  CHECK_EQ(shapes[2], (std::vector<int64_t>{4}));
  ShapeList built;
  built.reserve(3, 3);
  const int64_t dims[] = {2, 3, 4};
  built.add(dims, 2);
  built.add(dims, 0);
  CHECK(built != shapes);
  built.add(dims + 2, 1);
  CHECK(built == shapes);
  CHECK(!(ShapeList{{2}, {3}} == ShapeList{{2, 3}}));  // where one shape ends counts
  CHECK_EQ(bundleMemberName(q.name, 2), std::string("grads.2"));
  q.type = OpType::kAlltoall;
  CHECK(!q.isBundle());
}

TEST(request_round_trip_keeps_each_types_payload) {
  for (const Request& q : requestsWithPayloads()) {
    Request back = roundTrip(q);
    CHECK(back == q);
    CHECK(back.bundle_shapes == q.bundle_shapes);
    CHECK_EQ(back.send_splits, q.send_splits);
    CHECK_EQ(back.set_ranks, q.set_ranks);
    CHECK_EQ(back.set_id, q.set_id);
    CHECK_EQ(back.name, q.name);
    CHECK_EQ(back.single_use, q.single_use);
  }
}

TEST(request_operator_eq_sees_each_payload) {
  for (const Request& a : requestsWithPayloads()) {
    Request b = a;
    b.bundle_shapes = {{1}};
    CHECK(!(a == b));
    b = a;
    b.send_splits.push_back(1);
    CHECK(!(a == b));
    b = a;
    b.set_ranks.push_back(1);
    CHECK(!(a == b));
    b = a;
    b.set_id += 1;
    CHECK(!(a == b));
    b = a;
    b.single_use = !a.single_use;
    CHECK(!(a == b));
  }
}

TEST(response_round_trip_keeps_each_types_payload) {
  for (const Response& p : responsesWithPayloads()) checkSameResponse(roundTrip(p), p);
}

// A payload travels only with its type: another type's frame has no room
// for it, and the decoder reads none.
TEST(payloads_of_other_types_stay_off_the_wire) {
  Request plain = sampleRequest();  // a broadcast
  Request with = plain;
  with.bundle_shapes = {{1}};
  with.send_splits = {1};
  with.set_ranks = {1};
  with.set_id = 1;
  CHECK_EQ(encode(with), encode(plain));
  Response done;
  done.kind = Response::kDone;
  done.type = OpType::kBarrier;
  Response extra = done;
  extra.rank_first_dims = {{1}};
  extra.alltoall_splits = {{1}};
  extra.new_set_id = 3;
  extra.last_joined_rank = 2;
  CHECK_EQ(encode(extra), encode(done));
}

TEST(response_round_trip_fused_cache_ids) {
  Response p;
  p.type = OpType::kAllreduce;
  for (int i = 0; i < 100; ++i) {
    p.names.push_back("t" + std::to_string(i));
    p.cache_ids.push_back(i % 3 == 0 ? -1 : 1000 + i);
  }
  checkSameResponse(decodeResponse(encode(p)), p);
}

TEST(response_round_trip_inline_result_is_binary_safe) {
  Response p;
  p.kind = Response::kInline;
  p.names = {"small"};
  p.cache_ids = {4};
  for (int i = 0; i < 1024; ++i) p.inline_result.push_back(static_cast<char>(i & 0xff));
  Response back = decodeResponse(encode(p));
  checkSameResponse(back, p);
  CHECK_EQ(back.inline_result.size(), 1024u);
  CHECK_EQ(back.inline_result[0], '\0');
}

TEST(response_round_trip_error_and_done) {
  Response e;
  e.kind = Response::kError;
  e.type = OpType::kBroadcast;
  e.names = {"x"};
  e.cache_ids = {-1};
  e.error = "broadcast 'x': mismatched root ranks across ranks: rank 0 0, rank 1 1";
  checkSameResponse(decodeResponse(encode(e)), e);
  CHECK_EQ(decodeResponse(encode(e)).errorStatus().code, Status::kRefused);  // the default
  // The kind travels with the message: a failure the coordinator found in
  // its own state is a bug, which no caller should retry.
  e.error_code = Status::kInternal;
  CHECK_EQ(decodeResponse(encode(e)).errorStatus().code, Status::kInternal);
  e.error_code = Status::kInvalidArgument;
  CHECK_EQ(decodeResponse(encode(e)).error_code, Status::kInvalidArgument);

  Response d;
  d.kind = Response::kDone;
  d.type = OpType::kBarrier;
  d.names = {"barrier.0"};
  checkSameResponse(decodeResponse(encode(d)), d);

  Response empty;
  checkSameResponse(decodeResponse(encode(empty)), empty);
}

TEST(response_with_an_unknown_status_code_is_a_wire_error) {
  Response e;
  e.kind = Response::kError;
  e.names = {"x"};
  e.error = "bad";
  std::string bytes = encode(e);
  // The code sits right before the error string's u32 length and its bytes.
  const size_t at = bytes.size() - e.inline_result.size() - 4 - 4 - 4 - e.error.size() - 4 - 1;
  CHECK_EQ(static_cast<int>(static_cast<uint8_t>(bytes[at])), static_cast<int>(Status::kRefused));
  bytes[at] = static_cast<char>(99);
  bool threw = false;
  try {
    decodeResponse(bytes);
  } catch (const WireError&) {
    threw = true;
  }
  CHECK(threw);
}

TEST(several_messages_back_to_back_in_one_frame) {
  Writer w;
  Request q = sampleRequest();
  Response p;
  p.names = {"n"};
  p.cache_ids = {2};
  q.encode(w);
  p.encode(w);
  q.encode(w);
  Reader r(w.buffer());
  CHECK(Request::decode(r) == q);
  checkSameResponse(Response::decode(r), p);
  CHECK(Request::decode(r) == q);
  CHECK(r.done());
}

TEST(truncated_request_throws_wire_error_at_every_length) {
  std::vector<Request> requests = requestsWithPayloads();
  requests.push_back(sampleRequest());
  for (const Request& q : requests) {
    std::string bytes = encode(q);
    for (size_t n = 0; n < bytes.size(); ++n) {
      std::string cut = bytes.substr(0, n);
      CHECK_THROWS(decodeRequest(cut), WireError);
    }
  }
}

TEST(truncated_response_throws_wire_error_at_every_length) {
  Response p;
  p.kind = Response::kInline;
  p.type = OpType::kAllgather;
  p.names = {"a", "b"};
  p.rank_first_dims = {{1, 2}, {3, 4}};
  p.cache_ids = {5, 6};
  p.error = "err";
  p.inline_result = "data";
  p.templates = requestsWithPayloads();
  std::vector<Response> responses = responsesWithPayloads();
  responses.push_back(p);
  for (const Response& one : responses) {
    std::string bytes = encode(one);
    checkSameResponse(decodeResponse(bytes), one);
    for (size_t n = 0; n < bytes.size(); ++n) {
      std::string cut = bytes.substr(0, n);
      CHECK_THROWS(decodeResponse(cut), WireError);
    }
  }
}

TEST(reader_primitives) {
  Writer w;
  w.put<uint8_t>(0xab);
  w.put<int64_t>(-2);
  w.putString("hi");
  w.putBytes("\0\1\2", 3);
  CHECK_EQ(w.size(), 1u + 8 + 4 + 2 + 4 + 3);
  Reader r(w.buffer());
  CHECK_EQ(r.get<uint8_t>(), 0xab);
  CHECK_EQ(r.get<int64_t>(), -2);
  CHECK_EQ(r.getString(), "hi");
  uint32_t n = 0;
  const char* p = r.getBytes(&n);
  CHECK_EQ(n, 3u);
  CHECK_EQ(std::string(p, n), std::string("\0\1\2", 3));
  CHECK(r.done());
  CHECK_THROWS(r.get<uint8_t>(), WireError);
  // Little-endian on the wire.
  CHECK_EQ(static_cast<uint8_t>(w.buffer()[1]), 0xfe);
}

TEST(string_length_beyond_the_frame_throws_wire_error) {
  Writer w;
  w.put<uint32_t>(0xffffffffu);
  w.append("abc", 3);
  Reader r(w.buffer());
  CHECK_THROWS(r.getString(), WireError);
}

// A frame whose element count is corrupt (here the shape's rank or the names
// count says 2^32 - 1 with nothing after it) must fail as a malformed frame,
// like a truncated one. The decoders size their vectors from the count before
// reading, so the failure is whatever a 32 to 128 GiB allocation does on this
// machine; under a 1 GiB address-space cap that is std::bad_alloc.
TEST(corrupt_count_throws_wire_error_not_a_huge_allocation) {
  constexpr size_t kCap = size_t{1} << 30;
  int shape = inChildWithMemoryLimit(kCap, [] {
    Writer w;
    Request q;
    q.name = "x";
    q.shape = {};
    q.encode(w);
    std::string bytes = w.buffer();
    uint32_t huge = 0xffffffffu;
    // The shape's dim count (4 bytes), followed by an allreduce's empty
    // bundle_shapes (4), an empty group name (4), the group size (4), the
    // device (4) and the plane (1).
    std::memcpy(&bytes[bytes.size() - 21], &huge, 4);
    return classify([&] { decodeRequest(bytes); });
  });
  if (!CHECK_EQ(shape, 0)) std::printf("  (Request shape count: 1 = no error, 2 = bad_alloc)\n");

  int names = inChildWithMemoryLimit(kCap, [] {
    Writer w;
    w.put<uint8_t>(0);
    w.put<uint8_t>(0);
    w.put<uint32_t>(0xffffffffu);  // names count
    return classify([&] { decodeResponse(w.buffer()); });
  });
  if (!CHECK_EQ(names, 0)) std::printf("  (Response names count: 1 = no error, 2 = bad_alloc)\n");
}

// What a peer's bytes may not carry past the decoder (tests/fuzz found both):
// a value no enum has (an unknown dtype gave the coordinator's inline
// reduction a null function) and a shape whose element count overflows
// int64 (undefined behaviour in numElements()).
TEST(unknown_enum_values_and_overflowing_shapes_are_wire_errors) {
  Request q;
  q.name = "x";
  q.shape = {2};
  Writer w;
  q.encode(w);
  const std::string good = w.buffer();
  CHECK(decodeRequest(good) == q);
  // type, dtype, reduce op: the first three bytes; the plane: 2 from the end.
  for (size_t at : {size_t{0}, size_t{1}, size_t{2}, good.size() - 2}) {
    std::string bad = good;
    bad[at] = 99;
    CHECK_THROWS(decodeRequest(bad), WireError);
  }
  for (const auto& shape : std::vector<std::vector<int64_t>>{
           {-1}, {3, -2}, {int64_t{1} << 32, int64_t{1} << 32}, {int64_t{1} << 62, 4, 0},
           {0, int64_t{1} << 40, int64_t{1} << 40}}) {
    Request s = q;
    s.shape = shape;
    Writer sw;
    s.encode(sw);
    CHECK_THROWS(decodeRequest(sw.buffer()), WireError);
    Request b = q;
    b.bundle_shapes = ShapeList{shape};
    Writer bw;
    b.encode(bw);
    CHECK_THROWS(decodeRequest(bw.buffer()), WireError);
  }
  Request big = q;
  big.shape = {int64_t{1} << 31, int64_t{1} << 31};  // 2^62 elements: fits
  Writer bw;
  big.encode(bw);
  CHECK_EQ(decodeRequest(bw.buffer()).numElements(), int64_t{1} << 62);
  Response p;
  Writer pw;
  p.encode(pw);
  std::string bad = pw.buffer();
  bad[0] = 4;  // no such response kind
  CHECK_THROWS(decodeResponse(bad), WireError);
  bad = pw.buffer();
  bad[1] = 9;  // no such op type
  CHECK_THROWS(decodeResponse(bad), WireError);
}

TEST(rank_cache_holds_one_slot_per_name) {
  Request q = sampleRequest();
  RankCache cache;
  CHECK_EQ(cache.lookup("n", q), -1);
  cache.remember("n", q, 9);
  CHECK_EQ(cache.lookup("n", q), 9);
  CHECK_EQ(cache.lookup("m", q), -1);
  Request other = q;
  other.shape[0] = 3;
  CHECK_EQ(cache.lookup("n", other), -1);  // same name, another request: a miss
  cache.remember("n", other, 11);          // its new slot replaces the old one
  CHECK_EQ(cache.lookup("n", other), 11);
  CHECK_EQ(cache.lookup("n", q), -1);
  CHECK_EQ(cache.size(), 1u);
}

TEST(coordinator_cache_slots_are_dense_and_bounded) {
  CoordinatorCache cache(2);
  Request q = sampleRequest();
  CHECK_EQ(cache.insert("a", {q, q}), 0);
  CHECK_EQ(cache.insert("b", {q}), 1);
  CHECK_EQ(cache.insert("c", {q}), -1);  // full
  CHECK_EQ(cache.size(), 2u);
  if (CHECK(cache.find(0) != nullptr)) CHECK_EQ(cache.find(0)->size(), 2u);
  CHECK(cache.find(2) == nullptr);
  CHECK(cache.find(-1) == nullptr);
  CoordinatorCache off(0);
  CHECK_EQ(off.insert("a", {q}), -1);
}

TEST(coordinator_cache_keeps_one_slot_per_name) {
  CoordinatorCache cache(2);
  Request q = sampleRequest();
  Request other = q;
  other.shape[0] = 7;
  CHECK_EQ(cache.insert("a", {q}), 0);
  CHECK_EQ(cache.insert("a", {other, other}), 0);  // renegotiated: same slot, new requests
  if (CHECK(cache.find(0) != nullptr)) CHECK_EQ(cache.find(0)->at(1).shape[0], 7);
  CHECK_EQ(cache.size(), 1u);
  CHECK_EQ(cache.insert("b", {q}), 1);
  CHECK_EQ(cache.insert("a", {q}), 0);  // full, but "a" has its slot
}

int main() { return check::runAll(); }
