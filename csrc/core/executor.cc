#include "executor.h"

#include <cstring>
#include <numeric>

#include "reduce.h"

namespace hvd {

void Executor::execute(const Response& response, const std::vector<Entry*>& entries) {
  switch (response.type) {
    case OpType::kAllreduce:
      return allreduce(entries);
    case OpType::kAllgather:
      for (size_t i = 0; i < entries.size(); ++i) {
        Response one = response;
        one.first_dims = {response.first_dims[i]};
        allgather(one, *entries[i]);
      }
      return;
    case OpType::kBroadcast:
      for (Entry* e : entries) broadcast(*e);
      return;
    case OpType::kBarrier:
      if (backend_ != nullptr) backend_->barrier();
      return;
  }
}

void Executor::allreduce(const std::vector<Entry*>& entries) {
  const Request& q = entries[0]->request;
  const size_t elem = dataTypeSize(q.dtype);
  size_t total = 0;
  for (Entry* e : entries) total += static_cast<size_t>(e->request.numElements());

  // One tensor reduces in its own output buffer; several are packed into the
  // fusion buffer so the backend runs one collective for all of them.
  char* buf;
  if (entries.size() == 1) {
    buf = static_cast<char*>(entries[0]->output);
    if (buf != entries[0]->input) std::memcpy(buf, entries[0]->input, total * elem);
  } else {
    if (fusion_buffer_.size() < total * elem) fusion_buffer_.resize(total * elem);
    buf = fusion_buffer_.data();
    size_t off = 0;
    for (Entry* e : entries) {
      std::memcpy(buf + off, e->input, e->request.numBytes());
      off += e->request.numBytes();
    }
  }
  scaleBuffer(buf, total, q.dtype, q.prescale);
  if (backend_ != nullptr && size_ > 1 && total > 0) {
    backend_->allreduce(buf, total, q.dtype,
                        q.reduce_op == ReduceOp::kAverage ? ReduceOp::kSum : q.reduce_op);
  }
  if (q.reduce_op == ReduceOp::kAverage) divideBuffer(buf, total, q.dtype, size_);
  scaleBuffer(buf, total, q.dtype, q.postscale);
  if (entries.size() > 1) {
    size_t off = 0;
    for (Entry* e : entries) {
      std::memcpy(e->output, buf + off, e->request.numBytes());
      off += e->request.numBytes();
    }
  }
}

void Executor::allgather(const Response& response, Entry& e) {
  const std::vector<int64_t>& dims = response.first_dims[0];
  const int64_t row = e.request.rowElements();
  const int64_t total_rows = std::accumulate(dims.begin(), dims.end(), int64_t{0});
  e.work->setFirstDims(dims);
  void* out = e.allocate(total_rows);
  if (backend_ == nullptr || size_ == 1) {
    std::memcpy(out, e.input, e.request.numBytes());
    return;
  }
  if (total_rows * row == 0) return;
  std::vector<size_t> counts;
  for (int64_t d : dims) counts.push_back(static_cast<size_t>(d * row));
  backend_->allgatherv(e.input, out, counts, e.request.dtype);
}

void Executor::broadcast(Entry& e) {
  const size_t bytes = e.request.numBytes();
  if (e.output != e.input) std::memcpy(e.output, e.input, bytes);
  if (backend_ != nullptr && size_ > 1 && bytes > 0) {
    backend_->broadcast(e.output, static_cast<size_t>(e.request.numElements()), e.request.dtype,
                        e.request.root_rank);
  }
}

}  // namespace hvd
