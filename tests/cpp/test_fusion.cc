// Fusion planning (csrc/core/fusion.h), a pure function: which ready
// allreduces share one collective, in what order, and what passes through.
#include <cstdint>
#include <string>
#include <vector>

#include "check.h"
#include "core/fusion.h"

using namespace hvd;

namespace {

// An allreduce of `floats` float32 elements (4 bytes each) with cache slot
// `slot`; tweak the returned op for other cases.
ReadyOp op(const std::string& name, int64_t floats, int32_t slot = -1) {
  ReadyOp r;
  r.request.name = name;
  r.request.type = OpType::kAllreduce;
  r.request.dtype = DataType::kFloat32;
  r.request.reduce_op = ReduceOp::kSum;
  r.request.shape = {floats};
  r.response.kind = Response::kExecute;
  r.response.type = OpType::kAllreduce;
  r.response.names = {name};
  r.response.cache_ids = {slot};
  return r;
}

std::vector<std::string> order(const std::vector<Response>& rs) {
  std::vector<std::string> out;
  for (const auto& r : rs) {
    std::string joined;
    for (const auto& n : r.names) joined += (joined.empty() ? "" : "+") + n;
    out.push_back(joined);
  }
  return out;
}

using Names = std::vector<std::string>;

}  // namespace

TEST(empty_input_gives_nothing) { CHECK(planFusion({}, 1024).empty()); }

TEST(same_group_merges_up_to_the_threshold_in_order) {
  // 16 bytes each; 48 bytes fit three.
  std::vector<Response> out =
      planFusion({op("a", 4, 0), op("b", 4, 1), op("c", 4, 2), op("d", 4, 3)}, 48);
  CHECK_EQ(order(out), (Names{"a+b+c", "d"}));
  if (out.size() == 2) {
    CHECK_EQ(out[0].cache_ids, (std::vector<int32_t>{0, 1, 2}));
    CHECK_EQ(out[1].cache_ids, (std::vector<int32_t>{3}));
    CHECK_EQ(out[0].kind, Response::kExecute);
    CHECK_EQ(out[0].type, OpType::kAllreduce);
  }
  // Exactly filling the threshold is allowed; one byte less is not.
  CHECK_EQ(order(planFusion({op("a", 4), op("b", 4)}, 32)), (Names{"a+b"}));
  CHECK_EQ(order(planFusion({op("a", 4), op("b", 4)}, 31)), (Names{"a", "b"}));
}

TEST(threshold_zero_fuses_nothing) {
  CHECK_EQ(order(planFusion({op("a", 1), op("b", 1), op("c", 1)}, 0)), (Names{"a", "b", "c"}));
}

TEST(different_dtypes_ops_scales_or_process_sets_do_not_merge) {
  std::vector<ReadyOp> ready = {op("base", 1)};
  ReadyOp half = op("half", 2);
  half.request.dtype = DataType::kFloat16;
  ReadyOp max = op("max", 1);
  max.request.reduce_op = ReduceOp::kMax;
  ReadyOp avg = op("avg", 1);
  avg.request.reduce_op = ReduceOp::kAverage;
  ReadyOp pre = op("pre", 1);
  pre.request.prescale = 0.5;
  ReadyOp post = op("post", 1);
  post.request.postscale = 2.0;
  ReadyOp ps = op("ps", 1);
  ps.request.process_set = 1;
  ReadyOp gpu = op("gpu", 1);  // device memory never shares a host fusion buffer
  gpu.request.device = 0;
  gpu.request.plane = Plane::kDevice;
  for (const ReadyOp& r : {half, max, avg, pre, post, ps, gpu}) ready.push_back(r);
  CHECK_EQ(order(planFusion(ready, 1 << 20)),
           (Names{"base", "half", "max", "avg", "pre", "post", "ps", "gpu"}));
}

TEST(groups_keep_first_ready_order) {
  ReadyOp b = op("h1", 2);
  b.request.dtype = DataType::kFloat16;
  ReadyOp d = op("h2", 2);
  d.request.dtype = DataType::kFloat16;
  std::vector<Response> out =
      planFusion({op("f1", 1, 10), b, op("f2", 1, 11), d, op("f3", 1, 12)}, 1 << 20);
  CHECK_EQ(order(out), (Names{"f1+f2+f3", "h1+h2"}));
  if (out.size() == 2) CHECK_EQ(out[0].cache_ids, (std::vector<int32_t>{10, 11, 12}));
}

TEST(errors_inline_done_and_other_ops_pass_through_in_place) {
  ReadyOp err = op("err", 1);
  err.response.kind = Response::kError;
  err.response.error = "mismatch";
  ReadyOp inl = op("inline", 1);
  inl.response.kind = Response::kInline;
  inl.response.inline_result = std::string(4, '\x01');
  ReadyOp gather = op("gather", 1);
  gather.response.type = OpType::kAllgather;
  gather.request.type = OpType::kAllgather;
  gather.response.rank_first_dims = {{1, 1}};
  ReadyOp bcast = op("bcast", 1);
  bcast.response.type = OpType::kBroadcast;
  bcast.request.type = OpType::kBroadcast;
  ReadyOp barrier = op("barrier", 0);
  barrier.response.kind = Response::kDone;
  barrier.response.type = OpType::kBarrier;
  std::vector<Response> out =
      planFusion({op("a", 1), err, inl, op("b", 1), gather, bcast, barrier, op("c", 1)}, 1 << 20);
  CHECK_EQ(order(out), (Names{"a+b+c", "err", "inline", "gather", "bcast", "barrier"}));
  if (out.size() == 6) {
    CHECK_EQ(out[1].kind, Response::kError);
    CHECK_EQ(out[1].error, "mismatch");
    CHECK_EQ(out[2].kind, Response::kInline);
    CHECK_EQ(out[2].inline_result, std::string(4, '\x01'));
    CHECK_EQ(out[3].rank_first_dims, (std::vector<std::vector<int64_t>>{{1, 1}}));
    CHECK_EQ(out[5].kind, Response::kDone);
  }
  // Two errors with the same dtype are still two responses.
  ReadyOp err2 = err;
  err2.response.names = {"err2"};
  CHECK_EQ(order(planFusion({err, err2}, 1 << 20)), (Names{"err", "err2"}));
}

TEST(tensor_above_threshold_stays_alone) {
  // 400 bytes against a 64-byte threshold, first and in the middle.
  CHECK_EQ(order(planFusion({op("big", 100), op("s1", 4), op("s2", 4)}, 64)),
           (Names{"big", "s1+s2"}));
  CHECK_EQ(order(planFusion({op("s1", 4), op("big", 100), op("s2", 4)}, 64)),
           (Names{"s1+s2", "big"}));
  CHECK_EQ(order(planFusion({op("big1", 100), op("big2", 100)}, 64)), (Names{"big1", "big2"}));
  // A tensor exactly at the threshold fills a group by itself.
  CHECK_EQ(order(planFusion({op("full", 16), op("s", 1)}, 64)), (Names{"full", "s"}));
}

TEST(first_fit_skips_what_does_not_fit_and_takes_later_ops) {
  // 40 + 40 > 64, but 40 + 20 fits: a takes c, b goes alone.
  CHECK_EQ(order(planFusion({op("a", 10), op("b", 10), op("c", 5)}, 64)), (Names{"a+c", "b"}));
}

TEST(zero_element_tensors_fuse) {
  CHECK_EQ(order(planFusion({op("e1", 0), op("e2", 0), op("x", 4)}, 16)), (Names{"e1+e2+x"}));
}

int main() { return check::runAll(); }
