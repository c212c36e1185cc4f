#include "model/minimax_m3_cuda/cuda_m3_generate.h"

#include <string>

namespace m3::minimax_m3 {
namespace {

// One sequence on pages 0, 1, ... of the model's cache.
class Sequence {
 public:
  explicit Sequence(CudaM3Model* m) : model_(m) {}

  Status reserve(int64_t n) {
    const int64_t pages = (n + model_->page_size() - 1) / model_->page_size();
    if (pages > model_->num_kv_pages())
      return Status(StatusCode::kResourceExhausted, "[model.minimax_m3_cuda] " + std::to_string(n) +
                                                        " positions need " + std::to_string(pages) +
                                                        " KV pages, the cache has " +
                                                        std::to_string(model_->num_kv_pages()));
    while (static_cast<int64_t>(table_.size()) < pages)
      table_.push_back(static_cast<int32_t>(table_.size()));
    return Status::ok();
  }

  // As SequenceRunner::append.
  Status append(std::span<const int32_t> tokens, int64_t chunk, bool all_logits,
                std::vector<float>* logits) {
    M3_RETURN_IF_ERROR(reserve(length_ + static_cast<int64_t>(tokens.size())));
    return append_in_chunks(
        [&](const SequenceInput& in, ForwardOutput* out) {
          return model_->forward(std::span<const SequenceInput>(&in, 1), out);
        },
        table_, tokens, chunk, all_logits, &length_, logits);
  }

 private:
  CudaM3Model* model_;
  std::vector<int32_t> table_;
  int64_t length_ = 0;
};

}  // namespace

Result<std::vector<float>> cuda_score(CudaM3Model* model, std::span<const int32_t> prompt,
                                      int64_t chunk) {
  if (prompt.empty()) return invalid_argument("[model.minimax_m3_cuda.score] empty prompt");
  Sequence seq(model);
  std::vector<float> logits;
  M3_RETURN_IF_ERROR(seq.append(prompt, chunk, true, &logits));
  return logits;
}

Result<std::vector<int32_t>> cuda_generate(CudaM3Model* model, std::span<const int32_t> prompt,
                                           const GenerateOptions& opts) {
  Sequence seq(model);
  return generate_on(seq, prompt, opts);
}

}  // namespace m3::minimax_m3
