// Checks of a data plane (core/backend.h) with its ranks as threads of one
// process, shared by test_shm_backend, test_gloo_backend and
// test_hierarchical_backend. Each check runs one collective on every rank at
// once, one thread per rank, with inputs that every dtype holds exactly, and
// compares every rank's output with a reference computed here, element by
// element and bit for bit. A thread only runs its rank's calls and keeps what
// it got; the checks (check.h) run on the test's thread after every rank is
// joined.
//
// Sizes: callers pass small counts and large ones; from 256 KiB an op of the
// shared-memory plane chooses how to write its segment (core/slot_writes.h),
// and from 1 MiB its outputs are written with streaming stores
// (core/stream_copy.h).
#pragma once

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "core/backend.h"
#include "core/reduce.h"
#include "core/types.h"

namespace hvd_test {

using hvd::Backend;
using hvd::DataType;
using hvd::ReduceOp;

// The tests' op and start timeouts (EngineConfig): large enough that a
// failure is an exception, not a hang, yet far beyond any op here, even
// under a sanitizer on a loaded machine.
constexpr std::chrono::milliseconds kOpTimeout{60000};

// Runs fn(rank) on one thread per rank and joins them all; returns each
// rank's exception message ("" where none was thrown).
inline std::vector<std::string> onRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        if (errors[r].empty()) errors[r] = "exception with no message";
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// Fails the test for every rank that threw; true when none did.
inline bool noErrors(const std::vector<std::string>& errors, const std::string& what) {
  bool ok = true;
  for (size_t r = 0; r < errors.size(); ++r) {
    if (errors[r].empty()) continue;
    check::fail(__FILE__, __LINE__, what + ": rank " + std::to_string(r) + " threw: " + errors[r]);
    ok = false;
  }
  return ok;
}

// Makes one backend per rank, each on its own thread (a factory that meets
// its peers through a store must run on every rank at once).
inline std::vector<std::unique_ptr<Backend>> makeRanks(
    int n, const std::function<std::unique_ptr<Backend>(int)>& make) {
  std::vector<std::unique_ptr<Backend>> ranks(n);
  const auto errors = onRanks(n, [&](int r) { ranks[r] = make(r); });
  if (!noErrors(errors, "making the backends")) return {};
  for (int r = 0; r < n; ++r) {
    if (!ranks[r]) {
      check::fail(__FILE__, __LINE__, "rank " + std::to_string(r) + ": the factory made no backend");
      return {};
    }
  }
  return ranks;
}

inline std::vector<Backend*> pointers(const std::vector<std::unique_ptr<Backend>>& ranks) {
  std::vector<Backend*> out;
  for (const auto& b : ranks) out.push_back(b.get());
  return out;
}

// ------------------------------------------------------------- values

inline const char* dtypeName(DataType t) { return dataTypeName(t); }  // core/types.h

inline const char* opName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProduct: return "product";
    default: return "?";
  }
}

inline bool isFloat(DataType t) {
  return t == DataType::kFloat16 || t == DataType::kBFloat16 || t == DataType::kFloat32 ||
         t == DataType::kFloat64;
}

// Writes v (an integer or a half-integer every dtype here holds exactly) as
// element i of buf.
inline void store(DataType t, void* buf, size_t i, double v) {
  char* p = static_cast<char*>(buf) + i * hvd::dataTypeSize(t);
  auto put = [p](auto x) { std::memcpy(p, &x, sizeof(x)); };
  switch (t) {
    case DataType::kUInt8: return put(static_cast<uint8_t>(v));
    case DataType::kInt8: return put(static_cast<int8_t>(v));
    case DataType::kInt16: return put(static_cast<int16_t>(v));
    case DataType::kInt32: return put(static_cast<int32_t>(v));
    case DataType::kInt64: return put(static_cast<int64_t>(v));
    case DataType::kFloat16: return put(hvd::floatToHalf(static_cast<float>(v)));
    case DataType::kBFloat16: return put(hvd::floatToBfloat16(static_cast<float>(v)));
    case DataType::kFloat32: return put(static_cast<float>(v));
    case DataType::kFloat64: return put(v);
    case DataType::kBool: return put(static_cast<uint8_t>(v != 0));
  }
}

