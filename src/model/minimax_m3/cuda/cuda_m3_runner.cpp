#include "model/minimax_m3/cuda/cuda_m3_runner.h"

#include <string>
#include <vector>

#include "kv/kv_budget.h"
#include "model/minimax_m3/cuda/fit_check.h"

namespace m3 {

Result<std::unique_ptr<CudaM3ModelRunner>> CudaM3ModelRunner::create(
    const MiniMaxM3Config& cfg, const WeightSource& src, int64_t kv_cache_bytes,
    minimax_m3::CudaM3Options options) {
  // Fit first: the page arithmetic below assumes the real shapes.
  M3_RETURN_IF_ERROR(minimax_m3::check_real_shape_fit(cfg));
  M3_ASSIGN_OR_RETURN(
      int32_t pages,
      kv_pages_for_budget(kv_cache_bytes, minimax_m3::CudaM3Model::kv_bytes_per_page(cfg)));
  options.num_kv_pages = pages;
  M3_ASSIGN_OR_RETURN(std::unique_ptr<minimax_m3::CudaM3Model> model,
                      minimax_m3::CudaM3Model::load(cfg, src, options));
  return std::make_unique<CudaM3ModelRunner>(std::move(model));
}

Result<std::unique_ptr<CudaM3ModelRunner>> CudaM3ModelRunner::create_profiled(
    const MiniMaxM3Config& cfg, const WeightSource& src,
    std::function<Result<int64_t>(const minimax_m3::CudaMemoryProfile&)> pool_bytes,
    minimax_m3::CudaM3Options options) {
  M3_RETURN_IF_ERROR(minimax_m3::check_real_shape_fit(cfg));
  const int64_t page_bytes = minimax_m3::CudaM3Model::kv_bytes_per_page(cfg);
  options.num_kv_pages = 0;
  options.kv_pages_after_profile =
      [pool_bytes = std::move(pool_bytes),
       page_bytes](const minimax_m3::CudaMemoryProfile& p) -> Result<int64_t> {
    M3_ASSIGN_OR_RETURN(const int64_t bytes, pool_bytes(p));
    M3_ASSIGN_OR_RETURN(const int32_t pages, kv_pages_for_budget(bytes, page_bytes));
    return int64_t{pages};
  };
  M3_ASSIGN_OR_RETURN(std::unique_ptr<minimax_m3::CudaM3Model> model,
                      minimax_m3::CudaM3Model::load(cfg, src, options));
  return std::make_unique<CudaM3ModelRunner>(std::move(model));
}

int32_t CudaM3ModelRunner::vocab_size() const {
  return static_cast<int32_t>(model_->config().vocab_size);
}
int32_t CudaM3ModelRunner::num_kv_pages() const {
  return static_cast<int32_t>(model_->num_kv_pages());
}
int32_t CudaM3ModelRunner::page_size() const {
  return static_cast<int32_t>(model_->page_size());
}

int32_t CudaM3ModelRunner::hidden_size() const {
  return static_cast<int32_t>(model_->config().hidden_size);
}

Status CudaM3ModelRunner::forward(const ModelStep& step, ModelOutput& out) {
  if (!step.capture_layers.empty()) {
    return Status(StatusCode::kUnimplemented,
                  "[model.minimax_m3.cuda.runner] hidden-state capture is not available on the "
                  "CUDA path");
  }
  for (const ModelSlice& s : step.slices) {
    if (!s.embeddings.empty()) {
      return Status(StatusCode::kUnimplemented,
                    "[model.minimax_m3.cuda.runner] input embeddings are not available on the "
                    "CUDA path");
    }
  }
  return model_->forward(step.slices, &out);
}

}  // namespace m3
