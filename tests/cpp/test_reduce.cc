// Reduction and scaling kernels (csrc/core/reduce.h): every dtype under Sum,
// Min, Max and Product; the float16/bfloat16 conversions against an
// independent reference (exhaustive over all 16-bit patterns and every
// rounding tie); Horovod's Average and scaling arithmetic (postscale / size
// in double, integers truncated toward zero, float32 by float(factor));
// scaleBuffer.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "check.h"
#include "core/reduce.h"

using namespace hvd;

namespace {

uint32_t bitsOf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return x;
}

float floatOf(uint32_t x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

bool halfIsNan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
bool bf16IsNan(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

// The value a half bit pattern stands for, from the IEEE 754 definition.
double refHalfValue(uint16_t h) {
  int exp = (h >> 10) & 0x1f;
  int mant = h & 0x3ff;
  double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exp == 0x1f) return mant ? std::nan("") : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  return sign * std::ldexp(1024 + mant, exp - 25);
}

// Round to the nearest half, ties to even, computed in double with
// std::nearbyint (the default rounding mode is to nearest even). Not for NaN.
uint16_t refFloatToHalf(float f) {
  uint16_t sign = (bitsOf(f) >> 16) & 0x8000;
  double d = std::fabs(static_cast<double>(f));
  if (d >= 65520.0) return sign | 0x7c00;  // halfway to 2^16 and beyond: inf
  if (d < std::ldexp(1.0, -14)) {
    // Subnormal: multiples of 2^-24 (1024 of them rounds up to the first normal).
    return sign | static_cast<uint16_t>(std::nearbyint(std::ldexp(d, 24)));
  }
  int e = std::ilogb(d);
  int r = static_cast<int>(std::nearbyint(std::ldexp(d, 10 - e)));  // 1024..2048
  return sign | static_cast<uint16_t>(((e + 15) << 10) + r - 1024);
}

// Round to the nearest bfloat16 (8 significant bits), ties to even. Not for NaN.
uint16_t refFloatToBfloat16(float f) {
  uint16_t sign = (bitsOf(f) >> 16) & 0x8000;
  double d = std::fabs(static_cast<double>(f));
  if (std::isinf(d)) return sign | 0x7f80;
  if (d == 0) return sign;
  int e = std::max(std::ilogb(d), -126);  // float subnormals share the last exponent
  double v = std::ldexp(std::nearbyint(std::ldexp(d, 7 - e)), e - 7);
  if (v >= std::ldexp(1.0, 128)) return sign | 0x7f80;
  return sign | static_cast<uint16_t>(bitsOf(static_cast<float>(v)) >> 16);
}

uint16_t h(float f) { return floatToHalf(f); }
uint16_t bf(float f) { return floatToBfloat16(f); }

const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct};

template <typename T>
std::vector<T> reduce(DataType dtype, ReduceOp op, const std::vector<T>& a,
                      const std::vector<T>& b) {
  std::vector<T> out(a.size());
  ReduceFn fn = reduceFunction(dtype, op);
  if (!CHECK(fn != nullptr)) return out;
  fn(out.data(), a.data(), b.data(), a.size());
  return out;
}

long long refOp(ReduceOp op, long long a, long long b) {
  switch (op) {
    case ReduceOp::kMin:
      return a < b ? a : b;
    case ReduceOp::kMax:
      return a > b ? a : b;
    case ReduceOp::kProduct:
      return a * b;
    default:
      return a + b;
  }
}

// Small values every integer type holds, so the reference is plain arithmetic.
template <typename T>
void checkIntegerType(DataType dtype) {
  std::vector<long long> a = {-5, 3, 0, 9, -1, 11};
  std::vector<long long> b = {2, -7, 0, 4, -1, 11};
  if (!std::is_signed_v<T>) {
    for (auto& v : a) v = std::llabs(v);
    for (auto& v : b) v = std::llabs(v);
  }
  std::vector<T> ta(a.begin(), a.end()), tb(b.begin(), b.end());
  for (ReduceOp op : kOps) {
    std::vector<T> out = reduce(dtype, op, ta, tb);
    for (size_t i = 0; i < a.size(); ++i) {
      if (!CHECK_EQ(static_cast<long long>(out[i]), refOp(op, a[i], b[i])))
        std::printf("    dtype %s op %s element %zu\n", dataTypeName(dtype), reduceOpName(op), i);
    }
  }
  // Average reduces as Sum; the division is the caller's separate step.
  CHECK_EQ(reduce(dtype, ReduceOp::kAverage, ta, tb), reduce(dtype, ReduceOp::kSum, ta, tb));
  // Out may alias an input.
  std::vector<T> acc = ta;
  reduceFunction(dtype, ReduceOp::kSum)(acc.data(), acc.data(), tb.data(), acc.size());
  CHECK_EQ(acc, reduce(dtype, ReduceOp::kSum, ta, tb));
  // Adasum is not an element-wise reduction.
  CHECK(reduceFunction(dtype, ReduceOp::kAdasum) == nullptr);
}

}  // namespace

