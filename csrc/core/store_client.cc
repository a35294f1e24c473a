#include "store_client.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <thread>

#include "hmac_sha256.h"

namespace hvd {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Opcodes and reply statuses: the protocol in hvdrun/store_protocol.py. Opcode
// 1 was version 1's AUTH, which sent the secret.
enum Op : uint8_t { kSet = 2, kGet, kWait, kAdd, kDelete, kCheck, kList, kHello, kProof };
enum Status : uint8_t { kOk = 0, kValue, kTimeout, kError, kInt, kKeys, kChallenge };

constexpr uint32_t kProtocolVersion = 2;
constexpr size_t kNonceBytes = 32;

constexpr uint32_t kWaitForeverMs = 0xFFFFFFFFu;
constexpr uint32_t kMaxFrame = 1u << 30;
// How much longer than the request's own timeout we wait for the reply before
// deciding the server is wedged.
constexpr milliseconds kReplySlack{30000};

// Explicit shifts rather than memcpy: the wire is little-endian whatever the host.
void putU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void putI64(std::string& out, int64_t v) {
  uint64_t u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((u >> (8 * i)) & 0xFF));
}

void putStr(std::string& out, const char* data, size_t n) {
  if (n > kMaxFrame) throw StoreError("store key or value larger than 1 GiB");
  putU32(out, static_cast<uint32_t>(n));
  out.append(data, n);
}

void putStr(std::string& out, const std::string& s) { putStr(out, s.data(), s.size()); }

void putKeys(std::string& out, const std::vector<std::string>& keys) {
  putU32(out, static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) putStr(out, k);
}

uint32_t wireTimeout(milliseconds timeout) {
  if (timeout.count() < 0) return kWaitForeverMs;
  return static_cast<uint32_t>(
      std::min<int64_t>(timeout.count(), static_cast<int64_t>(kWaitForeverMs) - 1));
}

// HMAC-SHA256(secret, purpose | version | client nonce | server nonce): the
// proofs of store_protocol.py.
std::string proof(const char* purpose, const std::string& secret, uint32_t version,
                  const std::string& clientNonce, const std::string& serverNonce) {
  std::string message(purpose);
  putU32(message, version);
  message += clientNonce;
  message += serverNonce;
  const Digest256 d = hmacSha256(secret, message);
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

Clock::time_point replyDeadline(milliseconds timeout) {
  if (timeout.count() < 0) return Clock::time_point::max();
  return Clock::now() + timeout + kReplySlack;
}

// Milliseconds for poll(): -1 for no deadline, clamped to int otherwise.
int pollMs(Clock::time_point deadline) {
  if (deadline == Clock::time_point::max()) return -1;
  auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, INT_MAX));
}

std::string errnoText(int err) { return std::strerror(err); }

// Cursor over a reply body; running past the end means the server (or
// something pretending to be it) sent garbage.
class Parser {
 public:
  Parser(const std::string& body, const std::string& address)
      : body_(body), address_(address) {}
  uint32_t u32() {
    const unsigned char* p = take(4);
    return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
  }
  int64_t i64() {
    const unsigned char* p = take(8);
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u |= uint64_t(p[i]) << (8 * i);
    return static_cast<int64_t>(u);
  }
  std::string str() {
    uint32_t n = u32();
    return std::string(reinterpret_cast<const char*>(take(n)), n);
  }
  std::vector<std::string> strs() {
    uint32_t n = u32();
    std::vector<std::string> out;
    for (uint32_t i = 0; i < n; ++i) out.push_back(str());
    return out;
  }

 private:
  const unsigned char* take(size_t n) {
    if (body_.size() - pos_ < n) {
      throw StoreError("malformed reply from the store at " + address_);
    }
    const unsigned char* p = reinterpret_cast<const unsigned char*>(body_.data()) + pos_;
    pos_ += n;
    return p;
  }
  const std::string& body_;
  const std::string& address_;
  size_t pos_ = 0;
};

}  // namespace

