// The real-shape CUDA model over a quantised KV cache (--kv-cache-dtype fp8_e4m3 / fp4_e2m1)
// against the float32 CPU model over a cache of the same dtype, on cuda_real_model_test's weights
// and configs (real_model_fixture.h), both layer mixes (all MSA sparse; layer 1 full attention).
//
// The kernels themselves are checked exactly elsewhere (kv_quant_cache_test: the appends equal the
// CPU's kv_append_row byte for byte; kv_quant_decode_test: the decode kernels over the codes equal
// them over the dequantised bf16 values). This test checks the model's use of them: the appends
// after the attention inputs on both paths, the prefill chunks through the bf16 staging pages,
// decode rows reading the codes, graphs, and the pool's size.
//
// Bound. The GPU's K and V differ from the CPU's by the bf16 activations' error, at most
// real_model_fixture::rel_bound (B, relative) at any layer. Quantisation maps both sides' values to
// the same code unless one lies across a rounding boundary from the other, which happens to an
// element with probability about min(1, B / q) (q the format's relative quantum: fp8 2^-4, fp4
// 2^-3 of the block's largest value), and then moves it by one quantum, twice what the format's
// own rounding moves it at most. So the GPU departs from the CPU by B plus about 2 min(1, B / q) D,
// D the largest logit deviation (relative to the row's rms) that the format itself causes, which
// the test measures: the CPU over the quantised cache against the CPU over a float32 cache. The
// argmax must agree wherever the CPU's top-2 margin exceeds twice the bound. Decode steps replayed
// from CUDA graphs must equal the eager steps bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "model/minimax_m3/cuda/cuda_m3_model.h"
#include "model/minimax_m3/cuda/fit_check.h"
#include "model/minimax_m3/kv_cache.h"
#include "model/minimax_m3/model.h"
#include "real_model_fixture.h"

