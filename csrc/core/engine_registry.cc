#include "engine_registry.h"

#include <mutex>

namespace hvd {

namespace {
std::mutex registry_mu;
std::shared_ptr<Engine> registry_engine;
uint64_t registry_generation = 0;
}  // namespace

std::shared_ptr<Engine> currentEngine() {
  std::lock_guard<std::mutex> lock(registry_mu);
  return registry_engine;
}

void installEngine(std::shared_ptr<Engine> engine) {
  std::lock_guard<std::mutex> lock(registry_mu);
  registry_engine = std::move(engine);
}

std::shared_ptr<Engine> removeEngine() {
  std::lock_guard<std::mutex> lock(registry_mu);
  return std::move(registry_engine);
}

uint64_t nextGeneration() {
  std::lock_guard<std::mutex> lock(registry_mu);
  return registry_generation++;
}

}  // namespace hvd
