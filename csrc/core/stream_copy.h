// A copy into memory the caller will not read soon (a large result going to
// its output tensor): streaming stores, which skip the caches, so the copy
// does not first read every destination line from memory (a plain memcpy's
// read-for-ownership: a third of its traffic into cold memory).
#pragma once

#include <cstddef>

namespace hvd {

// Worth it for the pieces of an op of at least this many bytes, written to
// memory the op did not just read: smaller ones likely fit in the cache,
// where a streaming store would only evict the line.
constexpr size_t kStreamCopyFrom = size_t{1} << 20;

// memcpy(dst, src, n) through streaming stores (memcpy where the CPU has
// none). Ends with a store fence, so another thread or process that learns of
// the copy afterwards (an atomic, a barrier) sees every byte.
void streamCopy(void* dst, const void* src, size_t n);

}  // namespace hvd