struct StoreClient::Reply {
  uint8_t status;
  std::string body;  // the payload after the status byte
};

StoreClient::StoreClient(std::string host, int port, std::string secret,
                         milliseconds connect_timeout)
    : host_(std::move(host)), port_(port), address_(host_ + ":" + std::to_string(port)) {
  connect(connect_timeout);
  handshake(secret, randomBytes(kNonceBytes));
}

StoreClient::StoreClient(int connected_fd, std::string address, const std::string& secret,
                         const std::string& client_nonce)
    : port_(0), address_(std::move(address)), fd_(connected_fd) {
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
  handshake(secret, client_nonce);
}

void StoreClient::handshake(const std::string& secret, const std::string& client_nonce) {
  // The secret never goes on the wire: HELLO carries our nonce, the server
  // proves itself over both nonces, and only then do we prove ourselves.
  try {
    std::string hello(1, static_cast<char>(kHello));
    putU32(hello, kProtocolVersion);
    putStr(hello, client_nonce);
    Reply reply = call(hello, milliseconds(0));
    if (reply.status == kError) {
      std::string why = Parser(reply.body, address_).str();
      if (why.find("before AUTH") != std::string::npos) {  // a version-1 store's words
        why = "store protocol version mismatch: this client speaks version " +
              std::to_string(kProtocolVersion) + ", the store speaks version 1 (" + why + ")";
      }
      throw StoreError("the store at " + address_ + " refused this client: " + why);
    }
    const StoreError unproven("the store at " + address_ +
                              " could not prove it knows the job's secret (is something else "
                              "listening on the port?)");
    if (reply.status != kChallenge) throw unproven;
    std::string serverNonce, serverProof;
    uint32_t version = 0;
    try {
      Parser p(reply.body, address_);
      version = p.u32();
      if (version == kProtocolVersion) {
        serverNonce = p.str();
        serverProof = p.str();
      }
    } catch (const StoreError&) {
      throw unproven;
    }
    if (version != kProtocolVersion) {
      throw StoreError("store protocol version mismatch: this client speaks version " +
                       std::to_string(kProtocolVersion) + ", the store at " + address_ +
                       " speaks version " + std::to_string(version));
    }
    const std::string want =
        proof("hvd-torch store server", secret, kProtocolVersion, client_nonce, serverNonce);
    if (serverNonce.size() != kNonceBytes || !constantTimeEqual(serverProof, want)) {
      throw unproven;
    }
    std::string mine(1, static_cast<char>(kProof));
    putStr(mine, proof("hvd-torch store client", secret, kProtocolVersion, client_nonce,
                       serverNonce));
    reply = call(mine, milliseconds(0));
    if (reply.status == kError) {
      throw StoreError("the store at " + address_ +
                       " refused this client: " + Parser(reply.body, address_).str());
    }
    if (reply.status != kOk) {
      throw StoreError("unexpected reply to the handshake's PROOF from the store at " + address_);
    }
  } catch (...) {
    closeSocket();
    throw;
  }
}

StoreClient::~StoreClient() { closeSocket(); }

void StoreClient::closeSocket() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

void StoreClient::connect(milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string lastError = "no address";
  auto backoff = milliseconds(20);
  while (true) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* addrs = nullptr;
    int rc = ::getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &addrs);
    if (rc != 0) {
      lastError = ::gai_strerror(rc);
    }
    for (addrinfo* a = rc == 0 ? addrs : nullptr; a != nullptr; a = a->ai_next) {
      int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                        a->ai_protocol);
      if (fd < 0) {
        lastError = errnoText(errno);
        continue;
      }
      // Non-blocking connect + poll so a black-holed address cannot outlast the
      // timeout; the socket stays non-blocking for every later read and write.
      int err = 0;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
        err = errno;
        if (err == EINPROGRESS || err == EINTR) {
          pollfd pfd{fd, POLLOUT, 0};
          int n;
          do {
            n = ::poll(&pfd, 1, pollMs(deadline));
          } while (n < 0 && errno == EINTR);
          socklen_t len = sizeof(err);
          if (n <= 0) {
            err = n == 0 ? ETIMEDOUT : errno;
          } else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
            err = errno;
          }
        }
      }
      if (err == 0) {
        int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        ::freeaddrinfo(addrs);
        fd_ = fd;
        return;
      }
      lastError = errnoText(err);
      ::close(fd);
    }
    if (addrs != nullptr) ::freeaddrinfo(addrs);
    const auto now = Clock::now();
    if (now >= deadline) break;
    // The last sleep is cut short so that one attempt lands at the deadline.
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, milliseconds(500));
  }
  throw StoreError("cannot connect to the store at " + address_ + " within " +
                   std::to_string(timeout.count()) + " ms: " + lastError);
}

