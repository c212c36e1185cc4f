// The MiniMax-M3 vision tower and projector on the GPU (docs/vision.md, "On the GPU"): the CPU
// tower's computation (vision_tower.h) with bf16 weights and bf16 GEMM inputs, float32
// accumulation (cuBLASLt through PrefillGemm), a float32 residual stream, float32 LayerNorm,
// softmax and RoPE. Several images run in one call: the linears over all their patches at once,
// attention within each image (two GEMMs per image and head with the softmax between them;
// vision_batch_plan.h has the layouts).
//
// Weights come from the same VisionWeights the CPU tower loads (the checkpoint's tensors, or the
// dummy ones); q|k|v are concatenated into one [3H, H] matrix so each layer runs one GEMM for them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/status.h"
#include "loader/vision_config.h"
#include "model/minimax_m3/cuda/vision_batch_plan.h"
#include "model/minimax_m3/vision_tower.h"

namespace m3 {

struct CudaVisionImage {
  std::span<const float> patches;  // [grid.patches(), patch_values] in merge-window order
  VisionImageGrid grid;
};

class CudaVisionTower {
 public:
  // Uploads `weights` (bf16 matrices, float32 norms and biases) to the current device.
  static Result<std::unique_ptr<CudaVisionTower>> create(const VisionConfig& config,
                                                         const VisionWeights& weights);
  ~CudaVisionTower();
  CudaVisionTower(const CudaVisionTower&) = delete;
  CudaVisionTower& operator=(const CudaVisionTower&) = delete;

  const VisionConfig& config() const;
  int64_t weight_bytes() const;

  // One [outputs, text_hidden_size] float32 matrix per image (outputs = patches / merge²), the
  // embeddings of the image's placeholder tokens. Synchronous; not thread-safe.
  Result<std::vector<std::vector<float>>> encode(std::span<const CudaVisionImage> images);

  struct Impl;

 private:
  CudaVisionTower() = default;
  std::unique_ptr<Impl> impl_;
};

}  // namespace m3
