// StepPlan: what one engine step must compute, as plain data (no device types). The scheduler
// produces it; the model runner executes it; the engine samples the rows that need logits.
#pragma once

#include <cstdint>
#include <vector>

#include "kv/block_table.h"

namespace m3 {

using SeqId = int64_t;
using RequestId = uint64_t;

// One sequence's work in a step: feed `token_ids` at positions [start_pos, start_pos + size).
// Their K/V (and indexer keys) are written into the pages of `block_table`; attention reads
// positions [0, start_pos + size) through it. Positions [0, start_pos) are already in the pages
// (earlier chunks, decode steps, or a prefix-cache hit).
struct SeqSlice {
  SeqId seq_id = -1;
  RequestId request_id = 0;
  int32_t seq_index = 0;               // which of the request's n sequences
  std::vector<int32_t> token_ids;      // [num_tokens]
  int32_t start_pos = 0;
  BlockTable block_table;              // covers positions [0, start_pos + num_tokens)
  // True for the slice that reaches the end of the sequence's known tokens (last prefill chunk or
  // a decode token): the runner returns the logits of its LAST token, one row per such slice.
  bool need_logits = false;
  // Attention data-parallel group (SchedulerConfig::num_dp_groups > 1): block_table's page ids
  // are that group's pool's. 0 otherwise.
  int32_t dp_group = 0;
  // Speculative verification: the slice is [last token, d_1..d_k], the decode token followed by
  // k draft tokens (the last k of token_ids), and the runner returns the logits of every token.
  // Only the decode token counts as computed when the step commits; the engine then tells the
  // scheduler how many drafts the target accepted (Scheduler::append_verified).
  int32_t num_draft = 0;

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  int32_t end_pos() const { return start_pos + num_tokens(); }
  // A decode slice feeds the one token left to compute (the last sampled one), with its drafts
  // when verifying. Decode tokens are not charged against the prefill token budget.
  bool is_decode() const { return num_tokens() == 1 + num_draft && need_logits; }
};

struct StepPlan {
  uint64_t step_idx = 0;
  int32_t page_size = 0;
  // Per DP group in group order (one group without attention data parallelism): the group's
  // running sequences in admission priority order (oldest arrival first), then its newly admitted
  // ones.
  std::vector<SeqSlice> seqs;
  // Sequences preempted while planning this step; their pages are already back in the pool and
  // they wait to be recomputed. The runner needs to do nothing for them.
  std::vector<SeqId> preempted;
  int32_t num_tokens_prefill = 0;  // tokens in slices that are not decode slices
  int32_t num_tokens_decode = 0;

  bool empty() const { return seqs.empty(); }
  int32_t num_logits() const {
    int32_t n = 0;
    for (const auto& s : seqs) n += s.need_logits ? 1 : 0;
    return n;
  }
};

}  // namespace m3