TEST(integer_types_sum_min_max_product) {
  checkIntegerType<uint8_t>(DataType::kUInt8);
  checkIntegerType<int8_t>(DataType::kInt8);
  checkIntegerType<int16_t>(DataType::kInt16);
  checkIntegerType<int32_t>(DataType::kInt32);
  checkIntegerType<int64_t>(DataType::kInt64);
}

TEST(integer_types_wrap_and_keep_full_width) {
  // Overflow wraps like torch's integer tensors.
  CHECK_EQ(reduce<uint8_t>(DataType::kUInt8, ReduceOp::kSum, {200, 255}, {100, 3}),
           (std::vector<uint8_t>{44, 2}));
  CHECK_EQ(reduce<uint8_t>(DataType::kUInt8, ReduceOp::kProduct, {16}, {17}),
           (std::vector<uint8_t>{16}));
  CHECK_EQ(reduce<int8_t>(DataType::kInt8, ReduceOp::kSum, {127}, {1}),
           (std::vector<int8_t>{-128}));
  CHECK_EQ(reduce<uint8_t>(DataType::kUInt8, ReduceOp::kMax, {0, 255}, {255, 0}),
           (std::vector<uint8_t>{255, 255}));
  // int64 is not squeezed through a narrower type.
  const int64_t big = (int64_t{1} << 53) + 1;  // not representable in double
  CHECK_EQ(reduce<int64_t>(DataType::kInt64, ReduceOp::kSum, {big}, {big}),
           (std::vector<int64_t>{2 * big}));
  CHECK_EQ(reduce<int64_t>(DataType::kInt64, ReduceOp::kMin, {INT64_MIN, big}, {0, big + 1}),
           (std::vector<int64_t>{INT64_MIN, big}));
  CHECK_EQ(
      reduce<int64_t>(DataType::kInt64, ReduceOp::kProduct, {int64_t{1} << 31}, {int64_t{3} << 30}),
      (std::vector<int64_t>{int64_t{3} << 61}));
  CHECK_EQ(reduce<int32_t>(DataType::kInt32, ReduceOp::kMin, {INT32_MIN, INT32_MAX}, {0, 0}),
           (std::vector<int32_t>{INT32_MIN, 0}));
}

TEST(float32_and_float64_sum_min_max_product) {
  std::vector<float> a = {1.5f, -2.25f, 0.0f, 1e30f, -INFINITY, 3.0f};
  std::vector<float> b = {0.25f, 4.0f, -0.0f, 1e30f, 5.0f, -0.5f};
  CHECK_EQ(reduce(DataType::kFloat32, ReduceOp::kSum, a, b),
           (std::vector<float>{1.75f, 1.75f, 0.0f, 2e30f, -INFINITY, 2.5f}));
  CHECK_EQ(reduce(DataType::kFloat32, ReduceOp::kMin, a, b),
           (std::vector<float>{0.25f, -2.25f, 0.0f, 1e30f, -INFINITY, -0.5f}));
  CHECK_EQ(reduce(DataType::kFloat32, ReduceOp::kMax, a, b),
           (std::vector<float>{1.5f, 4.0f, 0.0f, 1e30f, 5.0f, 3.0f}));
  CHECK_EQ(reduce(DataType::kFloat32, ReduceOp::kProduct, a, b),
           (std::vector<float>{0.375f, -9.0f, -0.0f, INFINITY, -INFINITY, -1.5f}));
  // float32 arithmetic, not double: 1 + 2^-24 is 1 in float.
  CHECK_EQ(reduce<float>(DataType::kFloat32, ReduceOp::kSum, {1.0f}, {std::ldexp(1.0f, -24)}),
           (std::vector<float>{1.0f}));

  std::vector<double> c = {1.5, -2.25, 1e300, 1.0, -0.1};
  std::vector<double> d = {0.25, 4.0, 1e300, std::ldexp(1.0, -52), 0.2};
  CHECK_EQ(reduce(DataType::kFloat64, ReduceOp::kSum, c, d),
           (std::vector<double>{1.75, 1.75, 2e300, 1.0 + std::ldexp(1.0, -52), -0.1 + 0.2}));
  CHECK_EQ(reduce(DataType::kFloat64, ReduceOp::kMin, c, d),
           (std::vector<double>{0.25, -2.25, 1e300, std::ldexp(1.0, -52), -0.1}));
  CHECK_EQ(reduce(DataType::kFloat64, ReduceOp::kMax, c, d),
           (std::vector<double>{1.5, 4.0, 1e300, 1.0, 0.2}));
  CHECK_EQ(reduce(DataType::kFloat64, ReduceOp::kProduct, c, d),
           (std::vector<double>{0.375, -9.0, INFINITY, std::ldexp(1.0, -52), -0.1 * 0.2}));
  CHECK_EQ(reduce(DataType::kFloat64, ReduceOp::kAverage, c, d),
           reduce(DataType::kFloat64, ReduceOp::kSum, c, d));
  CHECK(reduceFunction(DataType::kFloat32, ReduceOp::kAdasum) == nullptr);
}

