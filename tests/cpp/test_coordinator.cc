// Negotiation on rank 0 (csrc/core/coordinator.h), driven directly: arrivals
// from simulated ranks go in, responses come out. Covers readiness across
// submission orders, the emission order, validation errors that name every
// rank's value, each type's payload (allgather first dimensions, the alltoall
// matrix, bundle shapes, process sets, join), inline reduction, the response
// cache and stall reporting.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "core/coordinator.h"
#include "core/reduce.h"

using namespace hvd;

namespace {

constexpr size_t kNoFusion = 0;
constexpr size_t kBigFusion = size_t{64} << 20;

Request req(const std::string& name, std::vector<int64_t> shape = {4},
            DataType dtype = DataType::kFloat32, OpType type = OpType::kAllreduce,
            ReduceOp op = ReduceOp::kSum) {
  Request q;
  q.name = name;
  q.shape = std::move(shape);
  q.dtype = dtype;
  q.type = type;
  q.reduce_op = op;
  return q;
}

Arrival arrive(int rank, const Request& q) {
  Arrival a;
  a.rank = rank;
  a.request = q;
  return a;
}

Arrival cached(int rank, int32_t slot) {
  Arrival a;
  a.rank = rank;
  a.cache_id = slot;
  return a;
}

template <typename T>
Arrival withData(int rank, const Request& q, const std::vector<T>& data) {
  Arrival a = arrive(rank, q);
  a.has_inline = true;
  a.inline_data.assign(reinterpret_cast<const char*>(data.data()), data.size() * sizeof(T));
  return a;
}

template <typename T>
std::vector<T> asVector(const std::string& bytes) {
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
  return v;
}

// Names of the responses in emission order, one entry per response
// ("a+b" for a fused one).
std::vector<std::string> order(const std::vector<Response>& rs) {
  std::vector<std::string> out;
  for (const auto& r : rs) {
    std::string joined;
    for (const auto& n : r.names) joined += (joined.empty() ? "" : "+") + n;
    out.push_back(joined);
  }
  return out;
}

bool contains(const std::string& text, const std::string& part) {
  bool found = text.find(part) != std::string::npos;
  if (!found) std::printf("    '%s' not in: %s\n", part.c_str(), text.c_str());
  return found;
}

// Whether add() took the arrival; prints why not.
bool accepted(const Status& s) {
  if (!s.ok()) std::printf("    not accepted (code %d): %s\n", int(s.code), s.message.c_str());
  return s.ok();
}

// Whether add() refused the arrival as a caller's mistake, saying `part`.
bool refusedWith(const Status& s, const std::string& part) {
  if (s.code != Status::kRefused)
    std::printf("    code %d, not kRefused: %s\n", int(s.code), s.message.c_str());
  return s.code == Status::kRefused && contains(s.message, part);
}

// Every rank submits `q` (per-rank variations through `vary`); returns the
// one response.
template <typename Vary>
Response negotiateOne(int size, const Request& q, Vary vary) {
  Coordinator c(size, kNoFusion, 16);
  for (int r = 0; r < size; ++r) {
    Request mine = q;
    vary(r, mine);
    CHECK(accepted(c.add(arrive(r, mine))));
  }
  std::vector<Response> out = c.takeReady();
  if (!CHECK_EQ(out.size(), 1u)) return Response{};
  return out[0];
}

}  // namespace

TEST(ready_only_when_every_rank_submitted_in_any_order) {
  Coordinator c(3, kNoFusion, 16);
  // rank 0: a b c; rank 1: c b a; rank 2: b c a.
  CHECK(accepted(c.add(arrive(0, req("a")))));
  CHECK(accepted(c.add(arrive(0, req("b")))));
  CHECK(accepted(c.add(arrive(0, req("c")))));
  CHECK(accepted(c.add(arrive(1, req("c")))));
  CHECK(accepted(c.add(arrive(1, req("b")))));
  CHECK(c.takeReady().empty());
  CHECK(accepted(c.add(arrive(2, req("b")))));
  std::vector<Response> first = c.takeReady();
  CHECK_EQ(order(first), (std::vector<std::string>{"b"}));
  CHECK(c.takeReady().empty());  // taken once
  CHECK(accepted(c.add(arrive(2, req("c")))));
  CHECK(accepted(c.add(arrive(1, req("a")))));
  CHECK(accepted(c.add(arrive(2, req("a")))));
  std::vector<Response> rest = c.takeReady();
  CHECK_EQ(order(rest), (std::vector<std::string>{"c", "a"}));
  for (const auto& r : rest) {
    CHECK_EQ(r.kind, Response::kExecute);
    CHECK_EQ(r.type, OpType::kAllreduce);
    CHECK_EQ(r.cache_ids.size(), 1u);
  }
  CHECK(c.waiting().empty());
}

TEST(emission_order_is_completion_order_and_deterministic) {
  // Same arrivals, same responses: every rank executes in this one order.
  auto run = [](size_t fusion) {
    Coordinator c(2, fusion, 16);
    const char* names[] = {"w0", "w1", "w2", "w3", "w4"};
    for (const char* n : names) c.add(arrive(1, req(n)));  // rank 1 first, in order
    std::vector<std::string> seen;
    for (int i = 4; i >= 0; --i) {  // rank 0 in reverse: completion order w4..w0
      c.add(arrive(0, req(names[i])));
      if (i % 2 == 0) {
        for (const auto& s : order(c.takeReady())) seen.push_back(s);
      }
    }
    return seen;
  };
  std::vector<std::string> a = run(kNoFusion);
  CHECK_EQ(a, (std::vector<std::string>{"w4", "w3", "w2", "w1", "w0"}));
  CHECK_EQ(run(kNoFusion), a);
  // With fusion, each batch that became ready together is one response, in
  // completion order inside it.
  std::vector<std::string> fused = run(kBigFusion);
  CHECK_EQ(fused, (std::vector<std::string>{"w4", "w3+w2", "w1+w0"}));
  CHECK_EQ(run(kBigFusion), fused);
}

