// Fuzz target: ByteRing (csrc/core/byte_ring.h), whose head and tail live in
// a segment the peer process writes too. Ops from the input write, read,
// sleep and wait as the two ends do; a model (a plain string) says what the
// reader must get. Other ops overwrite head or tail with what a crashed or
// hostile peer might leave there: from then on the ring may refuse (a
// StatusError, as any broken connection), but never read or write outside
// its memory or allocate beyond its capacity.
#include <memory>

#include "core/byte_ring.h"
#include "core/types.h"
#include "fuzz_check.h"

using namespace hvd;

namespace {

// The ring's header as byte_ring.h lays it out: head, then tail, one cache
// line each.
constexpr size_t kHeadAt = 0;
constexpr size_t kTailAt = 64;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const size_t capacity = 1 + in.byte() % 64;
  const size_t bytes = ByteRing::footprint(capacity);
  // Exactly the footprint, so ASan sees a step past its end.
  std::unique_ptr<char[]> memory(new char[bytes]());
  ByteRing ring(memory.get(), capacity);
  std::string model;  // written, not yet read
  bool corrupt = false;
  try {
    while (!in.empty()) {
      switch (in.byte() % 6) {
        case 0: {
          const std::string chunk = in.bytes(in.byte() % 80);
          const size_t took = ring.write(chunk.data(), chunk.size());
          FUZZ_CHECK(took <= chunk.size());
          if (!corrupt) {
            FUZZ_CHECK(took == std::min(chunk.size(), capacity - model.size()));
            model += chunk.substr(0, took);
          }
          break;
        }
        case 1: {
          std::string got;
          const size_t n = ring.read(got);
          FUZZ_CHECK(n == got.size() && n <= capacity);
          if (!corrupt) {
            FUZZ_CHECK(got == model);
            model.clear();
          }
          break;
        }
        case 2:
          if (ring.sleepIfEmpty()) {
            FUZZ_CHECK(corrupt || model.empty());
            ring.wake();
          }
          FUZZ_CHECK(corrupt || ring.empty() == model.empty());
          break;
        case 3: {
          const bool waits = ring.waitForRoom();
          FUZZ_CHECK(corrupt || waits == (model.size() == capacity));
          (void)ring.takeWaitingWriter();
          break;
        }
        case 4: {
          const uint64_t v = in.u64();
          std::memcpy(memory.get() + kHeadAt, &v, sizeof(v));
          corrupt = true;
          break;
        }
        default: {
          const uint64_t v = in.u64();
          std::memcpy(memory.get() + kTailAt, &v, sizeof(v));
          corrupt = true;
          break;
        }
      }
    }
  } catch (const StatusError& e) {
    // A refused ring: only after a peer scribbled on it.
    FUZZ_CHECK(corrupt);
    FUZZ_CHECK(e.status.code == Status::kPeerFailure);
  }
  return 0;
}
