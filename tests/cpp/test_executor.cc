// The executor (csrc/core/executor.h): running a negotiated response over
// this rank's entries. Size 1 with no backend checks the local arithmetic and
// the copies; a recording Backend that stands in for N ranks holding the same
// data checks which collectives reach the transport (one per fused group,
// Average sent as Sum) and what the executor does around them.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "core/executor.h"
#include "core/reduce.h"

using namespace hvd;

namespace {

struct Call {
  std::string what;
  const void* in = nullptr;
  void* buf = nullptr;
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int root = -1;
  std::vector<size_t> counts;
};

// Records every call. Stands in for `size` ranks that all hold this rank's
// data: Sum multiplies by size (plus `sum_offset`, to make an integer sum not
// divisible by size), Min/Max leave the data alone; allgatherv puts this
// rank's rows at rank `rank`'s place and 0x5a bytes elsewhere; broadcast
// fills the buffer with bytes equal to the root rank.
class RecordingBackend : public Backend {
 public:
  RecordingBackend(int size, int rank) : size_(size), rank_(rank) {}
  const char* name() const override { return "recording"; }

  void allreduce(void* buf, size_t count, DataType dtype, ReduceOp op) override {
    Call c;
    c.what = "allreduce";
    c.buf = buf;
    c.count = count;
    c.dtype = dtype;
    c.op = op;
    calls.push_back(c);
    if (fail) throw std::runtime_error("peer 1 is gone");
    if (op != ReduceOp::kSum) return;
    if (dtype == DataType::kFloat32) {
      float* p = static_cast<float*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] = p[i] * size_ + static_cast<float>(sum_offset);
    } else if (dtype == DataType::kInt32) {
      int32_t* p = static_cast<int32_t*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] = p[i] * size_ + sum_offset;
    }
  }

  void allgatherv(const void* in, void* out, const std::vector<size_t>& counts,
                  DataType dtype) override {
    Call c;
    c.what = "allgatherv";
    c.in = in;
    c.buf = out;
    c.dtype = dtype;
    c.counts = counts;
    calls.push_back(c);
    const size_t elem = dataTypeSize(dtype);
    char* o = static_cast<char*>(out);
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) {
        std::memcpy(o, in, counts[r] * elem);
      } else {
        std::memset(o, 0x5a, counts[r] * elem);
      }
      o += counts[r] * elem;
    }
  }

  void broadcast(void* buf, size_t count, DataType dtype, int root) override {
    Call c;
    c.what = "broadcast";
    c.buf = buf;
    c.count = count;
    c.dtype = dtype;
    c.root = root;
    calls.push_back(c);
    if (root != rank_) std::memset(buf, root, count * dataTypeSize(dtype));
  }

  void barrier() override {
    Call c;
    c.what = "barrier";
    calls.push_back(c);
  }

  // Our own chunk comes back as sent; a chunk from rank r is filled with byte r.
  void alltoallv(const void* in, const std::vector<int64_t>& send_counts, void* out,
                 const std::vector<int64_t>& recv_counts, DataType dtype) override {
    Call c;
    c.what = "alltoallv";
    c.dtype = dtype;
    for (int64_t n : send_counts) c.counts.push_back(static_cast<size_t>(n));
    recv_counts_ = recv_counts;
    calls.push_back(c);
    const size_t elem = dataTypeSize(dtype);
    const char* src = static_cast<const char*>(in);
    char* o = static_cast<char*>(out);
    for (size_t r = 0; r < recv_counts.size(); ++r) {
      if (static_cast<int>(r) == rank_) {
        int64_t before = 0;
        for (size_t q = 0; q < r; ++q) before += send_counts[q];
        std::memcpy(o, src + before * elem, recv_counts[r] * elem);
      } else {
        std::memset(o, static_cast<int>(r), recv_counts[r] * elem);
      }
      o += recv_counts[r] * elem;
    }
  }
  std::vector<int64_t> recv_counts_;

  std::vector<Call> calls;
  int32_t sum_offset = 0;
  bool fail = false;

 private:
  int size_;
  int rank_;
};