TEST(mismatched_shape_names_tensor_and_each_rank) {
  Response r = negotiateOne(3, req("grad"), [](int rank, Request& q) {
    if (rank == 2) q.shape = {5, 2};
  });
  CHECK_EQ(r.kind, Response::kError);
  CHECK_EQ(r.names, (std::vector<std::string>{"grad"}));
  CHECK_EQ(r.cache_ids, (std::vector<int32_t>{-1}));
  CHECK(contains(r.error, "'grad'"));
  CHECK(contains(r.error, "shapes"));
  CHECK(contains(r.error, "rank 0 [4]"));
  CHECK(contains(r.error, "rank 1 [4]"));
  CHECK(contains(r.error, "rank 2 [5, 2]"));
}

TEST(mismatched_dtype_names_each_rank) {
  Response r = negotiateOne(2, req("x"), [](int rank, Request& q) {
    if (rank == 1) q.dtype = DataType::kFloat16;
  });
  CHECK_EQ(r.kind, Response::kError);
  CHECK(contains(r.error, "'x'"));
  CHECK(contains(r.error, "dtypes"));
  CHECK(contains(r.error, "rank 0 float32"));
  CHECK(contains(r.error, "rank 1 float16"));
}

TEST(cpu_and_cuda_tensors_under_one_name_are_refused_naming_each_rank) {
  Response r = negotiateOne(3, req("x"), [](int rank, Request& q) {
    if (rank == 1) {
      q.device = 0;
      q.plane = Plane::kDevice;
    }
    if (rank == 2) {
      q.device = 1;
      q.plane = Plane::kStaged;
    }
  });
  CHECK_EQ(r.kind, Response::kError);
  CHECK(contains(r.error, "'x'"));
  CHECK(contains(r.error, "devices"));
  CHECK(contains(r.error, "rank 0 cpu"));
  CHECK(contains(r.error, "rank 1 cuda:0 (nccl)"));
  CHECK(contains(r.error, "rank 2 cuda:1 (host-staged)"));
}

TEST(cuda_tensors_on_different_device_indices_agree) {
  // Each rank its own GPU: cuda:0 on one host, cuda:1 on another is fine.
  Response r = negotiateOne(2, req("x"), [](int rank, Request& q) {
    q.device = rank;
    q.plane = Plane::kDevice;
  });
  CHECK_EQ(r.kind, Response::kExecute);
}

TEST(mismatched_reduce_op_names_each_rank) {
  Response r = negotiateOne(2, req("x"), [](int rank, Request& q) {
    q.reduce_op = rank == 0 ? ReduceOp::kSum : ReduceOp::kMax;
  });
  CHECK_EQ(r.kind, Response::kError);
  CHECK(contains(r.error, "'x'"));
  CHECK(contains(r.error, "rank 0 Sum"));
  CHECK(contains(r.error, "rank 1 Max"));
}

TEST(mismatched_prescale_and_postscale_name_each_rank) {
  Response pre = negotiateOne(2, req("x"), [](int rank, Request& q) {
    if (rank == 1) q.prescale = 0.5;
  });
  CHECK_EQ(pre.kind, Response::kError);
  CHECK(contains(pre.error, "'x'"));
  CHECK(contains(pre.error, "prescale"));
  CHECK(contains(pre.error, "rank 0 1"));
  CHECK(contains(pre.error, "rank 1 0.5"));
  Response post =
      negotiateOne(2, req("y"), [](int rank, Request& q) { q.postscale = rank == 0 ? 2.0 : 0.25; });
  CHECK_EQ(post.kind, Response::kError);
  CHECK(contains(post.error, "'y'"));
  CHECK(contains(post.error, "postscale"));
  CHECK(contains(post.error, "rank 0 2"));
  CHECK(contains(post.error, "rank 1 0.25"));
}

TEST(mismatched_root_rank_names_each_rank) {
  Request b = req("params", {3}, DataType::kFloat32, OpType::kBroadcast);
  Response r = negotiateOne(3, b, [](int rank, Request& q) { q.root_rank = rank == 1 ? 2 : 0; });
  CHECK_EQ(r.kind, Response::kError);
  CHECK_EQ(r.type, OpType::kBroadcast);
  CHECK(contains(r.error, "'params'"));
  CHECK(contains(r.error, "root"));
  CHECK(contains(r.error, "rank 0 0"));
  CHECK(contains(r.error, "rank 1 2"));
  CHECK(contains(r.error, "rank 2 0"));
  // Agreeing roots are fine, and broadcast ignores reduce op and scales.
  Response ok = negotiateOne(2, b, [](int rank, Request& q) {
    q.root_rank = 1;
    q.reduce_op = rank == 0 ? ReduceOp::kSum : ReduceOp::kMin;
  });
  CHECK_EQ(ok.kind, Response::kExecute);
}

TEST(mismatched_op_type_names_each_rank) {
  Response r = negotiateOne(2, req("t"), [](int rank, Request& q) {
    if (rank == 1) q.type = OpType::kBroadcast;
  });
  CHECK_EQ(r.kind, Response::kError);
  CHECK(contains(r.error, "'t'"));
  CHECK(contains(r.error, "rank 0 allreduce"));
  CHECK(contains(r.error, "rank 1 broadcast"));
}

TEST(error_responses_take_no_cache_slot_and_the_name_is_free_again) {
  Coordinator c(2, kNoFusion, 16);
  c.add(arrive(0, req("t", {4})));
  c.add(arrive(1, req("t", {5})));
  std::vector<Response> out = c.takeReady();
  if (CHECK_EQ(out.size(), 1u)) CHECK_EQ(out[0].error_code, Status::kRefused);
  CHECK_EQ(c.cacheSize(), 0u);
  // The same name can be submitted again and now agrees.
  CHECK(accepted(c.add(arrive(0, req("t", {4})))));
  CHECK(accepted(c.add(arrive(1, req("t", {4})))));
  out = c.takeReady();
  if (CHECK_EQ(out.size(), 1u)) {
    CHECK_EQ(out[0].kind, Response::kExecute);
    CHECK_EQ(out[0].cache_ids, (std::vector<int32_t>{0}));
  }
}

