// GPU sampling (backend/cuda/sampling/sample.h) against the CPU sampler (src/sample/sampler.h):
//  * kept set: the GPU's final kept mask equals a sort-based reference of the CPU semantics
//    (top_k by z with ties to lower ids, top_p prefix by descending p, min_p ratio), exactly;
//  * token: for the same (seed, stream, counter) the GPU token equals m3::sample_token's;
//  * distribution: many draws over a small kept set against the softmax probabilities within a
//    chi-square bound.
// Rows where a top_p / min_p cut lies within float rounding of a boundary (the GPU uses float exp
// and another summation order; see sample.h) are detected by the reference and skipped, and
// counted: the test fails if more than an eighth of the rows (at least 2) are skipped. Where the
// draw lies within rounding of a cumulative boundary, the GPU token must be one of the few tokens
// it could be. Margins: 1e-5 relative (float32 exp is within ~2 ulp, double sums of <= 200064
// terms in any order within ~200064 · 2^-53 relative).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cuda/sampling/sample.h"
#include "cuda_test_util.h"
#include "sample/sampler.h"

namespace m3::cuda_test {
namespace {

constexpr double kMargin = 1e-5;

struct RefResult {
  std::vector<uint8_t> kept;  // [V]
  bool ambiguous = false;     // a cut within kMargin of a boundary
};

// The CPU sampler's kept set (sampler.cpp), by a full sort, with boundary margins.
RefResult reference_kept(const std::vector<float>& logits, const cuda::SampleRowParams& rp) {
  const int32_t v = static_cast<int32_t>(logits.size());
  RefResult r;
  r.kept.assign(v, 0);
  if (rp.temperature < kGreedyTemperature) {
    int32_t best = 0;
    for (int32_t i = 1; i < v; ++i)
      if (logits[i] > logits[best]) best = i;
    r.kept[best] = 1;
    return r;
  }
  const float inv_t = 1.0f / rp.temperature;
  std::vector<float> z(v);
  for (int32_t i = 0; i < v; ++i) z[i] = logits[i] * inv_t;
  std::vector<int32_t> ids(v);
  std::iota(ids.begin(), ids.end(), 0);
  std::sort(ids.begin(), ids.end(),
            [&](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); });
  const double mx = z[ids[0]];
  int32_t kept = (rp.top_k > 0 && rp.top_k < v) ? rp.top_k : v;
  double total = 0.0;
  for (int32_t i = 0; i < kept; ++i) total += std::exp(double(z[ids[i]]) - mx);
  if (rp.top_p < 1.0f) {
    const double target = double(rp.top_p) * total;
    double cum = 0.0;
    for (int32_t i = 0; i < kept; ++i) {
      const double before = cum;
      cum += std::exp(double(z[ids[i]]) - mx);
      if (cum >= target) {
        // Ambiguous if the cut could move by rounding: cum or the previous cum near the target.
        if (std::abs(cum - target) <= kMargin * total || std::abs(before - target) <= kMargin * total)
          r.ambiguous = true;
        kept = i + 1;
        break;
      }
    }
  }
  const double min_ratio = rp.min_p > 0.0f ? double(rp.min_p) : 0.0;
  for (int32_t i = 0; i < kept; ++i) {
    const double e = std::exp(double(z[ids[i]]) - mx);
    if (min_ratio > 0 && std::abs(e - min_ratio) <= kMargin * min_ratio) r.ambiguous = true;
    if (e >= min_ratio) r.kept[ids[i]] = 1;
  }
  return r;
}

// The tokens the draw may pick within rounding: those whose cumulative-mass interval
// [cum before, cum after] (ascending id order over the kept set) meets [u - m, u + m], with
// m = kMargin · total. One token when the draw is clear of every boundary. Over a large kept set
// (full vocabulary: ~5e-6 of the mass per token at V = 200064) the window is a few tokens wide
// most of the time, so such rows are checked against the window instead of being skipped.
std::vector<int32_t> draw_window(const std::vector<float>& logits, const cuda::SampleRowParams& rp,
                                 const std::vector<uint8_t>& kept) {
  std::vector<int32_t> window;
  if (rp.temperature < kGreedyTemperature) return window;
  const float inv_t = 1.0f / rp.temperature;
  double mx = -INFINITY;
  for (float x : logits) mx = std::max(mx, double(x * inv_t));
  double total = 0.0;
  std::vector<double> e(logits.size(), 0.0);
  for (size_t i = 0; i < logits.size(); ++i)
    if (kept[i]) total += (e[i] = std::exp(double(logits[i] * inv_t) - mx));
  const double u = uniform01({rp.seed, rp.stream, rp.counter}) * total, m = kMargin * total;
  double cum = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!kept[i]) continue;
    const double before = cum;
    cum += e[i];
    if (cum >= u - m && before <= u + m) window.push_back(static_cast<int32_t>(i));
    if (before > u + m) break;
  }
  return window;
}

