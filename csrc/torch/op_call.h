// Options (csrc/core/op_options.h) to and from the dispatcher's values, and a
// runner as a boxed kernel.
//
// A runner is one form of one op: `R run(inputs..., const Options&)`, its
// inputs the schema's tensor arguments (a Tensor, a Tensor[], alltoall's
// Tensor and Tensor?), its options every argument after them, in schema order
// (fields()). The CPU/CUDA kernels and the autograd kernels register runners
// through boxedKernel<&run>; the eager entries (csrc/python/eager_fast_path.cpp)
// call the same runners. schemaMismatch<&run>() holds a schema and its runner
// to one another, argument by argument (name, type, default), both ways;
// hvd_torch runs it for every op at import (checkOpSchemas, kernels.h), so a
// schema and its options that drift apart fail there, not at a call.
//
// Everything here runs on the caller's thread and keeps no state.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core/op_options.h"

namespace hvd {
namespace torch_layer {

// ---- one option's value: the schema's type <-> the member's

inline c10::TypeKind schemaKind(const std::string&) { return c10::TypeKind::StringType; }
inline c10::TypeKind schemaKind(double) { return c10::TypeKind::FloatType; }
inline c10::TypeKind schemaKind(int32_t) { return c10::TypeKind::IntType; }
inline c10::TypeKind schemaKind(ReduceOp) { return c10::TypeKind::IntType; }

inline c10::IValue toIValue(const std::string& v) { return v; }
inline c10::IValue toIValue(double v) { return v; }
inline c10::IValue toIValue(int32_t v) { return static_cast<int64_t>(v); }
inline c10::IValue toIValue(ReduceOp v) { return static_cast<int64_t>(v); }

// An int argument for a narrower member: out of its range is the caller's
// mistake (a process set id of 2**32 must not wrap to the global set).
template <class Limit>
int64_t inRange(int64_t v, const std::string& op, const char* name) {
  TORCH_CHECK_VALUE(v >= std::numeric_limits<Limit>::min() && v <= std::numeric_limits<Limit>::max(),
                    op, ": ", name, " ", v, " is out of range");
  return v;
}

inline void fromIValue(const c10::IValue& v, const std::string&, const char*, std::string& out) {
  out = v.toStringRef();
}
inline void fromIValue(const c10::IValue& v, const std::string&, const char*, double& out) {
  out = v.toDouble();
}
inline void fromIValue(const c10::IValue& v, const std::string& op, const char* name,
                       int32_t& out) {
  out = static_cast<int32_t>(inRange<int32_t>(v.toInt(), op, name));
}
inline void fromIValue(const c10::IValue& v, const std::string& op, const char* name,
                       ReduceOp& out) {
  out = static_cast<ReduceOp>(inRange<std::underlying_type_t<ReduceOp>>(v.toInt(), op, name));
}

// ---- options as dispatcher values

// The options from the values of their arguments, in schema order (`args`
// points at the first; `op` names the op in errors).
template <class Options>
Options optionsFrom(const c10::IValue* args, const std::string& op) {
  Options o;
  fields(o, [&](const char* name, auto& member) { fromIValue(*args++, op, name, member); });
  return o;
}

template <class Options>
void pushOptions(torch::jit::Stack& stack, const Options& o) {
  fields(o, [&](const char*, const auto& member) { stack.emplace_back(toIValue(member)); });
}

// The options as one value (a tuple in field order, which compiled autograd
// can hash), for autograd's saved data.
template <class Options>
c10::IValue packOptions(const Options& o) {
  std::vector<c10::IValue> values;
  fields(o, [&](const char*, const auto& member) { values.emplace_back(toIValue(member)); });
  return c10::ivalue::Tuple::create(std::move(values));
}

template <class Options>
Options unpackOptions(const c10::IValue& packed) {
  return optionsFrom<Options>(packed.toTupleRef().elements().asArrayRef().data(), "hvd_torch");
}

// ---- runners

// A runner's inputs from the stack, and what their schema types are.
template <class In>
struct StackInput;

template <>
struct StackInput<const at::Tensor&> {
  explicit StackInput(const c10::IValue& v) : t(v.toTensor()) {}
  const at::Tensor& get() const { return t; }
  static bool matches(const c10::TypePtr& type) { return type->kind() == c10::TypeKind::TensorType; }
  const at::Tensor& t;
};

template <>
struct StackInput<at::TensorList> {
  explicit StackInput(const c10::IValue& v) : ts(v.toTensorVector()) {}
  at::TensorList get() const { return ts; }
  static bool matches(const c10::TypePtr& type) {
    return type->kind() == c10::TypeKind::ListType &&
           type->containedType(0)->kind() == c10::TypeKind::TensorType;
  }
  std::vector<at::Tensor> ts;
};

template <>
struct StackInput<const c10::optional<at::Tensor>&> {
  explicit StackInput(const c10::IValue& v) : t(v.toOptional<at::Tensor>()) {}
  const c10::optional<at::Tensor>& get() const { return t; }
  static bool matches(const c10::TypePtr& type) {
    return type->kind() == c10::TypeKind::OptionalType &&
           type->containedType(0)->kind() == c10::TypeKind::TensorType;
  }
  c10::optional<at::Tensor> t;
};

// What a runner takes and returns: R (*)(inputs..., const Options&).
template <class F>
struct RunnerTraits;

template <class R, class... A>
struct RunnerTraits<R (*)(A...)> {
  using Result = R;
  using Args = std::tuple<A...>;
  static constexpr size_t kInputs = sizeof...(A) - 1;
  using Options = std::decay_t<std::tuple_element_t<kInputs, Args>>;
  template <size_t I>
  using Input = std::tuple_element_t<I, Args>;
};

// A result onto the stack: one value per schema return.
inline void pushResult(torch::jit::Stack& s, at::Tensor&& r) { s.emplace_back(std::move(r)); }
inline void pushResult(torch::jit::Stack& s, int64_t r) { s.emplace_back(r); }
inline void pushResult(torch::jit::Stack& s, std::vector<at::Tensor>&& r) {
  s.emplace_back(std::move(r));
}
inline void pushResult(torch::jit::Stack& s, std::vector<int64_t>&& r) {
  s.emplace_back(std::move(r));
}
inline void pushResult(torch::jit::Stack& s, std::tuple<at::Tensor, at::Tensor>&& r) {
  s.emplace_back(std::move(std::get<0>(r)));
  s.emplace_back(std::move(std::get<1>(r)));
}

template <auto F, size_t... I>
void runBoxed(const c10::OperatorHandle& op, torch::jit::Stack* stack,
              std::index_sequence<I...>) {
  using T = RunnerTraits<decltype(F)>;
  const size_t n = op.schema().arguments().size();
  const c10::IValue* args = &*(stack->end() - static_cast<std::ptrdiff_t>(n));
  const std::tuple<StackInput<typename T::template Input<I>>...> inputs{args[I]...};
  const auto options = optionsFrom<typename T::Options>(args + T::kInputs, op.schema().name());
  if constexpr (std::is_void<typename T::Result>::value) {
    F(std::get<I>(inputs).get()..., options);
    torch::jit::drop(*stack, n);
  } else {
    typename T::Result result = F(std::get<I>(inputs).get()..., options);
    torch::jit::drop(*stack, n);
    pushResult(*stack, std::move(result));
  }
}

// The runner as a boxed kernel: reads its inputs and options off the stack,
// runs, and leaves its result there.
template <auto F>
void boxedKernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  runBoxed<F>(op, stack, std::make_index_sequence<RunnerTraits<decltype(F)>::kInputs>{});
}

template <auto F>
torch::CppFunction boxed() {
  return torch::CppFunction::makeFromBoxedFunction<&boxedKernel<F>>();
}

// Calls `op` through the dispatcher (from the dispatch keys this thread has
// not excluded) with its tensor inputs and options; returns its outputs.
template <class Options, class... In>
torch::jit::Stack callOp(const c10::OperatorHandle& op, const Options& o, In&&... inputs) {
  torch::jit::Stack stack;
  stack.reserve(op.schema().arguments().size());
  (stack.emplace_back(std::forward<In>(inputs)), ...);
  pushOptions(stack, o);
  op.callBoxed(stack);
  return stack;
}

// ---- the import-time check

template <auto F, size_t... I>
std::string schemaMismatch(const c10::FunctionSchema& schema, std::index_sequence<I...>) {
  using T = RunnerTraits<decltype(F)>;
  const std::vector<c10::Argument>& args = schema.arguments();
  std::string why;
  auto problem = [&](const std::string& what) { why += (why.empty() ? "" : "; ") + what; };
  if (args.size() < T::kInputs) return "fewer arguments than the runner's tensor inputs";
  const bool inputs_match[] = {true, StackInput<typename T::template Input<I>>::matches(
                                         args[I].type())...};
  for (size_t i = 0; i < T::kInputs; ++i) {
    if (!inputs_match[i + 1]) problem("argument " + args[i].name() + " is not the runner's input");
  }
  const typename T::Options defaults;
  size_t i = T::kInputs;
  fields(defaults, [&](const char* name, const auto& member) {
    const size_t at = i++;
    if (at >= args.size()) return problem(std::string("field ") + name + " has no argument");
    const c10::Argument& a = args[at];
    if (a.name() != name) {
      return problem("argument " + a.name() + " where the options have field " + name);
    }
    if (a.type()->kind() != schemaKind(member)) problem("argument " + a.name() + "'s type");
    if (!a.default_value() || !(*a.default_value() == toIValue(member))) {
      problem("argument " + a.name() + "'s default differs from the field's");
    }
  });
  for (; i < args.size(); ++i) problem("argument " + args[i].name() + " has no field");
  return why;
}

// Why `schema` does not fit the runner F ("" when it does): its first
// arguments must be the runner's inputs, and from there every argument has
// the field of that name, type and default at its position, and every field
// its argument.
template <auto F>
std::string schemaMismatch(const c10::FunctionSchema& schema) {
  return schemaMismatch<F>(schema,
                           std::make_index_sequence<RunnerTraits<decltype(F)>::kInputs>{});
}

}  // namespace torch_layer
}  // namespace hvd
