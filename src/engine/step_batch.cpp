#include "engine/step_batch.h"

#include <string>

namespace m3 {

std::vector<minimax_m3::SequenceInput> step_batch(const StepPlan& plan) {
  std::vector<minimax_m3::SequenceInput> batch(plan.seqs.size());
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const SeqSlice& s = plan.seqs[i];
    batch[i].tokens = s.token_ids;
    batch[i].start_pos = s.start_pos;
    batch[i].block_table = s.block_table;
    if (s.need_logits) batch[i].logits_rows = {s.num_tokens() - 1};
  }
  return batch;
}

Status gather_step_logits(const StepPlan& plan, const minimax_m3::ForwardOutput& fo, int32_t vocab,
                          const char* who, LogitsOut& out) {
  out.vocab_size = vocab;
  out.data.clear();
  out.data.reserve(static_cast<size_t>(plan.num_logits()) * vocab);
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    if (!plan.seqs[i].need_logits) continue;
    if (i >= fo.logits.size() || fo.logits[i].size() != static_cast<size_t>(vocab)) {
      return internal_error(std::string("[") + who + "] sequence " + std::to_string(i) + " got " +
                            std::to_string(i < fo.logits.size() ? fo.logits[i].size() : 0) +
                            " logits, expected " + std::to_string(vocab));
    }
    out.data.insert(out.data.end(), fo.logits[i].begin(), fo.logits[i].end());
  }
  return Status::ok();
}

}  // namespace m3