inline double load(DataType t, const void* buf, size_t i) {
  const char* p = static_cast<const char*>(buf) + i * hvd::dataTypeSize(t);
  auto get = [p](auto x) {
    std::memcpy(&x, p, sizeof(x));
    return x;
  };
  switch (t) {
    case DataType::kUInt8: return get(uint8_t{});
    case DataType::kInt8: return get(int8_t{});
    case DataType::kInt16: return get(int16_t{});
    case DataType::kInt32: return get(int32_t{});
    case DataType::kInt64: return static_cast<double>(get(int64_t{}));
    case DataType::kFloat16: return hvd::halfToFloat(get(uint16_t{}));
    case DataType::kBFloat16: return hvd::bfloat16ToFloat(get(uint16_t{}));
    case DataType::kFloat32: return get(float{});
    case DataType::kFloat64: return get(double{});
    case DataType::kBool: return get(uint8_t{});
  }
  return 0;
}

// Element i of rank r's input to a reduction: small integers (non-zero for
// a product, so that it stays informative; non-negative for uint8), so that
// any sum, product or scaling below is exact in every dtype.
inline double inputValue(DataType t, ReduceOp op, int r, size_t i) {
  const size_t k = i * 7 + static_cast<size_t>(r) * 13;
  if (op == ReduceOp::kProduct) {
    static const double kFactors[4] = {1, 2, -1, -2};
    return t == DataType::kUInt8 ? 1 + k % 2 : kFactors[k % 4];
  }
  if (t == DataType::kUInt8) return static_cast<double>(k % 11);
  return static_cast<double>(k % 11) - 5;
}

// The scale factors a check with scaling uses: floats halve each input
// (exact) and multiply the result by 4; integers triple each input and halve
// the result, which truncates toward zero (scaleBuffer's rule, reduce.h).
inline double prescaleFor(DataType t) { return isFloat(t) ? 0.5 : 3.0; }
inline double postscaleFor(DataType t) { return isFloat(t) ? 4.0 : 0.5; }

// v * factor as scaleBuffer computes it for dtype t, for the values above.
inline double scaled(DataType t, double v, double factor) {
  if (factor == 1.0) return v;
  return isFloat(t) ? v * factor : std::trunc(v * factor);
}

inline double combine(ReduceOp op, double a, double b) {
  switch (op) {
    case ReduceOp::kMin: return a < b ? a : b;
    case ReduceOp::kMax: return a > b ? a : b;
    case ReduceOp::kProduct: return a * b;
    default: return a + b;
  }
}

// Element i of the reduction over n ranks, in rank order, scaled.
inline double reduced(DataType t, ReduceOp op, int n, size_t i, double prescale, double postscale) {
  double acc = scaled(t, inputValue(t, op, 0, i), prescale);
  for (int r = 1; r < n; ++r) acc = combine(op, acc, scaled(t, inputValue(t, op, r, i), prescale));
  return scaled(t, acc, postscale);
}

// The byte k of element i of rank r's input to a move (gather, broadcast,
// alltoall): different for every rank, element and byte, so a block in the
// wrong place or shifted by one element shows.
inline uint8_t patternByte(int r, size_t i, size_t k) {
  return static_cast<uint8_t>(r * 89 + i * 7 + k * 3 + 1 + (i >> 8));
}

inline std::vector<char> pattern(DataType t, int r, size_t first, size_t count) {
  const size_t w = hvd::dataTypeSize(t);
  std::vector<char> out(count * w);
  for (size_t i = 0; i < count; ++i)
    for (size_t k = 0; k < w; ++k) out[i * w + k] = static_cast<char>(patternByte(r, first + i, k));
  return out;
}

