#include "model/minimax_m3/cuda/cuda_dspark_f32.h"

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
    return cuda::launch_dspark_block_attention(p, static_cast<CUstream_st*>(backend->stream()));
  };
}

}  // namespace m3::minimax_m3
