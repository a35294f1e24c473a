#include "executor.h"

#include <cctype>
#include <numeric>

#include "process_sets.h"
#include "reduce.h"

namespace hvd {

void Executor::execute(const Response& response, const std::vector<Entry*>& entries,
                       Timeline* timeline) {
  timeline_ = timeline && timeline->active() ? timeline : nullptr;
  if (timeline_) {
    rows_.clear();
    for (const auto& name : response.names)
      rows_.push_back(timelineRow(response.process_set, response.type, name));
    collective_.clear();
    for (const char* c = backend_ ? backend_->name() : "local"; *c; ++c)
      collective_ += static_cast<char>(std::toupper(*c));
    collective_ += "_" + timelinePhase(response.type);
  }
  // Inputs written by device work: order ours after it (the host plane
  // already waited when the op was submitted).
  for (Entry* e : entries) {
    if (e->ready) memory_->waitFor(*e->ready);
  }
  // Allreduce records its copies and its collective itself.
  TimelineSpan span(response.type == OpType::kAllreduce ? nullptr : timeline_, rows_, collective_);
  // Average divides by the ranks that contributed (joined ranks add zeros).
  const int divisor = response.contributors > 0 ? response.contributors : size_;
  switch (response.type) {
    case OpType::kJoin:
    case OpType::kAddProcessSet:  // the engine applies set changes itself: no data moves
    case OpType::kRemoveProcessSet:
      return;
    case OpType::kAllreduce:
      return allreduce(entries, divisor);
    case OpType::kAllgather:
      if (entries.size() > 1 && backend_ != nullptr) return allgatherFused(response, entries);
      for (size_t i = 0; i < entries.size(); ++i)
        allgather(response.rank_first_dims[i], *entries[i]);
      return;
    case OpType::kBroadcast:
      if (entries.size() > 1 && backend_ != nullptr) return broadcastFused(entries);
      for (Entry* e : entries) broadcast(*e);
      return;
    case OpType::kBarrier:
      if (backend_ != nullptr) backend_->barrier();
      return;
    case OpType::kReducescatter:
      for (Entry* e : entries) reducescatter(*e, divisor);
      return;
    case OpType::kAlltoall:
      for (size_t i = 0; i < entries.size(); ++i)
        alltoall(response.alltoall_splits[i], *entries[i]);
      return;
  }
}

namespace {

// Appends `s`, or extends the last span when `s` continues it in both its
// input and its output (members that are views of one buffer): fewer, longer
// copies.
void appendSpan(std::vector<Backend::Span>& spans, const Backend::Span& s, size_t elem) {
  if (!spans.empty()) {
    Backend::Span& last = spans.back();
    const size_t bytes = last.count * elem;
    if (static_cast<const char*>(last.in) + bytes == s.in &&
        static_cast<char*>(last.out) + bytes == s.out) {
      last.count += s.count;
      return;
    }
  }
  spans.push_back(s);
}

// Every buffer of the entries, in order: a bundle's members, else the entry's.
void spansOf(const std::vector<Entry*>& entries, size_t elem, std::vector<Backend::Span>& spans) {
  spans.clear();
  for (Entry* e : entries) {
    if (!e->parts.empty()) {
      for (const Backend::Span& part : e->parts) appendSpan(spans, part, elem);
    } else {
      appendSpan(spans, {e->input, e->output, static_cast<size_t>(e->request.numElements())},
                 elem);
    }
  }
}

std::vector<Backend::Span> spansOf(const std::vector<Entry*>& entries, size_t elem) {
  std::vector<Backend::Span> spans;
  spansOf(entries, elem, spans);
  return spans;
}

}  // namespace

// The fusion buffer holds the spans' bytes back to back, in order.
void Executor::packInputs(const std::vector<Backend::Span>& spans, size_t elem, char* buf) {
  for (const auto& s : spans) {
    memory_->copy(buf, s.in, s.count * elem);
    buf += s.count * elem;
  }
}

void Executor::unpackOutputs(const std::vector<Backend::Span>& spans, size_t elem,
                             const char* buf) {
  for (const auto& s : spans) {
    memory_->copy(s.out, buf, s.count * elem);
    buf += s.count * elem;
  }
}

void Executor::reducescatter(Entry& e, int divisor) {
  const Request& q = e.request;
  const size_t n = static_cast<size_t>(q.numElements());
  const ReduceOp op = q.reduce_op == ReduceOp::kAverage ? ReduceOp::kSum : q.reduce_op;
  const double post = postscaleFactor(q.reduce_op, divisor, q.postscale);
  const RowSlice mine = reducescatterSlice(q.shape[0], size_, rank_);
  const size_t row_bytes = static_cast<size_t>(q.rowElements()) * dataTypeSize(q.dtype);
  char* out = static_cast<char*>(e.allocate(mine.rows));
  if (backend_ != nullptr && n > 0) {
    std::vector<size_t> counts(size_);
    for (int r = 0; r < size_; ++r) {
      counts[r] = static_cast<size_t>(reducescatterSlice(q.shape[0], size_, r).rows *
                                      q.rowElements());
    }
    if (backend_->reducescatter(e.input, out, counts, q.dtype, op, q.prescale, post)) return;
  }
  // A backend without a reduce-scatter (NCCL's, for now; every host plane
  // has one): reduce the whole tensor, then keep this rank's rows, which
  // moves twice the bytes of a reduce-scatter.
  const size_t bytes = q.numBytes();
  char* buf = static_cast<char*>(memory_->scratch(bytes));
  memory_->copy(buf, e.input, bytes);
  memory_->scale(buf, n, q.dtype, q.prescale);
  if (backend_ != nullptr && n > 0) backend_->allreduce(buf, n, q.dtype, op);
  char* slice = buf + mine.offset * row_bytes;
  const size_t count = static_cast<size_t>(mine.rows * q.rowElements());
  memory_->scale(slice, count, q.dtype, post);
  memory_->copy(out, slice, count * dataTypeSize(q.dtype));
}

void Executor::alltoall(const std::vector<int64_t>& matrix, Entry& e) {
  // Every rank's splits, row-major: rank s sends matrix[s * n + d] rows to
  // rank d.
  const int n = size_;
  const int me = rank_;
  const int64_t row = e.request.rowElements();
  std::vector<int64_t> recv_rows(n), send_counts(n), recv_counts(n);
  int64_t total = 0;
  for (int r = 0; r < n; ++r) {
    recv_rows[r] = matrix[static_cast<size_t>(r) * n + me];
    send_counts[r] = matrix[static_cast<size_t>(me) * n + r] * row;
    recv_counts[r] = recv_rows[r] * row;
    total += recv_rows[r];
  }
  e.work->setRankRows(recv_rows);
  void* out = e.allocate(total);
  if (backend_ == nullptr) {
    memory_->copy(out, e.input, e.request.numBytes());
    return;
  }
  backend_->alltoallv(e.input, send_counts, out, recv_counts, e.request.dtype);
}

void Executor::allreduce(const std::vector<Entry*>& entries, int divisor) {
  const Request& q = entries[0]->request;
  const size_t elem = dataTypeSize(q.dtype);
  std::vector<Backend::Span>& spans = spans_;  // kept: no allocation per op
  spansOf(entries, elem, spans);
  size_t total = 0;
  for (const auto& s : spans) total += s.count;
  const ReduceOp op = q.reduce_op == ReduceOp::kAverage ? ReduceOp::kSum : q.reduce_op;
  const double post = postscaleFactor(q.reduce_op, divisor, q.postscale);
  if (backend_ != nullptr && total > 0 && backend_->directForms()) {
    // A backend that reads the inputs and writes the outputs itself needs
    // neither the fusion buffer nor a first copy into the output.
    // The copies in and out happen inside it: one span for all.
    TimelineSpan collective(timeline_, rows_, collective_);
    if (backend_->allreduceSpans(spans, q.dtype, op, q.prescale, post)) return;
  }

  if (backend_ == nullptr) {
    // One rank: each output is its input, scaled; no fusion buffer.
    for (const auto& s : spans) {
      memory_->copy(s.out, s.in, s.count * elem);
      memory_->scale(s.out, s.count, q.dtype, q.prescale);
      memory_->scale(s.out, s.count, q.dtype, post);
    }
    return;
  }
  // One tensor reduces in its own output buffer; several are packed into the
  // fusion buffer so the backend runs one collective for all of them.
  char* buf = spans.size() == 1 ? static_cast<char*>(spans[0].out)
                                : static_cast<char*>(memory_->scratch(total * elem));
  {
    TimelineSpan copy_in(timeline_, rows_, "MEMCPY_IN_FUSION_BUFFER");
    packInputs(spans, elem, buf);
    memory_->scale(buf, total, q.dtype, q.prescale);
  }
  if (backend_ != nullptr && total > 0) {
    TimelineSpan collective(timeline_, rows_, collective_);
    backend_->allreduce(buf, total, q.dtype, op);
  }
  TimelineSpan copy_out(timeline_, rows_, "MEMCPY_OUT_FUSION_BUFFER");
  memory_->scale(buf, total, q.dtype, post);
  if (spans.size() > 1) unpackOutputs(spans, elem, buf);
}

void Executor::allgather(const std::vector<int64_t>& dims, Entry& e) {
  const int64_t row = e.request.rowElements();
  const int64_t total_rows = std::accumulate(dims.begin(), dims.end(), int64_t{0});
  e.work->setRankRows(dims);
  void* out = e.allocate(total_rows);
  if (backend_ == nullptr) {
    memory_->copy(out, e.input, e.request.numBytes());
    return;
  }
  if (total_rows * row == 0) return;
  std::vector<size_t> counts;
  for (int64_t d : dims) counts.push_back(static_cast<size_t>(d * row));
  backend_->allgatherv(e.input, out, counts, e.request.dtype);
}

// Several allgathers as one: this rank's inputs packed into the front of the
// fusion buffer, one allgatherv whose per-rank count is the sum over the
// tensors, then each tensor's rows copied out of every rank's block.
void Executor::allgatherFused(const Response& response, const std::vector<Entry*>& entries) {
  const DataType dtype = entries[0]->request.dtype;
  const size_t elem = dataTypeSize(dtype);
  const size_t k = entries.size();
  std::vector<size_t> counts(size_, 0);  // elements per rank, all tensors
  std::vector<char*> outs(k);
  for (size_t i = 0; i < k; ++i) {
    const std::vector<int64_t>& dims = response.rank_first_dims[i];
    const int64_t row = entries[i]->request.rowElements();
    entries[i]->work->setRankRows(dims);
    outs[i] = static_cast<char*>(
        entries[i]->allocate(std::accumulate(dims.begin(), dims.end(), int64_t{0})));
    for (int r = 0; r < size_; ++r) counts[r] += static_cast<size_t>(dims[r] * row);
  }
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  if (total == 0) return;
  char* in = static_cast<char*>(memory_->scratch((counts[rank_] + total) * elem));
  char* out = in + counts[rank_] * elem;
  {
    TimelineSpan copy_in(timeline_, rows_, "MEMCPY_IN_FUSION_BUFFER");
    packInputs(spansOf(entries, elem), elem, in);
  }
  backend_->allgatherv(in, out, counts, dtype);
  TimelineSpan copy_out(timeline_, rows_, "MEMCPY_OUT_FUSION_BUFFER");
  const char* block = out;  // rank r's block: its rows of tensor 0, 1, ...
  std::vector<size_t> written(k, 0);
  for (int r = 0; r < size_; ++r) {
    for (size_t i = 0; i < k; ++i) {
      const size_t bytes = static_cast<size_t>(response.rank_first_dims[i][r] *
                                               entries[i]->request.rowElements()) * elem;
      memory_->copy(outs[i] + written[i], block, bytes);
      written[i] += bytes;
      block += bytes;
    }
  }
}

// Several broadcasts from one root as one, through the fusion buffer.
void Executor::broadcastFused(const std::vector<Entry*>& entries) {
  const Request& q = entries[0]->request;
  const size_t elem = dataTypeSize(q.dtype);
  const std::vector<Backend::Span> spans = spansOf(entries, elem);
  size_t total = 0;  // elements
  for (const auto& s : spans) total += s.count;
  if (total == 0) return;
  char* buf = static_cast<char*>(memory_->scratch(total * elem));
  const int root = ranks_.empty() ? q.root_rank : indexIn(ranks_, q.root_rank);
  if (rank_ == root) {
    TimelineSpan copy_in(timeline_, rows_, "MEMCPY_IN_FUSION_BUFFER");
    packInputs(spans, elem, buf);
  }
  backend_->broadcast(buf, total, q.dtype, root);
  TimelineSpan copy_out(timeline_, rows_, "MEMCPY_OUT_FUSION_BUFFER");
  unpackOutputs(spans, elem, buf);
}

void Executor::broadcast(Entry& e) {
  const size_t bytes = e.request.numBytes();
  // root_rank is a global rank (Horovod's convention); the backend counts
  // positions in the set.
  const int root = ranks_.empty() ? e.request.root_rank : indexIn(ranks_, e.request.root_rank);
  const size_t count = static_cast<size_t>(e.request.numElements());
  // Out of place, a direct backend copies the root's input as it goes.
  if (backend_ != nullptr && e.output != e.input &&
      backend_->broadcastInto(e.input, e.output, count, e.request.dtype, root)) {
    return;
  }
  // Only the root's output starts as its input: the broadcast overwrites
  // every other rank's (a copy of the whole tensor saved there, out of place).
  if (backend_ == nullptr || rank_ == root) memory_->copy(e.output, e.input, bytes);
  if (backend_ != nullptr && bytes > 0) {
    backend_->broadcast(e.output, count, e.request.dtype, root);
  }
}

}  // namespace hvd
