// The engine's ModelRunner (model/model.h) over CudaM3Model (the real-shape CUDA path): the step's
// slices are CudaM3Model's batch, as for the float32 model's runner. The scheduler's page ids
// index the model's bf16 KV cache directly. Input embeddings and hidden-state capture are not
// available on this path yet (a step asking for them fails with kUnimplemented).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "model/model.h"
#include "model/minimax_m3/cuda/cuda_m3_model.h"

namespace m3 {

class CudaM3ModelRunner final : public ModelRunner {
 public:
  explicit CudaM3ModelRunner(std::unique_ptr<minimax_m3::CudaM3Model> model)
      : model_(std::move(model)) {}

  // Loads the model with as many KV pages as fit in kv_cache_bytes (options.num_kv_pages is
  // overwritten). invalid_argument from check_real_shape_fit when the config does not fit.
  static Result<std::unique_ptr<CudaM3ModelRunner>> create(const MiniMaxM3Config& cfg,
                                                           const WeightSource& src,
                                                           int64_t kv_cache_bytes,
                                                           minimax_m3::CudaM3Options options);
  // Loads the weights, runs the profile step (options.profile_tokens; CudaM3Options) and makes
  // the pool of `pool_bytes(profile)` bytes.
  static Result<std::unique_ptr<CudaM3ModelRunner>> create_profiled(
      const MiniMaxM3Config& cfg, const WeightSource& src,
      std::function<Result<int64_t>(const minimax_m3::CudaMemoryProfile&)> pool_bytes,
      minimax_m3::CudaM3Options options);

  int32_t vocab_size() const override;
  int32_t hidden_size() const override;
  int32_t num_kv_pages() const override;
  int32_t page_size() const override;
  // Decode rows the engine offers are sampled on the GPU after the head (only their token ids
  // are copied back); other rows, and the rows of a prefill step, return their logits.
  bool samples_on_device() const override { return true; }
  Status forward(const ModelStep& step, ModelOutput& out) override;

  minimax_m3::CudaM3Model& model() { return *model_; }

 private:
  std::unique_ptr<minimax_m3::CudaM3Model> model_;
};

}  // namespace m3
