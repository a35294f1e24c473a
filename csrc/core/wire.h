// Little-endian byte writer/reader for the engine's control messages.
// A Reader that runs past the end throws WireError: a malformed frame from a
// peer is an error to report, never undefined behaviour.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace hvd {

class WireError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Writer {
 public:
  // Most control frames are under 128 bytes: one allocation.
  Writer() { buf_.resize(128); }
  template <typename T>
  void put(T value) {
    static_assert(std::is_trivially_copyable<T>::value, "plain values only");
    append(&value, sizeof(T));
  }
  void putString(const std::string& s) {
    put<uint32_t>(static_cast<uint32_t>(s.size()));
    append(s.data(), s.size());
  }
  void putBytes(const void* data, size_t n) {
    put<uint32_t>(static_cast<uint32_t>(n));
    append(data, n);
  }
  // A u32 count, then the values in one copy (an alltoall matrix runs to
  // millions at thousands of ranks).
  void putInt64s(const std::vector<int64_t>& values) {
    put<uint32_t>(static_cast<uint32_t>(values.size()));
    append(values.data(), values.size() * sizeof(int64_t));
  }
  // A copy into room made ahead, inlined: std::string's own append is a
  // library call, a few dozen instructions per value of a small frame.
  void append(const void* data, size_t n) {
    if (buf_.size() < used_ + n) buf_.resize(std::max(2 * buf_.size(), used_ + n));
    if (n > 0) std::memcpy(&buf_[used_], data, n);
    used_ += n;
  }
  // The bytes written (the room beyond them is dropped).
  std::string& buffer() {
    buf_.resize(used_);
    return buf_;
  }
  size_t size() const { return used_; }

 private:
  std::string buf_;  // [0, used_) written, the rest room for more
  size_t used_ = 0;
};

class Reader {
 public:
  Reader(const char* data, size_t size) : p_(data), end_(data + size) {}
  explicit Reader(const std::string& s) : Reader(s.data(), s.size()) {}

  template <typename T>
  T get() {
    T value;
    std::memcpy(&value, take(sizeof(T)), sizeof(T));
    return value;
  }
  std::string getString() {
    uint32_t n = get<uint32_t>();
    const char* p = take(n);
    return std::string(p, n);
  }
  // Returns a pointer into the frame; valid while the frame lives.
  const char* getBytes(uint32_t* n) {
    *n = get<uint32_t>();
    return take(*n);
  }
  // What putInt64s wrote.
  std::vector<int64_t> getInt64s() {
    std::vector<int64_t> values(getCount(sizeof(int64_t)));
    const size_t bytes = values.size() * sizeof(int64_t);
    if (bytes > 0) std::memcpy(values.data(), take(bytes), bytes);
    return values;
  }
  bool done() const { return p_ == end_; }
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }
  // Reads a u32 element count and checks that `count` elements of at least
  // `min_bytes` each can still follow, so a corrupt count is a WireError,
  // never a multi-gigabyte allocation.
  uint32_t getCount(size_t min_bytes) {
    uint32_t n = get<uint32_t>();
    if (static_cast<uint64_t>(n) * min_bytes > remaining()) throw WireError("corrupt element count in control message");
    return n;
  }

 private:
  const char* take(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) throw WireError("truncated control message");
    const char* p = p_;
    p_ += n;
    return p;
  }
  const char* p_;
  const char* end_;
};

}  // namespace hvd
