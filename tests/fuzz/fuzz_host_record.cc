// Fuzz target: HostRecord::decode (csrc/backends/host_record.h), what every
// member of a set reads from the store about every other before the set picks
// its data plane. A decode throws WireError or round-trips.
#include "backends/host_record.h"
#include "fuzz_check.h"

using namespace hvd;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    const HostRecord h = HostRecord::decode(bytes);
    const HostRecord again = HostRecord::decode(h.encode());
    FUZZ_CHECK(again.sameSwitches(h) && again.host == h.host);
    FUZZ_CHECK(h.encode().size() == bytes.size());  // every byte read
    FUZZ_CHECK(again.encode() == h.encode());
  } catch (const WireError&) {
  }
  return 0;
}
