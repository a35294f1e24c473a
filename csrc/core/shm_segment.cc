#include "shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <stdexcept>
#include <utility>

namespace hvd {

std::string ShmSegment::uniqueName() {
  std::random_device rd;
  return "/hvd_torch." + std::to_string(::getpid()) + "." + std::to_string(rd()) +
         std::to_string(rd());
}

namespace {

[[noreturn]] void fail(const std::string& what, const std::string& name, int err) {
  throw std::runtime_error("shared memory: " + what + " '/dev/shm" + name + "' failed: " +
                           std::strerror(err));
}

void* mapShared(int fd, size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : p;
}

}  // namespace

ShmSegment ShmSegment::create(const std::string& name, size_t bytes) {
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) fail("creating", name, errno);
  // posix_fallocate, not ftruncate: a full /dev/shm fails here, not with a
  // SIGBUS on first touch in the middle of a collective.
  int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  void* base = err == 0 ? mapShared(fd, bytes) : nullptr;
  if (base == nullptr && err == 0) err = errno;
  ::close(fd);
  if (base == nullptr) {
    ::shm_unlink(name.c_str());
    fail("sizing", name, err);
  }
  return ShmSegment(name, base, bytes, true);
}

ShmSegment ShmSegment::open(const std::string& name, size_t bytes) {
  int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) fail("opening", name, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < bytes) {
    ::close(fd);
    throw std::runtime_error("shared memory: '/dev/shm" + name + "' is smaller than expected");
  }
  void* base = mapShared(fd, bytes);
  const int err = errno;
  ::close(fd);
  if (base == nullptr) fail("mapping", name, err);
  return ShmSegment(name, base, bytes, false);
}

ShmSegment::ShmSegment(ShmSegment&& other) noexcept { *this = std::move(other); }

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    release();
    name_ = std::move(other.name_);
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    owner_ = std::exchange(other.owner_, false);
    borrowed_ = std::exchange(other.borrowed_, false);
  }
  return *this;
}

ShmSegment::~ShmSegment() { release(); }

void ShmSegment::unlink() {
  if (owner_) ::shm_unlink(name_.c_str());
  owner_ = false;
}

void ShmSegment::release() {
  unlink();
  if (base_ != nullptr && !borrowed_) ::munmap(base_, bytes_);
  base_ = nullptr;
  bytes_ = 0;
}

}  // namespace hvd