int32_t cpu_token(const std::vector<float>& logits, const cuda::SampleRowParams& rp) {
  SamplingParams sp;
  sp.temperature = rp.temperature;
  sp.top_k = rp.top_k;
  sp.top_p = rp.top_p;
  sp.min_p = rp.min_p;
  SampleInput in;
  in.logits = logits;
  in.params = &sp;
  in.rng = {rp.seed, rp.stream, rp.counter};
  SamplerScratch scratch;
  return sample_token(in, &scratch).token;
}

struct GpuRun {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
};
// split: with the greedy scratch (greedy rows over kSampleGreedySplits CTAs), run twice (the
// tickets must be back at zero for the second run).
GpuRun run_gpu(const std::vector<float>& logits, int64_t batch, int64_t vocab,
            const std::vector<cuda::SampleRowParams>& rows, bool with_mask, bool split = false) {
  Dev<float> dl(logits);
  Dev<cuda::SampleRowParams> dr(rows);
  auto out = Dev<int32_t>::poisoned(batch);
  auto mask = Dev<uint8_t>::poisoned(with_mask ? batch * vocab : 1);
  cuda::SampleParams p;
  p.logits = dl.ptr();
  p.batch = batch;
  p.vocab = vocab;
  p.ld = vocab;
  p.rows = dr.ptr();
  p.out = out.ptr();
  p.kept_mask = with_mask ? mask.ptr() : nullptr;
  const int64_t sl = cuda::kSampleGreedySplits;
  auto gv = Dev<float>::poisoned(batch * sl);
  auto gi = Dev<int32_t>::poisoned(batch * sl);
  Dev<uint32_t> gt(std::vector<uint32_t>(static_cast<size_t>(batch), 0u));
  if (split) p.greedy_value = gv.ptr(), p.greedy_index = gi.ptr(), p.greedy_tickets = gt.ptr();
  EXPECT_TRUE(cuda::launch_sample(p, stream()).is_ok());
  if (split) {
    const std::vector<int32_t> first = out.host();
    EXPECT_EQ(gt.host(), std::vector<uint32_t>(static_cast<size_t>(batch), 0u))
        << "tickets not reset";
    EXPECT_TRUE(cuda::launch_sample(p, stream()).is_ok());
    EXPECT_EQ(out.host(), first) << "second split run differs";
  }
  GpuRun r;
  r.tokens = out.host();
  if (with_mask) r.mask = mask.host();
  return r;
}

// Logits: normal with a per-row scale; some rows rounded to a coarse grid (many exact ties).
std::vector<float> make_logits(int64_t batch, int64_t vocab, uint32_t seed) {
  std::vector<float> l = randn(batch * vocab, seed, 1.0f);
  for (int64_t b = 0; b < batch; ++b) {
    const float scale = 1.0f + float(b % 5);
    for (int64_t i = 0; i < vocab; ++i) {
      float& x = l[b * vocab + i];
      x *= scale;
      if (b % 4 == 3) x = std::round(x * 4.0f) / 4.0f;  // ties
    }
  }
  return l;
}

