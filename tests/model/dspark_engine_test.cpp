// Speculative decoding with a DSpark draft on the bundled m3-tiny target (float32 CPU): greedy
// output equals ordinary decoding token for token (and logprob for logprob) with a random dummy
// draft (rejections nearly everywhere) and with an oracle draft proposing the target's own
// continuation (everything accepted), at 32 and 256 new tokens; after verify steps the target's
// KV cache of the committed positions is bitwise a fresh prefill's.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine_test_util.h"
#include "model/minimax_m3/cpu_model_runner.h"
#include "model/minimax_m3/dspark/dspark_engine_draft.h"
#include "model/minimax_m3/model_dir.h"
#include "model/minimax_m3/tensor_parallel_runner.h"
#include "single_sequence.h"

namespace m3 {
namespace {

using minimax_m3::dspark::DSparkEngineDraft;
using testing::Outcome;

const std::string kTinyDir = std::string(M3_REPO_ROOT) + "/models/m3-tiny";

// Proposes the known continuation of one sequence (prompt + the plain engine's output) through
// the engine's picker, with one-hot logits; the context goes through the real DSpark draft, so
// its bookkeeping is exercised as with any draft.
class OracleDraft final : public DraftModel {
 public:
  OracleDraft(std::unique_ptr<DSparkEngineDraft> inner, std::vector<int32_t> sequence,
              int32_t vocab)
      : inner_(std::move(inner)), sequence_(std::move(sequence)), vocab_(vocab) {}
  int32_t block_size() const override { return inner_->block_size(); }
  std::vector<int32_t> capture_layers() const override { return inner_->capture_layers(); }
  std::unique_ptr<DraftState> new_state() override { return inner_->new_state(); }
  Status append_context(DraftState& s, std::span<const float> c, int64_t n) override {
    return inner_->append_context(s, c, n);
  }
  Status truncate(DraftState& s, int64_t n) override { return inner_->truncate(s, n); }
  Status propose(DraftState& s, int32_t anchor, const DraftTokenPicker& pick,
                 std::vector<int32_t>* tokens) override {
    const int64_t p = s.length();  // the anchor's position
    if (p >= static_cast<int64_t>(sequence_.size()) || sequence_[p] != anchor)
      return internal_error("[oracle] the anchor is not the known sequence's");
    tokens->clear();
    std::vector<float> logits(vocab_);
    for (int32_t k = 0; k < block_size(); ++k) {
      const size_t at = static_cast<size_t>(p + 1 + k);
      const int32_t want = at < sequence_.size() ? sequence_[at] : 0;
      std::fill(logits.begin(), logits.end(), -1e30f);
      logits[want] = 0.0f;
      tokens->push_back(pick(logits, k));
    }
    return Status::ok();
  }

 private:
  std::unique_ptr<DSparkEngineDraft> inner_;
  std::vector<int32_t> sequence_;
  int32_t vocab_;
};

// Passes everything to the DSpark draft and records every proposal (the context length, the
// anchor and the drafted tokens): two runs whose draft contexts are the same propose the same.
struct Proposal {
  int64_t length = 0;
  int32_t anchor = 0;
  std::vector<int32_t> tokens;
  bool operator==(const Proposal&) const = default;
};

class RecordingDraft final : public DraftModel {
 public:
  RecordingDraft(std::unique_ptr<DraftModel> inner, std::vector<Proposal>* log)
      : inner_(std::move(inner)), log_(log) {}
  int32_t block_size() const override { return inner_->block_size(); }
  std::vector<int32_t> capture_layers() const override { return inner_->capture_layers(); }
  std::unique_ptr<DraftState> new_state() override { return inner_->new_state(); }
  Status append_context(DraftState& s, std::span<const float> c, int64_t n) override {
    return inner_->append_context(s, c, n);
  }
  Status truncate(DraftState& s, int64_t n) override { return inner_->truncate(s, n); }
  Status propose(DraftState& s, int32_t anchor, const DraftTokenPicker& pick,
                 std::vector<int32_t>* tokens) override {
    const int64_t length = s.length();
    M3_RETURN_IF_ERROR(inner_->propose(s, anchor, pick, tokens));
    log_->push_back({length, anchor, *tokens});
    return Status::ok();
  }