// Fails the test at the first element where got and want differ (bytes).
inline bool sameBytes(const std::string& what, const char* got, const char* want, size_t bytes,
                      size_t elem) {
  for (size_t b = 0; b < bytes; ++b) {
    if (got[b] == want[b]) continue;
    check::fail(__FILE__, __LINE__,
                what + ": element " + std::to_string(b / elem) + " byte " +
                    std::to_string(b % elem) + " is " + std::to_string(uint8_t(got[b])) +
                    ", want " + std::to_string(uint8_t(want[b])));
    return false;
  }
  return true;
}

inline std::string label(const char* op, DataType t, size_t count, int n) {
  return std::string(op) + " " + dtypeName(t) + " x" + std::to_string(count) + " on " +
         std::to_string(n) + " ranks";
}

// Elements of t in 300 KiB and a little more: past the size from which the
// shared-memory plane chooses how to write its segment (256 KiB), and not a
// multiple of any piece or line.
inline size_t largeCount(DataType t) { return (300u << 10) / hvd::dataTypeSize(t) + 3; }

// Every dtype a reduction takes here (bool is only ever moved).
inline const std::vector<DataType>& reduceDtypes() {
  static const std::vector<DataType> all = {DataType::kUInt8,   DataType::kInt8,
                                            DataType::kInt32,   DataType::kInt64,
                                            DataType::kFloat16, DataType::kBFloat16,
                                            DataType::kFloat32, DataType::kFloat64};
  return all;
}

// -------------------------------------------------------------- checks

// allreduce(buf) in place, compared with the sum, min, max or product over
// the ranks.
inline void checkAllreduce(const std::vector<Backend*>& ranks, DataType t, ReduceOp op,
                           size_t count) {
  const int n = static_cast<int>(ranks.size());
  const std::string what = label("allreduce", t, count, n) + " " + opName(op);
  const size_t w = hvd::dataTypeSize(t);
  std::vector<std::vector<char>> bufs(n, std::vector<char>(count * w));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) store(t, bufs[r].data(), i, inputValue(t, op, r, i));
  if (!noErrors(onRanks(n, [&](int r) { ranks[r]->allreduce(bufs[r].data(), count, t, op); }),
                what))
    return;
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) {
      const double got = load(t, bufs[r].data(), i);
      const double want = reduced(t, op, n, i, 1.0, 1.0);
      if (got != want) {
        check::fail(__FILE__, __LINE__,
                    what + ": rank " + std::to_string(r) + " element " + std::to_string(i) +
                        " is " + std::to_string(got) + ", want " + std::to_string(want));
        break;
      }
    }
  }
}

// allreduce() of every reduce dtype, from one element to large, as a sum;
// min, max and product over a few.
inline void checkAllreduceEveryDtype(const std::vector<Backend*>& ranks) {
  for (DataType t : reduceDtypes()) {
    for (size_t count : {size_t{1}, size_t{13}, size_t{1000}, largeCount(t)})
      checkAllreduce(ranks, t, ReduceOp::kSum, count);
  }
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
    for (DataType t : {DataType::kInt32, DataType::kFloat16, DataType::kFloat64})
      checkAllreduce(ranks, t, op, 1001);
  }
}

