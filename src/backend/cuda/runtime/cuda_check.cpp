#include "backend/cuda/runtime/cuda_check.h"

#include <string>

namespace m3::cuda {

Status cuda_error(cudaError_t e, const char* expr, const char* file, int line) {
  StatusCode code = e == cudaErrorMemoryAllocation ? StatusCode::kResourceExhausted
                                                   : StatusCode::kInternal;
  return Status(code, std::string("[cuda] ") + expr + " failed: " + cudaGetErrorName(e) + " (" +
                          cudaGetErrorString(e) + ") at " + file + ":" + std::to_string(line));
}

Status cublas_error(cublasStatus_t s, const char* expr, const char* file, int line) {
  StatusCode code = s == CUBLAS_STATUS_ALLOC_FAILED ? StatusCode::kResourceExhausted
                                                     : StatusCode::kInternal;
  return Status(code, std::string("[cublasLt] ") + expr + " failed: status " +
                          std::to_string(static_cast<int>(s)) + " at " + file + ":" +
                          std::to_string(line));
}

}  // namespace m3::cuda