TEST(under_the_agreement_a_slot_keeps_no_requests_and_refuses_cached_arrivals) {
  // Issue #47: cached ops never reach rank 0, so a name's slot is its key
  // alone; names renegotiated in full keep their slot; a cached arrival is a bug.
  Coordinator c(3, kBigFusion, 8);
  c.keepSlotRequests(false);
  for (int step = 0; step < 2; ++step) {
    for (int r = 0; r < 3; ++r) CHECK(accepted(c.add(arrive(r, req("g", {4 + step})))));
    std::vector<Response> out = c.takeReady();
    CHECK_EQ(out.size(), size_t{1});
    if (!out.empty()) CHECK(out[0].cache_ids == std::vector<int32_t>{0});
  }
  CHECK_EQ(c.cacheSize(), size_t{1});
  const Status s = c.add(cached(1, 0));
  CHECK_EQ(static_cast<int>(s.code), static_cast<int>(Status::kInternal));
  CHECK(contains(s.message, "rank 1 named cache slot 0, whose requests rank 0 does not keep"));
}

TEST(allgather_first_dims_per_rank) {
  Request g = req("gather", {2, 3}, DataType::kInt64, OpType::kAllgather);
  Response r = negotiateOne(3, g, [](int rank, Request& q) {
    q.shape[0] = rank == 0 ? 2 : rank == 1 ? 0 : 5;
  });
  CHECK_EQ(r.kind, Response::kExecute);
  CHECK_EQ(r.type, OpType::kAllgather);
  CHECK_EQ(r.rank_first_dims, (std::vector<std::vector<int64_t>>{{2, 0, 5}}));

  // A scalar counts as one row per rank.
  Response s =
      negotiateOne(2, req("s", {}, DataType::kFloat32, OpType::kAllgather), [](int, Request&) {});
  CHECK_EQ(s.rank_first_dims, (std::vector<std::vector<int64_t>>{{1, 1}}));

  // All dimensions but the first must agree.
  Response bad = negotiateOne(2, g, [](int rank, Request& q) { q.shape[1] = rank == 0 ? 3 : 4; });
  CHECK_EQ(bad.kind, Response::kError);
  CHECK(contains(bad.error, "'gather'"));
  CHECK(contains(bad.error, "rank 0 [2, 3]"));
  CHECK(contains(bad.error, "rank 1 [2, 4]"));
  Response rank_count = negotiateOne(2, g, [](int rank, Request& q) {
    if (rank == 1) q.shape = {2};
  });
  CHECK_EQ(rank_count.kind, Response::kError);
}

TEST(allgathers_fuse_and_broadcasts_fuse_per_root) {
  Coordinator c(2, kBigFusion, 16);
  for (int r = 0; r < 2; ++r) {
    c.add(arrive(r, req("g1", {2}, DataType::kFloat32, OpType::kAllgather)));
    c.add(arrive(r, req("g2", {r + 1}, DataType::kFloat32, OpType::kAllgather)));
    c.add(arrive(r, req("b1", {2}, DataType::kFloat32, OpType::kBroadcast)));
    c.add(arrive(r, req("b2", {2}, DataType::kFloat32, OpType::kBroadcast)));
    Request other_root = req("b3", {2}, DataType::kFloat32, OpType::kBroadcast);
    other_root.root_rank = 1;
    c.add(arrive(r, other_root));
    c.add(arrive(r, req("g3", {2}, DataType::kInt32, OpType::kAllgather)));
  }
  std::vector<Response> out = c.takeReady();
  // One collective per (op, dtype, root); each allgather keeps its own rows.
  CHECK_EQ(order(out), (std::vector<std::string>{"g1+g2", "b1+b2", "b3", "g3"}));
  CHECK_EQ(out[0].rank_first_dims, (std::vector<std::vector<int64_t>>{{2, 2}, {1, 2}}));
}

TEST(alltoall_gives_every_ranks_send_splits_as_one_matrix) {
  Request a = req("a2a", {3, 2}, DataType::kFloat32, OpType::kAlltoall);
  Response r = negotiateOne(2, a, [](int rank, Request& q) {
    q.send_splits = rank == 0 ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{3, 0};
  });
  CHECK_EQ(r.kind, Response::kExecute);
  CHECK_EQ(r.alltoall_splits, (std::vector<std::vector<int64_t>>{{1, 2, 3, 0}}));
  CHECK(r.rank_first_dims.empty());
  Response bad = negotiateOne(2, a, [](int rank, Request& q) {
    q.send_splits = rank == 0 ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{3};
  });
  CHECK_EQ(bad.kind, Response::kError);
  CHECK(contains(bad.error, "mismatched splits (one entry per rank expected)"));
  CHECK(contains(bad.error, "rank 1 1"));
}

TEST(bundle_mismatch_names_the_member_whose_shape_differs) {
  Request b = req("grads", {7});
  b.bundle_shapes = {{2, 2}, {3}};
  Response r = negotiateOne(2, b, [](int rank, Request& q) {
    if (rank == 1) q.bundle_shapes = {{2, 2}, {1, 3}};
  });
  CHECK_EQ(r.kind, Response::kError);
  CHECK(contains(r.error, "group 'grads' failed: allreduce 'grads.1': mismatched shapes"));
  CHECK(contains(r.error, "rank 0 [3], rank 1 [1, 3]"));
  r = negotiateOne(2, b, [](int rank, Request& q) {
    if (rank == 1) q.bundle_shapes = {{2, 2}};
  });
  CHECK(contains(r.error, "mismatched group sizes across ranks: rank 0 2 tensors, rank 1 1 tensors"));
}

TEST(barrier_is_done_without_data) {
  Request b = req("barrier", {}, DataType::kFloat32, OpType::kBarrier);
  Response r = negotiateOne(3, b, [](int rank, Request& q) { q.shape = {rank}; });
  CHECK_EQ(r.kind, Response::kDone);
  CHECK_EQ(r.type, OpType::kBarrier);
  CHECK(r.inline_result.empty());
}

