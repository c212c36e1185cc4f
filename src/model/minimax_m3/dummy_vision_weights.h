// Random vision-tower weights under the checkpoint's names (vision_weight_names) for a
// VisionConfig, without a checkpoint: the GPU tower's tests and benchmark at the real shapes.
// Matrices and biases are the dummy draw N(0, sigma²) (dummy_weights.h: a value depends only on
// the tensor's name and the element's index); LayerNorm weights are 1 + that draw, so the norms
// keep the activations' scale. With `bf16_values` every value is rounded to bf16 (what the
// released checkpoint stores); without, they stay float32 (tests of the bf16 rounding itself).
#pragma once

#include <string>
#include <vector>

#include "loader/vision_config.h"
#include "loader/weight_source.h"

namespace m3::minimax_m3 {

class DummyVisionWeightSource final : public WeightSource {
 public:
  explicit DummyVisionWeightSource(const VisionConfig& c, float sigma = 0.02f,
                                   bool bf16_values = true);
  bool has(const std::string& name) const override;
  Result<WeightFormat> format(const std::string& name) const override;
  Result<HostTensorF32> load_f32(const std::string& name,
                                 const std::vector<int64_t>& expected_shape) const override;
  std::vector<std::string> names() const override { return names_; }

 private:
  std::vector<std::string> names_;  // sorted
  float sigma_;
  bool bf16_;
};

}  // namespace m3::minimax_m3
