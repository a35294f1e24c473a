#include "types.h"

#include <algorithm>

namespace hvd {

size_t dataTypeSize(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8:
    case DataType::kInt8:
    case DataType::kBool:
      return 1;
    case DataType::kInt16:
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return 2;
    case DataType::kInt32:
    case DataType::kFloat32:
      return 4;
    case DataType::kInt64:
    case DataType::kFloat64:
      return 8;
  }
  return 0;
}

const char* dataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8: return "uint8";
    case DataType::kInt8: return "int8";
    case DataType::kInt16: return "int16";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kBool: return "bool";
  }
  return "unknown";
}

const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kAverage: return "Average";
    case ReduceOp::kSum: return "Sum";
    case ReduceOp::kAdasum: return "Adasum";
    case ReduceOp::kMin: return "Min";
    case ReduceOp::kMax: return "Max";
    case ReduceOp::kProduct: return "Product";
  }
  return "unknown";
}

const char* opTypeName(OpType op) {
  switch (op) {
    case OpType::kAllreduce: return "allreduce";
    case OpType::kAllgather: return "allgather";
    case OpType::kBroadcast: return "broadcast";
    case OpType::kBarrier: return "barrier";
    case OpType::kAlltoall: return "alltoall";
    case OpType::kReducescatter: return "reducescatter";
    case OpType::kJoin: return "join";
    case OpType::kAddProcessSet: return "add_process_set";
    case OpType::kRemoveProcessSet: return "remove_process_set";
  }
  return "unknown";
}

const char* planeName(Plane plane) {
  switch (plane) {
    case Plane::kHost: return "host";
    case Plane::kStaged: return "host-staged";
    case Plane::kDevice: return "nccl";
  }
  return "unknown";
}

RowSlice reducescatterSlice(int64_t rows, int size, int rank) {
  const int64_t base = rows / size;
  const int64_t extra = rows % size;
  return {rank * base + std::min<int64_t>(rank, extra), base + (rank < extra ? 1 : 0)};
}

bool isFloatingPoint(DataType dtype) {
  return dtype == DataType::kFloat16 || dtype == DataType::kBFloat16 ||
         dtype == DataType::kFloat32 || dtype == DataType::kFloat64;
}

bool isStatusCode(uint8_t code) { return code <= Status::kRefused; }

}  // namespace hvd