 private:
  std::unique_ptr<DraftModel> inner_;
  std::vector<Proposal>* log_;
};

struct TinyTarget {
  MiniMaxM3ModelRunner* runner = nullptr;
  std::unique_ptr<Engine> engine;
  MiniMaxM3Config cfg;

  // oracle: the sequence an oracle draft proposes from; empty: a random dummy draft; null: none.
  // Every proposal of the draft (a random dummy draft: with `oracle` null and `log` set).
  std::vector<Proposal> proposals;

  explicit TinyTarget(const std::vector<int32_t>* oracle, bool speculative = true,
                      bool record = false) {
    auto backend = std::make_unique<CpuBackend>(2);
    auto loaded = minimax_m3::load_model_dir(kTinyDir, backend.get());
    EXPECT_TRUE(loaded.is_ok()) << loaded.status().to_string();
    cfg = loaded->config;
    weights_ = std::move(loaded->weights);
    auto r =
        MiniMaxM3ModelRunner::create_with_pages(std::move(backend), std::move(loaded->model), 64);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    runner = r->get();
    EngineConfig c;
    c.scheduler.page_size = static_cast<int32_t>(cfg.index_block_size);
    c.scheduler.chunked_prefill_size = 64;
    auto e = Engine::create(std::move(c), std::move(r).value());
    EXPECT_TRUE(e.is_ok()) << e.status().to_string();
    engine = std::move(e).value();
    if (!speculative) return;
    minimax_m3::dspark::DSparkLoadOptions o;
    // A directory without config.json: a dummy draft at default_dspark_config_for(m3-tiny), whatever
    // draft models/m3-tiny/dspark bundles.
    o.draft_dir = kTinyDir + "/no-dspark-here";
    o.dummy_weights = true;
    auto d = minimax_m3::dspark::load_dspark_engine_draft(o, runner->model(), runner->backend());
    EXPECT_TRUE(d.is_ok()) << d.status().to_string();
    std::unique_ptr<DraftModel> draft = std::move(d).value();
    if (oracle) {
      draft = std::make_unique<OracleDraft>(
          std::unique_ptr<DSparkEngineDraft>(static_cast<DSparkEngineDraft*>(draft.release())),
          *oracle, static_cast<int32_t>(cfg.vocab_size));
    } else if (record) {
      draft = std::make_unique<RecordingDraft>(std::move(draft), &proposals);
    }
    SpeculativeOptions so;
    // The random draft's drafts are nearly all rejected: 2 per verify keep the test quick.
    so.num_draft_tokens = oracle ? draft->block_size() + 1 : 3;
    Status st = engine->enable_speculative(std::move(draft), so);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
  }

  Outcome run(const GenerateRequest& r) {
    auto h = engine->submit(r);
    EXPECT_TRUE(h.is_ok()) << h.status().to_string();
    std::vector<RequestHandle> hs;
    hs.push_back(std::move(h).value());
    return testing::run_all(*engine, hs, {r.params.n})[0];
  }

