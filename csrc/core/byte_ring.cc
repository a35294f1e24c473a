#include "byte_ring.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "types.h"

namespace hvd {

namespace {

// The peer's process writes head or tail, and so may a crashed or hostile
// one: more than `capacity` bytes between them is no state the two ends can
// reach, and taken as a count it would copy outside the ring's memory. The
// connection is broken, as if its socket had failed.
void checkUsed(uint64_t head, uint64_t tail, size_t capacity) {
  if (head - tail > capacity) {
    throw transportFailure("control ring corrupt: head " + std::to_string(head) + ", tail " +
                           std::to_string(tail) + " of a ring of " + std::to_string(capacity) +
                           " bytes");
  }
}

}  // namespace

size_t ByteRing::footprint(size_t capacity) { return sizeof(Header) + capacity; }

ByteRing::ByteRing(void* memory, size_t capacity)
    : header_(static_cast<Header*>(memory)),
      data_(static_cast<char*>(memory) + sizeof(Header)),
      capacity_(capacity) {}

size_t ByteRing::write(const char* data, size_t n) {
  const uint64_t head = header_->head.value.load(std::memory_order_relaxed);
  const uint64_t tail = header_->tail.value.load(std::memory_order_acquire);
  checkUsed(head, tail, capacity_);
  const size_t take = std::min<size_t>(n, capacity_ - static_cast<size_t>(head - tail));
  const size_t at = static_cast<size_t>(head % capacity_);
  const size_t first = std::min(take, capacity_ - at);
  std::memcpy(data_ + at, data, first);
  std::memcpy(data_, data + first, take - first);
  // Sequentially consistent: ordered before the writer's load of
  // reader_sleeping (see the header's comment on waking).
  if (take > 0) header_->head.value.store(head + take);
  return take;
}

size_t ByteRing::read(std::string& into) {
  const uint64_t tail = header_->tail.value.load(std::memory_order_relaxed);
  const uint64_t head = header_->head.value.load(std::memory_order_acquire);
  checkUsed(head, tail, capacity_);
  const size_t n = static_cast<size_t>(head - tail);
  if (n == 0) return 0;
  const size_t at = static_cast<size_t>(tail % capacity_);
  const size_t first = std::min(n, capacity_ - at);
  into.append(data_ + at, first);
  into.append(data_, n - first);
  header_->tail.value.store(tail + n);  // seq_cst: before takeWaitingWriter()
  return n;
}

bool ByteRing::empty() const {
  return header_->head.value.load(std::memory_order_acquire) ==
         header_->tail.value.load(std::memory_order_relaxed);
}

bool ByteRing::sleepIfEmpty() {
  header_->reader_sleeping.store(1);
  if (header_->head.value.load() != header_->tail.value.load(std::memory_order_relaxed)) {
    header_->reader_sleeping.store(0);
    return false;
  }
  return true;
}

bool ByteRing::waitForRoom() {
  header_->writer_waiting.store(1);
  const uint64_t used = header_->head.value.load(std::memory_order_relaxed) -
                        header_->tail.value.load();
  if (used < capacity_) {
    header_->writer_waiting.store(0);
    return false;
  }
  return true;
}

}  // namespace hvd