// allreduceSpans over tensors of `counts` elements (one array of the fused
// op), every even-numbered tensor in place and every odd one out of place,
// scaled by prescale and postscale.
inline void checkAllreduceSpans(const std::vector<Backend*>& ranks, DataType t, ReduceOp op,
                                const std::vector<size_t>& counts, double prescale,
                                double postscale) {
  const int n = static_cast<int>(ranks.size());
  size_t total = 0;
  for (size_t c : counts) total += c;
  const std::string what = label("allreduceSpans", t, total, n) + " " + opName(op) + " in " +
                           std::to_string(counts.size()) + " tensors, scaled " +
                           std::to_string(prescale) + "/" + std::to_string(postscale);
  const size_t w = hvd::dataTypeSize(t);
  // Rank r: inputs[r][k], outputs[r][k] (== inputs for even k).
  std::vector<std::vector<std::vector<char>>> inputs(n), outputs(n);
  for (int r = 0; r < n; ++r) {
    size_t at = 0;
    for (size_t k = 0; k < counts.size(); ++k) {
      std::vector<char> in(counts[k] * w);
      for (size_t i = 0; i < counts[k]; ++i) store(t, in.data(), i, inputValue(t, op, r, at + i));
      inputs[r].push_back(in);
      // Out of place: the output starts as garbage that must be overwritten.
      outputs[r].push_back(std::vector<char>(counts[k] * w, k % 2 ? '\x5a' : '\0'));
      at += counts[k];
    }
  }
  std::vector<int> offered(n, 0);  // not vector<bool>: ranks write it at once
  const auto errors = onRanks(n, [&](int r) {
    std::vector<Backend::Span> spans;
    for (size_t k = 0; k < counts.size(); ++k) {
      void* in = inputs[r][k].data();
      spans.push_back({in, k % 2 ? outputs[r][k].data() : in, counts[k]});
    }
    offered[r] = ranks[r]->allreduceSpans(spans, t, op, prescale, postscale);
  });
  if (!noErrors(errors, what)) return;
  for (int r = 0; r < n; ++r) {
    if (!CHECK(offered[r])) return;
    size_t at = 0;
    for (size_t k = 0; k < counts.size(); ++k) {
      const std::vector<char>& out = k % 2 ? outputs[r][k] : inputs[r][k];
      for (size_t i = 0; i < counts[k]; ++i) {
        const double got = load(t, out.data(), i);
        const double want = reduced(t, op, n, at + i, prescale, postscale);
        if (got != want) {
          check::fail(__FILE__, __LINE__,
                      what + ": rank " + std::to_string(r) + " tensor " + std::to_string(k) +
                          " element " + std::to_string(i) + " is " + std::to_string(got) +
                          ", want " + std::to_string(want));
          break;
        }
      }
      if (k % 2) {  // an out-of-place input is left as it was
        std::vector<char> in(counts[k] * w);
        for (size_t i = 0; i < counts[k]; ++i) store(t, in.data(), i, inputValue(t, op, r, at + i));
        sameBytes(what + ": rank " + std::to_string(r) + " input " + std::to_string(k),
                  inputs[r][k].data(), in.data(), in.size(), w);
      }
      at += counts[k];
    }
  }
}

// reducescatter: every rank's input holds counts[b] elements for each block
// b; rank r receives block r reduced and scaled.
inline void checkReducescatter(const std::vector<Backend*>& ranks, DataType t, ReduceOp op,
                               const std::vector<size_t>& counts, double prescale,
                               double postscale) {
  const int n = static_cast<int>(ranks.size());
  std::vector<size_t> first(n + 1, 0);
  for (int r = 0; r < n; ++r) first[r + 1] = first[r] + counts[r];
  const std::string what = label("reducescatter", t, first[n], n) + " " + opName(op) +
                           ", scaled " + std::to_string(prescale) + "/" +
                           std::to_string(postscale) + ", block of rank 0 x" +
                           std::to_string(counts[0]);
  const size_t w = hvd::dataTypeSize(t);
  std::vector<std::vector<char>> in(n, std::vector<char>(first[n] * w));
  std::vector<std::vector<char>> out(n);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < first[n]; ++i) store(t, in[r].data(), i, inputValue(t, op, r, i));
    out[r].assign(counts[r] * w, '\x33');
  }
  std::vector<int> offered(n, 0);  // not vector<bool>: ranks write it at once
  const auto errors = onRanks(n, [&](int r) {
    offered[r] = ranks[r]->reducescatter(in[r].data(), out[r].data(), counts, t, op, prescale,
                                         postscale);
  });
  if (!noErrors(errors, what)) return;
  for (int r = 0; r < n; ++r) {
    if (!CHECK(offered[r])) return;
    for (size_t i = 0; i < counts[r]; ++i) {
      const double got = load(t, out[r].data(), i);
      const double want = reduced(t, op, n, first[r] + i, prescale, postscale);
      if (got != want) {
        check::fail(__FILE__, __LINE__,
                    what + ": rank " + std::to_string(r) + " element " + std::to_string(i) +
                        " is " + std::to_string(got) + ", want " + std::to_string(want));
        break;
      }
    }
  }
}