TEST(inline_sum_with_prescale_and_postscale_on_three_ranks) {
  Coordinator c(3, kBigFusion, 16);
  Request q = req("small", {4});
  q.prescale = 2.0;
  q.postscale = 0.5;
  std::vector<std::vector<float>> data = {{1, 2, -3, 0.5f}, {2, 4, 6, 1}, {3, 0, -3, 1.5f}};
  for (int r = 0; r < 3; ++r) CHECK(accepted(c.add(withData(r, q, data[r]))));
  std::vector<Response> out = c.takeReady();
  if (!CHECK_EQ(out.size(), 1u)) return;
  CHECK_EQ(out[0].kind, Response::kInline);
  CHECK_EQ(out[0].names, (std::vector<std::string>{"small"}));
  CHECK_EQ(out[0].inline_result.size(), 16u);
  CHECK_EQ(asVector<float>(out[0].inline_result), (std::vector<float>{6, 6, 0, 3}));
}

TEST(inline_average_with_prescale_and_postscale_on_three_ranks) {
  Coordinator c(3, kBigFusion, 16);
  Request q = req("avg", {4}, DataType::kFloat32, OpType::kAllreduce, ReduceOp::kAverage);
  q.prescale = 0.5;
  q.postscale = 4.0;
  std::vector<std::vector<float>> data = {{1, 2, -3, 0.5f}, {2, 4, 6, 1}, {3, 0, -3, 1.5f}};
  for (int r = 0; r < 3; ++r) c.add(withData(r, q, data[r]));
  std::vector<Response> out = c.takeReady();
  if (!CHECK_EQ(out.size(), 1u)) return;
  CHECK_EQ(out[0].kind, Response::kInline);
  // sum(x * 0.5) / 3 * 4
  CHECK_EQ(asVector<float>(out[0].inline_result), (std::vector<float>{4, 4, 0, 2}));

  // Integer Average truncates sum * (1.0 / 3) toward zero, like Horovod.
  Coordinator ci(3, kBigFusion, 16);
  Request qi = req("iavg", {3}, DataType::kInt32, OpType::kAllreduce, ReduceOp::kAverage);
  std::vector<std::vector<int32_t>> idata = {{-7, 1, 9}, {0, 1, 0}, {0, 0, 1}};
  for (int r = 0; r < 3; ++r) ci.add(withData(r, qi, idata[r]));
  out = ci.takeReady();
  if (!CHECK_EQ(out.size(), 1u)) return;
  CHECK_EQ(asVector<int32_t>(out[0].inline_result), (std::vector<int32_t>{-2, 0, 3}));
}

TEST(inline_min_applies_prescale_before_reducing) {
  Coordinator c(3, kBigFusion, 16);
  Request q = req("m", {4}, DataType::kFloat32, OpType::kAllreduce, ReduceOp::kMin);
  q.prescale = -1.0;  // min(-x) = -max(x): shows the order of scale and reduce
  q.postscale = 2.0;
  std::vector<std::vector<float>> data = {{1, 2, -3, 0.5f}, {2, 4, 6, 1}, {3, 0, -3, 1.5f}};
  for (int r = 0; r < 3; ++r) c.add(withData(r, q, data[r]));
  std::vector<Response> out = c.takeReady();
  if (!CHECK_EQ(out.size(), 1u)) return;
  CHECK_EQ(out[0].kind, Response::kInline);
  CHECK_EQ(asVector<float>(out[0].inline_result), (std::vector<float>{-6, -8, -12, -3}));
}

TEST(inline_float16_sum_rounds_like_the_backend) {
  Coordinator c(3, kBigFusion, 16);
  Request q = req("h", {2}, DataType::kFloat16);
  std::vector<std::vector<uint16_t>> data = {{floatToHalf(2048), floatToHalf(0.5f)},
                                             {floatToHalf(1), floatToHalf(0.25f)},
                                             {floatToHalf(1), floatToHalf(-1)}};
  for (int r = 0; r < 3; ++r) c.add(withData(r, q, data[r]));
  std::vector<Response> out = c.takeReady();
  if (!CHECK_EQ(out.size(), 1u)) return;
  // Rank order, rounding after each step: (2048 + 1) -> 2048, + 1 -> 2048.
  CHECK_EQ(asVector<uint16_t>(out[0].inline_result),
           (std::vector<uint16_t>{floatToHalf(2048), floatToHalf(-0.25f)}));
}

TEST(inline_only_when_every_rank_sent_data) {
  Coordinator c(2, kBigFusion, 16);
  Request q = req("mixed", {2});
  c.add(withData(0, q, std::vector<float>{1, 2}));
  c.add(arrive(1, q));
  std::vector<Response> out = c.takeReady();
  if (!CHECK_EQ(out.size(), 1u)) return;
  CHECK_EQ(out[0].kind, Response::kExecute);
  CHECK(out[0].inline_result.empty());
}

TEST(inline_results_are_not_fused_with_executed_allreduces) {
  Coordinator c(2, kBigFusion, 16);
  for (int r = 0; r < 2; ++r) {
    c.add(arrive(r, req("big1")));
    c.add(withData(r, req("tiny"), std::vector<float>{1, 2, 3, 4}));
    c.add(arrive(r, req("big2")));
  }
  std::vector<Response> out = c.takeReady();
  CHECK_EQ(order(out), (std::vector<std::string>{"big1+big2", "tiny"}));
  if (out.size() == 2) {
    CHECK_EQ(out[0].cache_ids, (std::vector<int32_t>{0, 2}));
    CHECK_EQ(out[1].kind, Response::kInline);
    CHECK_EQ(asVector<float>(out[1].inline_result), (std::vector<float>{2, 4, 6, 8}));
  }
}

TEST(cache_second_negotiation_by_slot_id_reuses_the_slot) {
  Coordinator c(3, kNoFusion, 16);
  Request g = req("feat", {2, 8}, DataType::kFloat32, OpType::kAllgather);
  for (int r = 0; r < 3; ++r) {
    Request mine = g;
    mine.shape[0] = r + 1;
    c.add(arrive(r, mine));
  }
  std::vector<Response> first = c.takeReady();
  if (!CHECK_EQ(first.size(), 1u)) return;
  CHECK_EQ(first[0].cache_ids, (std::vector<int32_t>{0}));
  CHECK_EQ(c.cacheSize(), 1u);

  // Steady state: every rank sends only the slot; the coordinator recovers
  // each rank's own request (name, first dimension) from it.
  for (int r = 0; r < 3; ++r) CHECK(accepted(c.add(cached(r, 0))));
  std::vector<Response> second = c.takeReady();
  if (!CHECK_EQ(second.size(), 1u)) return;
  CHECK_EQ(second[0].kind, Response::kExecute);
  CHECK_EQ(second[0].names, (std::vector<std::string>{"feat"}));
  CHECK_EQ(second[0].cache_ids, (std::vector<int32_t>{0}));
  CHECK_EQ(second[0].rank_first_dims, (std::vector<std::vector<int64_t>>{{1, 2, 3}}));
  CHECK_EQ(c.cacheSize(), 1u);  // no new slot
}

