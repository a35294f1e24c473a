#include "device_io.h"

#include <atomic>

#include "host_output.h"

#ifdef HVD_TORCH_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <mutex>
#include <unordered_map>

#include "../backends/nccl/cuda_event.h"
#ifdef HVD_TORCH_WITH_NCCL
#include "../backends/nccl/nccl_backend.h"
#endif
#endif

namespace hvd {
namespace torch_layer {

namespace {

std::atomic<int> gpu_device{-1};
std::atomic<bool> gpu_nccl{false};

}  // namespace

void configureGpu(int device, bool use_nccl) {
  gpu_device = device;
  gpu_nccl = use_nccl;
}

int configuredGpu() { return gpu_device; }

bool ncclPlaneEnabled() { return gpu_nccl; }

bool cudaBuilt() {
#ifdef HVD_TORCH_WITH_CUDA
  return true;
#else
  return false;
#endif
}

bool ncclBuilt() {
#ifdef HVD_TORCH_WITH_NCCL
  return true;
#else
  return false;
#endif
}

#ifndef HVD_TORCH_WITH_CUDA

void checkDevice(const at::Tensor& tensor, const char* op, const std::string& name) {
  TORCH_CHECK_VALUE(tensor.device().is_cpu(), "hvd_torch.", op, " '", name, "': tensor is on ",
              tensor.device(),
              ", but this build of hvd_torch has no CUDA support (hvd.cuda_built() is False): "
              "rebuild it with a CUDA build of torch and nvcc on the PATH");
}

EngineInput prepareInput(const at::Tensor& tensor, DataType, const char* op,
                         const std::string& name) {
  checkDevice(tensor, op, name);
  EngineInput in;
  in.tensor = tensor.contiguous();
  return in;
}

at::Tensor engineEmpty(at::IntArrayRef shape, const EngineInput& input) {
  return hostOutput(shape, input.tensor.options());
}

void lendToEngine(const at::Tensor&, const EngineInput&) {}

at::Tensor finishOutput(const at::Tensor& engine_out, Plane, int,
                        const std::shared_ptr<DeviceEvent>&, const at::Tensor&) {
  return engine_out;
}

DevicePlaneFactory devicePlaneFactory() { return nullptr; }

#else  // HVD_TORCH_WITH_CUDA

namespace {

// One engine stream per device, from torch's pool so torch's caching
// allocator knows it (recordStream needs a c10 stream). High priority: a
// collective is usually on the critical path of the next step.
c10::cuda::CUDAStream engineStream(int device) {
  static std::mutex mu;
  static std::unordered_map<int, c10::cuda::CUDAStream> streams;
  std::lock_guard<std::mutex> lock(mu);
  auto it = streams.find(device);
  if (it == streams.end()) {
    it = streams
             .emplace(device, c10::cuda::getStreamFromPool(/*isHighPriority=*/true,
                                                           static_cast<c10::DeviceIndex>(device)))
             .first;
  }
  return it->second;
}

// Tells the caching allocator that `stream` uses the tensor's memory, so the
// memory is not handed out again before that stream's work is done.
void recordOn(const at::Tensor& t, const c10::cuda::CUDAStream& stream) {
  if (!t.defined() || !t.is_cuda() || t.storage().data_ptr().get() == nullptr) return;
  c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream);
}

}  // namespace

void checkDevice(const at::Tensor& tensor, const char* op, const std::string& name) {
  if (tensor.device().is_cpu()) return;
  TORCH_CHECK_VALUE(tensor.is_cuda(), "hvd_torch.", op, " '", name, "': tensor is on ", tensor.device(),
              "; hvd_torch supports CPU and CUDA tensors");
  const int device = tensor.device().index();
  const int expected = gpu_device.load();
  TORCH_CHECK_VALUE(expected >= 0, "hvd_torch.", op, " '", name, "': tensor is on ", tensor.device(),
              ", but hvd.init() found no usable GPU for this rank (torch.cuda.is_available() "
              "was False when hvd.init() ran)");
  TORCH_CHECK_VALUE(device == expected, "hvd_torch.", op, " '", name, "': tensor is on cuda:", device,
              ", but this rank's GPU is cuda:", expected,
              " (local_rank modulo the visible GPUs); call torch.cuda.set_device(hvd.local_rank() ",
              "% torch.cuda.device_count()) and keep the model and its tensors on that device");
}

EngineInput prepareInput(const at::Tensor& tensor, DataType dtype, const char* op,
                         const std::string& name) {
  checkDevice(tensor, op, name);
  EngineInput in;
  if (tensor.device().is_cpu()) {
    in.tensor = tensor.contiguous();
    return in;
  }
  const int device = tensor.device().index();
  in.device = device;
  const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(device);
#ifdef HVD_TORCH_WITH_NCCL
  const bool nccl = gpu_nccl.load() && ncclSupports(dtype);
#else
  const bool nccl = false;
  (void)dtype;
#endif
  if (nccl) {
    in.plane = Plane::kDevice;
    in.tensor = tensor.contiguous();
    // The engine's stream reads the input: order it after the producer
    // (an event on the caller's stream, not a host wait) and keep the memory
    // from being reused before the engine's read is done.
    in.ready = std::make_shared<CudaEvent>(device, caller.stream());
    recordOn(in.tensor, engineStream(device));
    return in;
  }
  in.plane = Plane::kStaged;
  // Pinned memory makes the copy asynchronous; the engine waits on the event
  // before it reads. Torch's host allocator keeps the block until the copy is done.
  in.tensor = at::empty(tensor.sizes(), tensor.options().device(at::kCPU).pinned_memory(true));
  in.tensor.copy_(tensor, /*non_blocking=*/true);
  in.ready = std::make_shared<CudaEvent>(device, caller.stream());
  return in;
}

at::Tensor engineEmpty(at::IntArrayRef shape, const EngineInput& input) {
  switch (input.plane) {
    case Plane::kHost:
      return hostOutput(shape, input.tensor.options());
    case Plane::kStaged:
      return at::empty(shape, input.tensor.options().pinned_memory(true));
    case Plane::kDevice: {
      // Allocated while the engine's stream is current, so the allocator ties
      // the block to it; finishOutput records the caller's stream as well.
      c10::cuda::CUDAStreamGuard on(engineStream(input.device));
      return at::empty(shape, input.tensor.options());
    }
  }
  TORCH_INTERNAL_ASSERT(false, "unknown plane");
}

void lendToEngine(const at::Tensor& tensor, const EngineInput& input) {
  if (input.plane == Plane::kDevice) recordOn(tensor, engineStream(input.device));
}

at::Tensor finishOutput(const at::Tensor& engine_out, Plane plane, int device,
                        const std::shared_ptr<DeviceEvent>& done, const at::Tensor& into) {
  if (plane == Plane::kHost) return engine_out;
  const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(device);
  if (plane == Plane::kDevice) {
    // The engine only enqueued the collective: the caller's stream waits for
    // its done event (a device-side wait; the host goes on at once).
    if (done) static_cast<const CudaEvent&>(*done).streamWait(caller.stream());
    recordOn(engine_out, caller);
    if (!into.defined()) return engine_out;
    if (!into.is_same(engine_out)) into.copy_(engine_out);
    return into;
  }
  // Host-staged: the result is in (pinned) host memory, complete; copy it to
  // the GPU on the caller's stream without waiting for the copy.
  c10::cuda::CUDAGuard on(static_cast<c10::DeviceIndex>(device));
  at::Tensor target =
      into.defined() ? into
                     : at::empty(engine_out.sizes(),
                                 engine_out.options().device(at::Device(at::kCUDA, device))
                                     .pinned_memory(false));
  target.copy_(engine_out, /*non_blocking=*/true);
  return target;
}

DevicePlaneFactory devicePlaneFactory() {
#ifdef HVD_TORCH_WITH_NCCL
  return [](int device, const Topology& set, const EngineConfig& config, StoreClient* store,
            const std::string& prefix) {
    return makeNcclPlane(device, engineStream(device).stream(), set, config, store, prefix);
  };
#else
  return nullptr;
#endif
}

#endif  // HVD_TORCH_WITH_CUDA

}  // namespace torch_layer
}  // namespace hvd
