#include "gloo_backend.h"

#include <dlfcn.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "../../core/address.h"
#include "../../core/reduction_plan.h"
#include "gloo_store.h"

namespace hvd {

namespace {

// Gloo only needs the element width: it moves bytes and calls our reduce
// function, which knows the real dtype. Dispatch on width, not dtype.
template <typename Fn>
void withWidth(DataType dtype, Fn fn) {
  switch (dataTypeSize(dtype)) {
    case 1: return fn(uint8_t{});
    case 2: return fn(uint16_t{});
    case 4: return fn(uint32_t{});
    default: return fn(uint64_t{});
  }
}

}  // namespace

GlooBackend::GlooBackend(const Topology& topology, const EngineConfig& config, StoreClient& store,
                         const std::string& prefix) {
  gloo::transport::tcp::attr attr;
  // One host: loopback only, nothing listens on the network. Several: the
  // address peers reach us at (core/address.h).
  attr.hostname = topology.cross_size == 1 ? "127.0.0.1" : localAddress(config);
  auto device = gloo::transport::tcp::CreateDevice(attr);
  context_ = std::make_shared<gloo::rendezvous::Context>(topology.rank, topology.size);
  context_->setTimeout(config.op_timeout);
  GlooStore gloo_store(store, prefix, config.start_timeout);
  context_->connectFullMesh(gloo_store, device);
}

GlooBackend::~GlooBackend() = default;

void GlooBackend::allreduce(void* buf, size_t count, DataType dtype, ReduceOp op) {
  withWidth(dtype, [&](auto t) {
    using T = decltype(t);
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(static_cast<T*>(buf), count);
    opts.setReduceFunction(reduceFunction(dtype, op));
    gloo::allreduce(opts);
  });
}

void GlooBackend::allgatherv(const void* in, void* out, const std::vector<size_t>& counts,
                             DataType dtype) {
  withWidth(dtype, [&](auto t) {
    using T = decltype(t);
    gloo::AllgathervOptions opts(context_);
    opts.setInput(const_cast<T*>(static_cast<const T*>(in)), counts[context_->rank]);
    opts.setOutput(static_cast<T*>(out), counts);
    gloo::allgatherv(opts);
  });
}

void GlooBackend::broadcast(void* buf, size_t count, DataType dtype, int root) {
  withWidth(dtype, [&](auto t) {
    using T = decltype(t);
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(static_cast<T*>(buf), count);
    opts.setRoot(root);
    gloo::broadcast(opts);
  });
}

void GlooBackend::alltoallv(const void* in, const std::vector<int64_t>& send_counts, void* out,
                            const std::vector<int64_t>& recv_counts, DataType dtype) {
  withWidth(dtype, [&](auto t) {
    using T = decltype(t);
    gloo::AlltoallvOptions opts(context_);
    opts.setInput(const_cast<T*>(static_cast<const T*>(in)), send_counts);
    opts.setOutput(static_cast<T*>(out), recv_counts);
    gloo::alltoallv(opts);
  });
}

bool GlooBackend::reducescatter(const void* in, void* out, const std::vector<size_t>& counts,
                                DataType dtype, ReduceOp op, double prescale, double postscale) {
  // Rank r ends with block r. At step s a rank sends the next rank the block
  // it finished at step s - 1 (at first, its own input's) and adds the
  // previous rank's partial of the next block to its own input's: after
  // n - 1 steps that block, its own, holds every rank's contribution. Each
  // block moves in segments, so that adding one overlaps receiving the next.
  const int n = context_->size;
  const int me = context_->rank;
  const size_t elem = dataTypeSize(dtype);
  std::vector<size_t> first(n + 1, 0);  // block r: elements [first[r], first[r + 1])
  for (int r = 0; r < n; ++r) first[r + 1] = first[r] + counts[r];
  const size_t bytes = first[n] * elem;
  const char* input = static_cast<const char*>(in);
  // Ring order, not rank order: only the plan's scaling steps apply here.
  const ReductionPlan plan(dtype, op, prescale, postscale, 1);  // Average folded: divisor 1
  if (plan.scalesInputs()) {  // every contribution is scaled before it is added
    scaled_.resize(bytes);
    std::memcpy(scaled_.data(), in, bytes);
    plan.prescale(scaled_.data(), first[n]);
    input = scaled_.data();
  }
  if (n > 2) partial_.resize(bytes);  // the blocks this rank adds to and passes on
  const size_t segment = std::max<size_t>(kSegmentBytes / elem, 1);  // elements
  received_.resize(2 * std::min(segment, *std::max_element(counts.begin(), counts.end())) * elem);
  const size_t half = received_.size() / 2;
  auto from_input = context_->createUnboundBuffer(const_cast<char*>(input), bytes);
  auto from_partial = context_->createUnboundBuffer(partial_.data(), bytes);
  std::unique_ptr<gloo::transport::UnboundBuffer> landing[2] = {
      context_->createUnboundBuffer(received_.data(), half),
      context_->createUnboundBuffer(received_.data() + half, half)};
  constexpr uint8_t kReducescatterSlotPrefix = 0x40;  // none of Gloo's own prefixes
  const uint64_t slot = gloo::Slot::build(kReducescatterSlotPrefix, next_tag_++);
  const ReduceFn reduce = reduceFunction(dtype, op);
  const auto timeout = context_->getTimeout();
  const int next = (me + 1) % n;
  const int prev = (me + n - 1) % n;
  auto check = [&](bool ok, const char* what, int peer) {
    if (!ok)
      throw std::runtime_error(std::string("gloo reducescatter: ") + what + " rank " +
                               std::to_string(peer) + " aborted");
  };
  for (int s = 0; s < n - 1; ++s) {
    const int out_block = (me - 1 - s + 2 * n) % n;
    const int in_block = (me - 2 - s + 2 * n) % n;  // == me at the last step
    // Segments are sent, and received, in order: Gloo matches a slot's
    // messages between two ranks first in, first out.
    auto& sender = s == 0 ? from_input : from_partial;
    size_t sends = 0;
    for (size_t at = 0; at < counts[out_block]; at += segment, ++sends) {
      const size_t count = std::min(segment, counts[out_block] - at);
      sender->send(next, slot, (first[out_block] + at) * elem, count * elem);
    }
    char* sum = s == n - 2 ? static_cast<char*>(out) : partial_.data() + first[in_block] * elem;
    const char* mine = input + first[in_block] * elem;
    const size_t total = counts[in_block];
    if (total > 0) landing[0]->recv(prev, slot, 0, std::min(segment, total) * elem);
    for (size_t at = 0, k = 0; at < total; at += segment, ++k) {
      const size_t count = std::min(segment, total - at);
      if (at + segment < total)  // the next segment lands in the other half meanwhile
        landing[(k + 1) % 2]->recv(prev, slot, 0, std::min(segment, total - at - segment) * elem);
      check(landing[k % 2]->waitRecv(timeout), "receive from", prev);
      reduce(sum + at * elem, mine + at * elem, received_.data() + (k % 2) * half, count);
    }
    for (size_t i = 0; i < sends; ++i) check(sender->waitSend(timeout), "send to", next);
  }
  if (n == 1) std::memcpy(out, input, bytes);
  plan.finish(out, counts[me]);
  return true;
}

void GlooBackend::barrier() {
  gloo::BarrierOptions opts(context_);
  gloo::barrier(opts);
}

std::unique_ptr<Backend> makeGlooBackend(const Topology& topology, const EngineConfig& config,
                                         StoreClient& store, const std::string& prefix) {
  return std::make_unique<GlooBackend>(topology, config, store, prefix);
}

std::string glooLibraryPath() {
  // The address the dynamic linker bound for a Gloo entry point we call.
  void (*fn)(gloo::AllreduceOptions const&) = &gloo::allreduce;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(fn), &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

}  // namespace hvd