namespace m3 {
namespace {

using minimax_m3::CudaM3Model;
using minimax_m3::CudaM3Options;
using minimax_m3::ForwardOutput;
using minimax_m3::Model;
using minimax_m3::PagedKvCache;
using minimax_m3::SequenceInput;
using real_model_fixture::Compare;
using real_model_fixture::Seq;
using real_model_fixture::last_argmax;
using real_model_fixture::random_tokens;
using real_model_fixture::TestSource;

constexpr int64_t kPages = 24;

// The largest |a - b| of a row relative to b's rms, over n rows of v.
double max_rel_dev(const float* a, const float* b, int64_t n, int64_t v) {
  double worst = 0;
  for (int64_t r = 0; r < n; ++r) {
    double ss = 0, d = 0;
    for (int64_t i = 0; i < v; ++i) {
      ss += double(b[r * v + i]) * b[r * v + i];
      d = std::max(d, std::abs(double(a[r * v + i]) - b[r * v + i]));
    }
    worst = std::max(worst, d / (std::sqrt(ss / double(v)) + 1e-12));
  }
  return worst;
}

void quantised_case(const MiniMaxM3Config& cfg, KvCacheDtype dtype, const std::string& label) {
  SCOPED_TRACE(label);
  TestSource src(cfg);
  CpuBackend cpu(0);
  auto cpu_model = Model::load(cfg, src, &cpu);
  ASSERT_TRUE(cpu_model.is_ok()) << cpu_model.status().to_string();
  PagedKvCache cache_q(&cpu, cfg, kPages, dtype), cache_f32(&cpu, cfg, kPages);
  CudaM3Options o;
  o.num_kv_pages = kPages;
  o.max_batch = 8;
  o.kv_cache_dtype = dtype;
  auto on = CudaM3Model::load(cfg, src, o);
  ASSERT_TRUE(on.is_ok()) << on.status().to_string();
  o.use_graphs = false;
  auto off = CudaM3Model::load(cfg, src, o);
  ASSERT_TRUE(off.is_ok()) << off.status().to_string();
  // The pool is the stored pages plus one layer's bf16 staging pages.
  EXPECT_EQ((*on)->stats().kv_bytes, kPages * CudaM3Model::kv_bytes_per_page(cfg, 1, 1, dtype));
  EXPECT_EQ(CudaM3Model::kv_bytes_per_page(cfg, 1, 1, dtype),
            minimax_m3::real_shape_kv_bytes_per_page(cfg, dtype) +
                minimax_m3::real_shape_kv_stage_bytes_per_page(cfg, dtype));

  const int64_t v = cfg.vocab_size;
  real_model_fixture::PageIds ids(kPages, 7);
  // Two sequences: A prefilled with 600 tokens in one step (all rows' logits), B in chunks of
  // 200 and 175 with A's decode token riding along the second; then 12 decode steps of both.
  Seq a = ids.new_seq(640), b = ids.new_seq(400);
  struct StepOut {
    ForwardOutput q, f32, on, off;
  };
  std::vector<StepOut> outs;
  auto step = [&](std::vector<Seq*> seqs, const std::vector<std::vector<int32_t>>& tokens,
                  bool all_rows) {
    std::vector<SequenceInput> in = real_model_fixture::step_inputs(seqs, tokens, all_rows);
    StepOut s;
    Status st = (*cpu_model)->forward(in, &cache_q, &s.q);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    st = (*cpu_model)->forward(in, &cache_f32, &s.f32);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    st = (*on)->forward(in, &s.on);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    st = (*off)->forward(in, &s.off);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    for (size_t i = 0; i < seqs.size(); ++i)
      seqs[i]->cached += static_cast<int64_t>(tokens[i].size());
    outs.push_back(std::move(s));
  };
  ASSERT_NO_FATAL_FAILURE(step({&a}, {random_tokens(600, v, 11)}, true));
  ASSERT_NO_FATAL_FAILURE(step({&b}, {random_tokens(200, v, 12)}, false));
  ASSERT_NO_FATAL_FAILURE(step({&a, &b}, {{last_argmax(outs[0].q.logits[0], v)},
                                          random_tokens(175, v, 13)},
                               false));
  size_t decode_from = outs.size();
  for (int i = 0; i < 12; ++i) {
    const StepOut& prev = outs.back();
    ASSERT_NO_FATAL_FAILURE(step({&a, &b}, {{last_argmax(prev.q.logits[0], v)},
                                            {last_argmax(prev.q.logits[1], v)}},
                                 false));
  }
  // D, then the comparison under the bound.
  double dev = 0;
  for (const StepOut& s : outs)
    for (size_t i = 0; i < s.q.logits.size(); ++i)
      dev = std::max(dev, max_rel_dev(s.q.logits[i].data(), s.f32.logits[i].data(),
                                      int64_t(s.q.logits[i].size()) / v, v));
  const double rel = real_model_fixture::rel_bound(cfg);
  const double q = dtype == KvCacheDtype::kFp8E4M3 ? std::ldexp(1.0, -4) : std::ldexp(1.0, -3);
  Compare cmp{rel + 2 * std::min(1.0, rel / q) * dev};
  int64_t bitwise_bad = 0, decode_rows = 0;
  for (size_t k = 0; k < outs.size(); ++k) {
    const StepOut& s = outs[k];
    for (size_t i = 0; i < s.q.logits.size(); ++i) {
      ASSERT_EQ(s.on.logits[i].size(), s.q.logits[i].size());
      cmp.rows_of(s.on.logits[i].data(), s.q.logits[i].data(),
                  int64_t(s.q.logits[i].size()) / v, v);
      if (k >= decode_from) {
        ++decode_rows;
        if (std::memcmp(s.on.logits[i].data(), s.off.logits[i].data(), size_t(v) * 4) != 0)
          ++bitwise_bad;
      }
    }
  }
  cmp.report(label + " vs CPU " + kv_cache_dtype_name(dtype));
  std::printf("[cuda_real_model_kv_quant] %s: D (CPU %s vs float32 cache) %.3f of the row rms; "
              "bound %.3f; graphs vs eager: %lld of %lld decode rows differ bitwise; decode steps "
              "%lld, graph replays %lld\n",
              label.c_str(), kv_cache_dtype_name(dtype), dev, cmp.rel_bound,
              (long long)bitwise_bad, (long long)decode_rows,
              (long long)(*on)->stats().decode_steps, (long long)(*on)->stats().graph_replays);
  EXPECT_TRUE(cmp.ok());
  EXPECT_EQ(bitwise_bad, 0);
  EXPECT_EQ((*on)->stats().decode_steps, 12);
  EXPECT_GE((*on)->stats().graph_replays, 1);
}

TEST(CudaRealModelKvQuant, Fp8Sparse) {
  quantised_case(real_model_fixture::test_config(), KvCacheDtype::kFp8E4M3, "fp8 sparse");
}
TEST(CudaRealModelKvQuant, Fp4Sparse) {
  quantised_case(real_model_fixture::test_config(), KvCacheDtype::kFp4E2M1, "fp4 sparse");
}
TEST(CudaRealModelKvQuant, Fp8FullAttentionLayer) {
  quantised_case(real_model_fixture::full_attention_test_config(), KvCacheDtype::kFp8E4M3,
                 "fp8 full-attention mix");
}
TEST(CudaRealModelKvQuant, Fp4FullAttentionLayer) {
  quantised_case(real_model_fixture::full_attention_test_config(), KvCacheDtype::kFp4E2M1,
                 "fp4 full-attention mix");
}

}  // namespace
}  // namespace m3
