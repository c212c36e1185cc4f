// The DSpark speculative draft's hyper-parameters, parsed from `dspark/config.json` of a
// MiniMax-M3.1-Flash checkpoint (docs/dspark.md, "Configuration"). The draft is a small dense
// decoder (sliding-window GQA, SwiGLU-OAI MLP) that reads fused target hidden states and predicts a
// block of tokens at once, plus a low-rank "Markov" logit correction between consecutive drafts.
//
// Parsing checks the file on its own; resolve_with_target() then checks it against the target
// model it drafts for (shared hidden size and vocabulary, target layer ids) and fills the RoPE
// fields the draft file leaves out from the target's. Every message names the file and the field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "loader/model_config.h"

namespace m3::minimax_m3::dspark {

// Which target hidden state feeds the draft for the LAST target layer in
// dspark_target_layer_ids (every other listed layer is its decoder output, the residual stream).
//  * kLayerOutput: the residual stream after that layer, before the final norm (SGLang, vLLM,
//    DeepSpec).
//  * kFinalNormLast: the target's final-norm output (NeMo's trainer, HF hidden_states[-1]).
// Which one the released M3.1-Flash draft was trained with is not published.
enum class CaptureConvention { kLayerOutput, kFinalNormLast };

const char* capture_convention_name(CaptureConvention c);

struct DSparkConfig {
  int64_t num_hidden_layers = 5;
  int64_t hidden_size = 6144;
  int64_t num_attention_heads = 64;
  int64_t num_key_value_heads = 4;
  int64_t head_dim = 128;
  int64_t vocab_size = 200064;
  int64_t intermediate_size = 12288;  // dspark_ffn_hidden_size / dense_intermediate_size
  double swiglu_alpha = 1.702;
  double swiglu_limit = 7.0;
  double rms_norm_eps = 1e-6;
  bool use_gemma_norm = true;  // RMSNorm scales by (1 + w); false: by w

  int64_t sliding_window = 4096;  // every layer is "sliding_attention"

  int64_t block_size = 7;           // dspark_block_size: query slots (anchor + noise)
  int64_t noise_token_id = 200058;  // dspark_noise_token_id
  std::vector<int64_t> target_layer_ids = {3, 17, 31, 45, 59};
  int64_t markov_rank = 256;  // dspark_markov_rank; only "vanilla" heads
  bool enable_confidence_head = true;
  bool confidence_head_with_markov = true;

  // RoPE (half-split, partial): unset when the file says nothing; resolve_with_target() then
  // takes the target's.
  std::optional<double> rope_theta;
  std::optional<int64_t> rotary_dim;

  std::string quant_method;  // "" or "mxfp8" (informational: formats are detected per tensor)
  CaptureConvention capture = CaptureConvention::kLayerOutput;  // dspark_target_hidden_convention

  std::string source = "dspark/config.json";  // for messages

  // Width of the fused target features: one hidden state per target layer id.
  int64_t feature_width() const { return hidden_size * int64_t(target_layer_ids.size()); }
  double theta() const { return rope_theta.value_or(0.0); }
  int64_t rot_dim() const { return rotary_dim.value_or(0); }

  // Internal consistency (sizes, divisibility, ranges). Named by field.
  Status validate() const;
  // Checks the draft against `target` and fills unset RoPE fields from it.
  Status resolve_with_target(const MiniMaxM3Config& target);
};

// Parses dspark/config.json text; `source` names the file in messages.
Result<DSparkConfig> parse_dspark_config(const std::string& json_text, const std::string& source);
// Reads and parses <dspark_dir>/config.json.
Result<DSparkConfig> load_dspark_config(const std::string& dspark_dir);

}  // namespace m3::minimax_m3::dspark
