// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), written here so that the
// store's and the control plane's handshakes need no crypto library (the wheel
// stays self-contained). Also: fresh random bytes from the kernel, and a
// comparison whose time does not depend on where two digests differ.
//
// Threading: every function is pure or uses only its arguments; any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace hvd {

using Digest256 = std::array<uint8_t, 32>;

Digest256 sha256(const void* data, size_t n);

// HMAC-SHA256(key, message); a key longer than SHA-256's 64-byte block is
// hashed first, as RFC 2104 says.
Digest256 hmacSha256(const std::string& key, const std::string& message);

// n bytes from getrandom(2) (the kernel's CSPRNG, blocking only before it is
// seeded at boot). Throws std::runtime_error if the kernel refuses.
std::string randomBytes(size_t n);

// a == b, looking at every byte whatever the first difference: a wrong proof
// teaches a prober nothing by how long it took to refuse. Sizes are not secret.
bool constantTimeEqual(const std::string& a, const std::string& b);

}  // namespace hvd