// An entry over caller-owned buffers.
Entry entry(const std::string& name, OpType type, DataType dtype, std::vector<int64_t> shape,
            const void* input, void* output) {
  Entry e;
  e.request.name = name;
  e.request.type = type;
  e.request.dtype = dtype;
  e.request.reduce_op = ReduceOp::kSum;  // Request's default is Average
  e.request.shape = std::move(shape);
  e.input = input;
  e.output = output;
  e.work = std::make_shared<Work>();
  return e;
}

Response execute(OpType type, const std::vector<Entry*>& entries) {
  Response r;
  r.type = type;
  for (Entry* e : entries) {
    r.names.push_back(e->request.name);
    r.cache_ids.push_back(-1);
  }
  return r;
}

}  // namespace

TEST(size1_allreduce_applies_prescale_and_postscale) {
  Executor ex(nullptr, 1);
  std::vector<float> in = {1, 2, -3};
  std::vector<float> out(3, 0);
  Entry e = entry("x", OpType::kAllreduce, DataType::kFloat32, {3}, in.data(), out.data());
  e.request.prescale = 2.0;
  e.request.postscale = 3.0;
  ex.execute(execute(OpType::kAllreduce, {&e}), {&e});
  CHECK_EQ(out, (std::vector<float>{6, 12, -18}));
  CHECK_EQ(in, (std::vector<float>{1, 2, -3}));  // input untouched

  // In place: output aliases input.
  std::vector<float> io = {1, 2, -3};
  Entry f = entry("y", OpType::kAllreduce, DataType::kFloat32, {3}, io.data(), io.data());
  f.request.postscale = 0.5;
  ex.execute(execute(OpType::kAllreduce, {&f}), {&f});
  CHECK_EQ(io, (std::vector<float>{0.5f, 1, -1.5f}));
}

TEST(size1_average_divides_by_one) {
  Executor ex(nullptr, 1);
  std::vector<int32_t> in = {-7, 7, 1};
  std::vector<int32_t> out(3, 0);
  Entry e = entry("i", OpType::kAllreduce, DataType::kInt32, {3}, in.data(), out.data());
  e.request.reduce_op = ReduceOp::kAverage;
  ex.execute(execute(OpType::kAllreduce, {&e}), {&e});
  CHECK_EQ(out, in);
  std::vector<float> fin = {0.1f, -2.5f};
  std::vector<float> fout(2, 0);
  Entry f = entry("f", OpType::kAllreduce, DataType::kFloat32, {2}, fin.data(), fout.data());
  f.request.reduce_op = ReduceOp::kAverage;
  f.request.prescale = 4.0;
  f.request.postscale = 0.25;
  ex.execute(execute(OpType::kAllreduce, {&f}), {&f});
  CHECK_EQ(fout, fin);
}

TEST(size1_fused_allreduce_copies_each_entry_in_and_out) {
  Executor ex(nullptr, 1);
  std::vector<double> a = {1, 2}, b = {3, 4, 5}, c = {99}, d = {6};  // c has shape [0]
  std::vector<double> oa(2), ob(3), oc(1);
  Entry ea = entry("a", OpType::kAllreduce, DataType::kFloat64, {2}, a.data(), oa.data());
  Entry eb = entry("b", OpType::kAllreduce, DataType::kFloat64, {3, 1}, b.data(), ob.data());
  Entry ec = entry("c", OpType::kAllreduce, DataType::kFloat64, {0}, c.data(), oc.data());
  Entry ed = entry("d", OpType::kAllreduce, DataType::kFloat64, {}, d.data(),
                   d.data());  // in place scalar
  std::vector<Entry*> all = {&ea, &eb, &ec, &ed};
  for (Entry* e : all) {
    e->request.prescale = 2.0;
    e->request.postscale = 0.25;
  }
  ex.execute(execute(OpType::kAllreduce, all), all);
  CHECK_EQ(oa, (std::vector<double>{0.5, 1}));
  CHECK_EQ(ob, (std::vector<double>{1.5, 2, 2.5}));
  CHECK_EQ(d, (std::vector<double>{3}));
  CHECK_EQ(oc, (std::vector<double>{0}));  // zero elements: nothing written
  CHECK_EQ(a, (std::vector<double>{1, 2}));
  CHECK_EQ(b, (std::vector<double>{3, 4, 5}));
}

