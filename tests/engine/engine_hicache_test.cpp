// HiCache through the engine and scheduler over the fake model (whose logits depend on the
// context read back through the block table, so a stale or wrong page loaded from the host or
// disk tier changes the output): 1,000 random turns of 50 conversations, up to three at once,
// over a device pool of 16 four-token pages (preemption included), with and without a disk
// tier and under both write policies. Every output equals the direct greedy computation, no
// slot is read at a wrong position, no device page is held once the turn ends, the index stays
// consistent with both pools, and a flush returns the whole device pool.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <random>

#include "engine_test_util.h"

namespace m3 {
namespace {

namespace fs = std::filesystem;
using testing::FakeModel;

void random_turns(HiCacheWritePolicy policy, const std::string& disk_dir) {
  testing::EngineFixtureConfig f;
  f.vocab = 50;
  f.pages = 16;
  f.page_size = 4;
  f.budget = 16;
  FakeModel* model = nullptr;
  std::unique_ptr<Engine> engine = testing::make_engine(f, &model);
  HiCacheOptions o;
  o.host_pages = 24;
  o.policy = policy;
  o.disk_dir = disk_dir;
  o.model_identity = "fake";
  ASSERT_TRUE(engine->enable_hicache(o).is_ok());

  std::mt19937 rng(99);
  std::vector<std::vector<int32_t>> convs(50);
  int turns = 0;
  while (turns < 1000) {
    const int batch = 1 + static_cast<int>(rng() % 3);
    std::vector<RequestHandle> handles;
    std::vector<size_t> which;
    std::vector<int32_t> ns;
    std::vector<int32_t> max_tokens;
    for (int b = 0; b < batch; ++b, ++turns) {
      size_t c = rng() % convs.size();
      if (std::find(which.begin(), which.end(), c) != which.end()) continue;
      std::vector<int32_t>& conv = convs[c];
      if (conv.size() > 40) conv.resize(rng() % 12);  // a new conversation in this slot
      const int32_t extra = 1 + static_cast<int32_t>(rng() % 6);
      for (int32_t i = 0; i < extra; ++i) conv.push_back(static_cast<int32_t>(rng() % 50));
      GenerateRequest r;
      r.prompt_tokens = conv;
      r.params.temperature = 0.0f;
      r.params.max_tokens = 1 + static_cast<int32_t>(rng() % 4);
      r.params.ignore_eos = true;
      auto h = engine->submit(r);
      ASSERT_TRUE(h.is_ok()) << h.status().to_string();
      handles.push_back(std::move(h).value());
      which.push_back(c);
      ns.push_back(1);
      max_tokens.push_back(r.params.max_tokens);
    }
    std::vector<testing::Outcome> outs = testing::run_all(*engine, handles, ns);
    for (size_t i = 0; i < outs.size(); ++i) {
      std::vector<int32_t>& conv = convs[which[i]];
      ASSERT_TRUE(outs[i].done && outs[i].error.is_ok()) << outs[i].error.to_string();
      ASSERT_EQ(outs[i].tokens[0], testing::greedy_reference(conv, f.vocab, max_tokens[i]))
          << "turn " << turns;
      conv.insert(conv.end(), outs[i].tokens[0].begin(), outs[i].tokens[0].end());
    }
    const EngineStats s = engine->stats();
    ASSERT_EQ(s.kv_pages_used, 0) << "turn " << turns << ": a device page leaked";
    ASSERT_EQ(s.kv_pages_free + s.kv_pages_cached, s.kv_pages_total);
    ASSERT_EQ(engine->scheduler().prefix_index().check_invariants(), "") << "turn " << turns;
  }
  EXPECT_EQ(model->corrupt_reads, 0);
  const EngineStats s = engine->stats();
  EXPECT_GT(s.hicache_host_hit_tokens_total, 0u);
  EXPECT_GT(s.prefix_cache_hit_tokens_total, s.hicache_host_hit_tokens_total);
  if (!disk_dir.empty()) {
    EXPECT_GT(s.hicache_disk_hit_tokens_total, 0u);
  }
  EXPECT_GT(s.num_preemptions_total, 0u) << "the pool never ran short: a weaker test";
  const_cast<Scheduler&>(engine->scheduler()).flush_prefix_cache();
  EXPECT_EQ(engine->scheduler().pool().num_free(), f.pages);
  EXPECT_EQ(engine->scheduler().prefix_index().check_invariants(), "");
}

TEST(EngineHiCache, RandomTurnsWriteThroughLeakNothing) {
  random_turns(HiCacheWritePolicy::kWriteThrough, "");
}

TEST(EngineHiCache, RandomTurnsWriteBackWithDiskLeakNothing) {
  const fs::path dir =
      fs::temp_directory_path() / ("m3_engine_hicache_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  random_turns(HiCacheWritePolicy::kWriteBack, dir.string());
  fs::remove_all(dir);
}

TEST(EngineHiCache, RefusedWithoutPrefixCache) {
  testing::EngineFixtureConfig f;
  f.prefix = false;
  std::unique_ptr<Engine> engine = testing::make_engine(f);
  HiCacheOptions o;
  o.host_pages = 8;
  o.model_identity = "fake";
  const Status st = engine->enable_hicache(o);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("needs the prefix cache"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace m3
