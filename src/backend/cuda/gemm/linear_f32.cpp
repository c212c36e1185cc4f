#include "backend/cuda/gemm/linear_f32.h"

#include <string>

#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda {

LinearF32::~LinearF32() {
  for (auto& [key, p] : plans_) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.desc);
  }
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

Status LinearF32::init(void* workspace, size_t workspace_bytes) {
  M3_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&handle_));
  workspace_ = workspace;
  workspace_bytes_ = workspace_bytes;
  return Status::ok();
}

// Row-major y[M,N] = x[M,K]·W[N,K]^T is column-major C[N,M] = op(A)·B with A = W stored
// column-major as [K,N] (so op(A) = A^T) and B = x stored column-major as [K,M].
Result<LinearF32::Plan*> LinearF32::plan(int64_t m, int64_t n, int64_t k) {
  auto key = std::make_tuple(m, n, k);
  auto it = plans_.find(key);
  if (it != plans_.end()) return &it->second;
  Plan p;
  M3_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  M3_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                           &ta, sizeof(ta)));
  M3_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                           &tb, sizeof(tb)));
  M3_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_32F, k, n, k));
  M3_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_32F, k, m, k));
  M3_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, n, m, n));
  cublasLtMatmulPreference_t pref = nullptr;
  M3_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                       &workspace_bytes_, sizeof(workspace_bytes_));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.c, p.c, pref, 1,
                                                     &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0)
    return internal_error("[cuda.linear] cuBLASLt has no float32 algorithm for M=" +
                          std::to_string(m) + " N=" + std::to_string(n) + " K=" +
                          std::to_string(k));
  p.algo = result.algo;
  return &plans_.emplace(key, p).first->second;
}

Status LinearF32::run(const LinearParams& p, cudaStream_t s) {
  if (p.m == 0 || p.n == 0) return Status::ok();
  if (p.k == 0) {
    if (!p.accumulate)
      M3_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(p.y, 0, sizeof(float) * p.m * p.n, s));
    return Status::ok();
  }
  M3_ASSIGN_OR_RETURN(Plan * pl, plan(p.m, p.n, p.k));
  const float alpha = 1.0f, beta = p.accumulate ? 1.0f : 0.0f;
  M3_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(handle_, pl->desc, &alpha, p.w, pl->a, p.x, pl->b,
                                           &beta, p.y, pl->c, p.y, pl->c, &pl->algo, workspace_,
                                           workspace_bytes_, s));
  return Status::ok();
}

}  // namespace m3::cuda
