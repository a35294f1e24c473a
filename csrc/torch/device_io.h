// CUDA tensors in and out of the engine. A CPU tensor goes to the engine as
// it is (Plane::kHost). A CUDA tensor takes one of two planes:
//   Plane::kDevice (NCCL): the engine works on the tensor's own memory on its
//     own stream; a CUDA event recorded on the caller's current stream at
//     submission orders the engine after the input's producer, and the
//     engine's done event orders the caller's stream after the result.
//   Plane::kStaged (Gloo): the tensor is copied into pinned host memory on
//     the caller's current stream (asynchronously; the engine waits on an
//     event before reading), reduced there, and copied back on the caller's
//     current stream when the op is synchronized.
// Which plane: configureGpu(), called by hvd.init(). Without CUDA in the
// build, every function here refuses CUDA tensors with a clear error.
//
// Threading: prepare/finish run on the caller's thread; engineEmpty may run
// on the engine's background thread (outputs whose size it learns late).
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>

#include "../core/backend.h"
#include "../core/device.h"
#include "../core/types.h"

namespace hvd {
namespace torch_layer {

// Whether this build has CUDA, and NCCL (setup.py's defines). Answered here, not
// where they are bound, so the CUDA compile check (scripts/cuda_compile_check.py,
// every file naming a guard) need not compile the whole Python module for them.
bool cudaBuilt();
bool ncclBuilt();

// This rank's GPU (expected device of every CUDA tensor) and whether NCCL
// moves CUDA tensors (else host staging). device < 0: CUDA not set up.
void configureGpu(int device, bool use_nccl);
int configuredGpu();
bool ncclPlaneEnabled();

// What the engine reads and writes for one tensor.
struct EngineInput {
  at::Tensor tensor;  // the engine's buffer: the contiguous input, or its pinned host copy
  Plane plane = Plane::kHost;
  int device = -1;  // the caller's CUDA device, -1 for CPU tensors
  std::shared_ptr<DeviceEvent> ready;
};

// Refuses a tensor the engine cannot take: on a device other than the CPU and
// this rank's GPU, or on a GPU in a build without CUDA.
void checkDevice(const at::Tensor& tensor, const char* op, const std::string& name);

// `tensor` as the engine will read it: contiguous, on the plane chosen for
// its device and dtype. Refuses a CUDA tensor on another GPU than this rank's.
EngineInput prepareInput(const at::Tensor& tensor, DataType dtype, const char* op,
                         const std::string& name);

// An empty tensor the engine can write on `input`'s plane (pinned host memory
// when staged; on the engine's stream for NCCL).
at::Tensor engineEmpty(at::IntArrayRef shape, const EngineInput& input);

// An output allocated by the caller for the engine: kept alive for the
// engine's stream until its work is done (NCCL plane; no-op otherwise).
void lendToEngine(const at::Tensor& tensor, const EngineInput& input);

// The op's result as the caller sees it once the engine completed it: on the
// caller's device, ordered before anything the caller's current stream does
// next. `into`, when defined, receives the result (an in-place op) and is
// returned. No host wait on either plane.
at::Tensor finishOutput(const at::Tensor& engine_out, Plane plane, int device,
                        const std::shared_ptr<DeviceEvent>& done, const at::Tensor& into);

// The engine's device plane (NCCL on the engine's stream), or an empty
// function when this build has no NCCL.
DevicePlaneFactory devicePlaneFactory();

}  // namespace torch_layer
}  // namespace hvd
