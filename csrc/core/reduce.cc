#include "reduce.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace hvd {

float halfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal half: normalise into a float32 normal.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400) == 0);
    bits = sign | ((112 - e) << 23) | ((mant & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t floatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0);
  if (ax >= 0x477ff000u) return sign | 0x7c00;  // rounds to >= 65520: inf
  if (ax < 0x38800000u) {
    // Result is subnormal (or zero): add the float to a magic number so the
    // FPU does the round-to-nearest-even shift for us.
    float magic;
    uint32_t m = 0x3f000000u;  // 0.5f: places half's subnormal ulp at bit 0
    std::memcpy(&magic, &m, 4);
    float a;
    std::memcpy(&a, &ax, 4);
    a += magic;
    uint32_t r;
    std::memcpy(&r, &a, 4);
    return sign | static_cast<uint16_t>(r - m);
  }
  uint32_t mant_odd = (ax >> 13) & 1;
  ax += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
  return sign | static_cast<uint16_t>(ax >> 13);
}

float bfloat16ToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t floatToBfloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet nan
  x += 0x7fffu + ((x >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(x >> 16);
}

namespace {

struct Sum { template <typename T> static T apply(T a, T b) { return a + b; } };
struct Min { template <typename T> static T apply(T a, T b) { return std::min(a, b); } };
struct Max { template <typename T> static T apply(T a, T b) { return std::max(a, b); } };
struct Prod { template <typename T> static T apply(T a, T b) { return a * b; } };

template <typename T, typename Op>
void reduceTyped(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = static_cast<T>(Op::apply(x[i], y[i]));
}

// 16-bit floats: widen, reduce, round back.
template <float (*Load)(uint16_t), uint16_t (*Store)(float), typename Op>
void reduceHalfLike(void* out, const void* a, const void* b, size_t n) {
  uint16_t* o = static_cast<uint16_t*>(out);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = Store(Op::apply(Load(x[i]), Load(y[i])));
}

// bool: Sum and Max are logical or, Min and Product are logical and.
template <bool kOr>
void reduceBool(void* out, const void* a, const void* b, size_t n) {
  uint8_t* o = static_cast<uint8_t*>(out);
  const uint8_t* x = static_cast<const uint8_t*>(a);
  const uint8_t* y = static_cast<const uint8_t*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = kOr ? (x[i] || y[i]) : (x[i] && y[i]);
}

template <typename Op>
ReduceFn pick(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8: return reduceTyped<uint8_t, Op>;
    case DataType::kInt8: return reduceTyped<int8_t, Op>;
    case DataType::kInt16: return reduceTyped<int16_t, Op>;
    case DataType::kInt32: return reduceTyped<int32_t, Op>;
    case DataType::kInt64: return reduceTyped<int64_t, Op>;
    case DataType::kFloat32: return reduceTyped<float, Op>;
    case DataType::kFloat64: return reduceTyped<double, Op>;
    case DataType::kFloat16: return reduceHalfLike<halfToFloat, floatToHalf, Op>;
    case DataType::kBFloat16: return reduceHalfLike<bfloat16ToFloat, floatToBfloat16, Op>;
    case DataType::kBool: return nullptr;
  }
  return nullptr;
}

// Horovod's CPU scaling (ScaleBuffer): integers multiply in double and
// convert back, truncating toward zero; float64 multiplies in double;
// float32 multiplies by the factor rounded to float, in float.
template <typename T>
void scaleInteger(void* buf, size_t n, double factor) {
  T* p = static_cast<T*>(buf);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<T>(static_cast<double>(p[i]) * factor);
}

template <typename T>
void scaleFloat(void* buf, size_t n, T factor) {
  T* p = static_cast<T*>(buf);
  for (size_t i = 0; i < n; ++i) p[i] = p[i] * factor;
}

// float16 (and bfloat16, which Horovod lacks on the CPU): widened to float32,
// multiplied by the float32 factor, rounded back once.
template <float (*Load)(uint16_t), uint16_t (*Store)(float)>
void scaleHalfLike(void* buf, size_t n, float factor) {
  uint16_t* p = static_cast<uint16_t*>(buf);
  for (size_t i = 0; i < n; ++i) p[i] = Store(Load(p[i]) * factor);
}

}  // namespace

ReduceFn reduceFunction(DataType dtype, ReduceOp op) {
  if (dtype == DataType::kBool) {
    return (op == ReduceOp::kMin || op == ReduceOp::kProduct) ? reduceBool<false>
                                                               : reduceBool<true>;
  }
  switch (op) {
    case ReduceOp::kAverage:
    case ReduceOp::kSum: return pick<Sum>(dtype);
    case ReduceOp::kMin: return pick<Min>(dtype);
    case ReduceOp::kMax: return pick<Max>(dtype);
    case ReduceOp::kProduct: return pick<Prod>(dtype);
    case ReduceOp::kAdasum: return nullptr;
  }
  return nullptr;
}

void scaleBuffer(void* buf, size_t n, DataType dtype, double factor) {
  if (factor == 1.0) return;
  const float f32 = static_cast<float>(factor);
  switch (dtype) {
    case DataType::kUInt8: return scaleInteger<uint8_t>(buf, n, factor);
    case DataType::kInt8: return scaleInteger<int8_t>(buf, n, factor);
    case DataType::kInt16: return scaleInteger<int16_t>(buf, n, factor);
    case DataType::kInt32: return scaleInteger<int32_t>(buf, n, factor);
    case DataType::kInt64: return scaleInteger<int64_t>(buf, n, factor);
    case DataType::kFloat32: return scaleFloat<float>(buf, n, f32);
    case DataType::kFloat64: return scaleFloat<double>(buf, n, factor);
    case DataType::kFloat16: return scaleHalfLike<halfToFloat, floatToHalf>(buf, n, f32);
    case DataType::kBFloat16: return scaleHalfLike<bfloat16ToFloat, floatToBfloat16>(buf, n, f32);
    case DataType::kBool: return;  // scaling a truth value is meaningless; callers refuse it
  }
}

double postscaleFactor(ReduceOp op, int divisor, double postscale) {
  // Horovod folds Average into the postscale factor (postscale / size, in
  // double) and scales once: dividing first and scaling after would round twice.
  return op == ReduceOp::kAverage ? postscale / divisor : postscale;
}

void postscaleBuffer(void* buf, size_t n, DataType dtype, ReduceOp op, int divisor,
                     double postscale) {
  scaleBuffer(buf, n, dtype, postscaleFactor(op, divisor, postscale));
}

}  // namespace hvd
