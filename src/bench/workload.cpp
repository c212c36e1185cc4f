#include "bench/workload.h"

#include <cmath>
#include <random>

namespace m3::bench {

namespace {

// Common English words; in BPE vocabularies each (with its leading space) is one token.
constexpr const char* kWords[] = {
    "the",   "of",    "and",   "to",    "in",    "is",    "that",  "for",   "it",    "as",
    "was",   "with",  "be",    "by",    "on",    "not",   "he",    "this",  "are",   "or",
    "his",   "from",  "at",    "which", "but",   "have",  "an",    "had",   "they",  "you",
    "were",  "their", "one",   "all",   "we",    "can",   "her",   "has",   "there", "been",
    "if",    "more",  "when",  "will",  "would", "who",   "so",    "no",    "time",  "people",
    "water", "house", "world", "light", "river", "stone", "music", "paper", "green", "small",
    "large", "early", "city",  "road",  "table", "north", "south", "white", "blue",  "open",
};
constexpr int kNumWords = sizeof(kWords) / sizeof(kWords[0]);

// A uniform double in [0, 1) from 53 random bits (portable, unlike std::generate_canonical).
double unit(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

// A uniform integer in [lo, hi]; the modulo bias is below 2^-40 for the ranges used here.
int uniform_int(std::mt19937_64& rng, int lo, int hi) {
  const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
  return lo + static_cast<int>(rng() % span);
}

int low_bound(int len, double range_ratio) {
  const int lo = static_cast<int>(std::ceil(len * (1.0 - range_ratio) - 1e-9));
  return std::max(1, std::min(lo, len));
}

}  // namespace

Result<std::vector<BenchRequest>> make_workload(const WorkloadOptions& o) {
  if (o.num_prompts < 1) return invalid_argument("--num-prompts must be at least 1");
  if (o.input_len < 1) return invalid_argument("--random-input-len must be at least 1");
  if (o.output_len < 1) return invalid_argument("--random-output-len must be at least 1");
  if (!(o.range_ratio >= 0.0 && o.range_ratio <= 1.0)) {
    return invalid_argument("--random-range-ratio must be in [0, 1]");
  }
  if (o.dataset == DatasetKind::kMultiTurn) {
    if (o.num_conversations < 1) return invalid_argument("--num-conversations must be at least 1");
    if (o.turns < 1) return invalid_argument("--turns must be at least 1");
    if (static_cast<int64_t>(o.num_conversations) * o.turns > 10'000'000) {
      return invalid_argument("--num-conversations * --turns must be at most 10000000");
    }
  }
  if (o.dataset == DatasetKind::kMixed) {
    if (o.mixed_streams < 1) return invalid_argument("--mixed-streams must be at least 1");
    if (o.mixed_prompt_len < 1) return invalid_argument("--mixed-prompt-len must be at least 1");
    if (o.mixed_prompt_output_len < 1) {
      return invalid_argument("--mixed-prompt-output-len must be at least 1");
    }
  }
  if (o.token_ids && o.vocab_size < 1) {
    return invalid_argument("--random-vocab-size must be at least 1");
  }
  std::mt19937_64 rng(o.seed);
  const bool multi_turn = o.dataset == DatasetKind::kMultiTurn;
  const bool mixed = o.dataset == DatasetKind::kMixed;
  const size_t streams = mixed ? static_cast<size_t>(o.mixed_streams) : 0;
  const size_t n = multi_turn ? static_cast<size_t>(o.num_conversations) * o.turns
                              : streams + static_cast<size_t>(o.num_prompts);
  std::vector<BenchRequest> out(n);
  for (size_t i = 0; i < n; ++i) {
    BenchRequest& r = out[i];
    if (multi_turn) {
      // Conversation-major order: a conversation's turns are consecutive.
      r.conversation = static_cast<int>(i / o.turns);
      r.turn = static_cast<int>(i % o.turns);
    }
    r.stream = i < streams;
    if (o.dataset == DatasetKind::kFixed) {
      r.input_len = o.input_len;
      r.output_len = o.output_len;
    } else if (mixed && i >= streams) {
      r.input_len = o.mixed_prompt_len;
      r.output_len = o.mixed_prompt_output_len;
    } else {
      r.input_len = uniform_int(rng, low_bound(o.input_len, o.range_ratio), o.input_len);
      r.output_len = uniform_int(rng, low_bound(o.output_len, o.range_ratio), o.output_len);
    }
    if (o.token_ids && !multi_turn) {
      r.prompt_ids.resize(static_cast<size_t>(r.input_len));
      for (int32_t& id : r.prompt_ids) id = uniform_int(rng, 0, o.vocab_size - 1);
    } else {
      for (int i = 0; i < r.input_len; ++i) {
        if (i) r.prompt_text.push_back(' ');
        r.prompt_text += kWords[uniform_int(rng, 0, kNumWords - 1)];
      }
    }
  }
  return out;
}

std::vector<double> poisson_arrivals(int n, double rate, uint64_t seed) {
  std::vector<double> out(static_cast<size_t>(std::max(n, 0)), 0.0);
  if (std::isinf(rate) || n <= 1) return out;
  // A different stream from the workload's, so changing the rate leaves the prompts unchanged.
  std::mt19937_64 rng(seed ^ 0x9E3779B97F4A7C15ull);
  for (size_t i = 1; i < out.size(); ++i) {
    out[i] = out[i - 1] - std::log1p(-unit(rng)) / rate;  // inverse CDF of Exp(rate)
  }
  return out;
}

}  // namespace m3::bench