TEST(size1_allgather_allocates_total_rows_and_copies) {
  Executor ex(nullptr, 1);
  std::vector<int16_t> in = {1, 2, 3, 4, 5, 6};
  std::vector<int16_t> out;
  int64_t asked = -1;
  Entry e = entry("g", OpType::kAllgather, DataType::kInt16, {3, 2}, in.data(), nullptr);
  e.allocate = [&](int64_t rows) {
    asked = rows;
    out.assign(static_cast<size_t>(rows * 2), 0);
    return static_cast<void*>(out.data());
  };
  Response r = execute(OpType::kAllgather, {&e});
  r.rank_first_dims = {{3}};
  ex.execute(r, {&e});
  CHECK_EQ(asked, 3);
  CHECK_EQ(out, in);
  CHECK_EQ(e.work->rankRows(), (std::vector<int64_t>{3}));
}

TEST(size1_broadcast_copies_input_to_output) {
  Executor ex(nullptr, 1);
  std::vector<uint8_t> in = {9, 8, 7};
  std::vector<uint8_t> out(3, 0);
  Entry e = entry("b", OpType::kBroadcast, DataType::kUInt8, {3}, in.data(), out.data());
  ex.execute(execute(OpType::kBroadcast, {&e}), {&e});
  CHECK_EQ(out, in);
  // Barrier with no backend is a no-op.
  Entry bar = entry("bar", OpType::kBarrier, DataType::kFloat32, {}, nullptr, nullptr);
  ex.execute(execute(OpType::kBarrier, {&bar}), {&bar});
}

TEST(fused_allreduce_is_one_backend_call_over_the_total) {
  RecordingBackend backend(4, 0);
  Executor ex(&backend, 4);
  std::vector<float> a = {1, 2}, b = {3, 4, 5}, c = {-6};
  std::vector<float> oa(2), ob(3), oc(1);
  Entry ea = entry("a", OpType::kAllreduce, DataType::kFloat32, {2}, a.data(), oa.data());
  Entry eb = entry("b", OpType::kAllreduce, DataType::kFloat32, {3}, b.data(), ob.data());
  Entry ec = entry("c", OpType::kAllreduce, DataType::kFloat32, {1}, c.data(), oc.data());
  std::vector<Entry*> all = {&ea, &eb, &ec};
  for (Entry* e : all) {
    e->request.prescale = 2.0;
    e->request.postscale = 0.5;
  }
  ex.execute(execute(OpType::kAllreduce, all), all);
  if (CHECK_EQ(backend.calls.size(), 1u)) {
    const Call& call = backend.calls[0];
    CHECK_EQ(call.what, "allreduce");
    CHECK_EQ(call.count, 6u);
    CHECK_EQ(call.dtype, DataType::kFloat32);
    CHECK_EQ(call.op, ReduceOp::kSum);
    // The fused buffer is neither entry's output.
    CHECK(call.buf != oa.data() && call.buf != ob.data() && call.buf != oc.data());
  }
  // x * 2 (prescale), summed over 4 identical ranks, * 0.5 (postscale).
  CHECK_EQ(oa, (std::vector<float>{4, 8}));
  CHECK_EQ(ob, (std::vector<float>{12, 16, 20}));
  CHECK_EQ(oc, (std::vector<float>{-24}));
}

