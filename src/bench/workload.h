// The benchmark's workload: prompts of chosen lengths and the arrival schedule.
//   random: input lengths uniform in [input_len*(1-range_ratio), input_len] (at least 1), output
//           lengths likewise from output_len; fixed: every request exactly input_len/output_len.
//   multi-turn: --num-conversations conversations of --turns turns each; every turn adds a user
//           message of input_len words (range_ratio applies) to the conversation so far, the
//           earlier turns' answers included (agent traffic), so each prompt extends the previous
//           one and a prefix cache can serve most of it. The runner sends a conversation's turns
//           one after the other, each once the previous answer is in.
//   mixed:  --mixed-streams long generations (input_len/output_len) start together; after
//           --mixed-delay seconds, --num-prompts long prompts (--mixed-prompt-len tokens,
//           --mixed-prompt-output-len generated) arrive at the request rate. The report splits the
//           streams' inter-token latency into gaps with no long prompt in flight and gaps
//           overlapping one: what a decode stream suffers while prefills run beside it.
// Prompt content is random either way (distinct prompts, so a prefix cache cannot shortcut the
// prefill): token ids uniform in [0, vocab_size) for the completions API, which takes id arrays,
// or random words for the chat API, which takes text (one common word is about one token).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace m3::bench {

enum class DatasetKind { kRandom, kFixed, kMultiTurn, kMixed };

struct WorkloadOptions {
  DatasetKind dataset = DatasetKind::kRandom;
  int num_prompts = 1000;
  int input_len = 1024;
  int output_len = 1024;
  double range_ratio = 0.0;  // 0: exact lengths; 1: uniform in [1, len]
  uint64_t seed = 1;
  int vocab_size = 4032;  // token ids are drawn from [0, vocab_size)
  bool token_ids = true;  // true: prompt_ids; false: prompt_text of random words
  int num_conversations = 8;  // multi-turn only (then num_prompts = conversations * turns)
  int turns = 4;              // multi-turn only
  int mixed_streams = 8;              // mixed only: the long generations
  int mixed_prompt_len = 8192;        // mixed only: the arriving prompts' tokens
  int mixed_prompt_output_len = 16;   // mixed only: what each arriving prompt generates
};

struct BenchRequest {
  int input_len = 0;   // planned prompt length in tokens (words for text prompts)
  int output_len = 0;  // max_tokens (with ignore_eos, the exact output length)
  std::vector<int32_t> prompt_ids;
  std::string prompt_text;  // multi-turn: this turn's new user message only
  int conversation = -1;    // multi-turn: which conversation; -1 for independent requests
  int turn = 0;             // multi-turn: 0 for the first turn
  bool stream = false;      // mixed: one of the long generations (sent at the start)
};

// Validates the options (names the offending flag) and draws the requests deterministically from
// the seed. Mixed workloads list the streams first, then the arriving prompts.
Result<std::vector<BenchRequest>> make_workload(const WorkloadOptions& options);

// Send times (seconds from the start) of `n` requests arriving as a Poisson process of `rate`
// requests/s: exponential gaps with mean 1/rate, the first at 0. An infinite rate sends all at 0.
std::vector<double> poisson_arrivals(int n, double rate, uint64_t seed);

}  // namespace m3::bench
