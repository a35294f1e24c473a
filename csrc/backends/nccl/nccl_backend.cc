#include "nccl_backend.h"

#include <chrono>
#include <cstring>
#include <thread>

#include "../../core/store_client.h"
#include "cuda_check.h"
#include "cuda_memory.h"

namespace hvd {

namespace {

ncclDataType_t ncclType(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8: return ncclUint8;
    case DataType::kInt8: return ncclInt8;
    case DataType::kInt32: return ncclInt32;
    case DataType::kInt64: return ncclInt64;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kBool: return ncclUint8;  // 0/1 bytes; the op decides or/and
    case DataType::kInt16: break;
  }
  throw std::runtime_error(std::string("NCCL has no type for ") + dataTypeName(dtype));
}

ncclRedOp_t ncclOp(DataType dtype, ReduceOp op) {
  if (dtype == DataType::kBool) {
    // or for Sum/Max, and for Min/Product, as on the host.
    return (op == ReduceOp::kMin || op == ReduceOp::kProduct) ? ncclMin : ncclMax;
  }
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kProduct: return ncclProd;
    default: break;
  }
  throw std::runtime_error(std::string("NCCL backend: unsupported reduce op ") + reduceOpName(op));
}

// Communicators are non-blocking, so that neither their creation nor a
// collective can hold the background thread forever: a call may answer
// ncclInProgress, and the next NCCL call must wait until it has settled.
void settle(ncclComm_t comm, ncclResult_t result, const char* what,
            std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (result == ncclInProgress) {
    if (std::chrono::steady_clock::now() > deadline) {
      ncclCommAbort(comm);
      throw std::runtime_error(std::string(what) + " did not complete within " +
                               std::to_string(timeout.count() / 1000) +
                               " s (a peer did not join: HOROVOD_START_TIMEOUT / "
                               "HOROVOD_GLOO_TIMEOUT_SECONDS)");
    }
    std::this_thread::yield();
    ncclCommGetAsyncError(comm, &result);
  }
  HVD_NCCL_CHECK(comm, result);
}

// How long an enqueue may report "in progress" (it is not the collective's
// run time: that happens on the GPU after the call returns).
constexpr std::chrono::milliseconds kEnqueueTimeout{60000};

}  // namespace

bool ncclSupports(DataType dtype) { return dtype != DataType::kInt16; }

NcclBackend::~NcclBackend() {
  if (aborted_ || comm_ == nullptr) return;
  try {
    CudaDeviceScope on(device_);
    settle(comm_, ncclCommFinalize(comm_), "ncclCommFinalize", kEnqueueTimeout);
  } catch (const std::exception&) {
    ncclCommAbort(comm_);
    return;
  }
  ncclCommDestroy(comm_);
}

void NcclBackend::allreduce(void* buf, size_t count, DataType dtype, ReduceOp op) {
  CudaDeviceScope on(device_);
  settle(comm_,
         ncclAllReduce(buf, buf, count, ncclType(dtype), ncclOp(dtype, op), comm_, stream_),
         "ncclAllReduce", kEnqueueTimeout);
}

void NcclBackend::allgatherv(const void* in, void* out, const std::vector<size_t>& counts,
                             DataType dtype) {
  CudaDeviceScope on(device_);
  const ncclDataType_t type = ncclType(dtype);
  bool even = true;
  for (size_t c : counts) even = even && c == counts[0];
  if (even) {
    settle(comm_, ncclAllGather(in, out, counts[0], type, comm_, stream_), "ncclAllGather",
           kEnqueueTimeout);
    return;
  }
  // Uneven rows: one broadcast per rank into its slice, fused by the group.
  int me = 0;
  HVD_NCCL_CHECK(comm_, ncclCommUserRank(comm_, &me));
  const size_t elem = dataTypeSize(dtype);
  char* dst = static_cast<char*>(out);
  HVD_NCCL_CHECK(comm_, ncclGroupStart());
  for (int r = 0; r < size_; ++r) {
    const void* send = r == me ? in : dst;
    ncclResult_t res = ncclBroadcast(send, dst, counts[r], type, r, comm_, stream_);
    if (res != ncclSuccess && res != ncclInProgress) {
      ncclGroupEnd();
      HVD_NCCL_CHECK(comm_, res);
    }
    dst += counts[r] * elem;
  }
  settle(comm_, ncclGroupEnd(), "ncclBroadcast group (allgatherv)", kEnqueueTimeout);
}

