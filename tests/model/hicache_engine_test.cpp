// HiCache end to end on the bundled m3-tiny (CPU, temperature 0): a 20-turn conversation
// whose prefix a long unrelated request pushes out of a device pool of a few pages is served from
// the host tier (prefix-cache and HiCache hit counters rise every turn), and every turn's tokens
// and logprobs are bitwise those of an engine without any prefix cache. The disk tier survives
// an engine restart on the same directory with the same bitwise outputs, and the pools return to
// their baseline after every run.
//
// Why bitwise: the copies move K, V and index-key bytes unchanged, and on the CPU backend a
// token's logits do not depend on whether its prefix was computed in this request or read from
// the cache (the prefix-cache invariance cpu_model_runner_test checks), so any difference is a
// wrong or stale page. Over an fp8 or fp4 cache, whose pages depend on the steps that wrote them,
// the reference is an engine that keeps every page on the device instead.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <map>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine_test_util.h"
#include "model/minimax_m3/cpu_model_runner.h"
#include "model/minimax_m3/model_dir.h"
#include "model/minimax_m3/tensor_parallel_runner.h"

namespace m3 {
namespace {

namespace fs = std::filesystem;
using testing::Outcome;

const std::string kTinyDir = std::string(M3_REPO_ROOT) + "/models/m3-tiny";

struct TinyServer {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<WeightSource> weights;

  // device_pages: the KV pool; host_pages 0 = no HiCache; prefix false = no prefix cache;
  // ranks > 1: tensor-parallel CPU ranks (TensorParallelCpuRunner, a page every rank's shard);
  // kv: the cache's storage (--kv-cache-dtype).
  TinyServer(int32_t device_pages, int32_t host_pages, bool prefix,
             HiCacheWritePolicy policy = HiCacheWritePolicy::kWriteThrough,
             const std::string& disk_dir = "", int ranks = 1,
             KvCacheDtype kv = KvCacheDtype::kFloat32) {
    auto backend = std::make_unique<CpuBackend>(2);
    auto loaded = minimax_m3::load_model_dir(kTinyDir, backend.get());
    EXPECT_TRUE(loaded.is_ok()) << loaded.status().to_string();
    const int32_t page_size = static_cast<int32_t>(loaded->config.index_block_size);
    weights = std::move(loaded->weights);
    std::unique_ptr<ModelRunner> runner;
    if (ranks > 1) {
      auto r = TensorParallelCpuRunner::create(loaded->config, *weights, ranks, 1, 1, device_pages,
                                               1, kv);
      EXPECT_TRUE(r.is_ok()) << r.status().to_string();
      runner = std::move(r).value();
    } else {
      auto r = MiniMaxM3ModelRunner::create_with_pages(std::move(backend),
                                                       std::move(loaded->model), device_pages, kv);
      EXPECT_TRUE(r.is_ok()) << r.status().to_string();
      runner = std::move(r).value();
    }
    EngineConfig c;
    c.scheduler.page_size = page_size;
    c.scheduler.chunked_prefill_size = 256;
    c.scheduler.enable_prefix_cache = prefix;
    auto e = Engine::create(std::move(c), std::move(runner));
    EXPECT_TRUE(e.is_ok()) << e.status().to_string();
    engine = std::move(e).value();
    if (host_pages > 0) {
      HiCacheOptions o;
      o.host_pages = host_pages;
      o.policy = policy;
      o.disk_dir = disk_dir;
      o.model_identity = "m3-tiny test";
      Status st = engine->enable_hicache(o);
      EXPECT_TRUE(st.is_ok()) << st.to_string();
    }
  }

  Outcome run(const std::vector<int32_t>& prompt, int32_t max_tokens) {
    GenerateRequest r;
    r.prompt_tokens = prompt;
    r.params.temperature = 0.0f;
    r.params.max_tokens = max_tokens;
    r.params.logprobs = true;
    r.params.ignore_eos = true;
    auto h = engine->submit(r);
    EXPECT_TRUE(h.is_ok()) << h.status().to_string();
    std::vector<RequestHandle> hs;
    hs.push_back(std::move(h).value());
    Outcome o = testing::run_all(*engine, hs, {1})[0];
    EXPECT_TRUE(o.done && o.error.is_ok()) << o.error.to_string();
    return o;
  }