cuda::SampleRowParams row_params(int64_t b, uint64_t seed) {
  cuda::SampleRowParams r;
  switch (b % 8) {
    case 0: r.temperature = 0.0f; break;                                     // greedy
    case 1: r.top_k = 50; break;                                             // top_k
    case 2: r.temperature = 0.7f, r.top_p = 0.9f; break;                     // top_p
    case 3: r.temperature = 1.3f, r.min_p = 0.05f; break;                    // min_p
    case 4: r.top_k = 1000, r.top_p = 0.8f, r.min_p = 0.01f; break;          // all three
    case 5: break;                                                           // full vocab
    case 6: r.top_k = 20, r.top_p = 0.5f, r.temperature = 0.5f; break;
    case 7: r.top_k = 1; break;
  }
  r.seed = seed + static_cast<uint64_t>(b);
  r.stream = static_cast<uint64_t>(b % 3);
  r.counter = static_cast<uint64_t>(7 * b);
  return r;
}

void check_batch(int64_t batch, int64_t vocab, uint32_t seed) {
  const auto logits = make_logits(batch, vocab, seed);
  std::vector<cuda::SampleRowParams> rows;
  for (int64_t b = 0; b < batch; ++b) rows.push_back(row_params(b, 1000 + seed));
  const GpuRun g = run_gpu(logits, batch, vocab, rows, true);
  // Greedy rows over several CTAs: the same tokens and kept sets, every row.
  const GpuRun gs = run_gpu(logits, batch, vocab, rows, true, /*split=*/true);
  EXPECT_EQ(gs.tokens, g.tokens) << "greedy rows split over CTAs";
  EXPECT_TRUE(gs.mask == g.mask) << "kept sets with the greedy rows split over CTAs";
  int skipped = 0, compared = 0, windowed = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const std::vector<float> row(logits.begin() + b * vocab, logits.begin() + (b + 1) * vocab);
    const RefResult ref = reference_kept(row, rows[b]);
    if (ref.ambiguous) {  // the kept set itself is within rounding of a cut
      ++skipped;
      continue;
    }
    ++compared;
    const std::vector<uint8_t> got(g.mask.begin() + b * vocab, g.mask.begin() + (b + 1) * vocab);
    int64_t diff = 0, first = -1, kept = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      kept += ref.kept[i];
      if (got[i] != ref.kept[i]) {
        ++diff;
        if (first < 0) first = i;
      }
    }
    EXPECT_EQ(diff, 0) << "row " << b << " (case " << b % 8 << "): " << diff
                       << " tokens differ in the kept set of " << kept << ", first id " << first;
    const int32_t want = cpu_token(row, rows[b]);
    const std::vector<int32_t> window = draw_window(row, rows[b], ref.kept);
    if (window.size() <= 1) {
      EXPECT_EQ(g.tokens[b], want) << "row " << b << " (case " << b % 8 << "), kept " << kept;
    } else {
      ++windowed;
      const bool cpu_in = std::find(window.begin(), window.end(), want) != window.end();
      const bool gpu_in = std::find(window.begin(), window.end(), g.tokens[b]) != window.end();
      EXPECT_TRUE(cpu_in) << "row " << b << ": the reference window misses the CPU token " << want;
      EXPECT_TRUE(gpu_in) << "row " << b << " (case " << b % 8 << "): GPU token " << g.tokens[b]
                          << " outside the " << window.size() << " tokens within rounding of the draw"
                          << " (CPU " << want << ")";
    }
  }
  std::printf("[ sampling B=%lld V=%lld ] compared %d rows (%d of them to a draw window of several "
              "tokens), skipped %d with a kept set within rounding of a cut\n",
              (long long)batch, (long long)vocab, compared, windowed, skipped);
  // The first version's bound, now on kept-set ambiguity alone (draws near a boundary are checked
  // against their window above): on the H200, 2 of 16, 6 of 128 and 0 of 24 rows were skipped.
  EXPECT_LE(skipped, std::max<int64_t>(2, batch / 8)) << "too many rows with an ambiguous kept set";
}

