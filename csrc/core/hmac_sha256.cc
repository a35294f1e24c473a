#include "hmac_sha256.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace hvd {
namespace {

// FIPS 180-4, 4.2.2: the first 32 bits of the fractional parts of the cube
// roots of the first 64 primes.
constexpr uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

// One 64-byte block into the state (FIPS 180-4, 6.2.2).
void compress(uint32_t h[8], const uint8_t* block) {
  uint32_t w[64];
  for (int t = 0; t < 16; ++t) {
    w[t] = uint32_t(block[4 * t]) << 24 | uint32_t(block[4 * t + 1]) << 16 |
           uint32_t(block[4 * t + 2]) << 8 | uint32_t(block[4 * t + 3]);
  }
  for (int t = 16; t < 64; ++t) {
    const uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    const uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
  for (int t = 0; t < 64; ++t) {
    const uint32_t t1 = k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) +
                        kRound[t] + w[t];
    const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    k = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h[0] += a;
  h[1] += b;
  h[2] += c;
  h[3] += d;
  h[4] += e;
  h[5] += f;
  h[6] += g;
  h[7] += k;
}

// SHA-256 over the concatenation of two buffers (HMAC's inner and outer hashes
// are a padded key followed by the rest), without copying them together.
Digest256 sha256Two(const uint8_t* a, size_t na, const uint8_t* b, size_t nb) {
  // FIPS 180-4, 5.3.3: the first 32 bits of the fractional parts of the square
  // roots of the first 8 primes.
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  uint8_t block[64];
  size_t fill = 0;
  auto feed = [&](const uint8_t* p, size_t n) {
    while (n > 0) {
      const size_t take = std::min(n, sizeof(block) - fill);
      std::memcpy(block + fill, p, take);
      fill += take;
      p += take;
      n -= take;
      if (fill == sizeof(block)) {
        compress(h, block);
        fill = 0;
      }
    }
  };
  if (na > 0) feed(a, na);
  if (nb > 0) feed(b, nb);
  // Padding (5.1.1): a 1 bit, zeros to 56 mod 64 bytes, the length in bits
  // as a big-endian 64-bit number.
  const uint64_t bits = (uint64_t(na) + uint64_t(nb)) * 8;
  const uint8_t one = 0x80;
  feed(&one, 1);
  const uint8_t zero = 0;
  while (fill != 56) feed(&zero, 1);
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
  feed(length, 8);
  Digest256 out;
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 4; ++j) out[4 * i + j] = static_cast<uint8_t>(h[i] >> (24 - 8 * j));
  }
  return out;
}

}  // namespace

Digest256 sha256(const void* data, size_t n) {
  return sha256Two(static_cast<const uint8_t*>(data), n, nullptr, 0);
}

Digest256 hmacSha256(const std::string& key, const std::string& message) {
  // RFC 2104: H((K ^ opad) | H((K ^ ipad) | message)), K padded with zeros to
  // the block size, or hashed first when longer than it.
  uint8_t k[64] = {};
  if (key.size() > sizeof(k)) {
    const Digest256 d = sha256(key.data(), key.size());
    std::memcpy(k, d.data(), d.size());
  } else if (!key.empty()) {
    std::memcpy(k, key.data(), key.size());
  }
  uint8_t pad[64];
  for (size_t i = 0; i < sizeof(pad); ++i) pad[i] = k[i] ^ 0x36;
  const Digest256 inner = sha256Two(pad, sizeof(pad),
                                    reinterpret_cast<const uint8_t*>(message.data()),
                                    message.size());
  for (size_t i = 0; i < sizeof(pad); ++i) pad[i] = k[i] ^ 0x5c;
  return sha256Two(pad, sizeof(pad), inner.data(), inner.size());
}

std::string randomBytes(size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::getrandom(&out[got], n - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(std::string("getrandom failed: ") + std::strerror(errno));
    }
    got += static_cast<size_t>(r);
  }
  return out;
}

bool constantTimeEqual(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  // volatile: the compiler may not turn the loop into an early-exit memcmp.
  volatile uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = diff | static_cast<uint8_t>(a[i] ^ b[i]);
  }
  return diff == 0;
}

}  // namespace hvd
