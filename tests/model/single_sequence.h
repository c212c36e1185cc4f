// Single-sequence helpers over the float32 MiniMax-M3 model, for tests: prefill (whole or
// chunked) and incremental decode on a private page list, and a reference generate() (greedy, or
// temperature sampling from std::mt19937_64) that the engine's output is checked against. The
// product's generation path is the engine (engine/engine.h); this is an oracle, not a second path.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/minimax_m3/kv_cache.h"
#include "model/minimax_m3/model.h"

namespace m3::testing {

using minimax_m3::ForwardOutput;
using minimax_m3::Model;
using minimax_m3::PagedKvCache;
using minimax_m3::SequenceInput;

// A LIFO free list of page ids [0, num_pages).
class SimplePagePool {
 public:
  explicit SimplePagePool(int64_t num_pages) {
    for (int64_t p = num_pages - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));
  }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  // Appends n pages to *table; resource_exhausted (and no change) when fewer are free.
  Status allocate(int64_t n, std::vector<int32_t>* table) {
    if (n > num_free())
      return Status(StatusCode::kResourceExhausted, "need " + std::to_string(n) + " pages, " +
                                                        std::to_string(num_free()) + " free");
    for (int64_t i = 0; i < n; ++i) {
      table->push_back(free_.back());
      free_.pop_back();
    }
    return Status::ok();
  }
  void release(const std::vector<int32_t>& pages) {
    for (auto it = pages.rbegin(); it != pages.rend(); ++it) free_.push_back(*it);
  }

 private:
  std::vector<int32_t> free_;
};

// One sequence's pages and length. Pages come from `pool` and go back on destruction.
class SequenceRunner {
 public:
  SequenceRunner(Model* model, PagedKvCache* cache, SimplePagePool* pool)
      : model_(model), cache_(cache), pool_(pool) {}
  ~SequenceRunner() { pool_->release(block_table_); }
  SequenceRunner(const SequenceRunner&) = delete;
  SequenceRunner& operator=(const SequenceRunner&) = delete;

  // Appends `tokens` to the sequence, running forward in chunks of at most `chunk_size` tokens
  // (<= 0: one chunk). *logits receives [tokens.size(), V] when all_logits, else [1, V] for the
  // last token.
  Status append(std::span<const int32_t> tokens, int64_t chunk_size, bool all_logits,
                std::vector<float>* logits) {
    if (tokens.empty()) return invalid_argument("no tokens to append");
    M3_RETURN_IF_ERROR(reserve(length_ + static_cast<int64_t>(tokens.size())));
    const int64_t total = static_cast<int64_t>(tokens.size());
    if (chunk_size <= 0) chunk_size = total;
    logits->clear();
    for (int64_t b = 0; b < total; b += chunk_size) {
      const int64_t n = std::min(chunk_size, total - b);
      SequenceInput in;
      in.tokens = tokens.subspan(static_cast<size_t>(b), static_cast<size_t>(n));
      in.start_pos = length_;
      in.block_table = block_table_;
      if (all_logits) {
        for (int64_t i = 0; i < n; ++i) in.logits_rows.push_back(static_cast<int32_t>(i));
      } else if (b + n == total) {
        in.logits_rows.push_back(static_cast<int32_t>(n - 1));
      }
      ForwardOutput out;
      M3_RETURN_IF_ERROR(model_->forward(std::span<const SequenceInput>(&in, 1), cache_, &out));
      logits->insert(logits->end(), out.logits[0].begin(), out.logits[0].end());
      length_ += n;
    }
    return Status::ok();
  }

  int64_t length() const { return length_; }
  const std::vector<int32_t>& block_table() const { return block_table_; }
  // Makes room for positions [0, n): allocates pages as needed.
  Status reserve(int64_t n) {
    const int64_t need = (n + cache_->page_size() - 1) / cache_->page_size();
    const int64_t have = static_cast<int64_t>(block_table_.size());
    if (need > have) return pool_->allocate(need - have, &block_table_);
    return Status::ok();
  }

 private:
  Model* model_;
  PagedKvCache* cache_;
  SimplePagePool* pool_;
  std::vector<int32_t> block_table_;
  int64_t length_ = 0;
};

// Index of the largest logit; ties go to the lowest id (torch.argmax returns the first maximum).
inline int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  return best;
}

struct GenerateOptions {
  int64_t max_tokens = 16;
  double temperature = 0.0;  // 0: greedy
  uint64_t seed = 0;
  std::vector<int64_t> eos_token_ids;  // stop after emitting one of these (kept in the output)
  bool ignore_eos = false;
  int64_t prefill_chunk = 0;  // <= 0: the whole prompt in one forward
};

// Up to max_tokens tokens after `prompt` on a fresh sequence: greedy, or a double-precision
// inverse-CDF draw from softmax(logits / temperature) with std::mt19937_64(seed).
inline Result<std::vector<int32_t>> generate(Model* model, PagedKvCache* cache,
                                             SimplePagePool* pool, std::span<const int32_t> prompt,
                                             const GenerateOptions& opts) {
  if (prompt.empty()) return invalid_argument("empty prompt");
  if (opts.max_tokens < 0) return invalid_argument("negative max_tokens");
  if (!(opts.temperature >= 0.0) || !std::isfinite(opts.temperature))
    return invalid_argument("temperature must be a finite number >= 0");
  SequenceRunner seq(model, cache, pool);
  std::vector<int32_t> out;
  if (opts.max_tokens == 0) return out;
  M3_RETURN_IF_ERROR(seq.reserve(static_cast<int64_t>(prompt.size()) + opts.max_tokens));
  std::mt19937_64 rng(opts.seed);
  auto sample = [&](std::span<const float> logits) {
    double mx = -INFINITY;
    for (float l : logits) mx = std::max(mx, static_cast<double>(l));
    std::vector<double> p(logits.size());
    double sum = 0;
    for (size_t i = 0; i < logits.size(); ++i)
      sum += p[i] = std::exp((logits[i] - mx) / opts.temperature);
    double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng) * sum, acc = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      acc += p[i];
      if (u < acc) return static_cast<int32_t>(i);
    }
    return static_cast<int32_t>(p.size() - 1);
  };
  std::vector<float> logits;
  M3_RETURN_IF_ERROR(seq.append(prompt, opts.prefill_chunk, false, &logits));
  for (int64_t i = 0; i < opts.max_tokens; ++i) {
    const int32_t next = opts.temperature == 0.0 ? argmax(logits) : sample(logits);
    out.push_back(next);
    if (!opts.ignore_eos && std::find(opts.eos_token_ids.begin(), opts.eos_token_ids.end(),
                                      next) != opts.eos_token_ids.end())
      break;
    if (i + 1 == opts.max_tokens) break;
    M3_RETURN_IF_ERROR(seq.append(std::span<const int32_t>(&next, 1), 0, false, &logits));
  }
  return out;
}

}  // namespace m3::testing
