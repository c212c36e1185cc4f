// Writes T new tokens' K, V (and index keys) into the paged float32 cache.
#include "backend/cuda/f32_ops.h"
#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda {
namespace {

// One block per token. A position beyond the block table or a bad page id skips the token.
__global__ void kv_write_kernel(KvWriteParams p) {
  const KvLayerView& c = p.cache;
  const int64_t i = blockIdx.x;
  const int64_t pos = p.positions[i];
  const int64_t blk = pos / c.page_size;
  if (pos < 0 || blk >= p.num_blocks) return;
  const int64_t page = p.block_table[blk];
  if (page < 0 || page >= c.num_pages) return;
  const int64_t slot = page * c.page_size + pos % c.page_size;
  const int64_t kv_row = c.num_kv_heads * c.head_dim;
  for (int64_t j = threadIdx.x; j < kv_row; j += blockDim.x) {
    c.k[slot * kv_row + j] = p.k[i * kv_row + j];
    c.v[slot * kv_row + j] = p.v[i * kv_row + j];
  }
  if (p.idx_k != nullptr && c.idx_k != nullptr)
    for (int64_t j = threadIdx.x; j < c.index_head_dim; j += blockDim.x)
      c.idx_k[slot * c.index_head_dim + j] = p.idx_k[i * c.index_head_dim + j];
}

}  // namespace

Status launch_kv_write(const KvWriteParams& p, cudaStream_t s) {
  if (p.t == 0) return Status::ok();
  if (p.cache.dtype != KvCacheDtype::kFloat32) return launch_kv_write_quantised(p, s);
  if (p.idx_k != nullptr && p.cache.idx_k == nullptr)
    return invalid_argument("[cuda.kv_write] layer has no index-key cache");
  kv_write_kernel<<<static_cast<unsigned>(p.t), 128, 0, s>>>(p);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(kv_write_kernel);
  return Status::ok();
}

}  // namespace m3::cuda