TEST(float16_sum_min_max_product) {
  std::vector<uint16_t> a = {h(1.5f), h(-2.25f), h(0.5f), h(60000.0f), h(2048.0f), h(2048.0f)};
  std::vector<uint16_t> b = {h(0.25f), h(4.0f), h(-0.5f), h(60000.0f), h(1.0f), h(3.0f)};
  // 60000 + 60000 overflows to inf; 2048 + 1 is a tie between 2048 and 2050
  // (half's spacing there is 2) and goes to the even 2048; 2048 + 3 is a tie
  // between 2050 and 2052 and goes to 2052.
  CHECK_EQ(reduce(DataType::kFloat16, ReduceOp::kSum, a, b),
           (std::vector<uint16_t>{h(1.75f), h(1.75f), h(0.0f), 0x7c00, h(2048.0f), h(2052.0f)}));
  CHECK_EQ(reduce(DataType::kFloat16, ReduceOp::kMin, a, b),
           (std::vector<uint16_t>{h(0.25f), h(-2.25f), h(-0.5f), h(60000.0f), h(1.0f), h(3.0f)}));
  CHECK_EQ(reduce(DataType::kFloat16, ReduceOp::kMax, a, b),
           (std::vector<uint16_t>{h(1.5f), h(4.0f), h(0.5f), h(60000.0f), h(2048.0f), h(2048.0f)}));
  CHECK_EQ(reduce(DataType::kFloat16, ReduceOp::kProduct, a, b),
           (std::vector<uint16_t>{h(0.375f), h(-9.0f), h(-0.25f), 0x7c00, h(2048.0f), h(6144.0f)}));
  CHECK_EQ(reduce(DataType::kFloat16, ReduceOp::kAverage, a, b),
           reduce(DataType::kFloat16, ReduceOp::kSum, a, b));
  // In place, as gloo calls it.
  std::vector<uint16_t> acc = a;
  reduceFunction(DataType::kFloat16, ReduceOp::kSum)(acc.data(), acc.data(), b.data(), acc.size());
  CHECK_EQ(acc, reduce(DataType::kFloat16, ReduceOp::kSum, a, b));
  CHECK(reduceFunction(DataType::kFloat16, ReduceOp::kAdasum) == nullptr);
}

TEST(bfloat16_sum_min_max_product) {
  std::vector<uint16_t> a = {bf(1.5f), bf(-2.25f), bf(0.5f), bf(3e38f), bf(256.0f), bf(256.0f)};
  std::vector<uint16_t> b = {bf(0.25f), bf(4.0f), bf(-0.5f), bf(3e38f), bf(1.0f), bf(3.0f)};
  // bfloat16's spacing at 256 is 2: 257 ties to 256, 259 ties to 260.
  CHECK_EQ(reduce(DataType::kBFloat16, ReduceOp::kSum, a, b),
           (std::vector<uint16_t>{bf(1.75f), bf(1.75f), bf(0.0f), 0x7f80, bf(256.0f), bf(260.0f)}));
  CHECK_EQ(
      reduce(DataType::kBFloat16, ReduceOp::kMin, a, b),
      (std::vector<uint16_t>{bf(0.25f), bf(-2.25f), bf(-0.5f), bf(3e38f), bf(1.0f), bf(3.0f)}));
  CHECK_EQ(
      reduce(DataType::kBFloat16, ReduceOp::kMax, a, b),
      (std::vector<uint16_t>{bf(1.5f), bf(4.0f), bf(0.5f), bf(3e38f), bf(256.0f), bf(256.0f)}));
  CHECK_EQ(
      reduce(DataType::kBFloat16, ReduceOp::kProduct, a, b),
      (std::vector<uint16_t>{bf(0.375f), bf(-9.0f), bf(-0.25f), 0x7f80, bf(256.0f), bf(768.0f)}));
  CHECK_EQ(reduce(DataType::kBFloat16, ReduceOp::kAverage, a, b),
           reduce(DataType::kBFloat16, ReduceOp::kSum, a, b));
  CHECK(reduceFunction(DataType::kBFloat16, ReduceOp::kAdasum) == nullptr);
}

