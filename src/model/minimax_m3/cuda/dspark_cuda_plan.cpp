#include "model/minimax_m3/cuda/dspark_cuda_plan.h"

#include <algorithm>
#include <string>

#include "backend/cuda/dspark/block_attention.h"

namespace m3::minimax_m3 {
namespace {

const std::string kWho = "[model.minimax_m3.cuda.dspark] ";

// MXFP8 [n, k]: a byte per value and an E8M0 scale per 32.
int64_t mxfp8_bytes(int64_t n, int64_t k) { return n * k + n * (k / 32); }
int64_t bf16_bytes(int64_t n) { return 2 * n; }

}  // namespace

int64_t DSparkCudaPlan::append_scratch_bytes(int64_t tokens) const {
  const int64_t t = std::max<int64_t>(tokens, 0);
  return t * feature_width * (4 + 2)       // features float32, then bf16
         + t * hidden * (4 + 2)            // c float32 and its normed bf16
         + t * 2 * kv_rows * 4             // the K|V projection
         + t * (1 + pages_per_sequence) * 4;  // positions and per-token block tables
}

Result<DSparkCudaPlan> plan_dspark_cuda(const dspark::DSparkConfig& c, int64_t page_size) {
  auto refuse = [](const std::string& what) {
    return Status(StatusCode::kUnimplemented, kWho + what + " (the real-shape GPU draft)");
  };
  if (!c.use_gemma_norm) return refuse("use_gemma_norm false: the bf16 norms scale by (1 + w)");
  if (c.head_dim != 128)
    return refuse("head_dim " + std::to_string(c.head_dim) + ": the q/k norm + RoPE kernel takes 128");
  if (c.rot_dim() <= 0 || c.rot_dim() > 128 || c.rot_dim() % 2 != 0)
    return refuse("rotary_dim " + std::to_string(c.rot_dim()) + ": even, at most 128");
  if (c.hidden_size % 256 != 0)
    return refuse("hidden_size " + std::to_string(c.hidden_size) +
                  ": the bf16 lm_head GEMV needs a multiple of 256");
  if (c.intermediate_size % 32 != 0 || (c.num_attention_heads * c.head_dim) % 32 != 0)
    return refuse("dspark_ffn_hidden_size " + std::to_string(c.intermediate_size) +
                  ": the MXFP8 GEMVs need multiples of 32");
  if (c.markov_rank <= 0) return refuse("dspark_markov_rank must be positive");
  if (c.sliding_window > cuda::kDSparkAttentionMaxWindow)
    return refuse("sliding_window " + std::to_string(c.sliding_window) + ": above 2^28 positions");
  if (page_size <= 0) return invalid_argument(kWho + "page size must be positive");

  DSparkCudaPlan p;
  p.layers = c.num_hidden_layers;
  p.hidden = c.hidden_size;
  p.heads = c.num_attention_heads;
  p.kv_heads = c.num_key_value_heads;
  p.head_dim = c.head_dim;
  p.inter = c.intermediate_size;
  p.vocab = c.vocab_size;
  p.rank = c.markov_rank;
  p.block = c.block_size;
  p.window = c.sliding_window;
  p.page_size = page_size;
  p.feature_width = c.feature_width();
  p.q_rows = p.heads * p.head_dim;
  p.kv_rows = p.kv_heads * p.head_dim;
  p.qkv_rows = p.q_rows + 2 * p.kv_rows;
  // The same count as DSparkContextCache (its bookkeeping is reused).
  p.pages_per_sequence = (p.window + page_size - 1) / page_size + 3;
  p.kv_bytes_per_page = p.layers * 2 * page_size * p.kv_rows * 2;
  p.kv_bytes_per_sequence = p.pages_per_sequence * p.kv_bytes_per_page;
  const int64_t per_layer = mxfp8_bytes(p.qkv_rows, p.hidden) + mxfp8_bytes(p.hidden, p.q_rows) +
                            mxfp8_bytes(2 * p.inter, p.hidden) + mxfp8_bytes(p.hidden, p.inter) +
                            bf16_bytes(2 * p.hidden + 2 * p.head_dim);
  p.weight_bytes = p.layers * per_layer + bf16_bytes(p.hidden * p.feature_width) +
                   bf16_bytes(2 * p.hidden) + bf16_bytes(2 * p.vocab * p.rank);
  const int64_t b = p.block;
  const int64_t widest = std::max({p.qkv_rows, 2 * p.inter, p.vocab, p.hidden});
  const int64_t slices = std::max<int64_t>(1, std::max(p.feature_width, p.inter) / 256);
  p.propose_scratch_bytes = b * p.hidden * (4 + 4 + 2)       // x, delta, h
                            + b * p.qkv_rows * 4              // the q|k|v projection
                            + b * (p.q_rows + p.kv_rows) * 2  // q and k bf16
                            + b * p.q_rows * 2                // attention output
                            + b * 2 * p.inter * 4 + b * p.inter * 2  // gate|up, activations
                            + b * p.vocab * 4                 // logits
                            + slices * b * widest * 4;        // split-K partials (bound)
  cuda::DSparkBlockAttentionParams attention;
  attention.block = b;
  attention.num_heads = p.heads;
  attention.num_kv_heads = p.kv_heads;
  attention.head_dim = p.head_dim;
  attention.window = p.window;
  p.propose_scratch_bytes += 4 * cuda::dspark_block_attention_workspace_floats(attention);
  return p;
}

}  // namespace m3::minimax_m3
