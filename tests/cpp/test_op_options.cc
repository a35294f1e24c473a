// Per-op options (csrc/core/op_options.h): each kind's field list names its
// schema's arguments in order, reaches the members it names, and the defaults
// are Horovod's. The schemas themselves are checked against these lists when
// hvd_torch imports (csrc/torch/op_call.h).
#include <string>
#include <type_traits>
#include <vector>

#include "check.h"
#include "core/op_options.h"

using namespace hvd;

namespace {

template <class O>
std::vector<std::string> names() {
  const O o;
  std::vector<std::string> out;
  fields(o, [&](const char* name, const auto&) { out.push_back(name); });
  return out;
}

// Writes 1, 2, 3, ... into the fields in order (a string gets the number's
// digits), as the torch layer's readers do.
template <class O>
O numbered() {
  O o;
  int next = 1;
  fields(o, [&](const char*, auto& member) {
    using T = std::decay_t<decltype(member)>;
    if constexpr (std::is_same<T, std::string>::value) {
      member = std::to_string(next++);
    } else {
      member = static_cast<T>(next++);
    }
  });
  return o;
}

}  // namespace

TEST(every_kind_names_its_schema_arguments_in_order) {
  using L = std::vector<std::string>;
  const L reduce = {"name", "op", "prescale_factor", "postscale_factor", "process_set_id"};
  L allreduce = reduce;
  allreduce.push_back("timeline_label");
  CHECK(names<AllreduceOptions>() == allreduce);
  CHECK(names<ReducescatterOptions>() == reduce);
  CHECK(names<AllgatherOptions>() == (L{"name", "process_set_id"}));
  CHECK(names<BroadcastOptions>() == (L{"root_rank", "name", "process_set_id"}));
  CHECK(names<AlltoallOptions>() == (L{"name", "process_set_id"}));
  CHECK_EQ(fieldCount<AllreduceOptions>(), 6);
  CHECK_EQ(fieldCount<BroadcastOptions>(), 3);
}

TEST(fields_reach_the_members_they_name) {
  const AllreduceOptions a = numbered<AllreduceOptions>();
  CHECK_EQ(a.name, std::string("1"));
  CHECK(a.reduction.op == static_cast<ReduceOp>(2));
  CHECK_EQ(a.reduction.prescale, 3.0);
  CHECK_EQ(a.reduction.postscale, 4.0);
  CHECK_EQ(a.process_set, 5);
  CHECK_EQ(a.timeline_label, std::string("6"));
  const BroadcastOptions b = numbered<BroadcastOptions>();
  CHECK_EQ(b.root_rank, 1);
  CHECK_EQ(b.name, std::string("2"));
  CHECK_EQ(b.process_set, 3);
}

TEST(defaults_are_horovods) {
  const AllreduceOptions a;
  CHECK(a.name.empty());
  CHECK(a.reduction.op == ReduceOp::kAverage);
  CHECK_EQ(a.reduction.prescale, 1.0);
  CHECK_EQ(a.reduction.postscale, 1.0);
  CHECK_EQ(a.process_set, 0);
  CHECK(a.timeline_label.empty());
  CHECK_EQ(BroadcastOptions().root_rank, 0);
}

int main() { return check::runAll(); }
