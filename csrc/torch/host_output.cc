#include "host_output.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iterator>
#include <mutex>
#include <new>
#include <vector>

#include <ATen/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>

namespace hvd {
namespace torch_layer {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kHugeFrom = size_t{1} << 20;  // smaller blocks: powers of two, no alignment slack

size_t roundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// A pooled block's size for `n` bytes: a power of two below 1 MiB (so sizes
// repeat and a freed block fits the next output near its size), else whole
// huge pages.
size_t blockBytes(size_t n) {
  if (n >= kHugeFrom) return roundUp(n, kHugePage);
  size_t b = 8192;
  while (b < n) b <<= 1;
  return b;
}

// One mapping: `data` is its first huge-page boundary (blocks of 1 MiB and
// more) or its start, `bytes` long.
struct Block {
  void* base;
  size_t mapped;
  void* data;
  size_t bytes;
};

size_t cacheCap() {
  size_t mb = 1024;
  if (const char* v = std::getenv("HVD_TORCH_OUTPUT_CACHE_MB")) mb = std::strtoull(v, nullptr, 10);
  const long pages = sysconf(_SC_PHYS_PAGES);
  const size_t eighth = pages > 0 ? static_cast<size_t>(pages) * sysconf(_SC_PAGESIZE) / 8 : 0;
  const size_t cap = mb << 20;
  return eighth > 0 && cap > eighth ? eighth : cap;
}

// Freed blocks, oldest first: a block is reused by the next output of its
// size; past the cap the oldest go, so the pool follows the sizes in use.
// The count is capped too: take() looks through the blocks (a miss looks at
// every one).
constexpr size_t kMaxCachedBlocks = 1024;
class Pool {
 public:
  Block* take(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = free_.rbegin(); it != free_.rend(); ++it) {
        if ((*it)->bytes != bytes) continue;
        Block* b = *it;
        free_.erase(std::next(it).base());
        cached_ -= bytes;
        return b;
      }
    }
    // A large block is mapped with a huge page of slack, so it starts on a
    // 2 MiB boundary (the kernel may back it with transparent huge pages).
    const bool huge = bytes >= kHugeFrom;
    const size_t mapped = huge ? bytes + kHugePage : bytes;
    void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return nullptr;
    void* data = huge ? reinterpret_cast<void*>(roundUp(reinterpret_cast<uintptr_t>(base), kHugePage))
                      : base;
    return new Block{base, mapped, data, bytes};
  }

  // HVD_TORCH_OUTPUT_CACHE_MB=0: nothing kept, so a block below 1 MiB would
  // cost a mapping per output; those then come from the default allocator.
  bool keeps() const { return cap_ > 0; }

  void give(Block* b) {
    std::vector<Block*> evicted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_.push_back(b);
      cached_ += b->bytes;
      while ((cached_ > cap_ || free_.size() > kMaxCachedBlocks) && !free_.empty()) {
        cached_ -= free_.front()->bytes;
        evicted.push_back(free_.front());
        free_.pop_front();
      }
    }
    for (Block* e : evicted) {
      munmap(e->base, e->mapped);
      delete e;
    }
  }

 private:
  std::mutex mu_;
  std::deque<Block*> free_;
  size_t cached_ = 0;
  const size_t cap_ = cacheCap();
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: blocks may be freed at exit
  return *p;
}

void giveBack(void* ctx) { pool().give(static_cast<Block*>(ctx)); }

// Small outputs (up to 4 KiB): freed blocks kept per 64-byte size class, a
// mutex-guarded stack each. The default CPU allocator's 64-byte-aligned
// malloc, free and usage reports cost about 900 instructions per output,
// most of the output's cost in a 4-byte functional allreduce. A block starts
// with a 64-byte header that holds its class, so the deleter needs only it.
constexpr size_t kSmallStep = 64;
constexpr size_t kSmallUpTo = 4096;
constexpr size_t kSmallClasses = kSmallUpTo / kSmallStep;
constexpr size_t kSmallKeptPerClass = 32;  // at most ~4 MiB kept in all

class SmallPool {
 public:
  static SmallPool& instance();

  c10::DataPtr take(size_t n) {
    const size_t cls = (n - 1) / kSmallStep;  // n >= 1
    char* base = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::vector<char*>& kept = free_[cls];
      if (!kept.empty()) {
        base = kept.back();
        kept.pop_back();
      }
    }
    if (base == nullptr) {
      base = static_cast<char*>(std::aligned_alloc(kSmallStep, kSmallStep * (cls + 2)));
      if (base == nullptr) throw std::bad_alloc();
      *reinterpret_cast<size_t*>(base) = cls;
    }
    return {base + kSmallStep, base, &SmallPool::giveBack, c10::Device(c10::DeviceType::CPU)};
  }

 private:
  static void giveBack(void* ctx) {
    char* base = static_cast<char*>(ctx);
    SmallPool& self = instance();
    {
      std::lock_guard<std::mutex> lock(self.mu_);
      std::vector<char*>& kept = self.free_[*reinterpret_cast<size_t*>(base)];
      if (kept.size() < kSmallKeptPerClass) {
        kept.push_back(base);
        return;
      }
    }
    std::free(base);
  }

  std::mutex mu_;
  std::vector<char*> free_[kSmallClasses];
};

SmallPool& SmallPool::instance() {
  static SmallPool* p = new SmallPool();  // never destroyed: blocks may be freed at exit
  return *p;
}

// The allocator of our outputs' storages, so they stay resizable tensors.
class OutputAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return c10::GetDefaultCPUAllocator()->allocate(n);
    if (n <= kSmallUpTo) return SmallPool::instance().take(n);
    if (n < kHugeFrom && !pool().keeps()) return c10::GetDefaultCPUAllocator()->allocate(n);
    Block* b = pool().take(blockBytes(n));
    if (b == nullptr) return c10::GetDefaultCPUAllocator()->allocate(n);
    return {b->data, b, &giveBack, c10::Device(c10::DeviceType::CPU)};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

}  // namespace

at::Tensor hostOutput(at::IntArrayRef shape, const at::TensorOptions& options) {
  static OutputAllocator allocator;
  return at::detail::empty_generic(shape, &allocator, c10::DispatchKeySet(c10::DispatchKey::CPU),
                                   c10::typeMetaToScalarType(options.dtype()), c10::nullopt);
}

}  // namespace torch_layer
}  // namespace hvd