void StoreClient::sendAll(const char* data, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    ssize_t sent = ::send(fd_, data, n, MSG_NOSIGNAL);
    if (sent > 0) {
      data += sent;
      n -= static_cast<size_t>(sent);
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pfd{fd_, POLLOUT, 0};
      int ready = ::poll(&pfd, 1, pollMs(deadline));
      if (ready == 0) throw StoreError("timed out sending to the store at " + address_);
      if (ready < 0 && errno != EINTR) {
        throw StoreError("poll failed on the store connection to " + address_ + ": " +
                         errnoText(errno));
      }
      continue;
    }
    throw StoreError("lost the connection to the store at " + address_ + ": " + errnoText(errno));
  }
}

void StoreClient::recvAll(char* data, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    ssize_t got = ::recv(fd_, data, n, 0);
    if (got > 0) {
      data += got;
      n -= static_cast<size_t>(got);
      continue;
    }
    if (got == 0) throw StoreError("the store at " + address_ + " closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      pollfd pfd{fd_, POLLIN, 0};
      int ready = ::poll(&pfd, 1, pollMs(deadline));
      if (ready == 0) throw StoreError("the store at " + address_ + " did not answer in time");
      if (ready < 0 && errno != EINTR) {
        throw StoreError("poll failed on the store connection to " + address_ + ": " +
                         errnoText(errno));
      }
      continue;
    }
    throw StoreError("lost the connection to the store at " + address_ + ": " + errnoText(errno));
  }
}

StoreClient::Reply StoreClient::call(const std::string& request, milliseconds timeout) {
  std::string frame;
  frame.reserve(4 + request.size());
  putU32(frame, static_cast<uint32_t>(request.size()));
  frame += request;

  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) {
    throw StoreError("the connection to the store at " + address_ +
                     " was closed by an earlier error");
  }
  const auto deadline = replyDeadline(timeout);
  try {
    sendAll(frame.data(), frame.size(), deadline);
  } catch (const StoreError&) {
    // The server refuses a frame over its limit (and says why) before reading
    // it all, then closes: its ERROR, when it reached us, explains the broken pipe.
    Reply refusal{};
    const bool refused = readRefusal(&refusal);
    closeSocket();
    if (refused) return refusal;
    throw;
  }
  try {
    char header[4];
    recvAll(header, sizeof(header), deadline);
    std::string lenBytes(header, sizeof(header));
    uint32_t len = Parser(lenBytes, address_).u32();
    if (len == 0 || len > kMaxFrame) {
      throw StoreError("bad frame length " + std::to_string(len) + " from the store at " +
                       address_);
    }
    const std::string payload = readPayload(len, deadline);
    return Reply{static_cast<uint8_t>(payload[0]), payload.substr(1)};
  } catch (const StoreError&) {
    // A half-sent request or half-read reply leaves the stream out of step with
    // the server: the connection cannot be reused.
    closeSocket();
    throw;
  }
}

std::string StoreClient::readPayload(uint32_t len, Clock::time_point deadline) {
  // The buffer grows with what has arrived (doubling, from 64 KiB), not with
  // what the length header claims: a header of 1 GiB followed by nothing, from
  // a broken or impostor server, costs 64 KiB, not a 1 GiB allocation.
  std::string payload;
  while (payload.size() < len) {
    const size_t have = payload.size();
    const size_t chunk = std::min<size_t>(len - have, std::max<size_t>(have, 64 << 10));
    payload.resize(have + chunk);
    recvAll(&payload[have], chunk, deadline);
  }
  return payload;
}

