// One POSIX shared-memory segment, mapped into this process.
//
// Lifetime: rank 0 of a set creates the segment under a name unique to the
// job; the others open it by that name; once every rank has it mapped, rank 0
// unlinks the name. From then on the memory lives exactly as long as the
// mappings do, so a job that is killed (SIGKILL included) leaves nothing in
// /dev/shm. Only the few milliseconds of setup hold a name.
//
// Threading: not thread-safe; owned by one backend.
#pragma once

#include <cstddef>
#include <string>

namespace hvd {

class ShmSegment {
 public:
  // Creates and maps a zero-filled segment. Throws std::runtime_error naming
  // the segment and the errno (e.g. /dev/shm full).
  static ShmSegment create(const std::string& name, size_t bytes);
  // Maps an existing segment. Throws std::runtime_error when it is missing or
  // smaller than `bytes` (a different /dev/shm: another container).
  static ShmSegment open(const std::string& name, size_t bytes);

  ShmSegment() = default;
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment();

  // A name no other segment has: "/hvd_torch.<pid>.<random>".
  static std::string uniqueName();

  // Removes the name (the mapping stays). Safe to call more than once.
  void unlink();

  // Another handle on this mapping, at the same address, that neither
  // unmaps nor unlinks it; this segment must outlive it. For ranks that are
  // threads of one process (tests/cpp/test_shm_backend.cc): a second mmap
  // would put each rank's view at its own address, where a race detector
  // cannot tell that two ranks touch one byte.
  ShmSegment borrow() const { return ShmSegment(name_, base_, bytes_, false, true); }

  char* data() const { return static_cast<char*>(base_); }
  size_t size() const { return bytes_; }
  const std::string& name() const { return name_; }

 private:
  ShmSegment(std::string name, void* base, size_t bytes, bool owner, bool borrowed = false)
      : name_(std::move(name)), base_(base), bytes_(bytes), owner_(owner), borrowed_(borrowed) {}
  void release();

  std::string name_;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  bool owner_ = false;  // created it: unlinks the name if still linked
  bool borrowed_ = false;  // borrow(): another segment unmaps
};

}  // namespace hvd
