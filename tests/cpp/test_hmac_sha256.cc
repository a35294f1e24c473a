// SHA-256 and HMAC-SHA256 (core/hmac_sha256.h) against published vectors:
// FIPS 180-2's examples for SHA-256 and RFC 4231's test cases for HMAC, whose
// keys and messages cross the 64-byte block (a hashed long key, long data).
#include <string>

#include "check.h"
#include "core/hmac_sha256.h"

using namespace hvd;

namespace {

std::string hex(const Digest256& d) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (uint8_t b : d) {
    out.push_back(digits[b >> 4]);
    out.push_back(digits[b & 15]);
  }
  return out;
}

std::string sha(const std::string& s) { return hex(sha256(s.data(), s.size())); }

}  // namespace

TEST(sha256_matches_the_fips_examples) {
  CHECK_EQ(sha(""), std::string("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
  CHECK_EQ(sha("abc"),
           std::string("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
  CHECK_EQ(sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
           std::string("248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"));
  CHECK_EQ(sha(std::string(1000000, 'a')),
           std::string("cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"));
}

TEST(hmac_sha256_matches_rfc_4231) {
  struct Case {
    std::string key, data, mac;
  };
  std::string key4;
  for (int i = 1; i <= 25; ++i) key4.push_back(static_cast<char>(i));
  const Case cases[] = {
      {std::string(20, '\x0b'), "Hi There",
       "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
      {"Jefe", "what do ya want for nothing?",
       "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
      {std::string(20, '\xaa'), std::string(50, '\xdd'),
       "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
      {key4, std::string(50, '\xcd'),
       "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
      {std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First",
       "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
      {std::string(131, '\xaa'),
       "This is a test using a larger than block-size key and a larger than block-size "
       "data. The key needs to be hashed before being used by the HMAC algorithm.",
       "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
  };
  for (const Case& c : cases) CHECK_EQ(hex(hmacSha256(c.key, c.data)), c.mac);
  // RFC 4231 case 5 publishes the first 128 bits only.
  CHECK_EQ(hex(hmacSha256(std::string(20, '\x0c'), "Test With Truncation")).substr(0, 32),
           std::string("a3b6167473100ee06e0c796c2955552b"));
}

TEST(a_key_of_exactly_one_block_is_used_as_it_is) {
  // 64 bytes: padded with nothing, not hashed; 65: hashed. Different MACs.
  const std::string k64(64, 'k'), k65(65, 'k');
  CHECK(hmacSha256(k64, "m") != hmacSha256(k65, "m"));
  CHECK(hmacSha256(k64, "m") == hmacSha256(k64, "m"));
}

TEST(random_bytes_are_fresh) {
  const std::string a = randomBytes(32), b = randomBytes(32);
  CHECK_EQ(a.size(), size_t(32));
  CHECK(a != b);  // equal by chance with probability 2^-256
  CHECK(randomBytes(0).empty());
}

TEST(constant_time_equal_is_equality) {
  CHECK(constantTimeEqual("", ""));
  CHECK(constantTimeEqual("abc", "abc"));
  CHECK(!constantTimeEqual("abc", "abd"));
  CHECK(!constantTimeEqual("abc", "xbc"));
  CHECK(!constantTimeEqual("abc", "ab"));
  CHECK(!constantTimeEqual(std::string("a\0b", 3), std::string("a\0c", 3)));
}

int main() { return check::runAll(); }
