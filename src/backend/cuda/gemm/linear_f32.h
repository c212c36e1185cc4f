// y[M, N] (+)= x[M, K] · W[N, K]^T in float32 through cuBLASLt (CUBLAS_COMPUTE_32F: true
// float32 products, no TF32), for the correctness path. Matmul descriptors and the chosen
// algorithm are cached per (M, N, K, accumulate).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <tuple>

#include "backend/backend.h"
#include "core/status.h"

namespace m3::cuda {

class LinearF32 {
 public:
  LinearF32() = default;
  ~LinearF32();
  LinearF32(const LinearF32&) = delete;
  LinearF32& operator=(const LinearF32&) = delete;

  // `workspace` must stay valid for the object's life.
  Status init(void* workspace, size_t workspace_bytes);
  Status run(const LinearParams& p, cudaStream_t s);

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  Result<Plan*> plan(int64_t m, int64_t n, int64_t k);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<std::tuple<int64_t, int64_t, int64_t>, Plan> plans_;
};

}  // namespace m3::cuda
