// Element-wise scaling on the GPU, with the host rules of core/reduce.h so a
// tensor scales to the same bits on either plane: float32/float64 multiply in
// their own precision by the factor as given (a double), float16/bfloat16
// compute in float32 and round to nearest even, integers scale in double and
// truncate toward zero; Average's integer division floors.
//
// Threading: any thread; the kernels are enqueued on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "../../core/types.h"

namespace hvd {

void launchScale(void* buf, size_t count, DataType dtype, double factor, cudaStream_t stream);
void launchDivide(void* buf, size_t count, DataType dtype, int divisor, cudaStream_t stream);

}  // namespace hvd
