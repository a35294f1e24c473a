// Fuzz target: the store client's reading of replies (csrc/core/store_client.cc),
// which come from the store server, or from whatever answers at its address.
//
// Input: a count and that many op bytes (SET, GET, WAIT, ADD, DELETE, CHECK,
// LIST), then the byte stream the "server" sends: the handshake's CHALLENGE
// and its answer to our PROOF first, then one reply per op. The client's nonce
// is fixed (kNonce), so a recorded CHALLENGE (the seeds, store_replies.py) can
// carry a valid server proof; a mutated one must be refused. The stream goes into one end of a socket pair, whose
// write side is then shut, so the client never waits: it reads a reply or
// the end of the stream. A small model of the protocol
// (hvdrun/store_protocol.py) reads the same stream and says what each call
// must return or throw; the client must agree, call by call.
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

#include "core/hmac_sha256.h"
#include "core/store_client.h"
#include "fuzz_check.h"

using namespace hvd;

namespace {

enum Status : uint8_t { kOk = 0, kValue, kTimeout, kError, kInt, kKeys, kChallenge };
constexpr uint32_t kMaxFrame = 1u << 30;
constexpr uint32_t kVersion = 2;
const std::string kSecret = "secret";
const std::string kNonce(32, 'n');
enum Op : uint8_t { kSet, kGet, kWait, kAdd, kDelete, kCheck, kList, kOps };

// What a call gave: a value, a StoreTimeout with its keys, or a StoreError.
struct Outcome {
  enum Kind { kReturned, kTimedOut, kFailed } kind = kFailed;
  std::string value;
  int64_t number = 0;
  std::vector<std::string> keys;
  bool operator==(const Outcome& o) const {
    return kind == o.kind && value == o.value && number == o.number && keys == o.keys;
  }
};

Outcome returned() { return {Outcome::kReturned, {}, 0, {}}; }
Outcome failed() { return {}; }

// A cursor over a reply body, as the protocol defines it; nullopt-like
// `ok` goes false past the end.
struct Body {
  const std::string& s;
  size_t at = 0;
  bool ok = true;
  const char* take(size_t n) {
    if (!ok || s.size() - at < n) {
      ok = false;
      return nullptr;
    }
    at += n;
    return s.data() + at - n;
  }
  uint32_t u32() {
    const char* p = take(4);
    uint32_t v = 0;
    if (p) std::memcpy(&v, p, 4);
    return v;
  }
  int64_t i64() {
    const char* p = take(8);
    int64_t v = 0;
    if (p) std::memcpy(&v, p, 8);
    return v;
  }
  std::string str() {
    const uint32_t n = u32();
    const char* p = take(n);
    return p ? std::string(p, n) : std::string();
  }
  std::vector<std::string> strs() {
    const uint32_t n = u32();
    std::vector<std::string> out;
    for (uint32_t i = 0; i < n && ok; ++i) out.push_back(str());
    return out;
  }
};

// The replies as the protocol frames them; after a framing error (or the end
// of the stream) the connection is gone and every later call fails.
class Model {
 public:
  explicit Model(const std::string& stream) : stream_(stream) {}

  bool next(uint8_t* status, std::string* body) {
    if (gone_) return false;
    if (stream_.size() - at_ < 4) return gone();
    uint32_t len;
    std::memcpy(&len, stream_.data() + at_, 4);
    if (len == 0 || len > kMaxFrame || stream_.size() - at_ - 4 < len) return gone();
    *status = static_cast<uint8_t>(stream_[at_ + 4]);
    *body = stream_.substr(at_ + 5, len - 1);
    at_ += 4 + len;
    return true;
  }

