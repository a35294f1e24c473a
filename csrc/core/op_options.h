// An op's arguments as one value per op kind, as Gloo's per-op options and
// c10d's AllreduceOptions are: built once from the caller's arguments (a
// schema's, csrc/torch/ops.cpp; the eager entry's; the c10d backend's) and
// carried unchanged to the adapter, which puts the negotiated ones into the
// Request. No torch here: plain values, read and written on the caller's thread.
//
// fields(o, v) names every option in its schema's order, after the op's
// tensor inputs: v(schema argument name, member) once per argument. The torch
// layer reads and writes options through it alone (csrc/torch/op_call.h: the
// boxed kernels, autograd, the eager entries), and checks at import that each
// schema argument after the tensors has its field, in order, with the same
// type and default, and the reverse. A new option is its member here (with the
// schema's default as initializer), one v(...) line, the schema's argument
// appended with that default, and the code that uses it.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "types.h"

namespace hvd {

// A reduction as Horovod takes it: prescale every contribution, reduce with
// `op`, postscale the result (reduction_plan.h composes them).
struct Reduction {
  ReduceOp op = ReduceOp::kAverage;
  double prescale = 1.0;
  double postscale = 1.0;
};

// What every op takes. `name`: the user's name ("" for an unnamed op, which
// the adapter names "<op>.noname.<n>"); `process_set`: the set's id (0: every
// rank).
struct OpOptions {
  std::string name;
  int32_t process_set = 0;
};

struct AllreduceOptions : OpOptions {
  Reduction reduction;
  // Local to this rank, never negotiated: rank 0's (the rank whose timeline
  // records) shows as a zero-length event of this name on the op's row when
  // rank 0 submits it; "" shows nothing.
  std::string timeline_label;
};
struct ReducescatterOptions : OpOptions {
  Reduction reduction;
};
struct AllgatherOptions : OpOptions {};
struct BroadcastOptions : OpOptions {
  int32_t root_rank = 0;  // a global rank, also for a process set (Horovod's convention)
};
// The splits (rows to send to each rank) are an input tensor, not an option.
struct AlltoallOptions : OpOptions {};

// fields(o, v) for `O` const or not (reading and writing share one list); one
// list may serve kinds whose arguments are the same.
template <class O, class... Kinds>
using IfOptions =
    std::enable_if_t<(std::is_same<std::remove_const_t<O>, Kinds>::value || ...)>;

// A reduction's three arguments, consecutive in every reducing schema.
template <class O, class V>
auto fields(O& r, V&& v) -> IfOptions<O, Reduction> {
  v("op", r.op);
  v("prescale_factor", r.prescale);
  v("postscale_factor", r.postscale);
}

template <class O, class V>
auto fields(O& o, V&& v) -> IfOptions<O, AllreduceOptions> {
  v("name", o.name);
  fields(o.reduction, v);
  v("process_set_id", o.process_set);
  v("timeline_label", o.timeline_label);
}

template <class O, class V>
auto fields(O& o, V&& v) -> IfOptions<O, ReducescatterOptions> {
  v("name", o.name);
  fields(o.reduction, v);
  v("process_set_id", o.process_set);
}

template <class O, class V>
auto fields(O& o, V&& v) -> IfOptions<O, AllgatherOptions, AlltoallOptions> {
  v("name", o.name);
  v("process_set_id", o.process_set);
}

template <class O, class V>
auto fields(O& o, V&& v) -> IfOptions<O, BroadcastOptions> {
  v("root_rank", o.root_rank);
  v("name", o.name);
  v("process_set_id", o.process_set);
}

// How many fields `O` has (the schema arguments after its tensors).
template <class O>
int fieldCount() {
  O o;
  int n = 0;
  fields(o, [&](const char*, auto&) { ++n; });
  return n;
}

}  // namespace hvd