void NcclBackend::broadcast(void* buf, size_t count, DataType dtype, int root) {
  CudaDeviceScope on(device_);
  settle(comm_, ncclBroadcast(buf, buf, count, ncclType(dtype), root, comm_, stream_),
         "ncclBroadcast", kEnqueueTimeout);
}

void NcclBackend::alltoallv(const void* in, const std::vector<int64_t>& send_counts, void* out,
                            const std::vector<int64_t>& recv_counts, DataType dtype) {
  CudaDeviceScope on(device_);
  const ncclDataType_t type = ncclType(dtype);
  const size_t elem = dataTypeSize(dtype);
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  HVD_NCCL_CHECK(comm_, ncclGroupStart());
  for (int r = 0; r < size_; ++r) {
    ncclResult_t res = ncclSuccess;
    if (send_counts[r] > 0) res = ncclSend(src, send_counts[r], type, r, comm_, stream_);
    if ((res == ncclSuccess || res == ncclInProgress) && recv_counts[r] > 0)
      res = ncclRecv(dst, recv_counts[r], type, r, comm_, stream_);
    if (res != ncclSuccess && res != ncclInProgress) {
      ncclGroupEnd();
      HVD_NCCL_CHECK(comm_, res);
    }
    src += send_counts[r] * elem;
    dst += recv_counts[r] * elem;
  }
  settle(comm_, ncclGroupEnd(), "ncclSend/ncclRecv group (alltoallv)", kEnqueueTimeout);
}

void NcclBackend::barrier() {
  // Barriers carry no tensor, so they always run on the host plane (Gloo).
  throw std::logic_error("internal: barrier on the NCCL plane");
}

void NcclBackend::abort() {
  if (aborted_ || comm_ == nullptr) return;
  aborted_ = true;
  ncclCommAbort(comm_);
}

DevicePlane makeNcclPlane(int device, cudaStream_t stream, const Topology& set,
                          const EngineConfig& config, StoreClient* store,
                          const std::string& prefix) {
  CudaDeviceScope on(device);
  ncclUniqueId id;
  const std::string key = prefix + "nccl_unique_id";
  if (set.rank == 0) {
    HVD_NCCL_CHECK(nullptr, ncclGetUniqueId(&id));
    if (store != nullptr && set.size > 1) {
      store->set(key, std::vector<char>(id.internal, id.internal + sizeof(id.internal)));
    }
  } else {
    if (store == nullptr) throw std::logic_error("internal: NCCL plane of several ranks, no store");
    const std::string bytes = store->get(key, config.start_timeout);
    if (bytes.size() != sizeof(id.internal)) {
      throw std::runtime_error("NCCL unique id under '" + key + "' has " +
                               std::to_string(bytes.size()) + " bytes, expected " +
                               std::to_string(sizeof(id.internal)));
    }
    std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
  }
  ncclConfig_t nccl_config = NCCL_CONFIG_INITIALIZER;
  nccl_config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t res = ncclCommInitRankConfig(&comm, set.size, id, set.rank, &nccl_config);
  if (res != ncclSuccess && res != ncclInProgress) HVD_NCCL_CHECK(comm, res);
  settle(comm, res, "ncclCommInitRankConfig", config.start_timeout);
  DevicePlane plane;
  plane.memory = std::make_unique<CudaMemory>(device, stream);
  plane.backend = std::make_unique<NcclBackend>(device, stream, comm, set.size);
  return plane;
}

}  // namespace hvd