TEST(single_use_names_get_no_slot_and_leave_room_for_names_that_recur) {
  // Unnamed ops and torch.distributed ops name each op afresh: a slot for
  // each would fill the cache (capacity 2 here) with names that never recur.
  Coordinator c(2, kNoFusion, 2);
  for (int i = 0; i < 5; ++i) {
    Request once = req("c10d.0." + std::to_string(i));
    once.single_use = true;
    for (int r = 0; r < 2; ++r) c.add(arrive(r, once));
    std::vector<Response> out = c.takeReady();
    if (!CHECK_EQ(out.size(), 1u)) return;
    CHECK_EQ(out[0].kind, Response::kExecute);
    CHECK_EQ(out[0].cache_ids, (std::vector<int32_t>{-1}));
  }
  CHECK_EQ(c.cacheSize(), 0u);
  for (int r = 0; r < 2; ++r) c.add(arrive(r, req("loss")));
  std::vector<Response> out = c.takeReady();
  if (CHECK_EQ(out.size(), 1u)) CHECK_EQ(out[0].cache_ids, (std::vector<int32_t>{0}));
}

TEST(cache_renegotiated_name_keeps_its_slot) {
  // A variable-length allgather: every step another first dimension. The
  // name keeps slot 0, which then holds the latest requests.
  Coordinator c(2, kNoFusion, 1);
  for (int64_t rows : {2, 5}) {
    for (int r = 0; r < 2; ++r) {
      Request mine = req("feat", {rows + r, 4}, DataType::kFloat32, OpType::kAllgather);
      c.add(arrive(r, mine));
    }
    std::vector<Response> out = c.takeReady();
    if (!CHECK_EQ(out.size(), 1u)) return;
    CHECK_EQ(out[0].cache_ids, (std::vector<int32_t>{0}));
    CHECK_EQ(out[0].rank_first_dims, (std::vector<std::vector<int64_t>>{{rows, rows + 1}}));
  }
  CHECK_EQ(c.cacheSize(), 1u);
  for (int r = 0; r < 2; ++r) CHECK(accepted(c.add(cached(r, 0))));
  std::vector<Response> out = c.takeReady();
  if (CHECK_EQ(out.size(), 1u))
    CHECK_EQ(out[0].rank_first_dims, (std::vector<std::vector<int64_t>>{{5, 6}}));
  // The cache (capacity 1) is full, yet the name still has its slot, and
  // another name gets none.
  for (int r = 0; r < 2; ++r) c.add(arrive(r, req("other")));
  out = c.takeReady();
  if (CHECK_EQ(out.size(), 1u)) CHECK_EQ(out[0].cache_ids, (std::vector<int32_t>{-1}));
}

TEST(cache_slots_work_with_inline_data) {
  Coordinator c(2, kNoFusion, 16);
  Request q = req("loss", {1}, DataType::kFloat32, OpType::kAllreduce, ReduceOp::kAverage);
  c.add(withData(0, q, std::vector<float>{1}));
  c.add(withData(1, q, std::vector<float>{3}));
  std::vector<Response> first = c.takeReady();
  if (!CHECK_EQ(first.size(), 1u)) return;
  CHECK_EQ(first[0].cache_ids, (std::vector<int32_t>{0}));
  CHECK_EQ(asVector<float>(first[0].inline_result), (std::vector<float>{2}));
  for (int r = 0; r < 2; ++r) {
    Arrival a = cached(r, 0);
    a.has_inline = true;
    float v = r == 0 ? 10.0f : 20.0f;
    a.inline_data.assign(reinterpret_cast<const char*>(&v), 4);
    c.add(std::move(a));
  }
  std::vector<Response> second = c.takeReady();
  if (!CHECK_EQ(second.size(), 1u)) return;
  CHECK_EQ(second[0].kind, Response::kInline);
  CHECK_EQ(second[0].cache_ids, (std::vector<int32_t>{0}));
  CHECK_EQ(asVector<float>(second[0].inline_result), (std::vector<float>{15}));
}

TEST(cache_full_or_disabled_gives_no_slot) {
  Coordinator c(2, kNoFusion, 1);
  for (int r = 0; r < 2; ++r) c.add(arrive(r, req("a")));
  for (int r = 0; r < 2; ++r) c.add(arrive(r, req("b")));
  std::vector<Response> out = c.takeReady();
  if (CHECK_EQ(out.size(), 2u)) {
    CHECK_EQ(out[0].cache_ids, (std::vector<int32_t>{0}));
    CHECK_EQ(out[1].cache_ids, (std::vector<int32_t>{-1}));
    CHECK_EQ(out[1].kind, Response::kExecute);
  }
  CHECK_EQ(c.cacheSize(), 1u);
  Coordinator off(2, kNoFusion, 0);
  for (int r = 0; r < 2; ++r) off.add(arrive(r, req("a")));
  out = off.takeReady();
  if (CHECK_EQ(out.size(), 1u)) CHECK_EQ(out[0].cache_ids, (std::vector<int32_t>{-1}));
}

TEST(cache_mixed_slot_and_full_request_is_validated) {
  Coordinator c(2, kNoFusion, 16);
  for (int r = 0; r < 2; ++r) c.add(arrive(r, req("t")));
  c.takeReady();
  // Rank 0 names the slot, rank 1 sends a request that disagrees with it.
  CHECK(accepted(c.add(cached(0, 0))));
  CHECK(accepted(c.add(arrive(1, req("t", {9})))));
  std::vector<Response> out = c.takeReady();
  if (!CHECK_EQ(out.size(), 1u)) return;
  CHECK_EQ(out[0].kind, Response::kError);
  CHECK(contains(out[0].error, "rank 0 [4]"));
  CHECK(contains(out[0].error, "rank 1 [9]"));
}

