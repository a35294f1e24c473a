// What every fuzz target shares: a check that aborts (libFuzzer saves the
// input that made it fail; the replay binary stops naming it), and a cursor
// that splits one input into the choices a target makes.
//
// Threading: single-threaded, like libFuzzer's calls into a target.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

// A logic error found by a round trip or an oracle: as loud as a crash.
#define FUZZ_CHECK(cond)                                                              \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                   \
    }                                                                                 \
  } while (0)

namespace fuzz {

// Reads choices off the front of the input; past the end every read is 0 or
// empty, so every input, however short, is a valid sequence of choices.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}

  uint8_t byte() { return p_ < end_ ? *p_++ : 0; }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(byte()) << (8 * i);
    return v;
  }
  uint64_t u64() { return uint64_t(u32()) | uint64_t(u32()) << 32; }
  // Up to n bytes (fewer at the end).
  std::string bytes(size_t n) {
    n = n < remaining() ? n : remaining();
    std::string out(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return out;
  }
  std::string rest() { return bytes(remaining()); }
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }
  bool empty() const { return p_ == end_; }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

}  // namespace fuzz