TEST(average_goes_to_the_backend_as_sum_then_divides) {
  RecordingBackend backend(4, 0);
  Executor ex(&backend, 4);
  std::vector<float> a = {1, 2}, b = {-3};
  std::vector<float> oa(2), ob(1);
  Entry ea = entry("a", OpType::kAllreduce, DataType::kFloat32, {2}, a.data(), oa.data());
  Entry eb = entry("b", OpType::kAllreduce, DataType::kFloat32, {1}, b.data(), ob.data());
  std::vector<Entry*> all = {&ea, &eb};
  for (Entry* e : all) e->request.reduce_op = ReduceOp::kAverage;
  ex.execute(execute(OpType::kAllreduce, all), all);
  if (CHECK_EQ(backend.calls.size(), 1u)) {
    CHECK_EQ(backend.calls[0].op, ReduceOp::kSum);
    CHECK_EQ(backend.calls[0].count, 3u);
  }
  CHECK_EQ(oa, a);  // the mean of four copies
  CHECK_EQ(ob, b);
}

TEST(integer_average_truncates_after_the_sum) {
  RecordingBackend backend(4, 0);
  backend.sum_offset = -1;  // the ranks' sum is 4x - 1: the mean is x - 0.25
  Executor ex(&backend, 4);
  std::vector<int32_t> in = {-3, 0, 5};
  std::vector<int32_t> out(3);
  Entry e = entry("i", OpType::kAllreduce, DataType::kInt32, {3}, in.data(), out.data());
  e.request.reduce_op = ReduceOp::kAverage;
  ex.execute(execute(OpType::kAllreduce, {&e}), {&e});
  // Horovod: trunc((4x - 1) * 0.25) = trunc(x - 0.25): -3.25 -> -3, -0.25 -> 0, 4.75 -> 4.
  CHECK_EQ(out, (std::vector<int32_t>{-3, 0, 4}));
}

TEST(single_allreduce_reduces_in_its_output_with_its_op) {
  RecordingBackend backend(2, 0);
  Executor ex(&backend, 2);
  std::vector<float> in = {3, -1};
  std::vector<float> out(2);
  Entry e = entry("m", OpType::kAllreduce, DataType::kFloat32, {2}, in.data(), out.data());
  e.request.reduce_op = ReduceOp::kMax;
  ex.execute(execute(OpType::kAllreduce, {&e}), {&e});
  if (CHECK_EQ(backend.calls.size(), 1u)) {
    CHECK_EQ(backend.calls[0].op, ReduceOp::kMax);
    CHECK_EQ(backend.calls[0].count, 2u);
    CHECK(backend.calls[0].buf == out.data());
  }
  CHECK_EQ(out, in);
}

TEST(empty_allreduce_makes_no_backend_call) {
  RecordingBackend backend(2, 0);
  Executor ex(&backend, 2);
  Entry e = entry("e", OpType::kAllreduce, DataType::kFloat32, {0, 3}, nullptr, nullptr);
  ex.execute(execute(OpType::kAllreduce, {&e}), {&e});
  CHECK(backend.calls.empty());
}

TEST(fusion_buffer_is_reused_across_calls_of_different_sizes) {
  RecordingBackend backend(2, 0);
  Executor ex(&backend, 2);
  for (int n : {5, 2, 9, 1}) {
    std::vector<float> a(n), b(n + 1);
    for (int i = 0; i < n; ++i) a[i] = static_cast<float>(i + n);
    for (int i = 0; i <= n; ++i) b[i] = static_cast<float>(-i);
    std::vector<float> oa(n), ob(n + 1);
    Entry ea = entry("a", OpType::kAllreduce, DataType::kFloat32, {n}, a.data(), oa.data());
    Entry eb = entry("b", OpType::kAllreduce, DataType::kFloat32, {n + 1}, b.data(), ob.data());
    ex.execute(execute(OpType::kAllreduce, {&ea, &eb}), {&ea, &eb});
    for (int i = 0; i < n; ++i) CHECK_EQ(oa[i], 2 * a[i]);
    for (int i = 0; i <= n; ++i) CHECK_EQ(ob[i], 2 * b[i]);
  }
  CHECK_EQ(backend.calls.size(), 4u);
}

