// `--load-format dummy`: random weights in the real storage formats of MiniMax-M3.1-Flash, for
// a config.json or the built-in M3.1-Flash config, without a checkpoint. Every value is exactly
// representable in the format the real checkpoint uses for that tensor (the weight is drawn from
// N(0, 0.02²), quantised and dequantised): routed experts NVFP4 (compressed-tensors layout),
// attention / indexer / dense-MLP / shared-expert linears MXFP8, the routing bias float32,
// everything else BF16. Values depend only on the tensor name and the element's index (a hash
// seeds each tensor), so two runs load the same model, and a tensor- / expert-parallel rank
// generates only its slice (load_f32_window).
//
// This is the host variant: the weights go through the normal loader into any Backend (the
// float32 correctness path of CPU and CUDA). src/backend/cuda/dummy generates the same formats on
// the GPU for the real-shape kernels and the benchmarks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "core/status.h"
#include "loader/model_config.h"
#include "loader/weight_source.h"
#include "model/minimax_m3/model_dir.h"

namespace m3::minimax_m3 {

// MiniMax-M3.1-Flash text model (m3-architecture.md §1.2-1.3): 60 layers (or `num_layers`),
// every layer MSA sparse attention, layers 0-2 dense MLP and the rest MoE, init block 1.
MiniMaxM3Config builtin_m3_flash_config(int64_t num_layers = 60);

// The dummy weights' draw, shared by every dummy source (the target's and the DSpark draft's):
// element i of a tensor is approximately N(0, sigma²), a sum of four 16-bit uniforms (Irwin-Hall,
// variance 4/12) from a hash of (seed, i), so any element (a rank's window) is drawn alone; a
// tensor's seed is a hash of its name.
uint64_t dummy_splitmix(uint64_t x);
uint64_t dummy_name_seed(const std::string& name);
float dummy_normal_at(uint64_t seed, float sigma, int64_t i);

// MiniMax-M3 text model (§1.2-1.3): M3.1-Flash's shapes, but layers 0-2 full_attention (dense
// attention, no indexer; sparse_attention_freq [0,0,0] + [1]*57) and init block 0.
MiniMaxM3Config builtin_m3_config(int64_t num_layers = 60);

class DummyWeightSource final : public WeightSource {
 public:
  explicit DummyWeightSource(const MiniMaxM3Config& cfg);
  bool has(const std::string& name) const override;
  Result<WeightFormat> format(const std::string& name) const override;
  Result<HostTensorF32> load_f32(const std::string& name,
                                 const std::vector<int64_t>& expected_shape) const override;
  // Generates only the window's values: equal to the same window of load_f32 (NVFP4 tensors use
  // one global scale fixed by the draw's bound, not by their values), so a sharded dummy model
  // equals the unsharded one.
  Result<HostTensorF32> load_f32_window(const std::string& name,
                                        const std::vector<int64_t>& expected_shape,
                                        const WeightWindow& w) const override;
  // The same values in their stored formats (load_f32 is exactly their dequantisation).
  Result<RawWeight> load_raw(const std::string& name,
                             const std::vector<int64_t>& expected_shape) const override;
  std::vector<std::string> names() const override { return names_; }

 private:
  std::vector<std::string> names_;  // sorted
};

// Loads a model with dummy weights: the config from <dir>/config.json (and the stop tokens from
// generation_config.json) when `dir` is not empty, else builtin_m3_flash_config(); num_layers > 0
// keeps only the first num_layers layers.
Result<LoadedModel> load_dummy_model(const std::string& dir, int64_t num_layers,
                                     Backend* backend);

}  // namespace m3::minimax_m3
