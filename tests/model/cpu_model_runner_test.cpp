// The engine on the real MiniMax-M3 CPU model (tiny random-weight config, 4-token pages with top-3
// block selection, so sparse attention is live): greedy output equals the model's own
// single-sequence generate(), and on the CPU backend a request's tokens AND logprobs are bitwise
// the same alone, batched with others, after a prefix-cache hit, and after preemption.
#include "model/minimax_m3/cpu_model_runner.h"

#include <gtest/gtest.h>

#include "model/tiny_model.h"
#include "backend/cpu/cpu_backend.h"
#include "engine/engine_test_util.h"
#include "single_sequence.h"

namespace m3 {
namespace {

using testing::Outcome;

struct TinyEngine {
  MiniMaxM3Config cfg = testing::tiny_config();
  MiniMaxM3ModelRunner* runner = nullptr;
  std::unique_ptr<Engine> engine;

  TinyEngine(int32_t pages, int32_t budget, bool prefix) {
    auto src = testing::random_weights(cfg, 1234);
    auto backend = std::make_unique<CpuBackend>(2);
    auto model = minimax_m3::Model::load(cfg, src, backend.get());
    EXPECT_TRUE(model.is_ok()) << model.status().to_string();
    auto r = MiniMaxM3ModelRunner::create_with_pages(std::move(backend), std::move(model).value(),
                                                     pages);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    runner = r->get();
    EngineConfig c;
    c.scheduler.page_size = static_cast<int32_t>(cfg.index_block_size);
    c.scheduler.chunked_prefill_size = budget;
    c.scheduler.max_running_requests = 16;
    c.scheduler.enable_prefix_cache = prefix;
    auto e = Engine::create(std::move(c), std::move(r).value());
    EXPECT_TRUE(e.is_ok()) << e.status().to_string();
    engine = std::move(e).value();
  }

  std::vector<Outcome> run(const std::vector<GenerateRequest>& reqs) {
    std::vector<RequestHandle> hs;
    std::vector<int32_t> ns;
    for (const auto& r : reqs) {
      auto h = engine->submit(r);
      EXPECT_TRUE(h.is_ok()) << h.status().to_string();
      hs.push_back(std::move(h).value());
      ns.push_back(r.params.n);
    }
    return testing::run_all(*engine, hs, ns);
  }
};

GenerateRequest request(int32_t seed, int32_t len, int32_t max_tokens, bool sample) {
  GenerateRequest r;
  r.prompt_tokens = testing::prompt_of(seed, len, 300);
  r.params.max_tokens = max_tokens;
  r.params.temperature = sample ? 0.9f : 0.0f;
  r.params.seed = 99 + seed;
  r.params.logprobs = true;
  return r;
}

std::vector<float> logprobs_of(const Outcome& o, int32_t seq) {
  std::vector<float> lp;
  for (const auto& g : o.detail[seq]) lp.push_back(g.logprob);
  return lp;
}

TEST(CpuModelRunner, GreedyMatchesTheModelsSingleSequenceGenerate) {
  TinyEngine t(64, 16, true);
  for (int32_t len : {3, 13, 30}) {
    GenerateRequest r = request(len, len, 10, false);
    Outcome o = t.run({r})[0];
    ASSERT_TRUE(o.done);
    ASSERT_TRUE(o.error.is_ok()) << o.error.to_string();
    minimax_m3::PagedKvCache cache(t.runner->model().backend(), t.cfg, 32);
    testing::SimplePagePool pool(32);
    testing::GenerateOptions opts;
    opts.max_tokens = 10;
    auto ref = testing::generate(&t.runner->model(), &cache, &pool, r.prompt_tokens, opts);
    ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
    EXPECT_EQ(o.tokens[0], *ref) << "prompt length " << len;
  }
}

TEST(CpuModelRunner, BatchPrefixAndPreemptionInvariance) {
  std::vector<GenerateRequest> reqs;
  for (int32_t i = 0; i < 6; ++i) {
    GenerateRequest r = request(i % 2, 9 + 5 * i, 8, i % 2 == 1);  // shared prompt prefixes
    if (i == 4) r.params.n = 2;
    reqs.push_back(r);
  }
  std::vector<Outcome> alone;
  for (const auto& r : reqs) {
    TinyEngine t(64, 16, false);
    alone.push_back(t.run({r})[0]);
    ASSERT_TRUE(alone.back().error.is_ok()) << alone.back().error.to_string();
  }
  struct Setup {
    int32_t pages, budget;
    bool prefix;
  };
  for (Setup s : {Setup{64, 16, false}, Setup{64, 7, true}, Setup{14, 8, true}}) {
    TinyEngine t(s.pages, s.budget, s.prefix);
    // Twice: the second round hits the prefix cache for every prompt.
    for (int round = 0; round < (s.prefix ? 2 : 1); ++round) {
      std::vector<Outcome> together = t.run(reqs);
      for (size_t i = 0; i < reqs.size(); ++i) {
        const std::string where = "pages " + std::to_string(s.pages) + " budget " +
                                  std::to_string(s.budget) + " round " + std::to_string(round) +
                                  " request " + std::to_string(i);
        ASSERT_TRUE(together[i].done) << where;
        EXPECT_EQ(together[i].tokens, alone[i].tokens) << where;
        for (int32_t q = 0; q < reqs[i].params.n; ++q) {
          EXPECT_EQ(logprobs_of(together[i], q), logprobs_of(alone[i], q)) << where;
        }
        if (round == 1) {
          EXPECT_GT(together[i].usage.cached_tokens, 0) << where;
        }
      }
    }
    const EngineStats st = t.engine->stats();
    if (s.pages == 14) {
      EXPECT_GT(st.num_preemptions_total, 0u);
    }
    EXPECT_EQ(st.kv_pages_used, 0);
  }
}

}  // namespace
}  // namespace m3
