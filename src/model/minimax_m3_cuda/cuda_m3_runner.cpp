#include "model/minimax_m3_cuda/cuda_m3_runner.h"

#include <string>
#include <vector>

#include "kv/kv_budget.h"
#include "model/minimax_m3_cuda/fit_check.h"

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

int32_t CudaM3ModelRunner::vocab_size() const {
  return static_cast<int32_t>(model_->config().vocab_size);
}
int32_t CudaM3ModelRunner::num_kv_pages() const {
  return static_cast<int32_t>(model_->num_kv_pages());
}
int32_t CudaM3ModelRunner::page_size() const {
  return static_cast<int32_t>(model_->page_size());
}

Status CudaM3ModelRunner::forward(const StepPlan& plan, LogitsOut& out) {
  std::vector<minimax_m3::SequenceInput> batch(plan.seqs.size());
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const SeqSlice& s = plan.seqs[i];
    batch[i].tokens = s.token_ids;
    batch[i].start_pos = s.start_pos;
    batch[i].block_table = s.block_table;
    if (s.need_logits) batch[i].logits_rows = {s.num_tokens() - 1};
  }
  minimax_m3::ForwardOutput fo;
  M3_RETURN_IF_ERROR(model_->forward(batch, &fo));
  const int32_t v = vocab_size();
  out.vocab_size = v;
  out.data.clear();
  out.data.reserve(static_cast<size_t>(plan.num_logits()) * v);
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    if (!plan.seqs[i].need_logits) continue;
    if (fo.logits[i].size() != static_cast<size_t>(v))
      return internal_error("[model.minimax_m3_cuda.runner] sequence " + std::to_string(i) +
                            " got " + std::to_string(fo.logits[i].size()) + " logits, expected " +
                            std::to_string(v));
    out.data.insert(out.data.end(), fo.logits[i].begin(), fo.logits[i].end());
  }
  return Status::ok();
}

}  // namespace m3
