// The Gloo data plane for CPU tensors: one full-mesh Gloo context over TCP.
// Which Gloo (Debian's libgloo, not torch's bundled copy) and why:
// docs/architecture.md, "Which Gloo".
//
// Threading: constructed on the init() thread, then used only by the thread
// that holds the engine's baton (its background thread or a caller driving its
// op, engine.h: one at a time).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "../../core/backend.h"

namespace gloo {
namespace rendezvous {
class Context;
}
}  // namespace gloo

namespace hvd {

class GlooBackend : public Backend {
 public:
  GlooBackend(const Topology& topology, const EngineConfig& config, StoreClient& store,
              const std::string& prefix);
  ~GlooBackend() override;

  const char* name() const override { return "gloo"; }
  void allreduce(void* buf, size_t count, DataType dtype, ReduceOp op) override;
  void allgatherv(const void* in, void* out, const std::vector<size_t>& counts,
                  DataType dtype) override;
  void broadcast(void* buf, size_t count, DataType dtype, int root) override;
  void alltoallv(const void* in, const std::vector<int64_t>& send_counts, void* out,
                 const std::vector<int64_t>& recv_counts, DataType dtype) override;
  void barrier() override;
  // A ring reduce-scatter over Gloo's point-to-point buffers: each rank
  // sends and receives (n-1)/n of the tensor, half of what an allreduce
  // moves (Gloo 0.5 has no reduce-scatter for arbitrary counts).
  bool reducescatter(const void* in, void* out, const std::vector<size_t>& counts,
                     DataType dtype, ReduceOp op, double prescale, double postscale) override;

 private:
  std::shared_ptr<gloo::rendezvous::Context> context_;
  uint32_t next_tag_ = 0;  // every rank runs the same ops in the same order
  // reducescatter's buffers, kept for their capacity: the prescaled input,
  // the partial sums passed on, two landing halves for received segments.
  static constexpr size_t kSegmentBytes = 4 << 20;
  std::vector<char> scaled_;
  std::vector<char> partial_;
  std::vector<char> received_;
};

std::unique_ptr<Backend> makeGlooBackend(const Topology& topology, const EngineConfig& config,
                                         StoreClient& store, const std::string& prefix);

// Where the Gloo symbols this library calls were resolved (a shared object's
// path), so the Python layer can check that only one Gloo serves us.
std::string glooLibraryPath();

}  // namespace hvd