  // The handshake as the protocol defines it: a CHALLENGE of our version with
  // a 32-byte nonce and the server's proof over kNonce and it, then OK.
  bool handshake() {
    uint8_t status = 0;
    std::string text;
    if (!next(&status, &text) || status != kChallenge) return false;
    Body b{text};
    const uint32_t version = b.u32();
    const std::string nonce = b.str();
    const std::string proof = b.str();
    if (!b.ok || version != kVersion || nonce.size() != 32) return false;
    std::string message = "hvd-torch store server";
    message.append(reinterpret_cast<const char*>(&version), 4);  // little-endian hosts only
    message += kNonce + nonce;
    const Digest256 want = hmacSha256(kSecret, message);
    if (proof != std::string(reinterpret_cast<const char*>(want.data()), want.size())) return false;
    return next(&status, &text) && status == kOk;
  }

  Outcome expect(Op op) {
    uint8_t status = 0;
    std::string text;
    if (!next(&status, &text)) return failed();
    Body b{text};
    Outcome out = returned();
    switch (op) {
      case kSet:
      case kDelete:
        return status == kOk ? out : failed();
      case kGet:
        if (status == kValue) {
          out.value = b.str();
          return b.ok ? out : failed();
        }
        if (status == kTimeout) {
          out.keys = b.strs();
          out.kind = Outcome::kTimedOut;
          return b.ok ? out : failed();
        }
        return failed();
      case kWait:
        if (status == kOk) return out;
        if (status == kTimeout) {
          out.keys = b.strs();
          return b.ok ? out : failed();
        }
        return failed();
      case kAdd:
      case kCheck:
        if (status != kInt) return failed();
        out.number = b.i64();
        if (op == kCheck) out.number = out.number == 1;
        return b.ok ? out : failed();
      case kList:
        if (status != kKeys) return failed();
        out.keys = b.strs();
        return b.ok ? out : failed();
      case kOps:
        break;
    }
    return failed();
  }

 private:
  bool gone() {
    gone_ = true;
    return false;
  }
  const std::string& stream_;
  size_t at_ = 0;
  bool gone_ = false;
};

class SocketStore : public StoreClient {
 public:
  SocketStore(int fd) : StoreClient(fd, "fuzz:0", kSecret, kNonce) {}
};

Outcome call(StoreClient& client, Op op) {
  using std::chrono::milliseconds;
  Outcome out = returned();
  try {
    switch (op) {
      case kSet: client.set("key", std::string("value")); break;
      case kGet: out.value = client.get("key", milliseconds(0)); break;
      case kWait: out.keys = client.wait({"a", "b"}, StoreClient::kForever); break;
      case kAdd: out.number = client.add("n", 1); break;
      case kDelete: client.deleteKey("key"); break;
      case kCheck: out.number = client.check({"a"}) ? 1 : 0; break;
      case kList: out.keys = client.listKeys("k/"); break;
      case kOps: break;
    }
  } catch (const StoreTimeout& e) {
    out = returned();
    out.kind = Outcome::kTimedOut;
    out.keys = e.missingKeys();
  } catch (const StoreError&) {
    out = failed();
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (64 << 10)) return 0;  // within one socket buffer: nothing blocks
  fuzz::Input in(data, size);
  std::vector<Op> ops(in.byte() % 17);
  for (auto& op : ops) op = static_cast<Op>(in.byte() % kOps);
  const std::string stream = in.rest();

  int fds[2];
  FUZZ_CHECK(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  FUZZ_CHECK(::send(fds[1], stream.data(), stream.size(), MSG_NOSIGNAL) ==
             static_cast<ssize_t>(stream.size()));
  ::shutdown(fds[1], SHUT_WR);  // the end of the stream: a server that hung up

  Model model(stream);
  const bool accepted = model.handshake();
  try {
    SocketStore client(fds[0]);
    FUZZ_CHECK(accepted);
    for (Op op : ops) {
      const Outcome want = model.expect(op);
      const Outcome got = call(client, op);
      FUZZ_CHECK(got == want);
    }
  } catch (const StoreError&) {
    FUZZ_CHECK(!accepted);  // the constructor owns and closed fds[0]
  }
  ::close(fds[1]);
  return 0;
}
