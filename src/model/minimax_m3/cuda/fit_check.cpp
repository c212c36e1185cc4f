#include "model/minimax_m3/cuda/fit_check.h"

#include <string>

namespace m3::minimax_m3 {
namespace {

Status no_fit(const std::string& field, int64_t value, const std::string& need) {
  return invalid_argument(
      "[model.minimax_m3.cuda] config does not fit the real-shape CUDA "
      "kernels: " +
      field + " = " + std::to_string(value) + " (" + need + ")");
}

}  // namespace

Status check_real_shape_fit(const MiniMaxM3Config& c) {
  M3_RETURN_IF_ERROR(c.validate());
  if (c.head_dim != 128) return no_fit("head_dim", c.head_dim, "needs 128");
  if (c.num_key_value_heads <= 0 || c.num_attention_heads != 16 * c.num_key_value_heads)
    return no_fit("num_attention_heads", c.num_attention_heads,
                  "needs 16 query heads per KV head, num_key_value_heads = " +
                      std::to_string(c.num_key_value_heads));
  if (c.index_block_size != 128)
    return no_fit("index_block_size", c.index_block_size, "KV page = sparse block needs 128");
  // full_attention layers (MiniMax-M3's first three) run dense attention (no indexer); the
  // indexer's limits apply where any layer is sparse.
  bool any_sparse = false;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) any_sparse |= c.is_sparse_layer(i);
  if (any_sparse) {
    if (c.index_head_dim != 128) return no_fit("index_head_dim", c.index_head_dim, "needs 128");
    if (c.index_n_heads != c.num_key_value_heads || c.index_n_heads > 8)
      return no_fit("index_n_heads", c.index_n_heads, "needs == num_key_value_heads and <= 8");
    if (c.index_topk_blocks < 1 || c.index_topk_blocks > 65535)
      return no_fit("index_topk_blocks", c.index_topk_blocks, "needs [1, 65535]");
    if (c.index_local_blocks < 0 || c.index_init_blocks < 0)
      return no_fit("index_local_blocks / index_init_blocks",
                    c.index_local_blocks < 0 ? c.index_local_blocks : c.index_init_blocks,
                    "needs >= 0");
  }
  if (c.rotary_dim < 2 || c.rotary_dim > 128 || c.rotary_dim % 2 != 0)
    return no_fit("rotary_dim", c.rotary_dim, "needs even, in [2, 128]");
  if (c.hidden_size <= 0 || c.hidden_size % 1024 != 0)
    return no_fit("hidden_size", c.hidden_size, "needs a positive multiple of 1024");
  if (c.vocab_size <= 0) return no_fit("vocab_size", c.vocab_size, "needs > 0");
  bool any_dense = false, any_moe = false;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    (c.is_moe_layer(i) ? any_moe : any_dense) = true;
  // The intermediate sizes are the K of the down projections: the decode GEMVs stage K in
  // 128-column steps (256 for BF16 weights' split-K kernel) and the grouped expert GEMM tiles K
  // and N by 128. Multiples of 256 keep every kernel (M3.1-Flash's 3072 over --tp 2 and 4: 1536,
  // 768).
  if (any_dense && (c.dense_intermediate_size <= 0 || c.dense_intermediate_size % 256 != 0))
    return no_fit("dense_intermediate_size", c.dense_intermediate_size,
                  "needs a positive multiple of 256");
  if (any_moe) {
    if (c.intermediate_size <= 0 || c.intermediate_size % 256 != 0)
      return no_fit("intermediate_size", c.intermediate_size, "needs a positive multiple of 256");
    const int64_t shared = c.shared_intermediate_size * c.n_shared_experts;
    if (shared < 0 || shared % 256 != 0)
      return no_fit("shared_intermediate_size * n_shared_experts", shared,
                    "needs 0 or a multiple of 256");
    if (c.num_local_experts < 1 || c.num_local_experts > 512)
      return no_fit("num_local_experts", c.num_local_experts, "needs [1, 512]");
    if (c.num_experts_per_tok < 1 || c.num_experts_per_tok > 16 ||
        c.num_experts_per_tok > c.num_local_experts)
      return no_fit("num_experts_per_tok", c.num_experts_per_tok,
                    "needs [1, min(16, num_local_experts)]");
  }
  return Status::ok();
}

int64_t real_shape_kv_bytes_per_page(const MiniMaxM3Config& c, KvCacheDtype dtype) {
  // A [128, heads, dim] tensor of one page: its codes, fp4's block scales, the page-head scales.
  auto tensor = [&](int64_t heads, int64_t dim) {
    if (dtype == KvCacheDtype::kBF16) return 128 * heads * dim * 2;
    return 128 * heads * (kv_row_code_bytes(dtype, dim) + kv_row_block_scale_bytes(dtype, dim)) +
           heads * 4;
  };
  int64_t bytes = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    bytes += 2 * tensor(c.num_key_value_heads, c.head_dim) +
             (c.is_sparse_layer(i) ? tensor(1, c.index_head_dim) : 0);
  return bytes;
}

int64_t real_shape_kv_pool_bytes_per_page(const MiniMaxM3Config& c, KvCacheDtype dtype) {
  return real_shape_kv_bytes_per_page(c, dtype) + real_shape_kv_stage_bytes_per_page(c, dtype);
}

int64_t real_shape_kv_stage_bytes_per_page(const MiniMaxM3Config& c, KvCacheDtype dtype) {
  if (dtype == KvCacheDtype::kBF16) return 0;
  bool any_sparse = false;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) any_sparse |= c.is_sparse_layer(i);
  return 128 * (2 * c.num_key_value_heads * c.head_dim + (any_sparse ? c.index_head_dim : 0)) * 2;
}

}  // namespace m3::minimax_m3