TEST(cached_arrivals_read_their_own_slot_in_a_recycled_entry) {
  // A cached arrival's request stays in its slot (Coordinator::requestOf);
  // the table entry it lands in was another name's, whose requests it still
  // holds. Allgathers read every rank's request: each must be its slot's.
  Coordinator c(3, kNoFusion, 16);
  for (const char* name : {"x", "y"}) {
    const int64_t base = name[0] == 'x' ? 1 : 7;
    for (int r = 0; r < 3; ++r)
      c.add(arrive(r, req(name, {base + r, 2}, DataType::kFloat32, OpType::kAllgather)));
    c.takeReady();
  }
  for (int32_t slot : {1, 0}) {
    for (int r : {2, 0, 1}) CHECK(accepted(c.add(cached(r, slot))));
    std::vector<Response> out = c.takeReady();
    if (!CHECK_EQ(out.size(), 1u)) return;
    CHECK_EQ(out[0].names, (std::vector<std::string>{slot == 0 ? "x" : "y"}));
    CHECK_EQ(out[0].cache_ids, (std::vector<int32_t>{slot}));
    CHECK_EQ(out[0].rank_first_dims,
             (std::vector<std::vector<int64_t>>{slot == 0 ? std::vector<int64_t>{1, 2, 3}
                                                          : std::vector<int64_t>{7, 8, 9}}));
  }
  // With a rank joined, readiness is scanned, not counted: two cached
  // arrivals complete the op, and the joined rank gives no rows.
  c.join(2);
  for (int r : {1, 0}) CHECK(accepted(c.add(cached(r, 0))));
  std::vector<Response> out = c.takeReady();
  if (!CHECK_EQ(out.size(), 1u)) return;
  CHECK_EQ(out[0].kind, Response::kExecute);
  CHECK_EQ(out[0].rank_first_dims, (std::vector<std::vector<int64_t>>{{1, 2, 0}}));
}

TEST(unknown_cache_slot_is_an_error) {
  Coordinator c(2, kNoFusion, 16);
  // Rank 0 gave out no such slot: the ranks' caches disagree, a bug.
  Status err = c.add(cached(1, 7));
  CHECK_EQ(err.code, Status::kInternal);
  CHECK(contains(err.message, "7"));
  CHECK(contains(err.message, "rank 1"));
  CHECK(c.takeReady().empty());
  CHECK(c.waiting().empty());
  CHECK_EQ(c.add(cached(0, 999)).code, Status::kInternal);
}

TEST(duplicate_arrival_from_one_rank_is_an_error) {
  Coordinator c(2, kNoFusion, 16);
  CHECK(accepted(c.add(arrive(0, req("dup")))));
  Status err = c.add(arrive(0, req("dup")));
  CHECK(refusedWith(err, "'dup'"));
  CHECK(contains(err.message, "rank 0"));
  CHECK(contains(err.message, "already in flight"));
  CHECK(c.takeReady().empty());
  // The first arrival still counts.
  CHECK(accepted(c.add(arrive(1, req("dup")))));
  std::vector<Response> out = c.takeReady();
  if (CHECK_EQ(out.size(), 1u)) CHECK_EQ(out[0].kind, Response::kExecute);
}

