// Client for the job's rendezvous key-value store (served by
// hvdrun/store_server.py; hvdrun/store_protocol.py documents the wire protocol
// byte by byte). The engine uses it to exchange addresses and to wait for its
// peers. Its methods are virtual so that a store living in the same process
// (the engine's unit tests, tests/cpp/test_engine.cc) can stand in.
//
// Threading: every method may be called from any thread. Requests are
// serialized by one mutex, so a get()/wait() that blocks for a long time holds
// up other callers of the same client; a thread that must not be held up (e.g.
// the background loop while the user thread waits) should own its own client.
//
// Timeouts: nothing blocks forever unless asked to. kForever waits as long as
// the server lives; a server that dies closes the socket and the call throws.
// Every reply is awaited for the request's timeout plus a fixed slack, so a
// server that hangs without closing also ends in StoreError.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace hvd {

// I/O failure, a failed handshake, or an ERROR reply. The message names the
// store's host:port.
class StoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Keys did not appear in time; missingKeys() lists the ones still absent.
class StoreTimeout : public StoreError {
 public:
  StoreTimeout(const std::string& what, std::vector<std::string> missing)
      : StoreError(what), missing_(std::move(missing)) {}
  const std::vector<std::string>& missingKeys() const { return missing_; }

 private:
  std::vector<std::string> missing_;
};

class StoreClient {
 public:
  // Wait as long as the server lives (timeout_ms 0xFFFFFFFF on the wire).
  static constexpr std::chrono::milliseconds kForever{-1};

  // Connects and runs the handshake (hvdrun/store_protocol.py): each side
  // proves it knows the secret over fresh nonces, which never crosses the
  // wire; a server that cannot prove it is refused before it hears anything
  // else. Connecting is retried until connect_timeout because ranks may start
  // before the server listens. Throws StoreError naming host:port and the
  // timeout on failure, on a failed proof either way, or on a version mismatch
  // (naming both versions).
  StoreClient(std::string host, int port, std::string secret,
              std::chrono::milliseconds connect_timeout);
  virtual ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  virtual void set(const std::string& key, const std::string& value);
  void set(const std::string& key, const std::vector<char>& value) {
    set(key, std::string(value.begin(), value.end()));
  }

  // The value once key exists. Throws StoreTimeout after timeout.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout);

  // Waits until every key exists. Returns the keys still missing after timeout
  // (empty: all present); it does not throw on timeout.
  virtual std::vector<std::string> wait(const std::vector<std::string>& keys,
                                        std::chrono::milliseconds timeout);

  // Atomically adds delta to the 8-byte integer at key (missing counts as 0)
  // and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta);

  virtual void deleteKey(const std::string& key);

  // True if every key exists right now.
  virtual bool check(const std::vector<std::string>& keys);

  // Existing keys that start with prefix, sorted.
  virtual std::vector<std::string> listKeys(const std::string& prefix);

  // "host:port", for error messages.
  const std::string& address() const { return address_; }

 protected:
  // A store in this process (a subclass overrides every request): no socket.
  explicit StoreClient(std::string address) : port_(0), address_(std::move(address)) {}
  // Over a socket already connected to a store, which it owns from now on;
  // runs the handshake as the public constructor does, with the given client
  // nonce (tests/fuzz drives the client's reply parsing through a socket pair
  // this way, its recorded replies proven over that nonce).
  StoreClient(int connected_fd, std::string address, const std::string& secret,
              const std::string& client_nonce);

 private:
  struct Reply;
  void handshake(const std::string& secret, const std::string& client_nonce);
  // A reply's payload of `len` bytes, read as it arrives.
  std::string readPayload(uint32_t len, std::chrono::steady_clock::time_point deadline);
  Reply call(const std::string& request, std::chrono::milliseconds timeout);
  void connect(std::chrono::milliseconds timeout);
  void sendAll(const char* data, size_t n, std::chrono::steady_clock::time_point deadline);
  void recvAll(char* data, size_t n, std::chrono::steady_clock::time_point deadline);
  void closeSocket();
  // After a failed send: the ERROR reply the server sent before closing, if
  // one arrives within a second (a frame it refused, and why).
  bool readRefusal(Reply* out);

  std::string host_;
  int port_;
  std::string address_;
  std::mutex mu_;  // guards fd_ and the request/reply exchange on it
  int fd_ = -1;
};

}  // namespace hvd
