// The host data plane of a process set whose ranks span several hosts, some
// with more than one rank: shared memory inside each host, Gloo between one
// leader per host (Horovod's hierarchical allreduce and allgather), and a
// Gloo context over every rank for what does not split by host (alltoall).
//
//   allreduce: reduce inside the host; leaders allreduce; leaders broadcast
//              inside the host. Cross-host bytes: one rank per host, not all.
//   allgather: gather inside the host; leaders allgather host blocks; leaders
//              broadcast inside the host; every rank reorders into rank order.
//   broadcast: inside the root's host; between leaders; inside the others.
//   reducescatter: reduce inside the host; leaders reduce-scatter host
//              segments; leaders broadcast their segment inside the host.
//
// Each local group and the leaders run the same ops in the same order, since
// every rank runs the same negotiated responses.
//
// Threading: made on the init() thread, then used only by the thread that holds
// the engine's baton (its background thread or a caller driving its op,
// engine.h: one at a time).
#pragma once

#include <memory>
#include <vector>

#include "../core/backend.h"

namespace hvd {

struct HostLayout {
  std::vector<int> host_of;                // set position -> host index
  std::vector<std::vector<int>> members;  // host index -> positions, ascending
};

class HierarchicalBackend : public Backend {
 public:
  // local: this host's plane (null when alone on it); leaders: between the
  // first rank of every host (null unless this rank leads); all: every rank.
  // allreduce_split/allgather_split false: that op goes through `all`.
  HierarchicalBackend(HostLayout layout, int rank, std::unique_ptr<Backend> local,
                      std::unique_ptr<Backend> leaders, std::unique_ptr<Backend> all,
                      bool allreduce_split, bool allgather_split);

  const char* name() const override { return "shm+gloo"; }
  void allreduce(void* buf, size_t count, DataType dtype, ReduceOp op) override;
  void allgatherv(const void* in, void* out, const std::vector<size_t>& counts,
                  DataType dtype) override;
  void broadcast(void* buf, size_t count, DataType dtype, int root) override;
  void alltoallv(const void* in, const std::vector<int64_t>& send_counts, void* out,
                 const std::vector<int64_t>& recv_counts, DataType dtype) override;
  void barrier() override;
  bool reducescatter(const void* in, void* out, const std::vector<size_t>& counts,
                     DataType dtype, ReduceOp op, double prescale, double postscale) override;
  void abort() override {
    for (Backend* b : {local_.get(), leaders_.get(), all_.get()})
      if (b) b->abort();
  }

 private:
  HostLayout layout_;
  int rank_;
  int host_;
  std::unique_ptr<Backend> local_;
  std::unique_ptr<Backend> leaders_;
  std::unique_ptr<Backend> all_;
  bool allreduce_split_;
  bool allgather_split_;
  std::vector<char> staging_;  // allgather's and reducescatter's host-major buffer
};

}  // namespace hvd