TEST(CudaSample, MatchesCpuSamplerAtRealVocab) { check_batch(16, 200064, 3); }
TEST(CudaSample, MatchesCpuSamplerBatch128) { check_batch(128, 200064, 5); }
TEST(CudaSample, MatchesCpuSamplerOddVocab) { check_batch(24, 1001, 7); }
// A vocabulary smaller than the greedy slices (empty slices) and all-equal or NaN rows.
TEST(CudaSample, GreedySplitEdgeRows) {
  const int64_t vocab = 20, batch = 3;
  std::vector<float> logits(static_cast<size_t>(batch * vocab), 0.5f);  // row 0: all ties -> 0
  logits[vocab + 17] = 3.0f;                                             // row 1: id 17
  for (int64_t i = 0; i < vocab; ++i) logits[2 * vocab + i] = std::nanf("");  // row 2: -1
  logits[2 * vocab + 9] = -INFINITY;                                      // ... except -inf: 9
  std::vector<cuda::SampleRowParams> rows(batch);
  for (auto& r : rows) r.temperature = 0.0f;
  const GpuRun one = run_gpu(logits, batch, vocab, rows, false);
  const GpuRun split = run_gpu(logits, batch, vocab, rows, false, /*split=*/true);
  EXPECT_EQ(one.tokens, (std::vector<int32_t>{0, 17, 9}));
  EXPECT_EQ(split.tokens, one.tokens);
}
TEST(CudaSample, RefusesPartialGreedyScratch) {
  Dev<float> dl(std::vector<float>(8, 0.0f));
  Dev<cuda::SampleRowParams> dr(std::vector<cuda::SampleRowParams>(1));
  auto out = Dev<int32_t>::poisoned(1);
  Dev<float> gv(std::vector<float>(cuda::kSampleGreedySplits, 0.0f));
  cuda::SampleParams p;
  p.logits = dl.ptr();
  p.batch = 1;
  p.vocab = p.ld = 8;
  p.rows = dr.ptr();
  p.out = out.ptr();
  p.greedy_value = gv.ptr();  // without greedy_index and greedy_tickets
  EXPECT_EQ(cuda::launch_sample(p, stream()).code(), StatusCode::kInvalidArgument);
}

// Many draws of one distribution (V = 64, top_k = 10): counts against the renormalised softmax,
// chi-square with 9 degrees of freedom below its 1 - 1e-6 quantile (Wilson-Hilferty).
TEST(CudaSample, DistributionChiSquare) {
  const int64_t vocab = 64, batch = 128, launches = 160, k = 10;
  std::vector<float> one = randn(vocab, 11, 1.0f);
  std::vector<float> logits;
  for (int64_t b = 0; b < batch; ++b) logits.insert(logits.end(), one.begin(), one.end());
  std::vector<int64_t> counts(vocab, 0);
  for (int64_t l = 0; l < launches; ++l) {
    std::vector<cuda::SampleRowParams> rows(batch);
    for (int64_t b = 0; b < batch; ++b) {
      rows[b].top_k = static_cast<int32_t>(k);
      rows[b].seed = 42;
      rows[b].counter = static_cast<uint64_t>(l * batch + b);
    }
    const GpuRun g = run_gpu(logits, batch, vocab, rows, false);
    for (int32_t t : g.tokens) {
      ASSERT_GE(t, 0);
      ASSERT_LT(t, vocab);
      ++counts[t];
    }
  }
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return one[a] > one[b]; });
  double z = 0.0;
  for (int64_t i = 0; i < k; ++i) z += std::exp(double(one[ids[i]]) - one[ids[0]]);
  const double n = double(batch * launches);
  double chi2 = 0.0;
  int64_t outside = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    const bool in_top = std::find(ids.begin(), ids.begin() + k, int32_t(i)) != ids.begin() + k;
    if (!in_top) {
      outside += counts[i];
      continue;
    }
    const double e = n * std::exp(double(one[i]) - one[ids[0]]) / z;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  EXPECT_EQ(outside, 0) << "draws outside the top-k set";
  const double dof = double(k - 1), zq = 4.753;  // standard normal 1 - 1e-6 quantile
  const double crit = dof * std::pow(1 - 2 / (9 * dof) + zq * std::sqrt(2 / (9 * dof)), 3);
  std::printf("[ sampling chi-square ] %.0f draws, chi2 %.2f (9 dof), bound %.2f\n", n, chi2, crit);
  EXPECT_LT(chi2, crit);
}

}  // namespace
}  // namespace m3::cuda_test
