// The hvd_torch._C module: lifecycle, topology and build facts. The
// collectives themselves are torch ops (torch.ops.hvd_torch.*), not here.
#include <torch/extension.h>

#include "../backends/gloo/gloo_backend.h"
#include "../backends/host_backend.h"
#include "../core/engine_registry.h"
#include "../core/log.h"
#include "../torch/adapter.h"
#include "../torch/device_io.h"
#include "../torch/kernels.h"

void registerEagerFastPath(pybind11::module& m);  // eager_fast_path.cpp
void registerC10dBackend(pybind11::module& m);    // c10d_backend_module.cpp
void registerHandles(pybind11::module& m);        // handles.cpp

namespace {

using hvd::currentEngine;

hvd::Topology topology(const char* what) {
  auto engine = currentEngine();
  TORCH_CHECK(engine != nullptr, "hvd_torch.", what,
              "() was called before hvd_torch.init(): call hvd.init() first");
  return engine->topology();
}

void init() {
  if (currentEngine() != nullptr) return;  // Horovod: a second init() is a no-op
  hvd::configureLogging();                  // HOROVOD_LOG_LEVEL may have changed since
  hvd::Topology topo = hvd::Topology::fromEnvironment();
  hvd::EngineConfig config = hvd::EngineConfig::fromEnvironment();
  std::shared_ptr<hvd::Engine> engine;
  {
    pybind11::gil_scoped_release no_gil;  // the rendezvous waits on peers
    engine = hvd::Engine::start(topo, config, hvd::makeHostBackend, hvd::nextGeneration(),
                                hvd::torch_layer::devicePlaneFactory());
  }
  hvd::torch_layer::resetNameCounter();
  hvd::installEngine(std::move(engine));
}

void shutdown() {
  auto engine = hvd::removeEngine();
  if (!engine) return;
  pybind11::gil_scoped_release no_gil;
  engine->shutdown();
  hvd::torch_layer::clearHandles();
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "hvd_torch engine lifecycle and topology";
  // Every schema registered (the extension's TORCH_LIBRARY blocks ran when it
  // loaded): a schema and its options that disagree fail the import.
  hvd::torch_layer::checkOpSchemas();
  m.def("options_mismatch", &hvd::torch_layer::optionsMismatch, pybind11::arg("op"),
        pybind11::arg("schema"),
        "Why the schema (text) would not fit op's options, '' when it fits (import check's "
        "tests).");
  registerEagerFastPath(m);
  registerC10dBackend(m);
  registerHandles(m);
  m.def("driven_ops", [] {
    auto engine = currentEngine();
    return engine ? engine->drivenOps() : uint64_t{0};
  }, "Ops this process's waiting callers ran themselves (Engine::drive).");
  m.def("cached_submissions", [] {
    auto engine = currentEngine();
    return engine ? engine->cachedSubmissions() : uint64_t{0};
  }, "Ops this process sent to rank 0 as a response-cache slot (Engine::cachedSubmissions).");
  m.def("agreed_ops", [] {
    auto engine = currentEngine();
    return engine ? engine->agreedOps() : uint64_t{0};
  }, "Cached ops this process ran by an agreement among the ranks, without rank 0 (issue #47).");
  m.def("agreement_rounds", [] {
    auto engine = currentEngine();
    return engine ? engine->agreementRounds() : uint64_t{0};
  }, "Rounds of the agreement this process finished (Engine::agreementRounds).");
  m.def("control_links", [] {
    auto engine = currentEngine();
    return engine ? engine->controlLinks() : size_t{0};
  }, "Control connections this process made at start (rank 0 with host leaders: its host's "
     "ranks and one per other host).");
  m.def("relayed_frames", [] {
    auto engine = currentEngine();
    return engine ? engine->relayedFrames() : uint64_t{0};
  }, "Control frames this process relayed to rank 0 for its host's ranks (a host leader).");
  m.def("lane_ops", [] {
    auto engine = currentEngine();
    return engine ? engine->laneOps() : uint64_t{0};
  }, "Blocking ops this process ran on the fast lane (Engine::laneOps).");
  m.def("lane_gave_up", [] {
    auto engine = currentEngine();
    return engine ? engine->laneGaveUp() : uint64_t{0};
  }, "Fast-lane arrivals that waited their patience out and took the engine.");
  m.def("lane_off", [] {
    auto engine = currentEngine();
    return engine ? engine->laneOff() : false;
  }, "True once the fast lane turned itself off for the job (counts out of step).");
  m.def("init", &init, "Meets the other ranks and starts the engine.");
  m.def("shutdown", &shutdown, "Stops the engine; pending operations fail.");
  m.def("is_initialized", [] { return currentEngine() != nullptr; });
  m.def("rank", [] { return topology("rank").rank; });
  m.def("size", [] { return topology("size").size; });
  m.def("local_rank", [] { return topology("local_rank").local_rank; });
  m.def("local_size", [] { return topology("local_size").local_size; });
  m.def("cross_rank", [] { return topology("cross_rank").cross_rank; });
  m.def("cross_size", [] { return topology("cross_size").cross_size; });
  m.def(
      "backend_name",
      [](int32_t process_set_id) {
        auto engine = currentEngine();
        return engine ? engine->backendName(process_set_id) : std::string();
      },
      "The data plane of a process set: shm, gloo or local ('' when not a member).",
      pybind11::arg("process_set_id") = 0);
  m.def(
      "control_plane",
      [] {
        auto engine = currentEngine();
        return engine ? engine->controlPlane() : std::string();
      },
      "How control frames travel between ranks: shm, tcp, or local (one rank).");
  // Process sets: the registry lives in the engine; Python keeps the objects.
  m.def("add_process_set", [](const std::vector<int64_t>& ranks) {
    pybind11::gil_scoped_release no_gil;  // a collective: waits for every rank
    return hvd::torch_layer::addProcessSet(ranks);
  });
  m.def("remove_process_set", [](int64_t id) {
    pybind11::gil_scoped_release no_gil;
    hvd::torch_layer::removeProcessSet(id);
  });
  m.def("set_refused_error_type", &hvd::torch_layer::setRefusedErrorType,
        "The class raised for ranks that disagree (hvd_torch.exceptions.RefusedError).");
  m.def("process_set_rank", &hvd::torch_layer::processSetRank);
  m.def("process_set_size", &hvd::torch_layer::processSetSize);
  m.def("process_set_ranks", [](int64_t id) {
    auto engine = currentEngine();
    std::vector<int> ranks;
    if (engine == nullptr || !engine->processSets().find(static_cast<int32_t>(id), &ranks))
      return pybind11::object(pybind11::none());
    return pybind11::object(pybind11::cast(ranks));
  });
  // Horovod's contract: called on every rank, only rank 0 records (it sees
  // every rank's arrival). Stopping writes what is pending and closes the file.
  m.def("start_timeline", [](const std::string& path, bool mark_cycles) {
    auto engine = currentEngine();
    TORCH_CHECK(engine != nullptr,
                "hvd_torch.start_timeline() was called before hvd_torch.init(): call hvd.init() first");
    if (engine->topology().rank != 0) return;
    const std::string error = engine->timeline().start(path, mark_cycles);
    engine->timelineChanged();
    TORCH_CHECK(error.empty(), "hvd_torch.start_timeline('", path, "'): ", error);
  });
  m.def("stop_timeline", [] {
    auto engine = currentEngine();
    TORCH_CHECK(engine != nullptr,
                "hvd_torch.stop_timeline() was called before hvd_torch.init(): call hvd.init() first");
    pybind11::gil_scoped_release no_gil;  // waits for the writer thread's last write
    engine->timeline().stop();
    engine->timelineChanged();
  });
  // The fusion and inline thresholds in force on this rank (autotune may move them).
  m.def("tunables", [] {
    auto engine = currentEngine();
    TORCH_CHECK(engine != nullptr, "hvd_torch: call hvd.init() first");
    const hvd::Tunables t = engine->tunables();
    return std::make_pair(t.fusion_threshold, t.inline_threshold);
  });
  m.def("gloo_library_path", &hvd::glooLibraryPath);
  // The torch version (major.minor.patch) whose headers compiled this extension, so
  // the doctor can tell a stale hvd_torch/_build_info.py from the .so it describes.
  m.def("built_with_torch", [] {
#ifdef TORCH_VERSION_MAJOR
    return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
           std::to_string(TORCH_VERSION_PATCH);
#else
    return std::string("unknown");
#endif
  });
  m.def("gloo_built", [] { return true; });
  m.def("shm_built", [] { return true; });
  // What this build compiled, decided once by setup.py (cuda_enabled, nccl_paths).
  m.def("nccl_built", &hvd::torch_layer::ncclBuilt);
  m.def("cuda_built", &hvd::torch_layer::cudaBuilt);
  // Set by hvd.init(): this rank's GPU and whether NCCL moves CUDA tensors.
  m.def("configure_gpu", &hvd::torch_layer::configureGpu, pybind11::arg("device"),
        pybind11::arg("use_nccl"));
  m.def("gpu_device", &hvd::torch_layer::configuredGpu);
  m.def("gpu_uses_nccl", &hvd::torch_layer::ncclPlaneEnabled);
}
