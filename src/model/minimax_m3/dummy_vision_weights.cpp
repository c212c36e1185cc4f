#include "model/minimax_m3/dummy_vision_weights.h"

#include <algorithm>

#include "core/dtype.h"
#include "model/minimax_m3/dummy_weights.h"
#include "model/minimax_m3/vision_tower.h"

namespace m3::minimax_m3 {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_layer_norm_weight(const std::string& name) {
  return ends_with(name, "layer_norm1.weight") || ends_with(name, "layer_norm2.weight") ||
         ends_with(name, "pre_layrnorm.weight");
}

}  // namespace

DummyVisionWeightSource::DummyVisionWeightSource(const VisionConfig& c, float sigma,
                                                 bool bf16_values)
    : names_(vision_weight_names(c)), sigma_(sigma), bf16_(bf16_values) {
  std::sort(names_.begin(), names_.end());
}

bool DummyVisionWeightSource::has(const std::string& name) const {
  return std::binary_search(names_.begin(), names_.end(), name);
}

Result<WeightFormat> DummyVisionWeightSource::format(const std::string& name) const {
  if (!has(name)) return not_found("[dummy vision weights] no tensor '" + name + "'");
  return bf16_ ? WeightFormat::kBF16 : WeightFormat::kF32;
}

Result<HostTensorF32> DummyVisionWeightSource::load_f32(
    const std::string& name, const std::vector<int64_t>& expected_shape) const {
  if (!has(name)) return not_found("[dummy vision weights] no tensor '" + name + "'");
  HostTensorF32 t;
  t.shape = expected_shape;
  const int64_t n = t.numel();
  t.data.resize(size_t(n));
  const uint64_t seed = dummy_name_seed(name);
  const float offset = is_layer_norm_weight(name) ? 1.0f : 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = offset + dummy_normal_at(seed, sigma_, i);
    t.data[size_t(i)] = bf16_ ? bf16_to_f32(f32_to_bf16(v)) : v;
  }
  return t;
}

}  // namespace m3::minimax_m3
