// Fuzz target: Endpoint::decode (csrc/core/address.h), rank 0's control
// address as every other rank reads it from the store before connecting.
// A decode throws WireError or gives a port in [1, 65535] and round-trips.
#include "core/address.h"
#include "core/wire.h"
#include "fuzz_check.h"

using namespace hvd;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const Endpoint e = Endpoint::decode(text);
    FUZZ_CHECK(e.port >= 1 && e.port <= 65535);
    FUZZ_CHECK(e.encode() == text);  // canonical: what encode() writes
    const Endpoint again = Endpoint::decode(e.encode());
    FUZZ_CHECK(again.host == e.host && again.port == e.port);
  } catch (const WireError&) {
  }
  return 0;
}