TEST(allgather_passes_counts_per_rank_and_the_allocated_buffer) {
  RecordingBackend backend(3, 1);  // this is rank 1
  Executor ex(&backend, 3);
  std::vector<int32_t> in = {7, 8, 9, 10};  // 1 row of 4
  std::vector<int32_t> out;
  int64_t asked = -1;
  Entry e = entry("g", OpType::kAllgather, DataType::kInt32, {1, 4}, in.data(), nullptr);
  e.allocate = [&](int64_t rows) {
    asked = rows;
    out.assign(static_cast<size_t>(rows * 4), -1);
    return static_cast<void*>(out.data());
  };
  Response r = execute(OpType::kAllgather, {&e});
  r.rank_first_dims = {{2, 1, 3}};
  ex.execute(r, {&e});
  CHECK_EQ(asked, 6);
  CHECK_EQ(e.work->rankRows(), (std::vector<int64_t>{2, 1, 3}));
  if (CHECK_EQ(backend.calls.size(), 1u)) {
    const Call& c = backend.calls[0];
    CHECK_EQ(c.what, "allgatherv");
    CHECK_EQ(c.counts, (std::vector<size_t>{8, 4, 12}));
    CHECK(c.in == in.data());
    CHECK(c.buf == out.data());
    CHECK_EQ(c.dtype, DataType::kInt32);
  }
  // Rank 1's rows sit after rank 0's two rows.
  CHECK_EQ(std::vector<int32_t>(out.begin() + 8, out.begin() + 12), in);
}

TEST(allgather_of_no_rows_allocates_and_skips_the_backend) {
  RecordingBackend backend(2, 0);
  Executor ex(&backend, 2);
  int64_t asked = -1;
  char dummy = 0;
  Entry e = entry("g0", OpType::kAllgather, DataType::kFloat32, {0, 4}, nullptr, nullptr);
  e.allocate = [&](int64_t rows) {
    asked = rows;
    return static_cast<void*>(&dummy);
  };
  Response r = execute(OpType::kAllgather, {&e});
  r.rank_first_dims = {{0, 0}};
  ex.execute(r, {&e});
  CHECK_EQ(asked, 0);
  CHECK(backend.calls.empty());
}

// A device's Memory as the executor sees it: host memory underneath, every
// call written to a log, so the order of waits, copies and scaling shows.
class LoggingMemory : public HostMemory {
 public:
  void copy(void* dst, const void* src, size_t bytes) override {
    log.push_back("copy");
    HostMemory::copy(dst, src, bytes);
  }
  void scale(void* buf, size_t count, DataType dtype, double factor) override {
    if (factor != 1.0) log.push_back("scale");
    HostMemory::scale(buf, count, dtype, factor);
  }
  void waitFor(const DeviceEvent& ready) override {
    log.push_back("wait");
    HostMemory::waitFor(ready);
  }
  std::vector<std::string> log;
};

TEST(broadcast_copies_then_broadcasts_the_output_from_root) {
  RecordingBackend backend(2, 0);
  LoggingMemory memory;
  Executor ex(&backend, 2, 0, {}, &memory);
  std::vector<uint8_t> in = {1, 2, 3};
  std::vector<uint8_t> out(3, 0);
  Entry e = entry("b", OpType::kBroadcast, DataType::kUInt8, {3}, in.data(), out.data());
  e.request.root_rank = 1;
  ex.execute(execute(OpType::kBroadcast, {&e}), {&e});
  if (CHECK_EQ(backend.calls.size(), 1u)) {
    CHECK_EQ(backend.calls[0].what, "broadcast");
    CHECK(backend.calls[0].buf == out.data());
    CHECK_EQ(backend.calls[0].count, 3u);
    CHECK_EQ(backend.calls[0].root, 1);
  }
  CHECK_EQ(out, (std::vector<uint8_t>{1, 1, 1}));  // root 1's bytes
  CHECK_EQ(in, (std::vector<uint8_t>{1, 2, 3}));
  // Not the root: the broadcast overwrites the output, so nothing copies into it first.
  CHECK(memory.log.empty());

  // On the root the data is its own input.
  RecordingBackend root_backend(2, 1);
  Executor root_ex(&root_backend, 2, 1);
  std::vector<uint8_t> root_out(3, 0);
  Entry f = entry("b", OpType::kBroadcast, DataType::kUInt8, {3}, in.data(), root_out.data());
  f.request.root_rank = 1;
  root_ex.execute(execute(OpType::kBroadcast, {&f}), {&f});
  CHECK_EQ(root_out, in);
}