TEST(bool_sum_max_are_or_min_product_are_and) {
  std::vector<uint8_t> a = {0, 0, 1, 1, 2};
  std::vector<uint8_t> b = {0, 1, 0, 1, 0};  // 2 is a true byte too
  std::vector<uint8_t> any = {0, 1, 1, 1, 1};
  std::vector<uint8_t> all = {0, 0, 0, 1, 0};
  CHECK_EQ(reduce(DataType::kBool, ReduceOp::kSum, a, b), any);
  CHECK_EQ(reduce(DataType::kBool, ReduceOp::kAverage, a, b), any);
  CHECK_EQ(reduce(DataType::kBool, ReduceOp::kMax, a, b), any);
  CHECK_EQ(reduce(DataType::kBool, ReduceOp::kMin, a, b), all);
  CHECK_EQ(reduce(DataType::kBool, ReduceOp::kProduct, a, b), all);
}

TEST(half_to_float_is_exact_for_all_65536_patterns) {
  for (uint32_t i = 0; i <= 0xffff; ++i) {
    uint16_t x = static_cast<uint16_t>(i);
    float f = halfToFloat(x);
    double want = refHalfValue(x);
    if (halfIsNan(x)) {
      CHECK(std::isnan(f));
      CHECK_EQ(std::signbit(f), (x & 0x8000) != 0);
    } else if (!CHECK_EQ(static_cast<double>(f), want)) {
      std::printf("    half 0x%04x\n", i);
    }
    if (x == 0x8000) CHECK(std::signbit(f));  // -0 stays -0
  }
}

TEST(half_round_trip_is_identity_for_all_65536_patterns) {
  for (uint32_t i = 0; i <= 0xffff; ++i) {
    uint16_t x = static_cast<uint16_t>(i);
    uint16_t back = floatToHalf(halfToFloat(x));
    if (halfIsNan(x)) {
      // The payload may change; NaN-ness and sign may not.
      CHECK(halfIsNan(back));
      CHECK_EQ(back & 0x8000, x & 0x8000);
    } else {
      CHECK_EQ(back, x);
    }
  }
}