 private:
  std::unique_ptr<WeightSource> weights_;
};

GenerateRequest greedy_request(int32_t max_tokens) {
  GenerateRequest r;
  for (int32_t i = 0; i < 21; ++i) r.prompt_tokens.push_back((i * 37 + 11) % 4000);
  r.params.temperature = 0.0f;
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  r.params.logprobs = true;
  return r;
}

// `got` (decoded with a draft) is `want` (decoded without) token for token and logprob for
// logprob, and the draft drafted.
void expect_same_decoding(const Outcome& got, const Outcome& want, const std::string& what) {
  ASSERT_TRUE(got.done && got.error.is_ok()) << what << ": " << got.error.to_string();
  EXPECT_EQ(got.tokens, want.tokens) << what;
  for (size_t t = 0; t < got.detail[0].size() && t < want.detail[0].size(); ++t) {
    EXPECT_EQ(got.detail[0][t].logprob, want.detail[0][t].logprob) << what << " token " << t;
  }
  EXPECT_GT(got.usage.spec_draft_tokens, 0) << what;
}

TEST(DSparkEngine, GreedyEqualsOrdinaryDecodingOnTheBundledModel) {
  for (int32_t max_tokens : {32, 256}) {
    const GenerateRequest r = greedy_request(max_tokens);
    TinyTarget plain(nullptr, false);
    const Outcome want = plain.run(r);
    ASSERT_TRUE(want.done && want.error.is_ok()) << want.error.to_string();
    ASSERT_EQ(want.tokens[0].size(), static_cast<size_t>(max_tokens));
    std::vector<int32_t> sequence = r.prompt_tokens;
    sequence.insert(sequence.end(), want.tokens[0].begin(), want.tokens[0].end());
    for (bool oracle : {false, true}) {
      TinyTarget spec(oracle ? &sequence : nullptr);
      const Outcome got = spec.run(r);
      const std::string what = std::to_string(max_tokens) + (oracle ? " oracle" : " random");
      ASSERT_NO_FATAL_FAILURE(expect_same_decoding(got, want, what));
      if (oracle) {
        EXPECT_EQ(got.usage.spec_accepted_tokens, got.usage.spec_draft_tokens) << what;
      } else {
        EXPECT_LT(got.usage.spec_accepted_tokens * 4, got.usage.spec_draft_tokens) << what;
      }
      EXPECT_EQ(spec.engine->stats().kv_pages_used, 0) << what;
    }
  }
}

// Image features (rows injected in place of prompt embeddings) with a draft: the draft's context
// is the target's captured hidden states, so the request decodes as without a draft, and an
// oracle draft is still accepted in full.
TEST(DSparkEngine, PromptEmbeddingsGreedyEqualsOrdinaryDecoding) {
  GenerateRequest r = greedy_request(48);
  TinyTarget plain(nullptr, false);
  const int64_t hidden = plain.cfg.hidden_size;
  auto values = std::make_shared<std::vector<float>>(size_t(8 * hidden));
  uint64_t x = 0x2545f4914f6cdd1dull;
  for (float& v : *values) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    v = (float((x >> 40) & 0xffff) / 65535.0f - 0.5f) * 0.2f;
  }
  PromptEmbeddings e;
  e.token_offset = 6;
  e.num_tokens = 8;
  e.values = values;
  e.content_hash = 0x1234;
  r.prompt_embeddings.push_back(e);