TEST(waiting_lists_missing_ranks) {
  Coordinator c(4, kNoFusion, 16);
  c.add(arrive(1, req("x")));
  c.add(arrive(3, req("x")));
  c.add(arrive(0, req("y")));
  std::vector<Coordinator::Waiting> w = c.waiting();
  std::sort(w.begin(), w.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  if (CHECK_EQ(w.size(), 2u)) {
    CHECK_EQ(w[0].name, "x");
    CHECK_EQ(w[0].missing_ranks, (std::vector<int>{0, 2}));
    CHECK_EQ(w[1].name, "y");
    CHECK_EQ(w[1].missing_ranks, (std::vector<int>{1, 2, 3}));
    CHECK(w[0].waited.count() >= 0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  w = c.waiting();
  for (const auto& one : w) CHECK(one.waited >= std::chrono::milliseconds(5));
  for (int r : {0, 2}) c.add(arrive(r, req("x")));
  c.takeReady();
  w = c.waiting();
  if (CHECK_EQ(w.size(), 1u)) CHECK_EQ(w[0].name, "y");
}

TEST(group_is_held_until_every_member_is_ready_then_emitted_together) {
  Coordinator c(2, kBigFusion, 16);
  auto member = [](const std::string& name, DataType dtype) {
    Request q = req(name);
    q.dtype = dtype;
    q.group = "g0";
    q.group_size = 2;
    return q;
  };
  for (int r = 0; r < 2; ++r) CHECK(accepted(c.add(arrive(r, member("a", DataType::kFloat32)))));
  CHECK(c.takeReady().empty());  // "a" is ready, but "b" is not yet
  for (int r = 0; r < 2; ++r) CHECK(accepted(c.add(arrive(r, member("b", DataType::kFloat32)))));
  auto out = c.takeReady();
  CHECK_EQ(out.size(), 1u);  // both members, fused into one response
  if (!out.empty()) CHECK_EQ(out[0].names, (std::vector<std::string>{"a", "b"}));
}

TEST(group_fails_as_a_unit_when_one_member_is_invalid) {
  Coordinator c(2, kBigFusion, 16);
  for (int r = 0; r < 2; ++r) {
    Request a = req("a");
    a.group = "g1";
    a.group_size = 2;
    Request b = req("b", {r == 0 ? int64_t{4} : int64_t{5}});  // shapes disagree
    b.group = "g1";
    b.group_size = 2;
    CHECK(accepted(c.add(arrive(r, a))));
    CHECK(accepted(c.add(arrive(r, b))));
  }
  auto out = c.takeReady();
  CHECK_EQ(out.size(), 2u);
  for (const auto& resp : out) {
    CHECK_EQ(resp.kind, Response::kError);
    CHECK(resp.error.find("group 'g1' failed") != std::string::npos);
    CHECK(resp.error.find("mismatched shapes") != std::string::npos);
  }
}

TEST(failed_group_leaves_its_members_slots_as_they_were) {
  Coordinator c(2, kBigFusion, 16);
  auto member = [](const char* name, int64_t n) {
    Request q = req(name, {n});
    q.group = "g";
    q.group_size = 2;
    return q;
  };
  for (int r = 0; r < 2; ++r) {
    c.add(arrive(r, member("a", 4)));
    c.add(arrive(r, member("b", 4)));
  }
  auto out = c.takeReady();
  if (!CHECK_EQ(out.size(), 1u) || !CHECK_EQ(out[0].cache_ids.size(), 2u)) return;
  const int32_t slot_a = out[0].cache_ids[0];
  // "a" agrees on a new shape, "b" does not: the group fails, and "a"'s slot
  // must keep meaning shape 4, which every rank still caches.
  for (int r = 0; r < 2; ++r) {
    c.add(arrive(r, member("a", 8)));
    c.add(arrive(r, member("b", r == 0 ? 8 : 9)));
  }
  out = c.takeReady();
  for (const auto& resp : out) {
    CHECK_EQ(resp.kind, Response::kError);
    CHECK_EQ(resp.cache_ids, std::vector<int32_t>(resp.names.size(), -1));
  }
  CHECK(accepted(c.add(cached(0, slot_a))));
  CHECK(accepted(c.add(arrive(1, member("a", 4)))));
  for (int r = 0; r < 2; ++r) c.add(arrive(r, member("b", 4)));
  out = c.takeReady();
  for (const auto& resp : out) CHECK_EQ(resp.kind, Response::kExecute);
}

namespace {

// Registers `ranks` as a process set through negotiation; returns its id.
int32_t addSet(Coordinator& c, int size, const std::vector<int64_t>& ranks, const char* name) {
  Request q = req(name, {}, DataType::kUInt8, OpType::kAddProcessSet);
  q.set_ranks = ranks;
  for (int r = 0; r < size; ++r) CHECK(accepted(c.add(arrive(r, q))));
  std::vector<Response> out = c.takeReady();
  if (!CHECK_EQ(out.size(), 1u) || !CHECK_EQ(out[0].kind, Response::kDone)) return -1;
  return out[0].new_set_id;
}

}  // namespace

TEST(process_set_op_is_ready_when_its_members_submitted) {
  Coordinator c(3, kNoFusion, 16);
  const int32_t id = addSet(c, 3, {0, 2}, "add.0");
  CHECK_EQ(id, 1);
  Request q = req("g", {2, 3}, DataType::kFloat32, OpType::kAllgather);
  q.process_set = id;
  Request q0 = q;
  q0.shape = {1, 3};
  CHECK(accepted(c.add(arrive(0, q0))));
  CHECK(c.takeReady().empty());
  CHECK(accepted(c.add(arrive(2, q))));  // rank 1 is not in the set: not awaited
  std::vector<Response> out = c.takeReady();
  if (!CHECK_EQ(out.size(), 1u)) return;
  CHECK_EQ(out[0].kind, Response::kExecute);
  CHECK_EQ(out[0].process_set, id);
  CHECK_EQ(out[0].rank_first_dims, (std::vector<std::vector<int64_t>>{{1, 2}}));
}

TEST(one_name_in_two_process_sets_are_two_ops) {
  Coordinator c(4, kNoFusion, 16);
  const int32_t even = addSet(c, 4, {0, 2}, "add.0");
  const int32_t odd = addSet(c, 4, {1, 3}, "add.1");
  for (int r = 0; r < 4; ++r) {
    Request q = req("grad");
    q.process_set = r % 2 == 0 ? even : odd;
    CHECK(accepted(c.add(arrive(r, q))));
  }
  std::vector<Response> out = c.takeReady();
  if (!CHECK_EQ(out.size(), 2u)) return;
  CHECK_EQ(out[0].kind, Response::kExecute);
  CHECK_EQ(out[1].kind, Response::kExecute);
  CHECK(out[0].process_set != out[1].process_set);
}

namespace {

// Negotiates `name` on set `id` in full from its `members`; returns its slot.
int32_t slotOnSet(Coordinator& c, int32_t id, const char* name, const std::vector<int>& members) {
  Request q = req(name);
  q.process_set = id;
  for (int r : members) c.add(arrive(r, q));
  std::vector<Response> out = c.takeReady();
  if (!CHECK_EQ(out.size(), 1u)) return -1;
  return out[0].cache_ids.at(0);
}

}  // namespace

TEST(cached_arrival_from_outside_the_slots_process_set_is_refused) {
  Coordinator c(3, kNoFusion, 16);
  const int32_t slot = slotOnSet(c, addSet(c, 3, {0, 2}, "add.0"), "t", {0, 2});
  CHECK(accepted(c.add(cached(0, slot))));
  CHECK(refusedWith(c.add(cached(1, slot)), "does not contain it"));
  CHECK(accepted(c.add(cached(2, slot))));
  std::vector<Response> out = c.takeReady();
  if (CHECK_EQ(out.size(), 1u)) CHECK_EQ(out[0].cache_ids, (std::vector<int32_t>{slot}));
}

TEST(arrival_from_outside_the_process_set_is_refused) {
  Coordinator c(3, kNoFusion, 16);
  const int32_t id = addSet(c, 3, {0, 2}, "add.0");
  Request q = req("t");
  q.process_set = id;
  CHECK(refusedWith(c.add(arrive(1, q)), "does not exist or does not contain it"));
  q.process_set = 7;
  CHECK(refusedWith(c.add(arrive(0, q)), "does not exist"));
}

TEST(add_process_set_errors_name_the_ranks) {
  Coordinator c(3, kNoFusion, 16);
  Response r = negotiateOne(3, req("add", {}, DataType::kUInt8, OpType::kAddProcessSet),
                            [](int rank, Request& q) { q.set_ranks = {0, rank == 1 ? 2 : 1}; });
  CHECK_EQ(r.kind, Response::kError);
  CHECK(contains(r.error, "mismatched process set ranks"));
  CHECK(contains(r.error, "rank 0 [0, 1]"));
  CHECK(contains(r.error, "rank 1 [0, 2]"));
  r = negotiateOne(2, req("add", {}, DataType::kUInt8, OpType::kAddProcessSet),
                   [](int, Request& q) { q.set_ranks = {0, 5}; });
  CHECK(contains(r.error, "rank 5 is out of range for 2 ranks"));
  r = negotiateOne(2, req("add", {}, DataType::kUInt8, OpType::kAddProcessSet),
                   [](int, Request& q) { q.set_ranks = {0, 1}; });
  CHECK(contains(r.error, "process set 0 already has ranks [0, 1]"));
}

TEST(remove_process_set_ids_must_match) {
  Response r = negotiateOne(2, req("rm", {}, DataType::kUInt8, OpType::kRemoveProcessSet),
                            [](int rank, Request& q) { q.set_id = rank + 1; });
  CHECK_EQ(r.kind, Response::kError);
  CHECK(contains(r.error, "mismatched process set ids across ranks: rank 0 [1], rank 1 [2]"));
}

TEST(the_last_join_is_done_and_names_the_rank_that_joined_last) {
  Coordinator c(3, kNoFusion, 16);
  c.join(2);
  c.join(0);
  CHECK(c.takeReady().empty());
  c.join(1);
  std::vector<Response> out = c.takeReady();
  if (!CHECK_EQ(out.size(), 1u)) return;
  CHECK_EQ(out[0].kind, Response::kDone);
  CHECK_EQ(out[0].type, OpType::kJoin);
  CHECK_EQ(out[0].last_joined_rank, 1);
}

TEST(a_cached_op_failed_by_a_removal_leaves_no_entry_for_its_slot) {
  // A cached op's entry is found by its slot while in the table; failing it
  // (a member asked to remove the set) takes it out, and the slot's next
  // arrival must make a new entry, which fails the same way.
  Coordinator d(3, kNoFusion, 16);
  const int32_t pair = addSet(d, 3, {0, 1}, "add.0");
  const int32_t slot = slotOnSet(d, pair, "step", {0, 1});
  CHECK(accepted(d.add(cached(0, slot))));
  Request rm = req("rm", {}, DataType::kUInt8, OpType::kRemoveProcessSet);
  rm.set_id = pair;
  CHECK(accepted(d.add(arrive(1, rm))));
  std::vector<Response> out = d.takeReady();
  if (!CHECK_EQ(out.size(), 1u)) return;
  CHECK_EQ(out[0].kind, Response::kError);
  CHECK(accepted(d.add(cached(0, slot))));
  out = d.takeReady();
  if (!CHECK_EQ(out.size(), 1u)) return;
  CHECK_EQ(out[0].kind, Response::kError);
  CHECK_EQ(out[0].names, std::vector<std::string>{"step"});
  const auto waiting = d.waiting();  // only the removal, for rank 0's request
  if (CHECK_EQ(waiting.size(), 1u)) CHECK_EQ(waiting[0].name, std::string("rm"));
}

// A rank that asks to remove a set blocks until every rank asks too, so an op
// on the set it never submitted could never complete: the ranks waiting in
// that op get an error naming the remover at once, instead of a stall.
TEST(remove_process_set_fails_ops_the_remover_never_submitted) {
  Coordinator d(3, kNoFusion, 16);
  const int32_t pair = addSet(d, 3, {0, 1}, "add.0");
  Request op = req("slow");
  op.process_set = pair;
  CHECK(accepted(d.add(arrive(0, op))));  // rank 1 has not submitted it
  Request rm = req("rm", {}, DataType::kUInt8, OpType::kRemoveProcessSet);
  rm.set_id = pair;
  CHECK(accepted(d.add(arrive(2, rm))));  // rank 2 is not in the set: 'slow' may still run
  CHECK(d.takeReady().empty());
  CHECK(accepted(d.add(arrive(1, rm))));  // rank 1 is: 'slow' can never run now
  std::vector<Response> out = d.takeReady();
  if (!CHECK_EQ(out.size(), 1u)) return;
  CHECK_EQ(out[0].kind, Response::kError);
  CHECK_EQ(out[0].names, std::vector<std::string>{"slow"});
  CHECK_EQ(out[0].process_set, pair);
  CHECK(contains(out[0].error, "rank 1 called remove_process_set() for this set without "
                               "submitting it (ranks [0] did)"));
  CHECK(accepted(d.add(arrive(0, rm))));
  out = d.takeReady();
  if (!CHECK_EQ(out.size(), 1u)) return;
  CHECK_EQ(out[0].kind, Response::kDone);
  CHECK(refusedWith(d.add(arrive(0, op)), "does not exist"));
}

// The other order: the removal reaches rank 0 first, then an op on the set
// from a member the remover will never join in it.
TEST(an_op_arriving_after_a_members_removal_request_fails_at_once) {
  Coordinator d(4, kNoFusion, 16);
  const int32_t trio = addSet(d, 4, {0, 1, 2}, "add.0");
  Request rm = req("rm", {}, DataType::kUInt8, OpType::kRemoveProcessSet);
  rm.set_id = trio;
  CHECK(accepted(d.add(arrive(2, rm))));
  Request op = req("late");
  op.process_set = trio;
  CHECK(accepted(d.add(arrive(0, op))));
  std::vector<Response> out = d.takeReady();
  if (!CHECK_EQ(out.size(), 1u)) return;
  CHECK_EQ(out[0].kind, Response::kError);
  CHECK(contains(out[0].error, "rank 2 called remove_process_set()"));
  CHECK(contains(out[0].error, "(ranks [0] did)"));
  // After the removal negotiates, nothing is left marked as being removed:
  // a new set's ops run.
  for (int r : {0, 1, 3}) CHECK(accepted(d.add(arrive(r, rm))));
  out = d.takeReady();
  if (CHECK_EQ(out.size(), 1u)) CHECK_EQ(out[0].kind, Response::kDone);
  const int32_t again = addSet(d, 4, {0, 1, 2}, "add.1");
  op.process_set = again;
  for (int r = 0; r < 3; ++r) CHECK(accepted(d.add(arrive(r, op))));
  out = d.takeReady();
  if (CHECK_EQ(out.size(), 1u)) CHECK(out[0].kind != Response::kError);
}

int main() { return check::runAll(); }
