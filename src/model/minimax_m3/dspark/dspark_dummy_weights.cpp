#include "model/minimax_m3/dspark/dspark_dummy_weights.h"

#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "model/minimax_m3/dspark/dspark_weights.h"
#include "quant/mxfp8.h"

namespace m3::minimax_m3::dspark {
namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t name_hash(const std::string& name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Element i: approximately N(0, sigma²), the sum of four 16-bit uniforms of one hash (variance
// 4/12 of the unit range), so any element is drawn on its own.
float normal_at(uint64_t seed, float sigma, int64_t i) {
  const float k = sigma * std::sqrt(3.0f) / 65536.0f;
  const uint64_t h = splitmix(seed ^ splitmix(static_cast<uint64_t>(i)));
  const int32_t s = static_cast<int32_t>(h & 0xFFFF) + static_cast<int32_t>((h >> 16) & 0xFFFF) +
                    static_cast<int32_t>((h >> 32) & 0xFFFF) + static_cast<int32_t>(h >> 48) -
                    2 * 65535;
  return static_cast<float>(s) * k;
}

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
  const uint64_t seed = splitmix(seed_) ^ name_hash(name);
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = normal_at(seed, sigma, i);
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
