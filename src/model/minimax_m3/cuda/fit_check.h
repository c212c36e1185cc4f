// Whether a MiniMax-M3 config fits the real-shape CUDA kernels (CudaM3Model). Host-only, so it is
// built and unit-tested without CUDA; the caller falls back to the float32 path when it fails.
#pragma once

#include "core/status.h"
#include "loader/model_config.h"
#include "quant/kv_quant.h"

namespace m3::minimax_m3 {

// ok, or invalid_argument naming the first field that does not fit and what the kernels need:
//  * head_dim 128, 16 query heads per KV head (sparse_decode, qk_norm_rope);
//  * index_block_size (= KV page) 128; where any layer is MSA sparse (layer_types; full_attention
//    layers run dense attention), index_head_dim 128, index_n_heads == num_key_value_heads
//    <= 8 (indexer_decode), index_topk_blocks in [1, 65535];
//  * rotary_dim even in [2, 128];
//  * hidden_size and every intermediate size a multiple of 1024 (the streaming GEMV's K slices:
//    512 for MXFP8, 1024 for NVFP4, 256 for BF16);
//  * MoE: num_local_experts in [1, 512], num_experts_per_tok in [1, min(16, experts)].
Status check_real_shape_fit(const MiniMaxM3Config& c);

// Bytes of one KV page of the real-shape path over all layers as stored in `dtype` (kBF16,
// kFp8E4M3 or kFp4E2M1): K and V [128, Hkv, D] per layer and index keys [128, Dix] per sparse
// layer (a full_attention layer caches none); quantised, with their page-head and block scales.
int64_t real_shape_kv_bytes_per_page(const MiniMaxM3Config& c,
                                     KvCacheDtype dtype = KvCacheDtype::kBF16);

// What a quantised pool adds per page: one layer's bf16 K, V and index keys, the staging copy the
// prefill kernels read (0 for bf16).
int64_t real_shape_kv_stage_bytes_per_page(const MiniMaxM3Config& c, KvCacheDtype dtype);

// What one page of the pool costs: the two above together (the KV pool is planned with it).
int64_t real_shape_kv_pool_bytes_per_page(const MiniMaxM3Config& c, KvCacheDtype dtype);

}  // namespace m3::minimax_m3
