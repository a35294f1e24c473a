// One check per library at the boundary: a failed CUDA or NCCL call throws
// std::runtime_error naming the call and the library's own words. The engine
// turns a throw on its background thread into a peer-failure status.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <stdexcept>
#include <string>

#define HVD_CUDA_CHECK(call)                                                              \
  do {                                                                                    \
    cudaError_t hvd_err_ = (call);                                                        \
    if (hvd_err_ != cudaSuccess) {                                                        \
      throw std::runtime_error(std::string(#call) + " failed: " +                         \
                               cudaGetErrorString(hvd_err_));                             \
    }                                                                                     \
  } while (0)

#define HVD_NCCL_CHECK(comm, call)                                                        \
  do {                                                                                    \
    ncclResult_t hvd_res_ = (call);                                                       \
    if (hvd_res_ != ncclSuccess) {                                                        \
      const char* hvd_last_ = ncclGetLastError(comm);                                     \
      throw std::runtime_error(std::string(#call) + " failed: " +                         \
                               ncclGetErrorString(hvd_res_) +                             \
                               (hvd_last_ && *hvd_last_ ? std::string(" (") + hvd_last_ + ")" \
                                                        : std::string()));                \
    }                                                                                     \
  } while (0)

namespace hvd {

// Makes `device` current for the scope and restores the previous one: the
// background thread serves every device plane, the caller's thread its own.
class CudaDeviceScope {
 public:
  explicit CudaDeviceScope(int device) {
    HVD_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) HVD_CUDA_CHECK(cudaSetDevice(device));
  }
  ~CudaDeviceScope() { cudaSetDevice(previous_); }
  CudaDeviceScope(const CudaDeviceScope&) = delete;
  CudaDeviceScope& operator=(const CudaDeviceScope&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace hvd
