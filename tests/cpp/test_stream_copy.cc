// The streaming copy (csrc/core/stream_copy.h): byte for byte memcpy's result
// for every head and tail alignment and sizes around its 256-byte and 64-byte
// edges, and nothing written outside the destination range.
#include <cstdint>
#include <cstring>
#include <vector>

#include "check.h"
#include "core/stream_copy.h"

using namespace hvd;

namespace {

void checkCopy(size_t n, size_t src_off, size_t dst_off) {
  std::vector<uint8_t> src(n + 128), dst(n + 256, 0xAB);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  streamCopy(dst.data() + 64 + dst_off, src.data() + src_off, n);
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += dst[64 + dst_off + i] != src[src_off + i];
  CHECK_EQ(wrong, size_t{0});
  size_t outside = 0;
  for (size_t i = 0; i < 64 + dst_off; ++i) outside += dst[i] != 0xAB;
  for (size_t i = 64 + dst_off + n; i < dst.size(); ++i) outside += dst[i] != 0xAB;
  CHECK_EQ(outside, size_t{0});
}

}  // namespace

TEST(copies_every_size_and_alignment_exactly) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{255}, size_t{256},
                   size_t{257}, size_t{319}, size_t{320}, size_t{4095}, size_t{65537}}) {
    for (size_t src_off = 0; src_off < 64; src_off += 7) {
      for (size_t dst_off = 0; dst_off < 64; dst_off += 5) checkCopy(n, src_off, dst_off);
    }
  }
}

TEST(copies_a_large_block_exactly) { checkCopy(size_t{3} << 20, 3, 17); }

int main() { return check::runAll(); }
