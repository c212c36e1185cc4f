#include "model/minimax_m3/dspark/dspark_dummy_weights.h"

#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "model/minimax_m3/dspark/dspark_weights.h"
#include "model/minimax_m3/dummy_weights.h"
#include "quant/mxfp8.h"

namespace m3::minimax_m3::dspark {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

DummyDSparkWeightSource::DummyDSparkWeightSource(const DSparkConfig& cfg, uint64_t seed,
                                                 const std::string& prefix)
    : seed_(seed), names_(dspark_weight_names(cfg, prefix)) {}

bool DummyDSparkWeightSource::has(const std::string& name) const {
  return std::binary_search(names_.begin(), names_.end(), name);
}

Result<WeightFormat> DummyDSparkWeightSource::format(const std::string& name) const {
  if (!has(name)) return not_found("[dummy DSpark weights] no tensor '" + name + "'");
  return ends_with(name, "_proj.weight") ? WeightFormat::kMxfp8 : WeightFormat::kBF16;
}

Result<HostTensorF32> DummyDSparkWeightSource::load_f32(const std::string& name,
                                                        const std::vector<int64_t>& shape) const {
  M3_ASSIGN_OR_RETURN(WeightFormat f, format(name));
  HostTensorF32 t;
  t.shape = shape;
  const int64_t n = t.numel();
  const int64_t cols = shape.empty() ? 1 : shape.back();
  const int64_t rows = cols > 0 ? n / cols : 0;
  const float sigma = ends_with(name, "norm.weight") ? 0.01f : 0.02f;
  const uint64_t seed = dummy_splitmix(seed_) ^ dummy_name_seed(name);
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = dummy_normal_at(seed, sigma, i);
  t.data.resize(v.size());
  if (f == WeightFormat::kMxfp8 && shape.size() == 2 && cols % 32 == 0 && n > 0) {
    M3_ASSIGN_OR_RETURN(Mxfp8Tensor q, quantize_mxfp8(v.data(), rows, cols));
    M3_RETURN_IF_ERROR(
        dequantize_mxfp8(q.codes.data(), q.scales.data(), rows, cols, t.data.data()));
  } else {
    for (size_t i = 0; i < v.size(); ++i) t.data[i] = bf16_to_f32(f32_to_bf16(v[i]));
  }
  return t;
}

}  // namespace m3::minimax_m3::dspark