bool StoreClient::readRefusal(Reply* out) {
  try {
    const auto deadline = Clock::now() + milliseconds(1000);
    char header[4];
    recvAll(header, sizeof(header), deadline);
    uint32_t len = Parser(std::string(header, sizeof(header)), address_).u32();
    if (len == 0 || len > kMaxFrame) return false;
    const std::string payload = readPayload(len, deadline);
    if (static_cast<uint8_t>(payload[0]) != kError) return false;
    *out = Reply{kError, payload.substr(1)};
    return true;
  } catch (const StoreError&) {
    return false;
  }
}

namespace {

[[noreturn]] void throwUnexpected(uint8_t status, const std::string& body, const char* op,
                                  const std::string& address) {
  if (status == kError) {
    throw StoreError(std::string(op) + " failed: the store at " + address +
                     " answered: " + Parser(body, address).str());
  }
  throw StoreError(std::string("unexpected reply status ") + std::to_string(status) + " to " +
                   op + " from the store at " + address);
}

}  // namespace

void StoreClient::set(const std::string& key, const std::string& value) {
  std::string req(1, static_cast<char>(kSet));
  putStr(req, key);
  putStr(req, value);
  Reply r = call(req, milliseconds(0));
  if (r.status != kOk) throwUnexpected(r.status, r.body, "SET", address_);
}

std::string StoreClient::get(const std::string& key, milliseconds timeout) {
  std::string req(1, static_cast<char>(kGet));
  putStr(req, key);
  putU32(req, wireTimeout(timeout));
  Reply r = call(req, timeout);
  if (r.status == kValue) return Parser(r.body, address_).str();
  if (r.status == kTimeout) {
    auto missing = Parser(r.body, address_).strs();
    throw StoreTimeout("timed out after " + std::to_string(timeout.count()) +
                           " ms waiting for key '" + key + "' in the store at " + address_,
                       std::move(missing));
  }
  throwUnexpected(r.status, r.body, "GET", address_);
}

std::vector<std::string> StoreClient::wait(const std::vector<std::string>& keys,
                                           milliseconds timeout) {
  std::string req(1, static_cast<char>(kWait));
  putKeys(req, keys);
  putU32(req, wireTimeout(timeout));
  Reply r = call(req, timeout);
  if (r.status == kOk) return {};
  if (r.status == kTimeout) return Parser(r.body, address_).strs();
  throwUnexpected(r.status, r.body, "WAIT", address_);
}

int64_t StoreClient::add(const std::string& key, int64_t delta) {
  std::string req(1, static_cast<char>(kAdd));
  putStr(req, key);
  putI64(req, delta);
  Reply r = call(req, milliseconds(0));
  if (r.status != kInt) throwUnexpected(r.status, r.body, "ADD", address_);
  return Parser(r.body, address_).i64();
}

void StoreClient::deleteKey(const std::string& key) {
  std::string req(1, static_cast<char>(kDelete));
  putStr(req, key);
  Reply r = call(req, milliseconds(0));
  if (r.status != kOk) throwUnexpected(r.status, r.body, "DELETE", address_);
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  std::string req(1, static_cast<char>(kCheck));
  putKeys(req, keys);
  Reply r = call(req, milliseconds(0));
  if (r.status != kInt) throwUnexpected(r.status, r.body, "CHECK", address_);
  return Parser(r.body, address_).i64() == 1;
}

std::vector<std::string> StoreClient::listKeys(const std::string& prefix) {
  std::string req(1, static_cast<char>(kList));
  putStr(req, prefix);
  Reply r = call(req, milliseconds(0));
  if (r.status != kKeys) throwUnexpected(r.status, r.body, "LIST", address_);
  return Parser(r.body, address_).strs();
}

}  // namespace hvd