// A direct backend's out-of-place broadcast: it gets the input and the
// output as they are, and the executor copies nothing itself.
class DirectBroadcastBackend : public RecordingBackend {
 public:
  using RecordingBackend::RecordingBackend;
  bool broadcastInto(const void* in, void* out, size_t count, DataType dtype,
                     int root) override {
    broadcast(out, count, dtype, root);  // records the call and fills `out`
    calls.back().what = "broadcastInto";
    calls.back().in = in;
    return true;
  }
};

TEST(out_of_place_broadcast_goes_to_a_direct_backend_whole) {
  DirectBroadcastBackend backend(3, 1);
  LoggingMemory memory;
  Executor ex(&backend, 3, 1, {}, &memory);
  std::vector<uint8_t> in = {1, 2, 3};
  std::vector<uint8_t> out(3, 0);
  Entry e = entry("b", OpType::kBroadcast, DataType::kUInt8, {3}, in.data(), out.data());
  e.request.root_rank = 2;
  ex.execute(execute(OpType::kBroadcast, {&e}), {&e});
  if (CHECK_EQ(backend.calls.size(), 1u)) {
    CHECK_EQ(backend.calls[0].what, "broadcastInto");
    CHECK(backend.calls[0].in == in.data());
    CHECK(backend.calls[0].buf == out.data());
    CHECK_EQ(backend.calls[0].count, 3u);
    CHECK_EQ(backend.calls[0].root, 2);
  }
  CHECK_EQ(out, (std::vector<uint8_t>{2, 2, 2}));
  CHECK(memory.log.empty());

  // In place, the plain broadcast as before.
  DirectBroadcastBackend same(3, 1);
  Executor in_place(&same, 3, 1);
  Entry f = entry("b", OpType::kBroadcast, DataType::kUInt8, {3}, out.data(), out.data());
  f.request.root_rank = 0;
  in_place.execute(execute(OpType::kBroadcast, {&f}), {&f});
  if (CHECK_EQ(same.calls.size(), 1u)) CHECK_EQ(same.calls[0].what, "broadcast");
}

TEST(barrier_calls_the_backend_once) {
  RecordingBackend backend(3, 0);
  Executor ex(&backend, 3);
  Entry e = entry("bar", OpType::kBarrier, DataType::kFloat32, {}, nullptr, nullptr);
  ex.execute(execute(OpType::kBarrier, {&e}), {&e});
  if (CHECK_EQ(backend.calls.size(), 1u)) CHECK_EQ(backend.calls[0].what, "barrier");
}

TEST(backend_failure_propagates) {
  RecordingBackend backend(2, 0);
  backend.fail = true;
  Executor ex(&backend, 2);
  std::vector<float> in = {1}, out(1);
  Entry e = entry("x", OpType::kAllreduce, DataType::kFloat32, {1}, in.data(), out.data());
  CHECK_THROWS(ex.execute(execute(OpType::kAllreduce, {&e}), {&e}), std::runtime_error);
}


