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

// buf[i] *= factor, as Horovod's CPU ScaleBuffer does it: integers in double,
// truncated toward zero; float64 in double; float32 by float(factor) in float;
// float16/bfloat16 widened to float32, times float(factor), rounded once.
void scaleBuffer(void* buf, size_t n, DataType dtype, double factor);

// After the reduction: Average and the postscale factor in one multiplication
// by postscale / divisor (Horovod's rule), so integer Average truncates
// sum * (1.0 / divisor) toward zero and float Average multiplies by 1/size.
// Other ops: buf *= postscale.
double postscaleFactor(ReduceOp op, int divisor, double postscale);
void postscaleBuffer(void* buf, size_t n, DataType dtype, ReduceOp op, int divisor,
                     double postscale);

float halfToFloat(uint16_t h);
uint16_t floatToHalf(float f);
float bfloat16ToFloat(uint16_t b);
uint16_t floatToBfloat16(float f);

}  // namespace hvd