TEST(float_to_half_known_values) {
  CHECK_EQ(h(0.0f), 0x0000);
  CHECK_EQ(h(-0.0f), 0x8000);
  CHECK_EQ(h(1.0f), 0x3c00);
  CHECK_EQ(h(-2.0f), 0xc000);
  CHECK_EQ(h(0.1f), 0x2e66);
  CHECK_EQ(h(3.14159265f), 0x4248);
  // Largest finite, and the overflow edge: 65520 is halfway between 65504
  // and 2^16 and rounds (to even) up, i.e. to inf.
  CHECK_EQ(h(65504.0f), 0x7bff);
  CHECK_EQ(h(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  CHECK_EQ(h(65520.0f), 0x7c00);
  CHECK_EQ(h(-65520.0f), 0xfc00);
  CHECK_EQ(h(65536.0f), 0x7c00);
  CHECK_EQ(h(1e10f), 0x7c00);
  CHECK_EQ(h(FLT_MAX), 0x7c00);
  CHECK_EQ(h(INFINITY), 0x7c00);
  CHECK_EQ(h(-INFINITY), 0xfc00);
  CHECK(halfIsNan(h(NAN)));
  CHECK(halfIsNan(h(floatOf(0x7f800001))));  // signalling NaN stays NaN, not inf
  CHECK(halfIsNan(h(floatOf(0xffc00000))) && (h(floatOf(0xffc00000)) & 0x8000));
  // Ties to even in the normal range (spacing 2^-10 at 1).
  CHECK_EQ(h(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  CHECK_EQ(h(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  CHECK_EQ(h(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -23)), 0x3c01);
  CHECK_EQ(h(1.0f + std::ldexp(1.0f, -10)), 0x3c01);
  CHECK_EQ(h(2.0f - std::ldexp(1.0f, -12)), 0x4000);  // rounds up across the exponent
  // Subnormals: multiples of 2^-24.
  CHECK_EQ(h(std::ldexp(1.0f, -24)), 0x0001);
  CHECK_EQ(h(-std::ldexp(1.0f, -24)), 0x8001);
  CHECK_EQ(h(std::ldexp(1.0f, -25)), 0x0000);                        // tie: to even 0
  CHECK_EQ(h(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);  // just above the tie
  CHECK_EQ(h(3 * std::ldexp(1.0f, -25)), 0x0002);                    // 1.5 units: to 2
  CHECK_EQ(h(5 * std::ldexp(1.0f, -25)), 0x0002);                    // 2.5 units: to 2
  CHECK_EQ(h(7 * std::ldexp(1.0f, -25)), 0x0004);                    // 3.5 units: to 4
  CHECK_EQ(h(std::ldexp(1.0f, -26)), 0x0000);
  CHECK_EQ(h(1023 * std::ldexp(1.0f, -24)), 0x03ff);  // largest subnormal
  CHECK_EQ(h(2045 * std::ldexp(1.0f, -25)), 0x03fe);  // 1022.5 units: to 1022
  CHECK_EQ(h(2047 * std::ldexp(1.0f, -25)), 0x0400);  // 1023.5: up to the first normal
  CHECK_EQ(h(std::ldexp(1.0f, -14)), 0x0400);         // smallest normal
  CHECK_EQ(h(std::numeric_limits<float>::denorm_min()), 0x0000);
  CHECK_EQ(h(-std::numeric_limits<float>::denorm_min()), 0x8000);
  CHECK_EQ(halfToFloat(0x0001), std::ldexp(1.0f, -24));
  CHECK_EQ(halfToFloat(0x03ff), 1023 * std::ldexp(1.0f, -24));
  CHECK_EQ(halfToFloat(0x7bff), 65504.0f);
  CHECK_EQ(halfToFloat(0x3555), 0.333251953125f);
  CHECK_EQ(halfToFloat(0xfc00), -INFINITY);
}

// Every tie between two adjacent halves, and the floats just either side of
// it, in both signs: the rounding decision at each of the 63488 boundaries.
TEST(float_to_half_every_tie_and_its_neighbours) {
  for (uint32_t i = 0; i < 0x7c00; ++i) {
    uint16_t lo = static_cast<uint16_t>(i);
    float a = halfToFloat(lo);
    float b = i == 0x7bff ? 65536.0f : halfToFloat(static_cast<uint16_t>(i + 1));
    float mid = a + (b - a) / 2;  // exact: one bit more than a half has
    uint16_t even = (lo & 1) ? static_cast<uint16_t>(lo + 1) : lo;
    for (float sign : {1.0f, -1.0f}) {
      uint16_t s = sign < 0 ? 0x8000 : 0;
      CHECK_EQ(h(sign * mid), s | even);
      CHECK_EQ(h(sign * std::nextafter(mid, 0.0f)), s | lo);
      CHECK_EQ(h(sign * std::nextafter(mid, INFINITY)), s | static_cast<uint16_t>(lo + 1));
    }
  }
}

// A sample of all float32 patterns (every 257th, both signs) against the
// double-precision reference.
TEST(float_to_half_matches_reference_on_sampled_floats) {
  for (uint64_t x = 0; x <= 0xffffffffu; x += 257) {
    float f = floatOf(static_cast<uint32_t>(x));
    if (std::isnan(f)) {
      CHECK(halfIsNan(h(f)));
      continue;
    }
    if (!CHECK_EQ(h(f), refFloatToHalf(f)))
      std::printf("    float bits 0x%08llx\n", (unsigned long long)x);
  }
}

TEST(bfloat16_round_trip_is_identity_for_all_65536_patterns) {
  for (uint32_t i = 0; i <= 0xffff; ++i) {
    uint16_t x = static_cast<uint16_t>(i);
    float f = bfloat16ToFloat(x);
    CHECK_EQ(bitsOf(f), i << 16);  // bfloat16 is float32's top half
    uint16_t back = floatToBfloat16(f);
    if (bf16IsNan(x)) {
      CHECK(bf16IsNan(back));
      CHECK_EQ(back & 0x8000, x & 0x8000);
    } else {
      CHECK_EQ(back, x);
    }
  }
}

TEST(float_to_bfloat16_known_values) {
  CHECK_EQ(bf(1.0f), 0x3f80);
  CHECK_EQ(bf(-0.0f), 0x8000);
  CHECK_EQ(bf(3.14159265f), 0x4049);
  CHECK_EQ(bf(1.0f + std::ldexp(1.0f, -8)), 0x3f80);                          // tie: to even
  CHECK_EQ(bf(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);                      // tie: to even
  CHECK_EQ(bf(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -23)), 0x3f81);  // above the tie
  CHECK_EQ(bf(2.0f - std::ldexp(1.0f, -9)), 0x4000);
  CHECK_EQ(bf(FLT_MAX), 0x7f80);  // above bfloat16's largest finite: rounds to inf
  CHECK_EQ(bf(bfloat16ToFloat(0x7f7f)), 0x7f7f);
  CHECK_EQ(bf(INFINITY), 0x7f80);
  CHECK_EQ(bf(-INFINITY), 0xff80);
  CHECK(bf16IsNan(bf(NAN)));
  CHECK(bf16IsNan(bf(floatOf(0x7f800001))));  // a low-payload NaN must not become inf
  CHECK(bf16IsNan(bf(floatOf(0xff800001))) && (bf(floatOf(0xff800001)) & 0x8000));
  CHECK(bf16IsNan(bf(floatOf(0x7fffffff))));  // must not carry into the sign
  CHECK_EQ(bf(std::numeric_limits<float>::denorm_min()), 0x0000);
  CHECK_EQ(bf(floatOf(0x00008000)), 0x0000);  // subnormal tie: to even
  CHECK_EQ(bf(floatOf(0x00018000)), 0x0002);
  CHECK_EQ(bf(floatOf(0x00008001)), 0x0001);
}

// Every tie between adjacent bfloat16 values and its neighbours, both signs
// (ties are float patterns with exactly bit 15 set below the kept half).
TEST(float_to_bfloat16_every_tie_and_its_neighbours) {
  for (uint32_t i = 0; i < 0x7f80; ++i) {
    uint32_t mid = (i << 16) | 0x8000;
    uint16_t even = (i & 1) ? static_cast<uint16_t>(i + 1) : static_cast<uint16_t>(i);
    for (uint32_t s : {0u, 0x80000000u}) {
      uint16_t sh = static_cast<uint16_t>(s >> 16);
      CHECK_EQ(bf(floatOf(s | mid)), sh | even);
      CHECK_EQ(bf(floatOf(s | (mid - 1))), sh | static_cast<uint16_t>(i));
      CHECK_EQ(bf(floatOf(s | (mid + 1))), sh | static_cast<uint16_t>(i + 1));
    }
  }
}

TEST(float_to_bfloat16_matches_reference_on_sampled_floats) {
  for (uint64_t x = 0; x <= 0xffffffffu; x += 257) {
    float f = floatOf(static_cast<uint32_t>(x));
    if (std::isnan(f)) {
      CHECK(bf16IsNan(bf(f)));
      continue;
    }
    if (!CHECK_EQ(bf(f), refFloatToBfloat16(f)))
      std::printf("    float bits 0x%08llx\n", (unsigned long long)x);
  }
}

namespace {

template <typename T>
std::vector<T> averaged(std::vector<T> v, DataType dtype, int divisor, double post = 1.0) {
  postscaleBuffer(v.data(), v.size(), dtype, ReduceOp::kAverage, divisor, post);
  return v;
}

// Horovod's integer Average: trunc(double(x) * (post / d)).
template <typename T>
void checkIntegerAverageRange(DataType dtype, long long lo, long long hi) {
  for (int d = 1; d <= 7; ++d) {
    std::vector<T> v;
    for (long long x = lo; x <= hi; ++x) v.push_back(static_cast<T>(x));
    postscaleBuffer(v.data(), v.size(), dtype, ReduceOp::kAverage, d, 1.0);
    for (long long x = lo; x <= hi; ++x) {
      long long want = static_cast<long long>(std::trunc(static_cast<double>(x) * (1.0 / d)));
      if (!CHECK_EQ(static_cast<long long>(v[x - lo]), want))
        std::printf("    %s: trunc(%lld * (1.0 / %d))\n", dataTypeName(dtype), x, d);
    }
  }
}

}  // namespace

// Horovod folds Average into the postscale factor (postscale / size) and
// scales integers in double, converting back toward zero: -7 / 2 -> -3
// (not floor's -4), and 49 * (1.0 / 49) = 0.999... -> 0.
TEST(integer_average_truncates_like_horovods_postscale) {
  CHECK_EQ(averaged<int32_t>({-7, 7, -1, -6, 0, 5}, DataType::kInt32, 2),
           (std::vector<int32_t>{-3, 3, 0, -3, 0, 2}));
  CHECK_EQ(averaged<int32_t>({-1, -2, -3, -4, 1, 2, 3, 4}, DataType::kInt32, 3),
           (std::vector<int32_t>{0, 0, -1, -1, 0, 0, 1, 1}));
  CHECK_EQ(averaged<int32_t>({49, 98, -49}, DataType::kInt32, 49),
           (std::vector<int32_t>{0, 1, 0}));
  CHECK_EQ(averaged<int8_t>({-128, -127, 127}, DataType::kInt8, 3),
           (std::vector<int8_t>{-42, -42, 42}));
  CHECK_EQ(averaged<uint8_t>({255, 7, 0}, DataType::kUInt8, 2), (std::vector<uint8_t>{127, 3, 0}));
  CHECK_EQ(averaged<int64_t>({int64_t{1} << 40, -3}, DataType::kInt64, 4),
           (std::vector<int64_t>{int64_t{1} << 38, 0}));
  // The postscale factor joins the division: one conversion, not two.
  CHECK_EQ(averaged<int32_t>({10, -10}, DataType::kInt32, 4, 2.0),
           (std::vector<int32_t>{5, -5}));  // 10 * 0.5; dividing first would give 2 * 2 = 4
  // Divisor 1 changes nothing; bool is left alone.
  CHECK_EQ(averaged<int32_t>({-7, 7}, DataType::kInt32, 1), (std::vector<int32_t>{-7, 7}));
  CHECK_EQ(averaged<uint8_t>({1, 0, 1}, DataType::kBool, 3), (std::vector<uint8_t>{1, 0, 1}));
  // Sum with a postscale factor scales by it alone.
  std::vector<int32_t> s = {7, -7};
  postscaleBuffer(s.data(), s.size(), DataType::kInt32, ReduceOp::kSum, 3, 0.5);
  CHECK_EQ(s, (std::vector<int32_t>{3, -3}));
  checkIntegerAverageRange<int8_t>(DataType::kInt8, -128, 127);
  checkIntegerAverageRange<uint8_t>(DataType::kUInt8, 0, 255);
  checkIntegerAverageRange<int16_t>(DataType::kInt16, -1000, 1000);
  checkIntegerAverageRange<int32_t>(DataType::kInt32, -1000, 1000);
  checkIntegerAverageRange<int64_t>(DataType::kInt64, -1000, 1000);
}

TEST(float_average_multiplies_by_postscale_over_size) {
  // float32: x * float(post / d), in float.
  std::vector<float> f;
  for (int i = -3000; i <= 3000; ++i) f.push_back(static_cast<float>(i) * 0.37f);
  for (int d : {2, 3, 5, 7}) {
    for (double post : {1.0, 0.3, 2.5}) {
      std::vector<float> got = averaged(f, DataType::kFloat32, d, post);
      const float factor = static_cast<float>(post / d);
      for (size_t i = 0; i < f.size(); ++i) CHECK_EQ(got[i], f[i] * factor);
    }
  }
  // float16/bfloat16: widened, times float(1/3), rounded once.
  std::vector<uint16_t> all16;
  for (uint32_t i = 0; i <= 0xffff; ++i) all16.push_back(static_cast<uint16_t>(i));
  std::vector<uint16_t> half3 = averaged(all16, DataType::kFloat16, 3);
  std::vector<uint16_t> bf3 = averaged(all16, DataType::kBFloat16, 3);
  const float third = static_cast<float>(1.0 / 3);
  for (uint32_t i = 0; i <= 0xffff; ++i) {
    uint16_t x = static_cast<uint16_t>(i);
    if (!halfIsNan(x)) CHECK_EQ(half3[i], h(halfToFloat(x) * third));
    if (!bf16IsNan(x)) CHECK_EQ(bf3[i], bf(bfloat16ToFloat(x) * third));
  }
  // float64: x * (post / d) in double.
  std::vector<double> g = {5.0, -7.0, 1e300, 0.1, 1.0};
  std::vector<double> g3 = averaged(g, DataType::kFloat64, 3, 0.7);
  for (size_t i = 0; i < g.size(); ++i) CHECK_EQ(g3[i], g[i] * (0.7 / 3));
  CHECK_EQ(averaged(g, DataType::kFloat64, 4),
           (std::vector<double>{1.25, -1.75, 2.5e299, 0.025, 0.25}));
}

TEST(scale_buffer_every_dtype) {
  // Integers scale in double and truncate toward zero.
  std::vector<int32_t> i32 = {7, -7, 5, -5, 0};
  scaleBuffer(i32.data(), i32.size(), DataType::kInt32, 0.5);
  CHECK_EQ(i32, (std::vector<int32_t>{3, -3, 2, -2, 0}));
  std::vector<int64_t> i64 = {int64_t{1} << 52, -3};
  scaleBuffer(i64.data(), i64.size(), DataType::kInt64, 1.5);
  CHECK_EQ(i64, (std::vector<int64_t>{int64_t{3} << 51, -4}));
  std::vector<int8_t> i8 = {-128, 100};
  scaleBuffer(i8.data(), i8.size(), DataType::kInt8, 0.25);
  CHECK_EQ(i8, (std::vector<int8_t>{-32, 25}));
  std::vector<int16_t> i16 = {300, -301};
  scaleBuffer(i16.data(), i16.size(), DataType::kInt16, 3.0);
  CHECK_EQ(i16, (std::vector<int16_t>{900, -903}));
  std::vector<uint8_t> u8 = {255, 3};
  scaleBuffer(u8.data(), u8.size(), DataType::kUInt8, 0.5);
  CHECK_EQ(u8, (std::vector<uint8_t>{127, 1}));

  std::vector<float> f32 = {1.5f, -2.0f, 0.1f};
  scaleBuffer(f32.data(), f32.size(), DataType::kFloat32, 3.0);
  CHECK_EQ(f32, (std::vector<float>{4.5f, -6.0f, 0.1f * 3.0f}));
  // float32 multiplies by float(factor), in float (Horovod's CPU rule), which
  // can differ from rounding the double product once: 1/3 shows it.
  std::vector<float> thirds = {1.0f, 3.0f, 0.1f, 7.0f};
  scaleBuffer(thirds.data(), thirds.size(), DataType::kFloat32, 1.0 / 3);
  const float t = static_cast<float>(1.0 / 3);
  CHECK_EQ(thirds, (std::vector<float>{1.0f * t, 3.0f * t, 0.1f * t, 7.0f * t}));
  std::vector<double> f64 = {1.5, -2.0};
  scaleBuffer(f64.data(), f64.size(), DataType::kFloat64, -0.25);
  CHECK_EQ(f64, (std::vector<double>{-0.375, 0.5}));

  std::vector<uint16_t> f16 = {h(1.5f), h(-2.0f), h(65504.0f), h(1.0f)};
  scaleBuffer(f16.data(), f16.size(), DataType::kFloat16, 3.0);
  CHECK_EQ(f16, (std::vector<uint16_t>{h(4.5f), h(-6.0f), 0x7c00, h(3.0f)}));
  std::vector<uint16_t> b16 = {bf(1.5f), bf(-2.0f), bf(1.0f)};
  scaleBuffer(b16.data(), b16.size(), DataType::kBFloat16, 0.5);
  CHECK_EQ(b16, (std::vector<uint16_t>{bf(0.75f), bf(-1.0f), bf(0.5f)}));

  std::vector<uint8_t> flags = {1, 0};
  scaleBuffer(flags.data(), flags.size(), DataType::kBool, 5.0);
  CHECK_EQ(flags, (std::vector<uint8_t>{1, 0}));

  // Factor 1 leaves the bits untouched (a NaN payload, a -0).
  std::vector<uint32_t> raw = {0x7fc01234u, 0x80000000u};
  scaleBuffer(raw.data(), raw.size(), DataType::kFloat32, 1.0);
  CHECK_EQ(raw, (std::vector<uint32_t>{0x7fc01234u, 0x80000000u}));
}

TEST(dtype_sizes_and_names) {
  CHECK_EQ(dataTypeSize(DataType::kUInt8), 1u);
  CHECK_EQ(dataTypeSize(DataType::kBool), 1u);
  CHECK_EQ(dataTypeSize(DataType::kFloat16), 2u);
  CHECK_EQ(dataTypeSize(DataType::kBFloat16), 2u);
  CHECK_EQ(dataTypeSize(DataType::kInt16), 2u);
  CHECK_EQ(dataTypeSize(DataType::kInt32), 4u);
  CHECK_EQ(dataTypeSize(DataType::kFloat32), 4u);
  CHECK_EQ(dataTypeSize(DataType::kInt64), 8u);
  CHECK_EQ(dataTypeSize(DataType::kFloat64), 8u);
  CHECK_EQ(std::string(dataTypeName(DataType::kBFloat16)), "bfloat16");
  CHECK_EQ(std::string(reduceOpName(ReduceOp::kAverage)), "Average");
  CHECK_EQ(std::string(opTypeName(OpType::kAllgather)), "allgather");
  CHECK(isFloatingPoint(DataType::kFloat16) && isFloatingPoint(DataType::kBFloat16));
  CHECK(!isFloatingPoint(DataType::kInt64) && !isFloatingPoint(DataType::kBool));
}

int main() { return check::runAll(); }
