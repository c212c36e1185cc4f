// The MiniMax-M3 vision tower and projector on the CPU in float32 (m3-architecture.md §6;
// docs/vision.md): pre-processed patches of one image -> one embedding per 2x2 merge window,
// in the text model's hidden size, for the image-token positions of the prompt.
//
//   x = patches · W_patch^T                         (the Conv3d as a linear, no bias)
//   x = LayerNorm_pre(x)
//   num_hidden_layers x { x += out_proj(Attn(RoPE3d(q), RoPE3d(k), v)) of LN1(x);
//                         x += fc2(GELU(fc1(LN2(x)))) }
//   y = linear_2(GELU(linear_1(x)))                 per patch
//   out = merge_linear_2(GELU(merge_linear_1(concat of the 4 patches of a merge window)))
//
// Attention is bidirectional over the image's patches, scale 1/sqrt(head_dim). 3-D RoPE: each
// axis (t, h, w) rotates rope_axis_dims() dims with inv_freq_j = theta^(-2j / axis_dims); the
// angles [t·f ; h·f ; w·f] are duplicated and applied half-split (rotate_half) over the first
// 3 * axis_dims dims of each head, the rest pass through. h, w are the patch's row and column.
//
// The same arithmetic is instantiated in double precision (encode_reference) so tests can bound
// the float32 path's rounding.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "loader/vision_config.h"
#include "loader/weight_source.h"

namespace m3 {

struct VisionLinear {
  int64_t out = 0, in = 0;
  std::vector<float> weight;  // [out, in]
  std::vector<float> bias;    // [out], empty when the layer has none
};

struct VisionLayerWeights {
  std::vector<float> ln1_weight, ln1_bias, ln2_weight, ln2_bias;
  VisionLinear q, k, v, out, fc1, fc2;
};

struct VisionWeights {
  VisionLinear patch_embed;  // [hidden, patch_values], no bias
  std::vector<float> pre_ln_weight, pre_ln_bias;
  std::vector<VisionLayerWeights> layers;
  VisionLinear proj1, proj2, merge1, merge2;
};

// The checkpoint names (HF naming, m3-architecture.md §4.2), under `prefix` ("" for the names as
// released). The patch embedding is [hidden, channels, temporal, patch, patch] in the checkpoint.
std::vector<std::string> vision_weight_names(const VisionConfig& c, const std::string& prefix = "");
// The prefix under which `source` holds the vision weights ("" or e.g. "model."), found from the
// pre-LayerNorm's name; not_found when the checkpoint has no vision tower.
Result<std::string> find_vision_prefix(const WeightSource& source);
Result<VisionWeights> load_vision_weights(const WeightSource& source, const VisionConfig& c);

class VisionTower {
 public:
  // `backend`, when given (a CPU backend), runs the float32 matmuls on its threads; else a plain
  // loop. Either way each output element is one float32 dot product.
  VisionTower(VisionConfig config, VisionWeights weights, Backend* backend = nullptr);

  const VisionConfig& config() const { return config_; }
  // Output rows for a grid (one per merge window).
  int64_t num_outputs(int32_t grid_t, int32_t grid_h, int32_t grid_w) const;

  // patches: [grid_t * grid_h * grid_w, patch_values] in merge-window order.
  // Returns [num_outputs, text_hidden_size].
  Result<std::vector<float>> encode(std::span<const float> patches, int32_t grid_t,
                                    int32_t grid_h, int32_t grid_w) const;
  // encode() plus the tower's last hidden state before the projector ([patches, hidden], merge-
  // window order), which the reference golden checks separately.
  struct Stages {
    std::vector<float> tower;
    std::vector<float> output;
  };
  Result<Stages> encode_stages(std::span<const float> patches, int32_t grid_t, int32_t grid_h,
                               int32_t grid_w) const;
  // The same computation in double precision (weights widened from float32), for tests.
  Result<std::vector<double>> encode_reference(std::span<const float> patches, int32_t grid_t,
                                               int32_t grid_h, int32_t grid_w) const;

 private:
  Status check(std::span<const float> patches, int32_t grid_t, int32_t grid_h,
               int32_t grid_w) const;
  template <typename T>
  std::vector<T> forward(std::span<const float> patches, int32_t grid_t, int32_t grid_h,
                         int32_t grid_w, std::vector<T>* tower_out = nullptr) const;
  template <typename T>
  void linear(const std::vector<T>& x, int64_t rows, const VisionLinear& l, std::vector<T>& y) const;

  VisionConfig config_;
  VisionWeights w_;
  Backend* backend_ = nullptr;
};

}  // namespace m3