TEST(alltoall_sends_this_ranks_row_of_splits_and_receives_its_column) {
  // 2 ranks, this is rank 1. Rank 0 sends [1, 2] rows, rank 1 sends [3, 1] rows; rows of 2 bytes.
  RecordingBackend backend(2, 1);
  Executor ex(&backend, 2, 1);
  std::vector<uint8_t> in = {10, 11, 12, 13, 14, 15, 16, 17};  // 4 rows: 3 to rank 0, 1 to itself
  std::vector<uint8_t> out;
  Entry e;
  e.request.type = OpType::kAlltoall;
  e.request.dtype = DataType::kUInt8;
  e.request.shape = {4, 2};
  e.request.send_splits = {3, 1};
  e.input = in.data();
  e.work = std::make_shared<Work>();
  e.allocate = [&](int64_t rows) {
    out.assign(static_cast<size_t>(rows) * 2, 0);
    return static_cast<void*>(out.data());
  };
  Response r;
  r.type = OpType::kAlltoall;
  r.names = {"a2a"};
  r.alltoall_splits = {{1, 2, 3, 1}};
  std::vector<Entry*> entries = {&e};
  ex.execute(r, entries);
  CHECK_EQ(backend.calls.size(), 1u);
  CHECK_EQ(backend.calls[0].counts, (std::vector<size_t>{6, 2}));
  CHECK_EQ(backend.recv_counts_, (std::vector<int64_t>{4, 2}));  // 2 rows from 0, 1 from itself
  CHECK_EQ(e.work->rankRows(), (std::vector<int64_t>{2, 1}));
  CHECK_EQ(out, (std::vector<uint8_t>{0, 0, 0, 0, 16, 17}));
}

int main() { return check::runAll(); }

namespace {


class CountingEvent : public DeviceEvent {
 public:
  void synchronize() const override { ++waits; }
  mutable int waits = 0;
};

}  // namespace

TEST(device_memory_waits_for_each_input_before_any_copy) {
  LoggingMemory memory;
  RecordingBackend backend(2, 0);
  Executor ex(&backend, 2, 0, {}, &memory);
  std::vector<float> a = {1, 2}, b = {3};
  std::vector<float> out_a(2), out_b(1);
  Entry ea = entry("a", OpType::kAllreduce, DataType::kFloat32, {2}, a.data(), out_a.data());
  Entry eb = entry("b", OpType::kAllreduce, DataType::kFloat32, {1}, b.data(), out_b.data());
  auto ready_a = std::make_shared<CountingEvent>();
  auto ready_b = std::make_shared<CountingEvent>();
  ea.ready = ready_a;
  eb.ready = ready_b;
  ea.request.prescale = eb.request.prescale = 2.0;
  ex.execute(execute(OpType::kAllreduce, {&ea, &eb}), {&ea, &eb});
  // Both waits first, then packing, scaling, the collective, unpacking.
  CHECK_EQ(memory.log, (std::vector<std::string>{"wait", "wait", "copy", "copy", "scale",
                                                 "copy", "copy"}));
  CHECK_EQ(ready_a->waits, 1);
  CHECK_EQ(ready_b->waits, 1);
  CHECK_EQ(backend.calls.size(), size_t{1});
  CHECK_EQ(out_a, (std::vector<float>{4, 8}));  // 2x prescale, then 2 ranks' Sum
  CHECK_EQ(out_b, (std::vector<float>{12}));
}

TEST(device_memory_serves_the_size1_allgather_copy) {
  LoggingMemory memory;
  Executor ex(nullptr, 1, 0, {}, &memory);
  std::vector<int32_t> in = {5, 6};
  std::vector<int32_t> out(2, 0);
  Entry e = entry("g", OpType::kAllgather, DataType::kInt32, {2}, in.data(), nullptr);
  e.allocate = [&out](int64_t rows) {
    CHECK_EQ(rows, int64_t{2});
    return static_cast<void*>(out.data());
  };
  Response r = execute(OpType::kAllgather, {&e});
  r.rank_first_dims = {{2}};
  ex.execute(r, {&e});
  CHECK_EQ(out, in);
  CHECK_EQ(memory.log, (std::vector<std::string>{"copy"}));
}
