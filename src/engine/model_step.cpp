#include "engine/model_step.h"

#include <string>

namespace m3 {

ModelStep model_step(const StepPlan& plan, std::span<const std::optional<DeviceSampling>> sampling,
                     const std::vector<bool>& all_rows) {
  ModelStep step;
  step.slices.resize(plan.seqs.size());
  size_t row = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const SeqSlice& s = plan.seqs[i];
    ModelSlice& m = step.slices[i];
    m.tokens = s.token_ids;
    m.start_pos = s.start_pos;
    m.block_table = s.block_table;
    m.dp_group = s.dp_group;
    if ((i < all_rows.size() && all_rows[i]) || (s.need_logits && s.num_draft > 0)) {
      // Prompt logits, or a verify slice: the row after every token.
      for (int32_t t = 0; t < s.num_tokens(); ++t) m.logits_rows.push_back(t);
    } else if (s.need_logits) {
      m.logits_rows = {s.num_tokens() - 1};
    }
    if (!s.need_logits) continue;
    // The runner may sample only a slice's single row.
    if (row < sampling.size() && m.logits_rows.size() == 1) m.sample = sampling[row];
    ++row;
  }
  return step;
}

Status gather_step_logits(const StepPlan& plan, const ModelStep& step, const ModelOutput& mo,
                          int32_t vocab, LogitsOut& out) {
  out.vocab_size = vocab;
  out.data.clear();
  out.tokens.clear();
  const size_t V = static_cast<size_t>(vocab);
  const bool sampled = !mo.tokens.empty();
  if (sampled && mo.tokens.size() != plan.seqs.size()) {
    return internal_error("[engine] the model returned " + std::to_string(mo.tokens.size()) +
                          " sampled-token entries for " + std::to_string(plan.seqs.size()) +
                          " sequences");
  }
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const size_t rows = step.slices[i].logits_rows.size();
    const bool row_sampled = sampled && mo.tokens[i] >= 0;
    const size_t want = row_sampled ? 0 : rows * V;
    if (rows > 0 && (i >= mo.logits.size() || mo.logits[i].size() != want)) {
      return internal_error("[engine] sequence " + std::to_string(i) + " got " +
                            std::to_string(i < mo.logits.size() ? mo.logits[i].size() : 0) +
                            " logits, expected " + std::to_string(want));
    }
    if (!plan.seqs[i].need_logits) continue;
    if (sampled) {
      // The engine checks the tokens against the vocabulary and the rows it offered
      // (Engine::check_step_output), for every runner.
      out.tokens.push_back(row_sampled ? mo.tokens[i] : -1);
      if (row_sampled) continue;
    }
    // The sampler reads the row after the slice's last token: the last row asked for.
    out.data.insert(out.data.end(), mo.logits[i].end() - static_cast<std::ptrdiff_t>(V),
                    mo.logits[i].end());
  }
  return Status::ok();
}

}  // namespace m3
