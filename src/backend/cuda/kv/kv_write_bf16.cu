#include "backend/cuda/kv/kv_write_bf16.h"

#include "backend/cuda/kv/kv_slot.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "core/dtype.h"

namespace m3::cuda {
namespace {

// One block per sequence.
__global__ void kv_write_bf16_kernel(KvWriteBf16Params p) {
  const KvCacheView& c = p.cache;
  const int64_t b = blockIdx.x;
  const int64_t slot = kv_cache_slot(c, p.block_tables, p.max_blocks, b, p.positions[b]);
  if (slot < 0) return;
  const int64_t row = c.num_kv_heads * c.head_dim;
  const int64_t ld_v = p.ld_v > 0 ? p.ld_v : row;
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
    c.k[slot * row + i] = p.k[b * row + i];
    c.v[slot * row + i] = f32_to_bf16(p.v[b * ld_v + i]);
  }
  if (p.idx_k != nullptr && c.idx_k != nullptr)
    for (int64_t i = threadIdx.x; i < c.index_head_dim; i += blockDim.x)
      c.idx_k[slot * c.index_head_dim + i] = p.idx_k[b * c.index_head_dim + i];
}

}  // namespace

Status launch_kv_write_bf16(const KvWriteBf16Params& p, CUstream_st* stream) {
  if (p.batch == 0) return Status::ok();
  kv_write_bf16_kernel<<<static_cast<unsigned>(p.batch), 256, 0, stream>>>(p);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(kv_write_bf16_kernel);
  return Status::ok();
}

}  // namespace m3::cuda