// Where each rank's input to an allgather lies: in a buffer of its own, at
// its own place in its output (in place), or at the front of its output,
// which is elsewhere for every rank but 0 (the plane must move it before
// any other rank's rows land on it).
enum class Placement { kApart, kOwnPlace, kAtFront };

// allgatherv of counts[r] elements from rank r.
inline void checkAllgather(const std::vector<Backend*>& ranks, DataType t,
                           const std::vector<size_t>& counts,
                           Placement placement = Placement::kApart) {
  const int n = static_cast<int>(ranks.size());
  std::vector<size_t> first(n + 1, 0);
  for (int r = 0; r < n; ++r) first[r + 1] = first[r] + counts[r];
  static const char* const kWhere[] = {"", " in place", " from the front of the output"};
  const std::string what = label("allgather", t, first[n], n) +
                           kWhere[static_cast<int>(placement)] + ", rank 0 x" +
                           std::to_string(counts[0]);
  const size_t w = hvd::dataTypeSize(t);
  std::vector<char> want;
  for (int r = 0; r < n; ++r) {
    const auto block = pattern(t, r, 0, counts[r]);
    want.insert(want.end(), block.begin(), block.end());
  }
  std::vector<std::vector<char>> in(n), out(n);
  std::vector<size_t> at(n, 0);  // the input's offset in the output, in bytes
  for (int r = 0; r < n; ++r) {
    in[r] = pattern(t, r, 0, counts[r]);
    out[r].assign(first[n] * w, '\x77');
    if (placement == Placement::kOwnPlace) at[r] = first[r] * w;
    if (placement != Placement::kApart && !in[r].empty())  // memcpy from null is UB
      std::memcpy(out[r].data() + at[r], in[r].data(), in[r].size());
  }
  const auto errors = onRanks(n, [&](int r) {
    const void* src = placement == Placement::kApart ? in[r].data() : out[r].data() + at[r];
    ranks[r]->allgatherv(src, out[r].data(), counts, t);
  });
  if (!noErrors(errors, what)) return;
  for (int r = 0; r < n; ++r)
    sameBytes(what + ": rank " + std::to_string(r), out[r].data(), want.data(), want.size(), w);
}

// broadcast from `root`: in place (broadcast), or out of place
// (broadcastInto, which must then be offered).
inline void checkBroadcast(const std::vector<Backend*>& ranks, DataType t, size_t count, int root,
                           bool into) {
  const int n = static_cast<int>(ranks.size());
  const std::string what = label(into ? "broadcastInto" : "broadcast", t, count, n) + " from " +
                           std::to_string(root);
  const size_t w = hvd::dataTypeSize(t);
  const std::vector<char> want = pattern(t, root, 0, count);
  std::vector<std::vector<char>> in(n), out(n);
  for (int r = 0; r < n; ++r) {
    in[r] = pattern(t, r, 0, count);  // a non-root's own bytes must not survive
    out[r].assign(count * w, '\x11');
  }
  std::vector<int> offered(n, 1);  // not vector<bool>: ranks write it at once
  const auto errors = onRanks(n, [&](int r) {
    if (into) {
      offered[r] = ranks[r]->broadcastInto(in[r].data(), out[r].data(), count, t, root);
    } else {
      ranks[r]->broadcast(in[r].data(), count, t, root);
    }
  });
  if (!noErrors(errors, what)) return;
  for (int r = 0; r < n; ++r) {
    if (!CHECK(offered[r])) return;
    const std::vector<char>& got = into ? out[r] : in[r];
    sameBytes(what + ": rank " + std::to_string(r), got.data(), want.data(), want.size(), w);
    if (into)  // the root's input is read, not written
      sameBytes(what + ": rank " + std::to_string(r) + " input", in[r].data(),
                pattern(t, r, 0, count).data(), count * w, w);
  }
}

