#include "device.h"

#include <cstring>

#include "reduce.h"

namespace hvd {

void HostMemory::copy(void* dst, const void* src, size_t bytes) {
  if (dst != src && bytes > 0) std::memcpy(dst, src, bytes);
}

void HostMemory::scale(void* buf, size_t count, DataType dtype, double factor) {
  scaleBuffer(buf, count, dtype, factor);
}

void* HostMemory::scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

std::shared_ptr<void> HostMemory::zeros(size_t bytes) {
  auto buf = std::make_shared<std::vector<char>>(bytes, 0);
  return std::shared_ptr<void>(buf, buf->data());
}

}  // namespace hvd
