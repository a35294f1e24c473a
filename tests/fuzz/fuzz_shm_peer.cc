// Fuzz target: ShmPeer::decode (csrc/backends/shm/shm_peer.h), the record
// each member of a host's set reads from the store about every other before
// they map one segment and watch each other's pids. A decode throws
// WireError or gives a positive pid and round-trips.
#include "backends/shm/shm_peer.h"
#include "fuzz_check.h"

using namespace hvd;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const ShmPeer p = ShmPeer::decode(text);
    FUZZ_CHECK(p.pid > 0);
    // Canonical: the text is exactly what encode() writes.
    FUZZ_CHECK(p.encode() == text);
    const ShmPeer again = ShmPeer::decode(p.encode());
    FUZZ_CHECK(again.identity == p.identity && again.pid == p.pid);
  } catch (const WireError&) {
  }
  return 0;
}
