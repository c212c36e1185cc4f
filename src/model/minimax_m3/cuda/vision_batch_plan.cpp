#include "model/minimax_m3/cuda/vision_batch_plan.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace m3 {

namespace {

int64_t round_up8(int64_t v) { return (v + 7) / 8 * 8; }

Status need_multiple_of_8(const char* field, int64_t v) {
  if (v > 0 && v % 8 == 0) return Status::ok();
  return invalid_argument(std::string("[vision.cuda] ") + field + " = " + std::to_string(v) +
                          " must be a positive multiple of 8 for the GPU tower (bf16 GEMM rows "
                          "of 16 bytes)");
}

}  // namespace

Status check_cuda_vision_config(const VisionConfig& c) {
  M3_RETURN_IF_ERROR(c.validate());
  if (c.num_attention_heads < 1 || c.hidden_size % c.num_attention_heads != 0) {
    return invalid_argument("[vision.cuda] hidden_size " + std::to_string(c.hidden_size) +
                            " is not a multiple of num_attention_heads " +
                            std::to_string(c.num_attention_heads));
  }
  M3_RETURN_IF_ERROR(need_multiple_of_8("vision_config.head_dim", c.head_dim()));
  M3_RETURN_IF_ERROR(need_multiple_of_8("vision_config.hidden_size", c.hidden_size));
  M3_RETURN_IF_ERROR(need_multiple_of_8("vision_config.intermediate_size", c.intermediate_size));
  M3_RETURN_IF_ERROR(need_multiple_of_8("patch values (channels x temporal x patch^2)",
                                        c.patch_values()));
  M3_RETURN_IF_ERROR(need_multiple_of_8("projector_hidden_size", c.projector_hidden_size));
  M3_RETURN_IF_ERROR(need_multiple_of_8("text_hidden_size", c.text_hidden_size));
  if (3 * c.rope_axis_dims() > c.head_dim()) {
    return invalid_argument("[vision.cuda] 3-D RoPE needs 3 x " +
                            std::to_string(c.rope_axis_dims()) + " dims of a head of " +
                            std::to_string(c.head_dim()));
  }
  return Status::ok();
}

Result<VisionBatchPlan> plan_vision_batch(const VisionConfig& c,
                                          std::span<const VisionImageGrid> grids) {
  if (grids.empty()) return invalid_argument("[vision.cuda] no images to encode");
  const int64_t M = c.spatial_merge_size, heads = c.num_attention_heads, D = c.head_dim();
  VisionBatchPlan p;
  for (size_t i = 0; i < grids.size(); ++i) {
    const VisionImageGrid& g = grids[i];
    if (g.t < 1 || g.h < 1 || g.w < 1 || g.h % M != 0 || g.w % M != 0) {
      return invalid_argument("[vision.cuda] image " + std::to_string(i) + ": grid (" +
                              std::to_string(g.t) + ", " + std::to_string(g.h) + ", " +
                              std::to_string(g.w) + ") is not whole merge windows of " +
                              std::to_string(M));
    }
    VisionBatchImage im;
    im.patch_start = p.total_patches;
    im.patches = g.patches();
    im.keys_padded = round_up8(im.patches);
    im.kv_offset = p.kv_elements;
    im.output_start = p.total_outputs;
    im.outputs = im.patches / (M * M);
    p.total_patches += im.patches;
    p.total_outputs += im.outputs;
    p.kv_elements += heads * im.keys_padded * D;
    p.max_patches = std::max(p.max_patches, im.patches);
    p.max_keys_padded = std::max(p.max_keys_padded, im.keys_padded);
    p.images.push_back(im);
  }
  // Positions and RoPE tables: the CPU tower's arithmetic (vision_tower.cpp), in float32.
  const int64_t axis = c.rope_axis_dims(), freqs = axis / 2;
  p.rope_half = 3 * freqs;
  p.patch_image.resize(size_t(p.total_patches));
  p.rope_cos.resize(size_t(p.total_patches * p.rope_half));
  p.rope_sin.resize(size_t(p.total_patches * p.rope_half));
  for (size_t i = 0; i < grids.size(); ++i) {
    const VisionImageGrid& g = grids[i];
    const VisionBatchImage& im = p.images[i];
    const int64_t windows_w = g.w / M, per_frame = int64_t(g.h) * g.w;
    for (int64_t q = 0; q < im.patches; ++q) {
      const int64_t in_frame = q % per_frame;
      const int64_t window = in_frame / (M * M), within = in_frame % (M * M);
      const int64_t pos[3] = {q / per_frame, (window / windows_w) * M + within / M,
                              (window % windows_w) * M + within % M};
      const int64_t row = im.patch_start + q;
      p.patch_image[size_t(row)] = int32_t(i);
      for (int64_t a = 0; a < 3; ++a) {
        for (int64_t j = 0; j < freqs; ++j) {
          const float inv_freq = float(1) / std::pow(float(c.rope_theta), float(2 * j) / float(axis));
          const float angle = float(pos[a]) * inv_freq;
          p.rope_cos[size_t(row * p.rope_half + a * freqs + j)] = std::cos(angle);
          p.rope_sin[size_t(row * p.rope_half + a * freqs + j)] = std::sin(angle);
        }
      }
    }
  }
  return p;
}

VisionFlops vision_tower_flops(const VisionConfig& c, std::span<const VisionImageGrid> grids) {
  const double H = double(c.hidden_size), F = double(c.intermediate_size);
  const double P = double(c.projector_hidden_size), T = double(c.text_hidden_size);
  const double merge = double(c.spatial_merge_size * c.spatial_merge_size);
  VisionFlops f;
  for (const VisionImageGrid& g : grids) {
    const double n = double(g.patches()), keys = double(round_up8(g.patches()));
    const double per_layer = 2.0 * n * (3.0 * H * H + H * H + 2.0 * H * F);
    f.linear += 2.0 * n * double(c.patch_values()) * H + double(c.num_hidden_layers) * per_layer +
                2.0 * n * (H * P + P * P) + 2.0 * (n / merge) * (merge * P * T + T * T);
    f.attention += double(c.num_hidden_layers) * 2.0 * 2.0 * n * keys * H;
  }
  return f;
}

}  // namespace m3
