// Random DSpark draft weights in the released checkpoint's storage formats, for a draft config
// without a checkpoint (the draft's counterpart of `--load-format dummy`, DummyWeightSource):
// attention and MLP linears MXFP8 (BF16 where a row does not split into 32-element blocks), fc,
// norms, Markov and confidence heads BF16. Each value is drawn from N(0, 0.02²) (norm offsets
// N(0, 0.01²)), quantised and dequantised, so the float32 weights are exactly what a real
// checkpoint in those formats would load as. Values depend only on the seed, the tensor name and
// the element index: the same seed gives the same draft at any shape.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loader/weight_source.h"
#include "model/minimax_m3/dspark/dspark_config.h"

namespace m3::minimax_m3::dspark {

class DummyDSparkWeightSource final : public WeightSource {
 public:
  explicit DummyDSparkWeightSource(const DSparkConfig& cfg, uint64_t seed = 0,
                                   const std::string& prefix = "language_model.model.dspark.");
  bool has(const std::string& name) const override;
  Result<WeightFormat> format(const std::string& name) const override;
  Result<HostTensorF32> load_f32(const std::string& name,
                                 const std::vector<int64_t>& expected_shape) const override;
  std::vector<std::string> names() const override { return names_; }

 private:
  uint64_t seed_;
  std::vector<std::string> names_;  // sorted
};

}  // namespace m3::minimax_m3::dspark
