// Fuzz target: the engine's messages (csrc/core/message.h), which the
// coordinator and the ranks read from each other's control frames.
//
// Input: one byte picks the decoder (Request, Response, ShapeList), the rest
// is the encoding. A decode either throws WireError or gives a value whose
// encoding decodes, consuming every byte, to the same value: so a decoder
// that reads a field the encoder does not write (or the reverse) is found,
// not only a crash.
#include <cmath>

#include "core/message.h"
#include "fuzz_check.h"

using namespace hvd;

namespace {

template <typename T>
std::string encoded(const T& value) {
  Writer w;
  value.encode(w);
  return w.buffer();
}

// decode(encode(value)) == value, and it reads exactly what encode wrote.
template <typename T, typename Same>
void roundTrips(const T& value, size_t read, Same same) {
  const std::string bytes = encoded(value);
  // As long as what the decoder read (flags may come back as 1 where the
  // input had another non-zero byte).
  FUZZ_CHECK(bytes.size() == read);
  Reader r(bytes);
  const T again = T::decode(r);
  FUZZ_CHECK(r.done());
  FUZZ_CHECK(same(value, again));
  FUZZ_CHECK(encoded(again) == bytes);
}

// What the coordinator does with a decoded request before it validates it
// against the others (coordinator.cc): names its enums, sizes it. A value no
// enum has would reach reduceFunction() as a null function; a shape whose
// element count overflows is undefined behaviour (UBSan stops here).
void checkUsable(const Request& q) {
  FUZZ_CHECK(std::string(opTypeName(q.type)) != "unknown");
  FUZZ_CHECK(std::string(dataTypeName(q.dtype)) != "unknown");
  FUZZ_CHECK(std::string(reduceOpName(q.reduce_op)) != "unknown");
  FUZZ_CHECK(std::string(planeName(q.plane)) != "unknown");
  FUZZ_CHECK(q.numElements() >= 0);
  FUZZ_CHECK(q.rowElements() >= 0);
  (void)q.shapeString();
  (void)q.deviceString();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const uint8_t which = in.byte() % 3;
  const std::string frame = in.rest();
  Reader r(frame);
  try {
    switch (which) {
      case 0: {
        const Request q = Request::decode(r);
        // A NaN scale factor is never == itself: then the encodings compare.
        roundTrips(q, frame.size() - r.remaining(), [](const Request& a, const Request& b) {
          return a == b || std::isnan(a.prescale) || std::isnan(a.postscale);
        });
        checkUsable(q);
        break;
      }
      case 1: {
        // Response has no operator==: its encoding is compared (roundTrips).
        const Response p = Response::decode(r);
        roundTrips(p, frame.size() - r.remaining(), [](const Response& a, const Response& b) {
          return a.kind == b.kind && a.type == b.type && a.names == b.names &&
                 a.cache_ids == b.cache_ids && a.templates.size() == b.templates.size();
        });
        FUZZ_CHECK(p.kind <= Response::kDone);
        FUZZ_CHECK(std::string(opTypeName(p.type)) != "unknown");
        for (const auto& q : p.templates) checkUsable(q);
        break;
      }
      default: {
        const ShapeList s = ShapeList::decode(r);
        roundTrips(s, frame.size() - r.remaining(),
                   [](const ShapeList& a, const ShapeList& b) { return a == b; });
        for (size_t i = 0; i < s.size(); ++i) (void)s[i];
        break;
      }
    }
  } catch (const WireError&) {
    // A malformed encoding: what the caller reports, never undefined behaviour.
  }
  return 0;
}
