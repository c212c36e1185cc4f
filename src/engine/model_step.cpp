#include "engine/model_step.h"

#include <string>

namespace m3 {

ModelStep model_step(const StepPlan& plan,
                     std::span<const std::optional<DeviceSampling>> sampling) {
  ModelStep step;
  std::vector<ModelSlice>& batch = step.slices;
  batch.resize(plan.seqs.size());
  size_t row = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const SeqSlice& s = plan.seqs[i];
    batch[i].tokens = s.token_ids;
    batch[i].start_pos = s.start_pos;
    batch[i].block_table = s.block_table;
    if (!s.need_logits) continue;
    batch[i].logits_rows = {s.num_tokens() - 1};
    if (row < sampling.size()) batch[i].sample = sampling[row];
    ++row;
  }
  return step;
}

Status gather_step_logits(const StepPlan& plan, const ModelOutput& fo, int32_t vocab,
                          LogitsOut& out) {
  const char* who = "engine";
  out.vocab_size = vocab;
  out.data.clear();
  out.tokens.clear();
  const bool sampled = !fo.tokens.empty();
  if (sampled && fo.tokens.size() != plan.seqs.size())
    return internal_error(std::string("[") + who + "] " + std::to_string(fo.tokens.size()) +
                          " sampled-token entries for " + std::to_string(plan.seqs.size()) +
                          " sequences");
  size_t kept = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i)
    if (plan.seqs[i].need_logits && !(sampled && fo.tokens[i] >= 0)) ++kept;
  out.data.reserve(kept * static_cast<size_t>(vocab));
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    if (!plan.seqs[i].need_logits) continue;
    if (sampled) {
      // The engine checks the tokens against the vocabulary and the rows it offered
      // (Engine::check_step_output), for every runner.
      out.tokens.push_back(fo.tokens[i] >= 0 ? fo.tokens[i] : -1);
      if (fo.tokens[i] >= 0) continue;
    }
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
