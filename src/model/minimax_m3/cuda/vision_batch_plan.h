// Host-side plan of one vision-tower call on the GPU (CudaVisionTower): several images run
// through the tower's linears together (their patches concatenated), while attention stays
// within each image. The plan fixes where each image's patches, keys and outputs live and holds
// the 3-D RoPE tables, computed on the host with the CPU tower's float32 arithmetic
// (vision_tower.h) so that both paths rotate by the same angles. No CUDA here: unit-tested on the
// CPU (tests/model_cuda/vision_batch_plan_test.cpp).
//
// Key layout per image (cuBLASLt takes row-major bf16 [N, K] weights with K a multiple of 8):
//   K   [heads, keys_padded, head_dim]   (the "weight" of S = Q · K^T)
//   V^T [heads, head_dim, keys_padded]   (the "weight" of O = P · V)
// keys_padded = patches rounded up to 8; the padding keys are zero and their probabilities are
// written as zero, so they change nothing.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "loader/vision_config.h"

namespace m3 {

struct VisionImageGrid {
  int32_t t = 1, h = 0, w = 0;  // patches along time, rows, columns
  int64_t patches() const { return int64_t(t) * h * w; }
};

struct VisionBatchImage {
  int64_t patch_start = 0, patches = 0;  // rows of the concatenated patch matrix
  int64_t keys_padded = 0;               // patches rounded up to a multiple of 8
  int64_t kv_offset = 0;                 // elements into the K and V^T buffers
  int64_t output_start = 0, outputs = 0;  // rows of the embeddings (one per merge window)
};

struct VisionBatchPlan {
  std::vector<VisionBatchImage> images;
  int64_t total_patches = 0, total_outputs = 0;
  int64_t kv_elements = 0;  // of each of K and V^T, all images
  int64_t max_patches = 0, max_keys_padded = 0;
  std::vector<int32_t> patch_image;  // [total_patches]: the image of each patch
  // [total_patches, rope_half]: cos / sin of the angles [t·f ; h·f ; w·f] (rope_half = 3·axis/2).
  int64_t rope_half = 0;
  std::vector<float> rope_cos, rope_sin;
};

// Whether the GPU tower takes this config: head_dim and every GEMM's K a multiple of 8 (bf16
// rows of 16 bytes for cuBLASLt), the RoPE dims inside the head. The error names the field.
Status check_cuda_vision_config(const VisionConfig& c);

// invalid_argument for an empty batch or a grid that is not whole merge windows.
Result<VisionBatchPlan> plan_vision_batch(const VisionConfig& c,
                                          std::span<const VisionImageGrid> grids);

// Multiply-adds x 2 of one tower call as executed on the GPU: the linears (patch embedding,
// q|k|v, out, fc1, fc2, projector, merge MLP) and attention (Q·K^T and P·V over the padded keys).
struct VisionFlops {
  double linear = 0, attention = 0;
  double total() const { return linear + attention; }
};
VisionFlops vision_tower_flops(const VisionConfig& c, std::span<const VisionImageGrid> grids);

}  // namespace m3