  const Outcome want = plain.run(r);
  ASSERT_TRUE(want.done && want.error.is_ok()) << want.error.to_string();
  TinyTarget text_only(nullptr, false);
  const Outcome without = text_only.run(greedy_request(48));
  ASSERT_TRUE(without.done && without.error.is_ok());
  EXPECT_NE(want.tokens, without.tokens) << "the injected rows changed nothing";
  std::vector<int32_t> sequence = r.prompt_tokens;
  sequence.insert(sequence.end(), want.tokens[0].begin(), want.tokens[0].end());
  for (bool oracle : {false, true}) {
    TinyTarget spec(oracle ? &sequence : nullptr);
    const Outcome got = spec.run(r);
    const std::string what = oracle ? "oracle" : "random";
    ASSERT_NO_FATAL_FAILURE(expect_same_decoding(got, want, what));
    if (oracle) {
      EXPECT_EQ(got.usage.spec_accepted_tokens, got.usage.spec_draft_tokens) << what;
    }
    EXPECT_EQ(spec.engine->stats().kv_pages_used, 0) << what;
  }
}

TEST(DSparkEngine, VerifiedKvEqualsAFreshPrefill) {
  // A random draft: every verify writes rejected drafts' K/V past the committed length, which the
  // next verify overwrites.
  TinyTarget spec(nullptr);
  GenerateRequest r = greedy_request(100);
  auto h = spec.engine->submit(r);
  ASSERT_TRUE(h.is_ok());
  for (int i = 0; i < 12; ++i) spec.engine->step();
  const std::vector<SeqId> running = spec.engine->scheduler().running_ids();
  ASSERT_EQ(running.size(), 1u);
  const SequenceState* st = spec.engine->scheduler().find(running[0]);
  ASSERT_NE(st, nullptr);
  ASSERT_GT(spec.engine->stats().spec_draft_tokens_total, 0u);
  const int64_t n = st->num_computed_tokens;
  ASSERT_GT(n, static_cast<int64_t>(r.prompt_tokens.size()) + 4);

  minimax_m3::PagedKvCache fresh(spec.runner->model().backend(), spec.cfg, 16);
  testing::SimplePagePool pool(16);
  testing::SequenceRunner seq(&spec.runner->model(), &fresh, &pool);
  std::vector<float> logits;
  ASSERT_TRUE(seq.append(std::span<const int32_t>(st->tokens.data(), static_cast<size_t>(n)), 0,
                         false, &logits)
                  .is_ok());
  const int64_t S = fresh.page_size();
  for (int64_t l = 0; l < spec.cfg.num_hidden_layers; ++l) {
    const KvLayerView a = spec.runner->kv_cache().layer(l);
    const KvLayerView b = fresh.layer(l);
    const size_t row = static_cast<size_t>(a.num_kv_heads * a.head_dim);
    for (int64_t pos = 0; pos < n; ++pos) {
      const size_t ia = static_cast<size_t>(st->pages[pos / S] * S + pos % S);
      const size_t ib = static_cast<size_t>(seq.block_table()[pos / S] * S + pos % S);
      ASSERT_EQ(std::memcmp(a.k + ia * row, b.k + ib * row, row * sizeof(float)), 0)
          << "K layer " << l << " position " << pos;
      ASSERT_EQ(std::memcmp(a.v + ia * row, b.v + ib * row, row * sizeof(float)), 0)
          << "V layer " << l << " position " << pos;
      if (a.idx_k) {
        const size_t d = static_cast<size_t>(a.index_head_dim);
        ASSERT_EQ(std::memcmp(a.idx_k + ia * d, b.idx_k + ib * d, d * sizeof(float)), 0)
            << "index keys layer " << l << " position " << pos;
      }
    }
  }
}

// A prompt of `pages` whole KV pages and a few tokens more.
GenerateRequest long_greedy_request(int32_t page_size, int32_t pages, int32_t max_tokens) {
  GenerateRequest r = greedy_request(max_tokens);
  r.prompt_tokens.clear();
  for (int32_t i = 0; i < pages * page_size + 5; ++i) {
    r.prompt_tokens.push_back((i * 53 + 7) % 4000);
  }
  return r;
}

// A speculative request served from the prefix cache (warm) decodes exactly as the same request
// computed from scratch (cold): the same tokens and logprobs, and the draft, whose context of
// the cached positions comes from the features kept with the pages, proposes the same tokens
// from the same context lengths.
TEST(DSparkEngine, WarmPrefixCacheEqualsCold) {
  TinyTarget spec(nullptr, true, /*record=*/true);
  const int32_t P = spec.engine->config().scheduler.page_size;
  const GenerateRequest r = long_greedy_request(P, 3, 24);
  const Outcome cold = spec.run(r);
  ASSERT_TRUE(cold.done && cold.error.is_ok()) << cold.error.to_string();
  EXPECT_EQ(cold.usage.cached_tokens, 0);
  const std::vector<Proposal> cold_proposals = spec.proposals;
  ASSERT_FALSE(cold_proposals.empty());
  ASSERT_NE(spec.engine->draft_feature_store(), nullptr);
  EXPECT_GE(spec.engine->draft_feature_store()->num_allocated(), 3);
  // Only committed full pages are published: the prompt and the generated tokens but the last
  // (never computed), not the pages the rejected drafts were written to.
  const int32_t committed = static_cast<int32_t>(r.prompt_tokens.size()) + 24 - 1;
  EXPECT_EQ(spec.engine->scheduler().prefix_index().num_nodes(), committed / P);

  spec.proposals.clear();
  const Outcome warm = spec.run(r);
  ASSERT_TRUE(warm.done && warm.error.is_ok()) << warm.error.to_string();
  EXPECT_EQ(warm.usage.cached_tokens, 3 * P) << "the prompt's full pages come from the cache";
  EXPECT_EQ(warm.tokens, cold.tokens);
  ASSERT_EQ(warm.detail[0].size(), cold.detail[0].size());
  for (size_t t = 0; t < warm.detail[0].size(); ++t) {
    EXPECT_EQ(warm.detail[0][t].logprob, cold.detail[0][t].logprob) << "token " << t;
  }
  EXPECT_EQ(spec.proposals, cold_proposals);
  EXPECT_EQ(warm.usage.spec_draft_tokens, cold.usage.spec_draft_tokens);
  EXPECT_EQ(warm.usage.spec_accepted_tokens, cold.usage.spec_accepted_tokens);
  EXPECT_EQ(spec.engine->stats().kv_pages_used, 0);

  // And both equal ordinary decoding.
  TinyTarget plain(nullptr, false);
  const Outcome want = plain.run(r);
  EXPECT_EQ(cold.tokens, want.tokens);
}

// n = 2 speculative sequences share the prompt's pages (the second is served from the first's
// prefill) and each decodes as a single request does.
TEST(DSparkEngine, SpeculativeSiblingsSharePromptPages) {
  TinyTarget spec(nullptr);
  const int32_t P = spec.engine->config().scheduler.page_size;
  GenerateRequest r = long_greedy_request(P, 2, 16);
  const Outcome one = spec.run(r);
  ASSERT_TRUE(one.done && one.error.is_ok()) << one.error.to_string();
  TinyTarget fresh(nullptr);
  r.params.n = 2;
  const Outcome two = fresh.run(r);
  ASSERT_TRUE(two.done && two.error.is_ok()) << two.error.to_string();
  ASSERT_EQ(two.tokens.size(), 2u);
  EXPECT_EQ(two.tokens[0], one.tokens[0]);
  EXPECT_EQ(two.tokens[1], one.tokens[0]);
  EXPECT_EQ(fresh.engine->stats().prefix_cache_hit_tokens_total, static_cast<uint64_t>(2 * P))
      << "the second sequence reads the first one's two prompt pages";
  EXPECT_EQ(fresh.engine->stats().kv_pages_used, 0);
}

// Pages written by a request that records no draft features (one that keeps its prompt logits
// decodes without the draft) are not used by a speculative request: it computes them again.
TEST(DSparkEngine, PagesWithoutDraftFeaturesAreRecomputed) {
  TinyTarget spec(nullptr);
  const int32_t P = spec.engine->config().scheduler.page_size;
  GenerateRequest plain = long_greedy_request(P, 2, 4);
  plain.prompt_logits = true;
  const Outcome first = spec.run(plain);
  ASSERT_TRUE(first.done && first.error.is_ok()) << first.error.to_string();
  const uint64_t hits = spec.engine->stats().prefix_cache_hit_tokens_total;
  GenerateRequest r = long_greedy_request(P, 2, 16);
  const Outcome got = spec.run(r);
  ASSERT_TRUE(got.done && got.error.is_ok()) << got.error.to_string();
  EXPECT_EQ(got.usage.cached_tokens, 0);
  EXPECT_EQ(spec.engine->stats().prefix_cache_hit_tokens_total, hits);
  EXPECT_GT(got.usage.spec_draft_tokens, 0);
  // Recomputed, the pages now carry features: the same request hits the cache.
  const Outcome again = spec.run(r);
  ASSERT_TRUE(again.done && again.error.is_ok()) << again.error.to_string();
  EXPECT_EQ(again.usage.cached_tokens, 2 * P);
  EXPECT_EQ(again.tokens, got.tokens);
  TinyTarget ordinary(nullptr, false);
  EXPECT_EQ(ordinary.run(r).tokens, got.tokens);
}

// Over CPU ranks: the draft runs unsplit on rank 0 (its embedding, lm_head and final norm), fed
// by the hidden states the sharded target captures; verification runs through the sharded
// target. With attention data parallelism (--enable-dp-attention --dp 2) the requests are spread
// over the groups, each group's first rank sends its captured states to rank 0, and the draft
// features kept for prefix-cache hits are per group's pool. Greedy output and logprobs equal
// ordinary decoding on the same ranks, request by request (two ranks sum in one order either
// way, so a token's logits do not depend on the step's other rows).
void ranks_case(int dp, int requests) {
  auto backend = std::make_unique<CpuBackend>(1);
  auto loaded = minimax_m3::load_model_dir(kTinyDir, backend.get());
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  auto make = [&](bool speculative) {
    // The draft reads the whole lm_head on rank 0 (the other rank holds its vocabulary slice);
    // the plain run splits it over both ranks.
    auto r = TensorParallelCpuRunner::create(loaded->config, *loaded->weights, 2, 1, 1, 64, dp,
                                             KvCacheDtype::kFloat32, speculative);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    TensorParallelCpuRunner* ranks = r->get();
    EngineConfig c;
    c.scheduler.page_size = static_cast<int32_t>(loaded->config.index_block_size);
    c.scheduler.chunked_prefill_size = 64;
    auto e = Engine::create(std::move(c), std::move(r).value());
    EXPECT_TRUE(e.is_ok()) << e.status().to_string();
    std::unique_ptr<Engine> engine = std::move(e).value();
    if (speculative) {
      minimax_m3::dspark::DSparkLoadOptions o;
      o.dummy_weights = true;
      auto d = minimax_m3::dspark::load_dspark_engine_draft(
          o, loaded->config, ranks->first_rank_model(), ranks->first_rank_backend());
      EXPECT_TRUE(d.is_ok()) << d.status().to_string();
      SpeculativeOptions so;
      so.num_draft_tokens = 3;
      Status st = engine->enable_speculative(std::move(d).value(), so);
      EXPECT_TRUE(st.is_ok()) << st.to_string();
    }
    return engine;
  };
  const int32_t P = static_cast<int32_t>(loaded->config.index_block_size);
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < requests; ++i) {
    GenerateRequest r = long_greedy_request(P, 1, 32);
    for (int32_t& t : r.prompt_tokens) t = (t + 97 * i) % 4000;  // a different prompt each
    reqs.push_back(r);
  }
  auto run = [&](Engine& engine) {
    std::vector<RequestHandle> hs;
    for (const GenerateRequest& r : reqs) {
      auto h = engine.submit(r);
      EXPECT_TRUE(h.is_ok()) << h.status().to_string();
      hs.push_back(std::move(h).value());
    }
    return testing::run_all(engine, hs, std::vector<int32_t>(reqs.size(), 1));
  };
  std::unique_ptr<Engine> plain = make(false);
  std::unique_ptr<Engine> spec = make(true);
  ASSERT_EQ(spec->scheduler().num_dp_groups(), dp);
  const std::vector<Outcome> want = run(*plain);
  const std::vector<Outcome> got = run(*spec);
  for (int i = 0; i < requests; ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    ASSERT_TRUE(want[i].done && want[i].error.is_ok()) << want[i].error.to_string();
    ASSERT_TRUE(got[i].done && got[i].error.is_ok()) << got[i].error.to_string();
    ASSERT_EQ(want[i].tokens[0].size(), 32u);
    EXPECT_EQ(got[i].tokens, want[i].tokens);
    ASSERT_EQ(got[i].detail[0].size(), want[i].detail[0].size());
    for (size_t t = 0; t < got[i].detail[0].size(); ++t) {
      EXPECT_EQ(got[i].detail[0][t].logprob, want[i].detail[0][t].logprob) << "token " << t;
    }
    EXPECT_GT(got[i].usage.spec_verify_steps, 0);
  }
  for (int g = 0; g < dp; ++g) {  // every group served speculative requests and kept features
    ASSERT_NE(spec->draft_feature_store(g), nullptr);
    EXPECT_GT(spec->draft_feature_store(g)->num_allocated(), 0) << "group " << g;
  }
  // And served again from the prefix cache, over the ranks too (round robin puts request i in
  // group i % dp again: each group's cache holds its own requests' prefixes).
  const std::vector<Outcome> warm = run(*spec);
  for (int i = 0; i < requests; ++i) {
    EXPECT_EQ(warm[i].usage.cached_tokens, P) << "request " << i;
    EXPECT_EQ(warm[i].tokens, want[i].tokens) << "request " << i;
  }
  EXPECT_EQ(spec->stats().kv_pages_used, 0);
}

TEST(DSparkEngine, TensorParallelGreedyEqualsOrdinaryDecodingOnTheSameRanks) {
  ranks_case(1, 1);
}

TEST(DSparkEngine, AttentionDataParallelGreedyEqualsOrdinaryDecodingOnTheSameRanks) {
  ranks_case(2, 4);
}

TEST(DSparkEngine, MissingDraftDirectoryIsAClearError) {
  auto backend = std::make_unique<CpuBackend>(1);
  auto loaded = minimax_m3::load_model_dir(kTinyDir, backend.get());
  ASSERT_TRUE(loaded.is_ok());
  minimax_m3::dspark::DSparkLoadOptions o;
  o.draft_dir = kTinyDir + "/no-such-draft";
  auto d = minimax_m3::dspark::load_dspark_engine_draft(o, *loaded->model, backend.get());
  ASSERT_FALSE(d.is_ok());
  EXPECT_NE(d.status().message().find("--speculative-draft-model-path"), std::string::npos);
  EXPECT_NE(d.status().message().find("--load-format dummy"), std::string::npos);
}

}  // namespace
}  // namespace m3
