#include "sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/status.h"

namespace m3 {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// log(sum(exp(x - max))) + max in double; -inf if every logit is -inf.
double log_sum_exp(std::span<const float> x) {
  float mx = kNegInf;
  for (float v : x) mx = std::max(mx, v);
  if (mx == kNegInf) return -std::numeric_limits<double>::infinity();
  double s = 0.0;
  for (float v : x) s += std::exp(static_cast<double>(v) - mx);
  return std::log(s) + mx;
}

int32_t argmax(std::span<const float> x) {
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(x.size()); ++i) {
    if (x[i] > x[best]) best = i;  // strict: ties keep the lower id
  }
  return best;
}

// Orders token ids by descending value, ties by ascending id.
struct ByValueDesc {
  const float* v;
  bool operator()(int32_t a, int32_t b) const { return v[a] > v[b] || (v[a] == v[b] && a < b); }
};

}  // namespace

double raw_logprob(std::span<const float> logits, int32_t token) {
  return static_cast<double>(logits[token]) - log_sum_exp(logits);
}

std::vector<TokenLogprob> raw_top_logprobs(std::span<const float> logits, int32_t n) {
  std::vector<TokenLogprob> out;
  if (n <= 0) return out;
  const double lse = log_sum_exp(logits);
  const int32_t v = static_cast<int32_t>(logits.size());
  n = std::min(n, v);
  std::vector<int32_t> ids(v);
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), ByValueDesc{logits.data()});
  for (int32_t i = 0; i < n; ++i) {
    out.push_back({ids[i], static_cast<float>(static_cast<double>(logits[ids[i]]) - lse)});
  }
  return out;
}

namespace {

// Applies the logits processors to scratch->work; returns the greedy token (temperature below
// kGreedyTemperature), or -1 after filling scratch->probs with the unnormalised mass of every
// kept id (0 elsewhere) and *kept_total with their sum.
int32_t kept_mass(const SampleInput& in, SamplerScratch* scratch, double* kept_total) {
  M3_CHECK(in.params != nullptr && !in.logits.empty(), "[sample] no params or empty logits");
  const SamplingParams& p = *in.params;
  const int32_t v = static_cast<int32_t>(in.logits.size());

  std::vector<float>& z = scratch->work;
  z.assign(in.logits.begin(), in.logits.end());
  const int32_t num_output = in.penalties ? in.penalties->num_output() : 0;
  if (num_output < p.min_tokens) mask_tokens(z, in.min_tokens_mask);
  apply_logit_bias(z, p.logit_bias);
  if (in.penalties) apply_penalties(z, p, *in.penalties);

  if (p.temperature < kGreedyTemperature) {
    const int32_t token = argmax(z);
    M3_CHECK(z[token] > kNegInf, "[sample] every logit is -inf or NaN");
    return token;
  }
  const float inv_t = 1.0f / p.temperature;
  for (float& x : z) x *= inv_t;
  // Candidate ids in descending z. top_k and top_p need an order; a partial sort of a growing
  // prefix avoids sorting all V (200k) ids when the kept set is small.
  std::vector<int32_t>& ids = scratch->order;
  ids.resize(v);
  std::iota(ids.begin(), ids.end(), 0);
  const ByValueDesc cmp{z.data()};
  int32_t num_kept = (p.top_k > 0 && p.top_k < v) ? p.top_k : v;
  const bool need_order = num_kept < v || p.top_p < 1.0f;
  float mx_f = kNegInf;
  for (float x : z) mx_f = std::max(mx_f, x);
  M3_CHECK(mx_f > kNegInf, "[sample] every logit is -inf or NaN");
  const double mx = mx_f;
  int32_t sorted = 0;
  if (need_order) {
    sorted = std::min(num_kept, 1024);
    std::partial_sort(ids.begin(), ids.begin() + sorted, ids.end(), cmp);
    // ids[0, num_kept) becomes exactly the top-k set; its order past `sorted` is produced
    // below only if top_p needs it.
    if (num_kept > sorted && num_kept < v) {
      std::nth_element(ids.begin() + sorted, ids.begin() + num_kept - 1, ids.end(), cmp);
    }
  }
  // Mass of the kept (top_k) set.
  double total = 0.0;
  for (int32_t i = 0; i < num_kept; ++i) total += std::exp(static_cast<double>(z[ids[i]]) - mx);
  if (p.top_p < 1.0f) {
    // Grow the sorted prefix until its mass reaches top_p of the kept mass.
    const double target = static_cast<double>(p.top_p) * total;
    double cum = 0.0;
    int32_t i = 0;
    int32_t keep = num_kept;
    while (i < num_kept) {
      if (i == sorted) {
        const int32_t next = std::min(num_kept, sorted * 4);
        std::partial_sort(ids.begin() + sorted, ids.begin() + next, ids.begin() + num_kept, cmp);
        sorted = next;
      }
      cum += std::exp(static_cast<double>(z[ids[i]]) - mx);
      ++i;
      if (cum >= target) {
        keep = i;
        break;
      }
    }
    num_kept = keep;
  }
  // min_p: ratio to the max probability, invariant to renormalisation after top_k/top_p.
  double min_ratio = p.min_p > 0.0f ? static_cast<double>(p.min_p) : 0.0;
  // Kept set as a per-id mass, then one pass in id order.
  std::vector<double>& mass = scratch->probs;
  mass.assign(v, 0.0);
  for (int32_t i = 0; i < num_kept; ++i) {
    const double e = std::exp(static_cast<double>(z[ids[i]]) - mx);  // max ratio is e / 1
    if (e >= min_ratio) mass[ids[i]] = e;
  }
  double kept = 0.0;
  for (int32_t t = 0; t < v; ++t) kept += mass[t];
  *kept_total = kept;
  return -1;
}

}  // namespace

int32_t draw_from_mass(std::span<const double> mass, double total, double u) {
  const double target = u * total;
  double cum = 0.0;
  int32_t token = -1;
  for (int32_t t = 0; t < static_cast<int32_t>(mass.size()); ++t) {
    if (mass[t] == 0.0) continue;
    cum += mass[t];
    token = t;
    if (cum > target) break;
  }
  return token;
}

void sampling_distribution(const SampleInput& in, SamplerScratch* scratch,
                           std::vector<double>* probs) {
  double total = 0.0;
  const int32_t greedy = kept_mass(in, scratch, &total);
  if (greedy >= 0) {
    probs->assign(in.logits.size(), 0.0);
    (*probs)[greedy] = 1.0;
    return;
  }
  M3_CHECK(total > 0.0, "[sample] empty kept set");
  probs->resize(scratch->probs.size());
  for (size_t t = 0; t < probs->size(); ++t) (*probs)[t] = scratch->probs[t] / total;
}

SampleResult sample_token(const SampleInput& in, SamplerScratch* scratch) {
  SampleResult res;
  double total = 0.0;
  res.token = kept_mass(in, scratch, &total);
  if (res.token < 0) {
    res.token = draw_from_mass(scratch->probs, total, uniform01(in.rng));
    M3_CHECK(res.token >= 0, "[sample] empty kept set");
  }
  if (in.params->logprobs) {
    res.logprob = static_cast<float>(raw_logprob(in.logits, res.token));
    res.top_logprobs = raw_top_logprobs(in.logits, in.params->top_logprobs);
  }
  return res;
}

}  // namespace m3
