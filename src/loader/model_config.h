// MiniMax-M3 text-model hyper-parameters, parsed from config.json (the multimodal wrapper with
// `text_config`, or a bare text config; HF-normalised or legacy checkpoint field names).
// See docs/design/model.md, "Configuration". Every value is read from the file; the defaults below
// are the real model's values and only apply where the file is silent and the reference agrees.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace m3 {

enum class AttentionKind { kFull, kSparse };  // "full_attention" | "minimax_m3_sparse"
enum class MlpKind { kDense, kMoe };          // "dense" | "sparse"

struct QuantizationConfig {
  std::string quant_method;      // "" (none), "mxfp8", "compressed-tensors", "modelopt", ...
  std::string moe_quant_algo;    // "NVFP4" for M3.1-Flash, else ""
  std::string raw_json;          // the whole block, for diagnostics
};

struct MiniMaxM3Config {
  std::string model_type;        // "minimax_m3_vl" (wrapper) or the text model's type
  int64_t hidden_size = 6144;
  int64_t num_hidden_layers = 60;
  int64_t num_attention_heads = 64;
  int64_t num_key_value_heads = 4;
  int64_t head_dim = 128;
  int64_t vocab_size = 200064;
  int64_t max_position_embeddings = 524288;
  double rope_theta = 5e6;
  int64_t rotary_dim = 64;       // rotated dims per head (partial RoPE, half-split)
  double rms_norm_eps = 1e-6;

  // MLP / MoE
  int64_t intermediate_size = 3072;         // per routed expert
  int64_t shared_intermediate_size = 3072;  // shared expert (0 = none)
  int64_t dense_intermediate_size = 12288;  // dense-MLP layers
  int64_t num_local_experts = 128;
  int64_t num_experts_per_tok = 4;
  int64_t n_shared_experts = 1;
  double routed_scaling_factor = 2.0;
  bool use_routing_bias = true;
  double swiglu_alpha = 1.702;
  double swiglu_limit = 7.0;

  // Sparse attention (MSA indexer)
  int64_t index_n_heads = 4;
  int64_t index_head_dim = 128;
  int64_t index_block_size = 128;   // tokens per block == KV page size
  int64_t index_topk_blocks = 16;   // forced blocks count toward this
  int64_t index_local_blocks = 1;   // blocks b_q, b_q-1, ... forced
  int64_t index_init_blocks = 0;    // blocks 0..n-1 forced (legacy sparse_init_block)

  std::vector<AttentionKind> layer_types;   // size num_hidden_layers
  std::vector<MlpKind> mlp_layer_types;     // size num_hidden_layers

  bool tie_word_embeddings = false;
  int64_t bos_token_id = 200034;  // -1 when the file says null
  std::vector<int64_t> eos_token_ids = {200020};  // int or list in the file; empty when null

  // Top-level wrapper fields.
  bool is_multimodal_wrapper = false;  // config.json had text_config
  int64_t image_token_index = 200025;
  int64_t video_token_index = 200026;
  QuantizationConfig quantization;

  // Where the values came from, for messages: the file, and "text_config." when the text fields
  // sat inside the multimodal wrapper ("" for a bare text config).
  std::string source = "config.json";
  std::string field_prefix;

  bool is_sparse_layer(int64_t i) const { return layer_types.at(size_t(i)) == AttentionKind::kSparse; }
  bool is_moe_layer(int64_t i) const { return mlp_layer_types.at(size_t(i)) == MlpKind::kMoe; }

  // Checks internal consistency (sizes, divisibility, list lengths). The message names the field.
  Status validate() const;
};

// Parse config.json text. `source` names the file in error messages.
Result<MiniMaxM3Config> parse_minimax_m3_config(const std::string& json_text, const std::string& source);
// Read and parse <model_dir>/config.json.
Result<MiniMaxM3Config> load_minimax_m3_config(const std::string& model_dir);

}  // namespace m3
