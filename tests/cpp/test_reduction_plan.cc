// ReductionPlan (csrc/core/reduction_plan.h): for every dtype, op and scaling
// on 1 to 4 rows, reduce() over untouched rows, and combine() over rows
// prescaled in place (the shared-memory plane's form, the result aliasing the
// first row), give the bytes of the composition written out step by step with
// reduce.h's kernels: prescale each, reduce in rank order, postscale once with
// Average's division folded in. Plus Average against values worked by hand.
#include <cstdint>
#include <cstring>
#include <vector>

#include "check.h"
#include "core/reduction_plan.h"

using namespace hvd;

namespace {

const DataType kTypes[] = {DataType::kUInt8,   DataType::kInt8,     DataType::kInt16,
                           DataType::kInt32,   DataType::kInt64,    DataType::kFloat16,
                           DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64,
                           DataType::kBool};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax,
                         ReduceOp::kProduct};
const double kScalings[][2] = {{1.0, 1.0}, {0.5, 3.0}, {3.0, 0.25}};
constexpr size_t kN = 37;

template <class T>
void put(std::vector<char>& row, size_t i, T v) {
  std::memcpy(row.data() + i * sizeof(T), &v, sizeof(T));
}

// Row r of a dtype: fractional floats of both signs, small integers.
std::vector<char> rowOf(DataType t, int r) {
  std::vector<char> row(kN * dataTypeSize(t));
  for (size_t i = 0; i < kN; ++i) {
    const int small = static_cast<int>((i * 7 + r * 5) % 7) - 3;  // -3..3
    const double frac = (static_cast<double>(i) - 18.0) * 0.37 + r * 1.13;
    switch (t) {
      case DataType::kUInt8: put<uint8_t>(row, i, static_cast<uint8_t>(small + 3)); break;
      case DataType::kInt8: put<int8_t>(row, i, static_cast<int8_t>(small)); break;
      case DataType::kInt16: put<int16_t>(row, i, static_cast<int16_t>(small)); break;
      case DataType::kInt32: put<int32_t>(row, i, small); break;
      case DataType::kInt64: put<int64_t>(row, i, small); break;
      case DataType::kFloat16: put<uint16_t>(row, i, floatToHalf(static_cast<float>(frac))); break;
      case DataType::kBFloat16:
        put<uint16_t>(row, i, floatToBfloat16(static_cast<float>(frac)));
        break;
      case DataType::kFloat32: put<float>(row, i, static_cast<float>(frac)); break;
      case DataType::kFloat64: put<double>(row, i, frac); break;
      case DataType::kBool: put<uint8_t>(row, i, static_cast<uint8_t>(small > 0)); break;
    }
  }
  return row;
}

// The composition spelled out with reduce.h, as each path wrote it before.
std::vector<char> byHand(DataType t, ReduceOp op, double pre, double post,
                         const std::vector<std::vector<char>>& rows) {
  const ReduceFn fn = reduceFunction(t, op);
  std::vector<char> acc = rows[0];
  scaleBuffer(acc.data(), kN, t, pre);
  for (size_t r = 1; r < rows.size(); ++r) {
    std::vector<char> tmp = rows[r];
    scaleBuffer(tmp.data(), kN, t, pre);
    fn(acc.data(), acc.data(), tmp.data(), kN);
  }
  postscaleBuffer(acc.data(), kN, t, op, static_cast<int>(rows.size()), post);
  return acc;
}

}  // namespace

TEST(reduce_and_combine_match_the_composition_by_hand) {
  int cases = 0;
  for (DataType t : kTypes) {
    for (ReduceOp op : kOps) {
      for (const auto& s : kScalings) {
        const bool scaled = s[0] != 1.0 || s[1] != 1.0;
        if (t == DataType::kBool && (op == ReduceOp::kAverage || scaled)) continue;
        for (int k = 1; k <= 4; ++k) {
          std::vector<std::vector<char>> rows;
          for (int r = 0; r < k; ++r) rows.push_back(rowOf(t, r));
          const std::vector<char> want = byHand(t, op, s[0], s[1], rows);
          const ReductionPlan plan(t, op, s[0], s[1], k);
          CHECK_EQ(plan.scalesInputs(), s[0] != 1.0);

          std::vector<char> out(want.size()), scratch;
          plan.reduce(out.data(), k, [&](int r) -> const void* { return rows[r].data(); }, kN,
                      scratch);
          plan.finish(out.data(), kN);
          CHECK(out == want);

          std::vector<std::vector<char>> scaled_rows = rows;
          for (auto& row : scaled_rows) plan.prescale(row.data(), kN);
          plan.combine(scaled_rows[0].data(), k,
                       [&](int r) -> const void* { return scaled_rows[r].data(); }, kN);
          plan.finish(scaled_rows[0].data(), kN);
          CHECK(scaled_rows[0] == want);
          ++cases;
        }
      }
    }
  }
  CHECK_EQ(cases, (9 * 5 * 3 + 4) * 4);
}

TEST(average_divides_once_by_the_divisor_after_the_postscale) {
  // float32: (1 + 2 + 4) * 0.5 prescaled = 3.5, then * 3 / 2 (divisor 2, not k = 3).
  std::vector<float> rows[3] = {{1.0f}, {2.0f}, {4.0f}};
  const ReductionPlan plan(DataType::kFloat32, ReduceOp::kAverage, 0.5, 3.0, 2);
  float out = 0;
  std::vector<char> scratch;
  plan.reduce(&out, 3, [&](int r) -> const void* { return rows[r].data(); }, 1, scratch);
  plan.finish(&out, 1);
  CHECK_EQ(out, 5.25f);
  // int32: 7 over 2 truncates toward zero (7 * 0.5), and -7 to -3.
  int32_t ints[2] = {7, -7};
  const ReductionPlan average(DataType::kInt32, ReduceOp::kAverage, 1.0, 1.0, 2);
  average.finish(ints, 2);
  CHECK_EQ(ints[0], 3);
  CHECK_EQ(ints[1], -3);
}

TEST(combine_of_one_row_copies_it_unless_it_is_the_output) {
  std::vector<int64_t> row = {5, -6, 7};
  std::vector<int64_t> out(3, 0);
  const ReductionPlan plan(DataType::kInt64, ReduceOp::kSum, 1.0, 1.0, 1);
  plan.combine(out.data(), 1, [&](int) -> const void* { return row.data(); }, 3);
  CHECK(out == row);
  plan.combine(row.data(), 1, [&](int) -> const void* { return row.data(); }, 3);
  CHECK(row == (std::vector<int64_t>{5, -6, 7}));
}

int main() { return check::runAll(); }
