// The engine's ModelRunner (model/model.h) over the float32 MiniMax-M3 model on any Backend
// (model.h in this folder) and its paged KV cache. The page ids the scheduler hands out index
// the PagedKvCache directly, so the cache must have at least as many pages as the engine's pool.
// Honours input embeddings and hidden-state capture; samples nothing itself.
// On the CPU backend a sequence's logits do not depend on the rest of the batch (the model's
// contract), which the engine tests check end to end.
#pragma once

#include <cstdint>
#include <memory>

#include "backend/backend.h"
#include "model/model.h"
#include "model/minimax_m3/kv_cache.h"
#include "model/minimax_m3/model.h"
#include "model/minimax_m3/paged_kv_copier.h"

namespace m3 {

class MiniMaxM3ModelRunner final : public ModelRunner {
 public:
  // Takes ownership of everything; `model` must have been loaded onto `backend`. The KV cache
  // gets as many pages as fit in kv_cache_bytes (invalid argument if not even one).
  static Result<std::unique_ptr<MiniMaxM3ModelRunner>> create(
      std::unique_ptr<Backend> backend, std::unique_ptr<minimax_m3::Model> model,
      int64_t kv_cache_bytes, KvCacheDtype kv_dtype = KvCacheDtype::kFloat32);
  // Same, with the page count given directly (tests).
  static Result<std::unique_ptr<MiniMaxM3ModelRunner>> create_with_pages(
      std::unique_ptr<Backend> backend, std::unique_ptr<minimax_m3::Model> model,
      int32_t num_pages, KvCacheDtype kv_dtype = KvCacheDtype::kFloat32);
  // Bytes one KV page of this model takes in the backend's storage in `kv_dtype`.
  static int64_t bytes_per_page(Backend* backend, const MiniMaxM3Config& cfg,
                                KvCacheDtype kv_dtype = KvCacheDtype::kFloat32);

  int32_t vocab_size() const override;
  int32_t hidden_size() const override;
  int32_t num_kv_pages() const override;
  int32_t page_size() const override;
  ModelFeatures features() const override { return {true, true}; }
  Status forward(const ModelStep& step, ModelOutput& out) override;
  KvPageCopier* kv_page_copier() override { return copier_.get(); }

  minimax_m3::Model& model() { return *model_; }
  Backend* backend() { return backend_.get(); }
  // The KV cache (tests compare it with a fresh prefill's).
  minimax_m3::PagedKvCache& kv_cache() { return *cache_; }

 private:
  MiniMaxM3ModelRunner() = default;

  // Destruction order: cache and model release backend memory before the backend goes.
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<minimax_m3::Model> model_;
  std::unique_ptr<minimax_m3::PagedKvCache> cache_;
  std::unique_ptr<minimax_m3::PagedKvCacheCopier> copier_;
};

}  // namespace m3
