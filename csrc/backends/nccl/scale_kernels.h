// Element-wise scaling on the GPU with the host's rules (core/reduce.h,
// scaleBuffer: Horovod's CPU ScaleBuffer), so a tensor scales to the same bits
// on either plane: integers multiply in double and truncate toward zero;
// float64 multiplies in double; float32 by float(factor) in float;
// float16/bfloat16 widen to float32, multiply by float(factor), round once.
// Average is a factor too (postscaleFactor), so there is no divide kernel.
//
// Threading: any thread; the kernel is enqueued on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "../../core/types.h"

namespace hvd {

void launchScale(void* buf, size_t count, DataType dtype, double factor, cudaStream_t stream);

}  // namespace hvd
