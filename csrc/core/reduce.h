// Element-wise reduction and scaling kernels for every DataType, shared by
// the coordinator (inline allreduce) and the Gloo backend (custom reduce
// function). float16/bfloat16 compute in float32 and round to nearest even.
#pragma once

#include <cstddef>

#include "types.h"

namespace hvd {

// out[i] = a[i] (op) b[i]; out may alias a or b. op is Sum, Min, Max or
// Product (Average reduces as Sum; the division is a separate scale step).
// Signature matches gloo's AllreduceOptions::Func.
using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t n);
ReduceFn reduceFunction(DataType dtype, ReduceOp op);

// buf[i] *= factor. Integers are scaled in double and truncated toward zero.
void scaleBuffer(void* buf, size_t n, DataType dtype, double factor);

// buf[i] = floor(buf[i] / divisor) for integers (Horovod's integer Average),
// buf[i] *= 1.0 / divisor for floating point (Horovod folds the division into
// the postscale factor, so we multiply too: results match it bit for bit).
void divideBuffer(void* buf, size_t n, DataType dtype, int divisor);

float halfToFloat(uint16_t h);
uint16_t floatToHalf(float f);
float bfloat16ToFloat(uint16_t b);
uint16_t floatToBfloat16(float f);

}  // namespace hvd
