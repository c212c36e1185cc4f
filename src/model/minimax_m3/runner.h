// Single-sequence helpers over Model: prefill (whole or chunked), incremental decode, greedy or
// temperature sampling. Used by the `score` / `generate` commands and the tests; the server's
// scheduler drives Model::forward directly with its own batches and pages.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/minimax_m3/kv_cache.h"
#include "model/minimax_m3/model.h"

namespace m3::minimax_m3 {

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
                std::vector<float>* logits);

  int64_t length() const { return length_; }
  const std::vector<int32_t>& block_table() const { return block_table_; }
  // Makes room for positions [0, n): allocates pages as needed.
  Status reserve(int64_t n);

 private:
  Model* model_;
  PagedKvCache* cache_;
  SimplePagePool* pool_;
  std::vector<int32_t> block_table_;
  int64_t length_ = 0;
};

// The forward calls of appending `tokens` to one sequence at position *length (chunks of
// `chunk_size` tokens, <= 0: one chunk) through `forward`; *length advances, *logits receives
// [tokens.size(), V] when all_logits, else [1, V] for the last token. Shared by SequenceRunner and
// the CUDA real-shape model's sequence (its cache is the model's own).
using ForwardOne = std::function<Status(const SequenceInput& in, ForwardOutput* out)>;
Status append_in_chunks(const ForwardOne& forward, std::span<const int32_t> block_table,
                        std::span<const int32_t> tokens, int64_t chunk_size, bool all_logits,
                        int64_t* length, std::vector<float>* logits);

// Parses "1,2,3" (spaces allowed around ids) into non-negative int32 token ids. Errors say which
// entry is bad.
Result<std::vector<int32_t>> parse_token_ids(const std::string& text);

// Index of the largest logit; ties go to the lowest id (torch.argmax returns the first maximum).
int32_t argmax(std::span<const float> logits);

struct GenerateOptions {
  int64_t max_tokens = 16;
  double temperature = 0.0;  // 0: greedy
  uint64_t seed = 0;
  std::vector<int64_t> eos_token_ids;  // stop after emitting one of these (kept in the output)
  bool ignore_eos = false;
  int64_t prefill_chunk = 0;  // <= 0: the whole prompt in one forward
};

// Generates up to max_tokens tokens after `prompt` with a fresh sequence.
Result<std::vector<int32_t>> generate(Model* model, PagedKvCache* cache, SimplePagePool* pool,
                                      std::span<const int32_t> prompt,
                                      const GenerateOptions& opts);

// The pieces of generate() that any single-sequence model shares (the CUDA real-shape model uses
// them too): argument checks, and the token loop over `append`, which appends tokens to the
// sequence (in chunks of `chunk` tokens, <= 0: one) and sets *logits to the last token's [V].
// Greedy, or the double-precision inverse-CDF draw from std::mt19937_64(opts.seed).
using AppendTokens =
    std::function<Status(std::span<const int32_t> tokens, int64_t chunk, std::vector<float>* logits)>;
Status check_generate_args(std::span<const int32_t> prompt, const GenerateOptions& opts);
Result<std::vector<int32_t>> generate_tokens(const AppendTokens& append,
                                             std::span<const int32_t> prompt,
                                             const GenerateOptions& opts);

// generate() on a fresh single sequence `seq` (any type with reserve(n) and
// append(tokens, chunk, all_logits, logits)): checks, room for prompt + max_tokens, the loop.
template <typename Seq>
Result<std::vector<int32_t>> generate_on(Seq& seq, std::span<const int32_t> prompt,
                                         const GenerateOptions& opts) {
  M3_RETURN_IF_ERROR(check_generate_args(prompt, opts));
  M3_RETURN_IF_ERROR(seq.reserve(static_cast<int64_t>(prompt.size()) + opts.max_tokens));
  return generate_tokens(
      [&](std::span<const int32_t> tokens, int64_t chunk, std::vector<float>* logits) {
        return seq.append(tokens, chunk, false, logits);
      },
      prompt, opts);
}

}  // namespace m3::minimax_m3
