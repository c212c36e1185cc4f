#include "model/minimax_m3/cuda/cuda_dspark_f32.h"

#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/dspark/block_attention.h"

namespace m3::minimax_m3 {

dspark::BlockAttentionFn cuda_dspark_block_attention_f32(CudaBackend* backend) {
  return [backend](const dspark::BlockAttentionParams& a) -> Status {
    cuda::DSparkBlockAttentionParams p;
    p.q = a.q;
    p.block_k = a.block_k;
    p.block_v = a.block_v;
    p.cache_k = a.cache.k;
    p.cache_v = a.cache.v;
    p.out = a.out;
    p.block_table = a.block_table;
    p.num_blocks = a.num_blocks;
    p.num_pages = a.cache.num_pages;
    p.page_size = a.cache.page_size;
    p.anchor_pos = a.anchor_pos;
    p.block = a.block;
    p.num_heads = a.num_heads;
    p.num_kv_heads = a.cache.num_kv_heads;
    p.head_dim = a.cache.head_dim;
    p.window = a.window;
    p.scale = a.scale;
    // The split partials, from the backend's caching allocator: freed after the launch, the
    // memory is only handed out again for work later on the same stream.
    const int64_t floats = cuda::dspark_block_attention_workspace_floats(p);
    p.workspace = floats > 0 ? static_cast<float*>(backend->alloc(floats * 4)) : nullptr;
    if (floats > 0 && p.workspace == nullptr)
      return Status(StatusCode::kResourceExhausted,
                    "[cuda.dspark.block_attention] no device memory for " +
                        std::to_string(floats * 4) + " bytes of workspace");
    Status s = cuda::launch_dspark_block_attention(p, static_cast<CUstream_st*>(backend->stream()));
    if (p.workspace != nullptr) backend->free(p.workspace);
    return s;
  };
}

}  // namespace m3::minimax_m3
