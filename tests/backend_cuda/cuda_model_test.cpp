// The whole MiniMax-M3 text model on the CUDA backend (float32): against the independent
// double-precision reference of tests/model/tiny_model.h with the same tolerance the CPU model
// test uses, against the CPU backend token by token, decode/chunked prefill against one prefill,
// and a steady-state decode loop that never reaches cudaMalloc (the caching allocator serves it).
#include <span>

#include "../model/tiny_model.h"
#include "cuda_test_util.h"
#include "model/minimax_m3/model.h"
#include "../model/single_sequence.h"

namespace m3 {
namespace {

using minimax_m3::Model;
using minimax_m3::PagedKvCache;
using testing::SequenceRunner;
using testing::SimplePagePool;

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

struct Harness {
  MiniMaxM3Config cfg;
  testing::MemoryWeightSource src;
  Backend* be;
  std::unique_ptr<Model> model;
  std::unique_ptr<PagedKvCache> cache;
  std::unique_ptr<SimplePagePool> pool;
  Harness(const MiniMaxM3Config& c, uint32_t seed, Backend* backend)
      : cfg(c), src(testing::random_weights(c, seed)), be(backend) {
    auto m = Model::load(cfg, src, be);
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    if (m.is_ok()) model = std::move(m).value();
    cache = std::make_unique<PagedKvCache>(be, cfg, 64);
    pool = std::make_unique<SimplePagePool>(64);
  }
  std::vector<float> run(const std::vector<int32_t>& tokens, int64_t chunk) {
    SequenceRunner seq(model.get(), cache.get(), pool.get());
    std::vector<float> logits;
    Status st = seq.append(tokens, chunk, true, &logits);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return logits;
  }
};

// Same bound as tests/model/model_test.cpp: |err| <= 2e-5·max(1, max|logit| of the row) against
// the double reference (each op is within a few units of roundoff of exact; see there).
void expect_matches_reference(const MiniMaxM3Config& cfg, int64_t len, uint32_t seed,
                              const char* what) {
  Harness g(cfg, seed, cuda_test::gpu());
  ASSERT_TRUE(g.model);
  auto tokens = random_tokens(len, cfg.vocab_size, seed + 1);
  auto got = g.run(tokens, 0);
  auto want = testing::ref::forward(cfg, g.src, tokens);
  const int64_t V = cfg.vocab_size;
  double worst = 0;
  int64_t wt = -1, wv = -1, argmax_checked = 0;
  for (int64_t t = 0; t < len; ++t) {
    double scale = 0;
    for (double z : want[t]) scale = std::max(scale, std::abs(z));
    const double tol = 2e-5 * std::max(scale, 1.0);
    int64_t best = 0;
    for (int64_t v = 0; v < V; ++v) {
      ASSERT_FALSE(std::isnan(got[t * V + v]));
      const double r = std::abs(got[t * V + v] - want[t][v]) / tol;
      if (r > worst) worst = r, wt = t, wv = v;
      if (want[t][v] > want[t][best]) best = v;
    }
    double second = -INFINITY;
    for (int64_t v = 0; v < V; ++v)
      if (v != best) second = std::max(second, want[t][v]);
    if (want[t][best] - second > tol) {
      ++argmax_checked;
      EXPECT_EQ(testing::argmax(std::span<const float>(got.data() + t * V, V)), best)
          << what << " position " << t;
    }
  }
  std::printf("[ %-40s ] worst |gpu-ref|/bound = %.3g (position %lld, id %lld), argmax equal at "
              "%lld/%lld positions\n",
              what, worst, (long long)wt, (long long)wv, (long long)argmax_checked,
              (long long)len);
  EXPECT_LE(worst, 1.0) << what;
}

TEST(CudaModel, MatchesReferenceMixedLayers) {
  expect_matches_reference(testing::tiny_config(), 37, 11, "tiny model mixed layers");
}

TEST(CudaModel, MatchesReferenceAllSparseInitBlock) {
  auto c = testing::tiny_config();
  c.layer_types.assign(3, AttentionKind::kSparse);
  c.index_init_blocks = 1;
  c.index_local_blocks = 2;
  c.index_topk_blocks = 4;
  c.rotary_dim = 16;
  expect_matches_reference(c, 45, 12, "tiny model all sparse, init block");
}

TEST(CudaModel, DecodeAndChunksMatchOnePrefillAndCpu) {
  // Float rounding may differ between chunkings on the GPU (cuBLASLt picks algorithms by M), so
  // the comparison is the reference tolerance again, against the CPU model's logits.
  auto cfg = testing::tiny_config();
  Harness g(cfg, 31, cuda_test::gpu());
  Harness c(cfg, 31, cuda_test::cpu());
  auto tokens = random_tokens(30, cfg.vocab_size, 32);
  auto want = c.run(tokens, 0);
  const int64_t V = cfg.vocab_size;
  for (int64_t chunk : {0, 1, 4, 7}) {
    auto got = g.run(tokens, chunk);
    ASSERT_EQ(got.size(), want.size());
    double worst = 0;
    for (int64_t t = 0; t < 30; ++t) {
      double scale = 1.0;
      for (int64_t v = 0; v < V; ++v) scale = std::max(scale, double(std::abs(want[t * V + v])));
      for (int64_t v = 0; v < V; ++v)
        worst = std::max(worst, std::abs(got[t * V + v] - want[t * V + v]) / (4e-5 * scale));
      // Argmax must agree unless the CPU's top-2 gap is within the tolerance (a rounding tie).
      const int32_t best = testing::argmax(std::span<const float>(want.data() + t * V, V));
      float second = -INFINITY;
      for (int64_t v = 0; v < V; ++v)
        if (v != best) second = std::max(second, want[t * V + v]);
      if (want[t * V + best] - second > 8e-5 * scale) {
        EXPECT_EQ(testing::argmax(std::span<const float>(got.data() + t * V, V)), best)
            << "chunk " << chunk << " position " << t;
      }
    }
    std::printf("[ %-40s ] chunk %lld: worst |gpu-cpu|/(4e-5·scale) = %.3g\n", "model gpu vs cpu",
                (long long)chunk, worst);
    EXPECT_LE(worst, 1.0) << "chunk " << chunk;
  }
}

TEST(CudaModel, SteadyDecodeDoesNotCallCudaMalloc) {
  auto* be = cuda_test::gpu();
  Harness g(testing::tiny_config(), 71, be);
  testing::GenerateOptions opts;
  opts.max_tokens = 4;
  opts.ignore_eos = true;
  auto prompt = random_tokens(9, g.cfg.vocab_size, 72);
  ASSERT_TRUE(testing::generate(g.model.get(), g.cache.get(), g.pool.get(), prompt, opts).is_ok());
  const int64_t before = be->allocator_stats().num_device_allocs;
  opts.max_tokens = 24;
  auto gen = testing::generate(g.model.get(), g.cache.get(), g.pool.get(), prompt, opts);
  ASSERT_TRUE(gen.is_ok()) << gen.status().to_string();
  const auto st = be->allocator_stats();
  std::printf("[ %-40s ] cudaMalloc calls during 24 decode steps: %lld (cache hits %lld)\n",
              "caching allocator", (long long)(st.num_device_allocs - before),
              (long long)st.num_cache_hits);
  EXPECT_EQ(st.num_device_allocs, before);
}

}  // namespace
}  // namespace m3
