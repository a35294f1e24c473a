// Where an operation's buffers live, and the buffer work an executor does on
// them (copies, scaling, the fusion buffer). The host kind is built in
// (memcpy and reduce.cc); a device kind (CUDA, csrc/backends/nccl/) is
// supplied by the layer that knows the device, so the engine stays free of
// CUDA and torch: it only carries DeviceEvents and calls Memory.
//
// Ordering contract of a device Memory: every call enqueues work on one
// stream that the device's Backend also uses, so copies, scaling and the
// collective of one response run in the order the executor issued them, and
// nothing here waits on the host.
//
// Threading: Memory is used only by the thread that holds the engine's baton
// (its background thread or a caller driving its op, engine.h: one at a time).
// DeviceEvents are created on callers' threads and read by the baton's holder
// (and the other way round); each is written once before it is shared.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "types.h"

namespace hvd {

// A point in a device's work (a CUDA event). Made and consumed by the device
// layers; the engine only carries it.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  // Blocks the calling thread until the work before the event has finished.
  virtual void synchronize() const = 0;
};

class Memory {
 public:
  virtual ~Memory() = default;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // buf *= factor with reduce.h's rules per dtype (Average is a factor too:
  // postscaleFactor), so host and device scale to the same bits.
  virtual void scale(void* buf, size_t count, DataType dtype, double factor) = 0;
  // A reusable buffer of at least `bytes` (the fusion buffer); what it held
  // before is lost. Valid until the next call.
  virtual void* scratch(size_t bytes) = 0;
  // A zero-filled buffer of `bytes`, freed when the last reference goes
  // (a joined rank's stand-in input).
  virtual std::shared_ptr<void> zeros(size_t bytes) = 0;
  // Orders the work issued after this call after the work before `ready`.
  // The host waits for it; a device makes its stream wait (no host wait).
  virtual void waitFor(const DeviceEvent& ready) = 0;
  // An event after all work issued so far; null when that work is already
  // done (the host: everything above is synchronous).
  virtual std::shared_ptr<DeviceEvent> record() = 0;
};

// Plain host memory: memcpy and the loops of reduce.cc, all synchronous.
class HostMemory : public Memory {
 public:
  void copy(void* dst, const void* src, size_t bytes) override;
  void scale(void* buf, size_t count, DataType dtype, double factor) override;
  void* scratch(size_t bytes) override;
  std::shared_ptr<void> zeros(size_t bytes) override;
  void waitFor(const DeviceEvent& ready) override { ready.synchronize(); }
  std::shared_ptr<DeviceEvent> record() override { return nullptr; }

 private:
  std::vector<char> scratch_;
};

}  // namespace hvd
