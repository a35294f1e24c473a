// The Gloo data plane for CPU tensors: one full-mesh Gloo context over TCP.
// Which Gloo (Debian's libgloo, not torch's bundled copy) and why:
// docs/architecture.md, "Which Gloo".
//
// Threading: constructed on the init() thread, then used only by the
// engine's background thread.
#pragma once

#include <memory>

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

 private:
  std::shared_ptr<gloo::rendezvous::Context> context_;
};

std::unique_ptr<Backend> makeGlooBackend(const Topology& topology, const EngineConfig& config,
                                         StoreClient& store, const std::string& prefix);

// Where the Gloo symbols this library calls were resolved (a shared object's
// path), so the Python layer can check that only one Gloo serves us.
std::string glooLibraryPath();

}  // namespace hvd
