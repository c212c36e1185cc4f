#include "model/minimax_m3/cpu_model_runner.h"

#include <string>
#include <vector>

#include "kv/kv_budget.h"

namespace m3 {

int64_t MiniMaxM3ModelRunner::bytes_per_page(Backend* backend, const MiniMaxM3Config& cfg,
                                             KvCacheDtype kv_dtype) {
  // Ask the cache itself (one page) rather than re-deriving its storage layout here.
  minimax_m3::PagedKvCache probe(backend, cfg, 1, kv_dtype);
  return probe.bytes_per_page();
}

Result<std::unique_ptr<MiniMaxM3ModelRunner>> MiniMaxM3ModelRunner::create(
    std::unique_ptr<Backend> backend, std::unique_ptr<minimax_m3::Model> model,
    int64_t kv_cache_bytes, KvCacheDtype kv_dtype) {
  if (!backend || !model) return invalid_argument("[model.minimax_m3.cpu_model_runner] null backend/model");
  const int64_t page_bytes = bytes_per_page(backend.get(), model->config(), kv_dtype);
  M3_ASSIGN_OR_RETURN(int32_t pages, kv_pages_for_budget(kv_cache_bytes, page_bytes));
  return create_with_pages(std::move(backend), std::move(model), pages, kv_dtype);
}

Result<std::unique_ptr<MiniMaxM3ModelRunner>> MiniMaxM3ModelRunner::create_with_pages(
    std::unique_ptr<Backend> backend, std::unique_ptr<minimax_m3::Model> model,
    int32_t num_pages, KvCacheDtype kv_dtype) {
  if (!backend || !model) return invalid_argument("[model.minimax_m3.cpu_model_runner] null backend/model");
  if (model->backend() != backend.get()) {
    return invalid_argument("[model.minimax_m3.cpu_model_runner] the model was loaded on another backend");
  }
  if (num_pages <= 0) {
    return invalid_argument("[model.minimax_m3.cpu_model_runner] KV cache of " + std::to_string(num_pages) +
                            " pages");
  }
  std::unique_ptr<MiniMaxM3ModelRunner> r(new MiniMaxM3ModelRunner());
  r->cache_ = std::make_unique<minimax_m3::PagedKvCache>(backend.get(), model->config(), num_pages,
                                                         kv_dtype);
  r->copier_ = std::make_unique<minimax_m3::PagedKvCacheCopier>(r->cache_.get());
  r->backend_ = std::move(backend);
  r->model_ = std::move(model);
  return r;
}

int32_t MiniMaxM3ModelRunner::vocab_size() const {
  return static_cast<int32_t>(model_->config().vocab_size);
}
int32_t MiniMaxM3ModelRunner::hidden_size() const {
  return static_cast<int32_t>(model_->config().hidden_size);
}
int32_t MiniMaxM3ModelRunner::num_kv_pages() const {
  return static_cast<int32_t>(cache_->num_pages());
}
int32_t MiniMaxM3ModelRunner::page_size() const {
  return static_cast<int32_t>(cache_->page_size());
}

Status MiniMaxM3ModelRunner::forward(const ModelStep& step, ModelOutput& out) {
  return model_->forward(step.slices, cache_.get(), &out, step.capture_layers);
}

}  // namespace m3
