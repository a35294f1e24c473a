#include "gloo_backend.h"

#include <dlfcn.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include "../../core/address.h"
#include "../../core/reduce.h"
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
