// The process's current engine: the one mutable global, behind a mutex.
// init() installs an engine, shutdown() removes it; ops look it up per call.
#pragma once

#include <cstdint>
#include <memory>

#include "engine.h"

namespace hvd {

std::shared_ptr<Engine> currentEngine();
void installEngine(std::shared_ptr<Engine> engine);
// Removes and returns the engine (nullptr when none).
std::shared_ptr<Engine> removeEngine();
// 0, 1, 2, ... per init() in this process: keeps rendezvous keys apart.
uint64_t nextGeneration();

}  // namespace hvd