// alltoallv where rank s sends sends[s][d] elements to rank d.
inline void checkAlltoall(const std::vector<Backend*>& ranks, DataType t,
                          const std::vector<std::vector<int64_t>>& sends) {
  const int n = static_cast<int>(ranks.size());
  const size_t w = hvd::dataTypeSize(t);
  size_t moved = 0;
  for (const auto& row : sends)
    for (int64_t c : row) moved += static_cast<size_t>(c);
  const std::string what = label("alltoall", t, moved, n);
  std::vector<std::vector<char>> in(n), out(n), want(n);
  std::vector<std::vector<int64_t>> recvs(n, std::vector<int64_t>(n));
  for (int s = 0; s < n; ++s) {
    size_t total = 0;
    for (int d = 0; d < n; ++d) total += static_cast<size_t>(sends[s][d]);
    in[s] = pattern(t, s, 0, total);
  }
  for (int d = 0; d < n; ++d) {
    for (int s = 0; s < n; ++s) {
      recvs[d][s] = sends[s][d];
      size_t from = 0;  // rank s's block for d starts after its blocks for ranks before d
      for (int e = 0; e < d; ++e) from += static_cast<size_t>(sends[s][e]);
      const auto block = pattern(t, s, from, static_cast<size_t>(sends[s][d]));
      want[d].insert(want[d].end(), block.begin(), block.end());
    }
    out[d].assign(want[d].size(), '\x22');
  }
  const auto errors = onRanks(n, [&](int r) {
    ranks[r]->alltoallv(in[r].data(), sends[r], out[r].data(), recvs[r], t);
  });
  if (!noErrors(errors, what)) return;
  for (int r = 0; r < n; ++r)
    sameBytes(what + ": rank " + std::to_string(r), out[r].data(), want[r].data(),
              want[r].size(), w);
}

// Each rank counts itself in before barrier(); after it, every rank must see
// all of them. Rank r first sleeps r ms, so the late ones are the last in.
inline void checkBarrier(const std::vector<Backend*>& ranks, int rounds) {
  const int n = static_cast<int>(ranks.size());
  std::atomic<int> arrived{0};
  std::vector<std::vector<int>> seen(n);
  const auto errors = onRanks(n, [&](int r) {
    for (int k = 1; k <= rounds; ++k) {
      std::this_thread::sleep_for(std::chrono::milliseconds(r));
      arrived.fetch_add(1);
      ranks[r]->barrier();
      seen[r].push_back(arrived.load());
      ranks[r]->barrier();  // nobody counts itself into round k + 1 before all have looked
    }
  });
  if (!noErrors(errors, "barrier")) return;
  for (int r = 0; r < n; ++r)
    for (int k = 1; k <= rounds; ++k)
      CHECK_EQ(seen[r][k - 1], n * k);
}

// Send counts that differ for every pair, with some empty: rank s sends
// ((s + 2d) % 3) * unit elements to rank d.
inline std::vector<std::vector<int64_t>> unevenSends(int n, int64_t unit) {
  std::vector<std::vector<int64_t>> sends(n, std::vector<int64_t>(n));
  for (int s = 0; s < n; ++s)
    for (int d = 0; d < n; ++d) sends[s][d] = ((s + 2 * d) % 3) * unit + (s == d ? 1 : 0);
  return sends;
}

// Like unevenSends, but rank `idle` sends and receives nothing (its input
// and output have no storage).
inline std::vector<std::vector<int64_t>> sendsWithIdleRank(int n, int64_t unit, int idle) {
  auto sends = unevenSends(n, unit);
  for (int r = 0; r < n; ++r) sends[idle][r] = sends[r][idle] = 0;
  return sends;
}

// Counts per rank, one of them empty when n > 2: rank r holds
// unit * (r + 1) elements, except rank 1 of 3 or more, which holds none.
inline std::vector<size_t> unevenCounts(int n, size_t unit) {
  std::vector<size_t> counts(n);
  for (int r = 0; r < n; ++r) counts[r] = unit * (r + 1) + r;
  if (n > 2) counts[1] = 0;
  return counts;
}

}  // namespace hvd_test
