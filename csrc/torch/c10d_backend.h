// hvd-torch as a torch.distributed backend: a c10d::Backend whose collectives
// run on the hvd engine through the same submission path as hvd.allreduce and
// friends (adapter.h), so `dist.init_process_group("hvd")` moves DDP's and
// FSDP's bytes through our data planes (shared memory on one host, Gloo or
// hierarchical across hosts; NCCL or host-staged for CUDA tensors, with
// CUDA-aware futures). hvd_torch/distributed.py registers it with
// torch.distributed.Backend.register_backend; docs/torch_distributed.md says
// what is supported.
//
// Ownership: the backend does not own the engine. It finds the running one
// (engine_registry) at every call, so hvd.init() and init_process_group("hvd")
// share one engine; destroying the process group leaves the engine running
// until hvd.shutdown() (or exit).
//
// Threading: every collective may be called from any thread (DDP calls
// allreduce from autograd's threads). A call checks its arguments and submits
// to the engine on the caller's thread, so a caller's mistake raises there, on
// every rank that makes it; it returns at once with a Work. One completion
// thread per backend waits for the engine's results in submission order,
// copies them into the caller's output tensors and completes the Work's
// future (running its callbacks, e.g. a DDP comm hook's `then`), or sets the
// op's error on it. Ops are matched across ranks by name: "c10d.<group>.<n>",
// n counting this backend's collectives, so ranks that call different
// collectives at the same position get the engine's "mismatched operations"
// error instead of a hang.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace hvd {
namespace torch_layer {

// group_rank/group_size: this rank's place in the torch group; process_set:
// the engine's process set that holds exactly the group's ranks, whose global
// ranks are `global_ranks` in group-rank order; group_name: torch's name for
// the group (part of every op's name).
c10::intrusive_ptr<c10d::Backend> makeC10dBackend(int group_rank, int group_size,
                                                  int64_t process_set,
                                                  std::vector<int64_t> global_ranks,
                                                  std::string group_name);

}  // namespace torch_layer
}  // namespace hvd
