#include "model/minimax_m3/runner.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <random>

namespace m3::minimax_m3 {

Status SequenceRunner::reserve(int64_t n) {
  int64_t need = (n + cache_->page_size() - 1) / cache_->page_size();
  int64_t have = static_cast<int64_t>(block_table_.size());
  if (need > have) return pool_->allocate(need - have, &block_table_);
  return Status::ok();
}

Status append_in_chunks(const ForwardOne& forward, std::span<const int32_t> block_table,
                        std::span<const int32_t> tokens, int64_t chunk_size, bool all_logits,
                        int64_t* length, std::vector<float>* logits) {
  if (tokens.empty()) return invalid_argument("[model.runner] no tokens to append");
  const int64_t total = static_cast<int64_t>(tokens.size());
  if (chunk_size <= 0) chunk_size = total;
  logits->clear();
  for (int64_t b = 0; b < total; b += chunk_size) {
    const int64_t n = std::min(chunk_size, total - b);
    SequenceInput in;
    in.tokens = tokens.subspan(static_cast<size_t>(b), static_cast<size_t>(n));
    in.start_pos = *length;
    in.block_table = block_table;
    if (all_logits) {
      for (int64_t i = 0; i < n; ++i) in.logits_rows.push_back(static_cast<int32_t>(i));
    } else if (b + n == total) {
      in.logits_rows.push_back(static_cast<int32_t>(n - 1));
    }
    ForwardOutput out;
    M3_RETURN_IF_ERROR(forward(in, &out));
    logits->insert(logits->end(), out.logits[0].begin(), out.logits[0].end());
    *length += n;
  }
  return Status::ok();
}

Status SequenceRunner::append(std::span<const int32_t> tokens, int64_t chunk_size,
                              bool all_logits, std::vector<float>* logits) {
  M3_RETURN_IF_ERROR(reserve(length_ + static_cast<int64_t>(tokens.size())));
  return append_in_chunks(
      [&](const SequenceInput& in, ForwardOutput* out) {
        return model_->forward(std::span<const SequenceInput>(&in, 1), cache_, out);
      },
      block_table_, tokens, chunk_size, all_logits, &length_, logits);
}

Result<std::vector<int32_t>> parse_token_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t start = 0;
  while (true) {
    size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos
                                                                     : comma - start);
    size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    item = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    bool ok = !item.empty() && item.size() <= 10 &&
              item.find_first_not_of("0123456789") == std::string::npos;
    long long v = ok ? std::stoll(item) : -1;
    if (!ok || v > INT32_MAX)
      return invalid_argument("entry " + std::to_string(ids.size() + 1) + " ('" + item +
                              "') is not a token id (a non-negative integer)");
    ids.push_back(static_cast<int32_t>(v));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return ids;
}

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  return best;
}

namespace {

// Samples from softmax(logits / temperature) (double precision, inverse CDF).
int32_t sample(std::span<const float> logits, double temperature, std::mt19937_64* rng) {
  double mx = -INFINITY;
  for (float l : logits) mx = std::max(mx, static_cast<double>(l));
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) sum += p[i] = std::exp((logits[i] - mx) / temperature);
  double u = std::uniform_real_distribution<double>(0.0, 1.0)(*rng) * sum, acc = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    acc += p[i];
    if (u < acc) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(p.size() - 1);
}

}  // namespace

Status check_generate_args(std::span<const int32_t> prompt, const GenerateOptions& opts) {
  if (prompt.empty()) return invalid_argument("[model.generate] empty prompt");
  if (opts.max_tokens < 0) return invalid_argument("[model.generate] negative max_tokens");
  if (!(opts.temperature >= 0.0) || !std::isfinite(opts.temperature))
    return invalid_argument("[model.generate] temperature must be a finite number >= 0");
  return Status::ok();
}

Result<std::vector<int32_t>> generate_tokens(const AppendTokens& append,
                                             std::span<const int32_t> prompt,
                                             const GenerateOptions& opts) {
  M3_RETURN_IF_ERROR(check_generate_args(prompt, opts));
  std::vector<int32_t> out;
  if (opts.max_tokens == 0) return out;
  std::mt19937_64 rng(opts.seed);
  std::vector<float> logits;
  M3_RETURN_IF_ERROR(append(prompt, opts.prefill_chunk, &logits));
  for (int64_t i = 0; i < opts.max_tokens; ++i) {
    int32_t next = opts.temperature == 0.0 ? argmax(logits) : sample(logits, opts.temperature, &rng);
    out.push_back(next);
    if (!opts.ignore_eos && std::find(opts.eos_token_ids.begin(), opts.eos_token_ids.end(),
                                      next) != opts.eos_token_ids.end())
      break;
    if (i + 1 == opts.max_tokens) break;
    M3_RETURN_IF_ERROR(append(std::span<const int32_t>(&next, 1), 0, &logits));
  }
  return out;
}

Result<std::vector<int32_t>> generate(Model* model, PagedKvCache* cache, SimplePagePool* pool,
                                      std::span<const int32_t> prompt,
                                      const GenerateOptions& opts) {
  SequenceRunner seq(model, cache, pool);
  return generate_on(seq, prompt, opts);
}

}  // namespace m3::minimax_m3
