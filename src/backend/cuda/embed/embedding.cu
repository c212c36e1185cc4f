// Embedding lookup and row gather (float32). Ids outside [0, V) leave their output row untouched
// (the model validates ids before the call).
#include "backend/cuda/f32_ops.h"
#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda {
namespace {

__global__ void embedding_kernel(EmbeddingParams p) {
  const int64_t t = blockIdx.x;
  const int32_t id = p.ids[t];
  if (id < 0 || id >= p.vocab) return;
  const float* src = p.table + static_cast<int64_t>(id) * p.dim;
  for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) p.out[t * p.dim + i] = src[i];
}

__global__ void gather_rows_kernel(GatherRowsParams p) {
  const int64_t r = blockIdx.x;
  const float* src = p.x + static_cast<int64_t>(p.rows[r]) * p.dim;
  for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) p.out[r * p.dim + i] = src[i];
}

}  // namespace

Status launch_embedding(const EmbeddingParams& p, cudaStream_t s) {
  if (p.t == 0) return Status::ok();
  embedding_kernel<<<static_cast<unsigned>(p.t), 256, 0, s>>>(p);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(embedding_kernel);
  return Status::ok();
}

Status launch_gather_rows(const GatherRowsParams& p, cudaStream_t s) {
  if (p.num_rows == 0) return Status::ok();
  gather_rows_kernel<<<static_cast<unsigned>(p.num_rows), 256, 0, s>>>(p);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(gather_rows_kernel);
  return Status::ok();
}

}  // namespace m3::cuda
