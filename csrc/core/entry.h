// One submitted operation as the engine holds it until completion.
#pragma once

#include <functional>
#include <memory>

#include "backend.h"
#include "device.h"
#include "message.h"
#include "work.h"

namespace hvd {

struct Entry {
  Request request;
  const void* input = nullptr;
  // A bundle (Request::isBundle): its members' buffers in request order, one
  // dtype; input and output are unused.
  std::vector<Backend::Span> parts;
  // Allreduce/broadcast: a buffer of the input's size; may alias `input`.
  void* output = nullptr;
  // Allgather: called on the background thread once the total first
  // dimension is known; returns the output buffer (must stay valid).
  std::function<void*(int64_t total_first_dim)> allocate;
  // Set when the input is written by device work that may not have finished
  // (a CUDA event on the caller's stream): the engine orders its reads after
  // it. Plane::kStaged waits on the host before the input is read;
  // Plane::kDevice makes the device's stream wait.
  std::shared_ptr<DeviceEvent> ready;
  std::shared_ptr<Work> work;
  // Bytes this op sends through rank 0 on the inline path (0: not inline).
  size_t inline_traffic = 0;
  // Whatever owns input/output (tensors); released after completion.
  std::shared_ptr<void> keep_alive;
};

}  // namespace hvd