  // Nothing held by a sequence, and the radix index consistent with both pools.
  void expect_baseline() const {
    EngineStats s = engine->stats();
    EXPECT_EQ(s.kv_pages_used, 0);
    EXPECT_EQ(s.kv_pages_free + s.kv_pages_cached, s.kv_pages_total);
    EXPECT_EQ(engine->scheduler().prefix_index().check_invariants(), "");
  }
};

std::vector<int32_t> words(uint32_t seed, int32_t n) {
  std::vector<int32_t> t;
  uint32_t x = seed * 2654435761u + 12345u;
  for (int32_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    t.push_back(static_cast<int32_t>(10 + (x >> 8) % 3000));
  }
  return t;
}

void expect_same_output(const Outcome& got, const Outcome& want, const std::string& what) {
  ASSERT_EQ(got.tokens[0], want.tokens[0]) << what;
  ASSERT_EQ(got.detail[0].size(), want.detail[0].size()) << what;
  for (size_t i = 0; i < got.detail[0].size(); ++i) {
    EXPECT_EQ(got.detail[0][i].logprob, want.detail[0][i].logprob) << what << ", token " << i;
  }
}

constexpr int32_t kTurns = 20;
constexpr int32_t kNewTokens = 4;
constexpr int32_t kDevicePages = 8;  // of 32 tokens: the longest turn (<= 7 pages) and little more

// The conversation's turns: a 40-token system prompt, then per turn the model's 4 tokens and 4
// user tokens. The reference outputs come from an engine without a prefix cache.
struct Conversation {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<Outcome> want;
};

// A quantised cache is not prefix-invariant (a page's codes depend on the steps that wrote it),
// so its reference is an engine with the prefix cache and a pool that never evicts: the tiers
// must give exactly what keeping the pages on the device gives.
const Conversation& reference_conversation(int ranks = 1,
                                           KvCacheDtype kv = KvCacheDtype::kFloat32) {
  static std::map<std::pair<int, KvCacheDtype>, Conversation> made;
  if (auto it = made.find({ranks, kv}); it != made.end()) return it->second;
  const Conversation& c = made[{ranks, kv}] = [ranks, kv] {
    Conversation c;
    const bool quantised = kv != KvCacheDtype::kFloat32;
    TinyServer fresh(quantised ? 64 : kDevicePages, 0, quantised,
                     HiCacheWritePolicy::kWriteThrough, "", ranks, kv);
    std::vector<int32_t> conv = words(1, 40);
    for (int32_t turn = 0; turn < kTurns; ++turn) {
      c.prompts.push_back(conv);
      c.want.push_back(fresh.run(conv, kNewTokens));
      const auto& out = c.want.back().tokens[0];
      conv.insert(conv.end(), out.begin(), out.end());
      std::vector<int32_t> user = words(100 + static_cast<uint32_t>(turn), 4);
      conv.insert(conv.end(), user.begin(), user.end());
    }
    return c;
  }();
  return c;
}

void serve_conversation(HiCacheWritePolicy policy, int32_t turns, int ranks = 1,
                        KvCacheDtype kv = KvCacheDtype::kFloat32) {
  const Conversation& ref = reference_conversation(ranks, kv);
  TinyServer tiered(kDevicePages, 48, true, policy, "", ranks, kv);
  uint64_t last_prefix_hits = 0, last_host_hits = 0;
  for (int32_t turn = 0; turn < turns; ++turn) {
    const std::string what =
        std::string(hicache_write_policy_name(policy)) + " turn " + std::to_string(turn);
    Outcome got = tiered.run(ref.prompts[turn], kNewTokens);
    expect_same_output(got, ref.want[turn], what);
    EngineStats s = tiered.engine->stats();
    if (turn > 0) {
      EXPECT_GT(got.usage.cached_tokens, 0) << what;
      EXPECT_GT(s.prefix_cache_hit_tokens_total, last_prefix_hits) << what;
      EXPECT_GT(s.hicache_host_hit_tokens_total, last_host_hits) << what;
    }
    last_prefix_hits = s.prefix_cache_hit_tokens_total;
    last_host_hits = s.hicache_host_hit_tokens_total;
    // 255 tokens + 1 generated fill all 8 device pages: every cached page of the conversation
    // must leave the device.
    tiered.run(words(1000 + static_cast<uint32_t>(turn), kDevicePages * 32 - 1), 1);
    EXPECT_GT(tiered.engine->scheduler().prefix_index().num_host_nodes(), 0) << what;
    tiered.expect_baseline();
  }
  EngineStats s = tiered.engine->stats();
  EXPECT_TRUE(s.hicache_enabled);
  EXPECT_GT(s.hicache_host_pages_used, 0);
  EXPECT_EQ(s.hicache_host_pages_total, 48);
  EXPECT_EQ(s.hicache_loads_total, uint64_t(turns - 1));
  EXPECT_EQ(s.hicache_disk_hit_tokens_total, 0u);
}

TEST(HiCacheEngine, EvictedConversationIsServedFromHostBitwiseWriteThrough) {
  serve_conversation(HiCacheWritePolicy::kWriteThrough, kTurns);
}

TEST(HiCacheEngine, EvictedConversationIsServedFromHostBitwiseWriteBack) {
  serve_conversation(HiCacheWritePolicy::kWriteBack, 8);
}

// --tp 2 on CPU ranks: a host page is both ranks' shards; the same bitwise check against an
// engine of the same two ranks without a prefix cache.
TEST(HiCacheEngine, EvictedConversationIsServedFromHostOverTwoCpuRanks) {
  serve_conversation(HiCacheWritePolicy::kWriteThrough, 8, 2);
}

// Quantised caches: a page moves with its codes, block scales and page-head scales.
TEST(HiCacheEngine, EvictedConversationIsServedFromHostWithAnFp8Cache) {
  serve_conversation(HiCacheWritePolicy::kWriteThrough, 8, 1, KvCacheDtype::kFp8E4M3);
}

TEST(HiCacheEngine, EvictedConversationIsServedFromHostWithAnFp4CacheOverTwoCpuRanks) {
  serve_conversation(HiCacheWritePolicy::kWriteBack, 6, 2, KvCacheDtype::kFp4E2M1);
}

TEST(HiCacheEngine, DiskTierSurvivesARestart) {
  const fs::path dir =
      fs::temp_directory_path() / ("m3_hicache_engine_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  std::vector<int32_t> conv = words(2, 200);
  TinyServer fresh(kDevicePages, 0, false);
  const Outcome want = fresh.run(conv, kNewTokens);
  {
    // A host tier of two pages: the conversation's pages reach the disk once evicted.
    TinyServer first(kDevicePages, 2, true, HiCacheWritePolicy::kWriteBack, dir.string());
    expect_same_output(first.run(conv, kNewTokens), want, "first server");
    first.run(words(3, kDevicePages * 32 - 1), 1);
    first.run(words(4, kDevicePages * 32 - 1), 1);
    first.expect_baseline();
  }
  TinyServer second(kDevicePages, 2, true, HiCacheWritePolicy::kWriteBack, dir.string());
  const Outcome got = second.run(conv, kNewTokens);
  expect_same_output(got, want, "restarted server");
  EngineStats s = second.engine->stats();
  // 200 tokens: 6 full pages, all of them matchable ((200 - 1) / 32 = 6).
  EXPECT_EQ(s.hicache_disk_hit_tokens_total, uint64_t(6 * 32));
  EXPECT_EQ(got.usage.cached_tokens, 6 * 32);
  second.expect_baseline();
  fs::remove_all(dir);
}

TEST(HiCacheEngine, WithoutPrefixCacheIsRefused) {
  // Prefix cache off: HiCache has nothing to stand behind.
  TinyServer off(8, 0, false);
  HiCacheOptions o;
  o.host_pages = 4;
  o.model_identity = "x";
  Status st = off.engine->enable_hicache(o);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("--enable-hierarchical-cache"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace m3
