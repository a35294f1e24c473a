// Host memory for the tensors the engine writes (a functional allreduce's or
// broadcast's output, an allgather's). Blocks above 4 KiB are mappings (whole
// huge pages from 1 MiB, powers of two below) kept in a bounded pool when
// freed, so a training loop that makes outputs of the same sizes step after
// step reuses memory that is already faulted in instead of faulting in every
// page of a fresh allocation (most of a large functional op's cost
// otherwise). Blocks of 4 KiB and less come from free lists per 64-byte size
// class, cheaper than the default CPU allocator.
//
// HVD_TORCH_OUTPUT_CACHE_MB bounds the freed memory kept (default 1024, 0
// keeps none; never more than an eighth of the machine's memory); past it the
// blocks freed longest ago are unmapped.
// Threading: any thread; blocks may be freed on any thread.
#pragma once

#include <ATen/ATen.h>

namespace hvd {
namespace torch_layer {

// An uninitialized CPU tensor like at::empty(shape, options).
at::Tensor hostOutput(at::IntArrayRef shape, const at::TensorOptions& options);

}  // namespace torch_layer
}  // namespace hvd
