// Speculative decoding in the engine over fakes (tests/engine/spec_fakes.h): greedy output equals
// ordinary decoding token for token whatever the draft proposes, with every sampling parameter;
// at temperature 1 the law of the generated tokens is the target's (chi-square against the exact
// law, token-wise and block verification; a biased verifier must fail the same test); pages and
// the draft's context stay consistent under rejections, preemption and cancellation.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "engine_test_util.h"
#include "spec_fakes.h"

namespace m3::testing {
namespace {

struct SpecEngine {
  std::unique_ptr<Engine> engine;
  CapturingFakeModel* model = nullptr;
  FakeDraft* draft = nullptr;
};

SpecEngine make_spec_engine(const EngineFixtureConfig& f, std::optional<DraftKind> kind,
                            SpeculativeOptions opts = {}, int32_t block = 5) {
  auto model = std::make_unique<CapturingFakeModel>(f.vocab, f.pages, f.page_size);
  SpecEngine out;
  out.model = model.get();
  EngineConfig c;
  c.scheduler.page_size = f.page_size;
  c.scheduler.chunked_prefill_size = f.budget;
  c.scheduler.max_running_requests = f.max_running;
  c.scheduler.enable_prefix_cache = f.prefix;
  c.generation_defaults.eos_token_ids = f.eos;
  c.detokenizer = f.detok;
  c.num_sampler_threads = f.sampler_threads;
  auto e = Engine::create(std::move(c), std::move(model));
  EXPECT_TRUE(e.is_ok()) << e.status().to_string();
  out.engine = std::move(e).value();
  if (kind) {
    auto draft = std::make_unique<FakeDraft>(*kind, f.vocab, block);
    out.draft = draft.get();
    if (opts.num_draft_tokens == 0) opts.num_draft_tokens = block + 1;
    Status st = out.engine->enable_speculative(std::move(draft), opts);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
  }
  return out;
}

std::vector<Outcome> run_requests(Engine& e, const std::vector<GenerateRequest>& reqs) {
  std::vector<RequestHandle> hs;
  std::vector<int32_t> ns;
  for (const auto& r : reqs) {
    auto h = e.submit(r);
    EXPECT_TRUE(h.is_ok()) << h.status().to_string();
    hs.push_back(std::move(h).value());
    ns.push_back(r.params.n);
  }
  return run_all(e, hs, ns, 100000);
}

// Requests exercising every sampling parameter at temperature 0.
std::vector<GenerateRequest> greedy_requests(int32_t vocab, int32_t max_tokens) {
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 8; ++i) {
    GenerateRequest r;
    r.prompt_tokens = prompt_of(i, 3 + 5 * i, vocab);
    r.params.temperature = 0.0f;
    r.params.max_tokens = max_tokens - 3 * i;
    r.params.ignore_eos = true;
    r.params.logprobs = true;
    r.params.top_logprobs = 2;
    if (i % 4 == 1) {
      r.params.presence_penalty = 1.5f;
      r.params.frequency_penalty = 0.3f;
      r.params.repetition_penalty = 1.3f;
    }
    if (i % 4 == 2) r.params.logit_bias = {{7, 2.5f}, {11, -3.0f}};
    if (i == 3) {
      r.params.n = 3;
      r.params.min_tokens = 4;
      r.params.stop_token_ids = {5};
    }
    if (i == 5) r.params.stop = {"kq", "zz"};
    if (i == 6) r.params.max_tokens = 1;
    // Decodes without the draft (prompt logits), in the same steps as the speculative rows.
    if (i == 7) r.prompt_logits = true;
    reqs.push_back(r);
  }
  return reqs;
}

void expect_same(const std::vector<Outcome>& a, const std::vector<Outcome>& b,
                 const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i].done && b[i].done) << what << " request " << i;
    EXPECT_TRUE(a[i].error.is_ok() && b[i].error.is_ok()) << what << " " << a[i].error.to_string();
    EXPECT_EQ(a[i].tokens, b[i].tokens) << what << " request " << i;
    EXPECT_EQ(a[i].text, b[i].text) << what << " request " << i;
    EXPECT_EQ(a[i].finish, b[i].finish) << what << " request " << i;
    EXPECT_EQ(a[i].usage.completion_tokens, b[i].usage.completion_tokens) << what;
    for (size_t s = 0; s < a[i].detail.size(); ++s) {
      ASSERT_EQ(a[i].detail[s].size(), b[i].detail[s].size());
      for (size_t t = 0; t < a[i].detail[s].size(); ++t) {
        EXPECT_EQ(a[i].detail[s][t].logprob, b[i].detail[s][t].logprob) << what;
        ASSERT_EQ(a[i].detail[s][t].top_logprobs.size(), b[i].detail[s][t].top_logprobs.size());
        for (size_t k = 0; k < a[i].detail[s][t].top_logprobs.size(); ++k) {
          EXPECT_EQ(a[i].detail[s][t].top_logprobs[k].token,
                    b[i].detail[s][t].top_logprobs[k].token);
        }
      }
    }
  }
}

TEST(EngineSpeculative, GreedyOutputEqualsOrdinaryDecoding) {
  for (int32_t max_tokens : {32, 256}) {
    for (int32_t pages : {512, 40}) {  // 40: preemption with drafts in flight
      EngineFixtureConfig f;
      f.pages = pages;
      f.budget = 8;
      f.detok = letter_detokenizer();
      const auto reqs = greedy_requests(f.vocab, pages == 40 ? 48 : max_tokens);
      auto plain = make_spec_engine(f, std::nullopt);
      const auto want = run_requests(*plain.engine, reqs);
      for (DraftKind kind : {DraftKind::kRandom, DraftKind::kOracle}) {
        const std::string what = "max_tokens " + std::to_string(max_tokens) + " pages " +
                                 std::to_string(pages) +
                                 (kind == DraftKind::kOracle ? " oracle" : " random");
        auto spec = make_spec_engine(f, kind);
        const auto got = run_requests(*spec.engine, reqs);
        expect_same(got, want, what);
        EXPECT_EQ(spec.model->corrupt_reads, 0) << what;
        EXPECT_EQ(spec.draft->bad_context, 0) << what;
        // Greedy requests draft through propose_greedy (a GPU draft's on-device argmax chain).
        EXPECT_GT(spec.draft->num_greedy_proposals, 0) << what;
        EXPECT_EQ(spec.draft->num_greedy_proposals, spec.draft->num_proposals) << what;
        // Concurrent greedy sequences are proposed together (one batch per step).
        EXPECT_GT(spec.draft->max_greedy_batch, 1) << what;
        const EngineStats s = spec.engine->stats();
        EXPECT_EQ(s.kv_pages_used, 0) << what;
        EXPECT_EQ(s.kv_pages_free + s.kv_pages_cached, pages) << what;
        EXPECT_GT(s.spec_draft_tokens_total, 0u) << what;
        uint64_t steps = 0, committed = 0;
        for (size_t n = 0; n < s.spec_accept_length_counts.size(); ++n) {
          steps += s.spec_accept_length_counts[n];
          committed += n * s.spec_accept_length_counts[n];
        }
        EXPECT_EQ(committed, steps + s.spec_accepted_tokens_total) << what;
        // Per-request usage adds up to the engine's counters.
        uint64_t drafted = 0, accepted = 0;
        for (const Outcome& o : got) {
          drafted += static_cast<uint64_t>(o.usage.spec_draft_tokens);
          accepted += static_cast<uint64_t>(o.usage.spec_accepted_tokens);
        }
        EXPECT_EQ(drafted, s.spec_draft_tokens_total) << what;
        EXPECT_EQ(accepted, s.spec_accepted_tokens_total) << what;
        if (kind == DraftKind::kOracle && pages == 512) {
          // The oracle proposes the raw target's greedy continuation: every draft of a request
          // without penalties, logit bias or min_tokens is accepted.
          for (size_t i : {0, 4}) {
            EXPECT_GT(got[i].usage.spec_draft_tokens, 0) << what << " request " << i;
            EXPECT_EQ(got[i].usage.spec_accepted_tokens, got[i].usage.spec_draft_tokens)
                << what << " request " << i;
            // Several tokens per step.
            EXPECT_LT(got[i].usage.spec_verify_steps * 3, got[i].usage.completion_tokens)
                << what << " request " << i;
          }
        }
        EXPECT_EQ(got[7].usage.spec_draft_tokens, 0) << what;
        if (kind == DraftKind::kRandom) {
          EXPECT_LT(s.spec_accepted_tokens_total * 4, s.spec_draft_tokens_total) << what;
        }
      }
      if (pages == 40) break;  // one preemption run is enough
    }
  }
}

// A stop string, an EOS id or a stop id that lands inside an accepted run ends the sequence
// there: the tokens after it are dropped and the output equals ordinary decoding.
TEST(EngineSpeculative, StopInsideAnAcceptedRun) {
  EngineFixtureConfig f;
  f.detok = letter_detokenizer();
  GenerateRequest r;
  r.prompt_tokens = prompt_of(3, 9, f.vocab);
  r.params.temperature = 0.0f;
  r.params.max_tokens = 20;
  auto reference = make_spec_engine(f, std::nullopt);
  const std::vector<int32_t> free_run = run_requests(*reference.engine, {r})[0].tokens[0];
  ASSERT_EQ(free_run.size(), 20u);
  // Output index 3 is inside the first verify run of the oracle (indices 1..6: 5 drafts and the
  // target's token). The first index at which each stop condition can match.
  const int32_t t = free_run[3];
  const size_t first = static_cast<size_t>(
      std::find(free_run.begin(), free_run.end(), t) - free_run.begin());
  ASSERT_GE(first, 1u) << "pick another prompt: the stop token is the prefill's";
  ASSERT_LE(first, 3u);
  for (int variant = 0; variant < 3; ++variant) {
    EngineFixtureConfig g = f;
    GenerateRequest q = r;
    if (variant == 0) q.params.stop_token_ids = {t};
    if (variant == 1) g.eos = {t};
    if (variant == 2) q.params.stop = {std::string(1, static_cast<char>('a' + t % 26))};
    auto plain = make_spec_engine(g, std::nullopt);
    const Outcome want = run_requests(*plain.engine, {q})[0];
    auto spec = make_spec_engine(g, DraftKind::kOracle);
    const Outcome got = run_requests(*spec.engine, {q})[0];
    EXPECT_EQ(got.tokens, want.tokens) << "variant " << variant;
    EXPECT_EQ(got.text, want.text) << "variant " << variant;
    EXPECT_EQ(got.finish, want.finish) << "variant " << variant;
    EXPECT_EQ(got.finish[0], FinishReason::kStop) << "variant " << variant;
    EXPECT_EQ(got.stop_string, want.stop_string) << "variant " << variant;
    // One verify step produced the stopping token, with tokens after it accepted and dropped.
    EXPECT_EQ(got.usage.spec_verify_steps, 1) << "variant " << variant;
    EXPECT_GT(got.usage.spec_accepted_tokens, static_cast<int32_t>(got.tokens[0].size()) - 1)
        << "variant " << variant;
    EXPECT_EQ(got.usage.completion_tokens, static_cast<int32_t>(got.tokens[0].size()));
    EXPECT_EQ(spec.engine->stats().kv_pages_used, 0);
  }
}

// The exact law of generated tokens [from, to) of `prompt` under `params` (FakeModel's logits
// through the sampler's own distribution: penalties over the path so far, temperature, top-k,
// top-p, min-p).
std::map<std::vector<int32_t>, double> exact_law(const std::vector<int32_t>& prompt, int32_t vocab,
                                                 int32_t from, int32_t to,
                                                 const SamplingParams& params) {
  std::map<std::vector<int32_t>, double> law;
  std::function<void(std::vector<int32_t>&, const PenaltyState&, double)> walk =
      [&](std::vector<int32_t>& ctx, const PenaltyState& history, double prob) {
        const int32_t gen = static_cast<int32_t>(ctx.size() - prompt.size());
        if (gen == to) {
          law[std::vector<int32_t>(ctx.begin() + static_cast<std::ptrdiff_t>(prompt.size()) + from,
                                   ctx.end())] += prob;
          return;
        }
        std::vector<float> logits(vocab);  // per level: the recursion below reuses none
        FakeModel::logits_for(ctx, vocab, logits.data());
        SampleInput in;
        in.logits = logits;
        in.params = &params;
        in.penalties = &history;
        SamplerScratch scratch;
        std::vector<double> p;
        sampling_distribution(in, &scratch, &p);
        for (int32_t v = 0; v < vocab; ++v) {
          if (p[v] == 0.0) continue;
          PenaltyState next = history;
          next.add_output(v);
          ctx.push_back(v);
          walk(ctx, next, prob * p[v]);
          ctx.pop_back();
        }
      };
  std::vector<int32_t> ctx = prompt;
  PenaltyState start;
  start.set_prompt(prompt);
  walk(ctx, start, 1.0);
  return law;
}

// Pearson's chi-square of `counts` against `law`, cells of expectation below 5 pooled.
double chi_square(const std::map<std::vector<int32_t>, int64_t>& counts,
                  const std::map<std::vector<int32_t>, double>& law, int64_t n, int32_t* df) {
  double chi = 0, pooled_e = 0, pooled_o = 0;
  int32_t cells = 0;
  for (const auto& [key, p] : law) {
    const double e = p * n;
    auto it = counts.find(key);
    const double o = it == counts.end() ? 0 : static_cast<double>(it->second);
    if (e < 5) {
      pooled_e += e;
      pooled_o += o;
      continue;
    }
    chi += (o - e) * (o - e) / e;
    ++cells;
  }
  if (pooled_e > 0) {
    chi += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    ++cells;
  }
  *df = cells - 1;
  return chi;
}

// Chi-square critical value at upper-tail probability 1e-4 (Wilson-Hilferty).
double chi_square_critical(int32_t df) {
  const double z = 3.719, a = 2.0 / (9.0 * df);
  return df * std::pow(1 - a + z * std::sqrt(a), 3);
}

TEST(EngineSpeculative, SampledOutputFollowsTheTargetsLaw) {
  // Tokens 2..4 of each request: the first comes from the prefill, the next ones from a verify
  // of 3 drafts (then of fewer, capped by max_tokens).
  const int32_t vocab = 4, n = 3000;
  const std::vector<int32_t> prompt = {1, 3, 0, 2};
  // Plain temperature 1, and a truncated, penalised distribution: the draft's q is truncated
  // the same way (but not penalised), and the target's rows count the drafts before them. The
  // penalties are strong enough that rows forgetting the drafts fail here (χ² ≈ 67 against a
  // critical 39.5, checked by breaking the engine).
  SamplingParams plain_params;
  plain_params.temperature = 1.0f;
  SamplingParams shaped = plain_params;
  shaped.temperature = 0.8f;
  shaped.top_k = 3;
  shaped.top_p = 0.9f;
  shaped.presence_penalty = 2.0f;
  shaped.frequency_penalty = 1.0f;
  shaped.repetition_penalty = 1.2f;
  const auto plain_law = exact_law(prompt, vocab, 1, 4, plain_params);
  const auto shaped_law = exact_law(prompt, vocab, 1, 4, shaped);
  struct Mode {
    const char* name;
    VerifyMethod method;
    std::optional<DraftKind> kind;
    int32_t simulate;
    bool must_pass;
    bool shaped = false;
  };
  for (const Mode& m :
       {Mode{"no draft", VerifyMethod::kTokenWise, std::nullopt, 0, true},
        Mode{"token-wise", VerifyMethod::kTokenWise, DraftKind::kPerturbed, 0, true},
        Mode{"block", VerifyMethod::kBlock, DraftKind::kPerturbed, 0, true},
        Mode{"block, random draft", VerifyMethod::kBlock, DraftKind::kRandom, 0, true},
        Mode{"forced acceptance", VerifyMethod::kTokenWise, DraftKind::kPerturbed, 3, false},
        Mode{"shaped, no draft", VerifyMethod::kTokenWise, std::nullopt, 0, true, true},
        Mode{"shaped, token-wise", VerifyMethod::kTokenWise, DraftKind::kPerturbed, 0, true, true},
        Mode{"shaped, block", VerifyMethod::kBlock, DraftKind::kPerturbed, 0, true, true}}) {
    EngineFixtureConfig f;
    f.vocab = vocab;
    f.pages = 4096;
    f.max_running = 512;
    f.budget = 4096;
    f.prefix = false;
    SpeculativeOptions opts;
    opts.num_draft_tokens = 4;
    opts.method = m.method;
    opts.simulate_accept_length = m.simulate;
    auto spec = make_spec_engine(f, m.kind, opts, 3);
    std::vector<GenerateRequest> reqs(n);
    for (int32_t i = 0; i < n; ++i) {
      reqs[i].prompt_tokens = prompt;
      reqs[i].params = m.shaped ? shaped : plain_params;
      reqs[i].params.max_tokens = 5;
      reqs[i].params.seed = 7000 + i;
      reqs[i].params.ignore_eos = true;
    }
    const auto got = run_requests(*spec.engine, reqs);
    std::map<std::vector<int32_t>, int64_t> counts;
    for (const Outcome& o : got) {
      ASSERT_EQ(o.tokens[0].size(), 5u) << m.name;
      ++counts[std::vector<int32_t>(o.tokens[0].begin() + 1, o.tokens[0].begin() + 4)];
    }
    int32_t df = 0;
    const double chi = chi_square(counts, m.shaped ? shaped_law : plain_law, n, &df);
    const EngineStats s = spec.engine->stats();
    ASSERT_EQ(s.spec_draft_tokens_total > 0, m.kind.has_value());
    if (m.must_pass) {
      EXPECT_LT(chi, chi_square_critical(df)) << m.name << " df " << df;
      if (m.kind == DraftKind::kPerturbed) {
        // Partial acceptance: both outcomes occur often.
        EXPECT_GT(s.spec_accepted_tokens_total * 5, s.spec_draft_tokens_total) << m.name;
        EXPECT_LT(s.spec_accepted_tokens_total * 10, s.spec_draft_tokens_total * 9) << m.name;
      }
    } else {
      EXPECT_GT(chi, chi_square_critical(df)) << m.name << ": the test has no power";
    }
    EXPECT_EQ(s.kv_pages_used, 0);
  }
}

TEST(EngineSpeculative, BlockVerificationAcceptsAtLeastAsMuchAsTokenWise) {
  const int32_t vocab = 6;
  uint64_t accepted[2] = {0, 0}, drafted[2] = {0, 0};
  for (int method = 0; method < 2; ++method) {
    EngineFixtureConfig f;
    f.vocab = vocab;
    f.pages = 2048;
    f.max_running = 256;
    f.budget = 2048;
    SpeculativeOptions opts;
    opts.method = method == 0 ? VerifyMethod::kTokenWise : VerifyMethod::kBlock;
    auto spec = make_spec_engine(f, DraftKind::kPerturbed, opts, 5);
    std::vector<GenerateRequest> reqs(400);
    for (int32_t i = 0; i < 400; ++i) {
      reqs[i].prompt_tokens = prompt_of(i, 6, vocab);
      reqs[i].params.temperature = 1.0f;
      reqs[i].params.max_tokens = 20;
      reqs[i].params.seed = i;
      reqs[i].params.ignore_eos = true;
    }
    run_requests(*spec.engine, reqs);
    // Sampled requests draft through the engine's picker (the draft's q is their distribution).
    EXPECT_GT(spec.draft->num_proposals, 0);
    EXPECT_EQ(spec.draft->num_greedy_proposals, 0);
    EXPECT_EQ(spec.draft->max_greedy_batch, 0);
    accepted[method] = spec.engine->stats().spec_accepted_tokens_total;
    drafted[method] = spec.engine->stats().spec_draft_tokens_total;
  }
  // Acceptance rates, with a margin for sampling noise (several thousand drafts each).
  const double tw = double(accepted[0]) / double(drafted[0]);
  const double bv = double(accepted[1]) / double(drafted[1]);
  EXPECT_GT(bv, tw - 0.02) << "token-wise " << tw << " block " << bv;
}

TEST(EngineSpeculative, NoPageLeaksUnderRejectionsAndCancellation) {
  EngineFixtureConfig f;
  f.pages = 60;
  f.budget = 8;
  SpeculativeOptions opts;
  auto spec = make_spec_engine(f, DraftKind::kPerturbed, opts, 4);
  std::mt19937 rng(5);
  std::vector<RequestHandle> live;
  for (int round = 0; round < 60; ++round) {
    for (int j = 0; j < 3; ++j) {
      GenerateRequest r;
      r.prompt_tokens = prompt_of(static_cast<int32_t>(rng() % 50), 2 + rng() % 17, f.vocab);
      r.params.temperature = (rng() % 2) ? 1.0f : 0.0f;
      r.params.max_tokens = 1 + static_cast<int32_t>(rng() % 30);
      r.params.n = 1 + static_cast<int32_t>(rng() % 2);
      r.params.seed = rng();
      auto h = spec.engine->submit(r);
      ASSERT_TRUE(h.is_ok()) << h.status().to_string();
      live.push_back(std::move(h).value());
    }
    spec.engine->step();
    spec.engine->step();
    if (!live.empty() && rng() % 2) {
      const size_t k = rng() % live.size();
      spec.engine->cancel(live[k].id());
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    }
    const EngineStats s = spec.engine->stats();
    ASSERT_EQ(s.kv_pages_used + s.kv_pages_cached + s.kv_pages_free, f.pages);
  }
  while (spec.engine->step()) {
  }
  const EngineStats s = spec.engine->stats();
  EXPECT_EQ(s.kv_pages_used, 0);
  EXPECT_EQ(s.kv_pages_free + s.kv_pages_cached, f.pages);
  EXPECT_EQ(spec.model->corrupt_reads, 0);
  EXPECT_EQ(spec.draft->bad_context, 0);
  EXPECT_GT(s.spec_accepted_tokens_total, 0u);
  EXPECT_LT(s.spec_accepted_tokens_total, s.spec_draft_tokens_total);
}

TEST(EngineSpeculative, OptionsAreChecked) {
  EngineFixtureConfig f;
  auto plain = make_spec_engine(f, std::nullopt);
  SpeculativeOptions o;
  o.num_draft_tokens = 9;
  Status st = plain.engine->enable_speculative(
      std::make_unique<FakeDraft>(DraftKind::kOracle, f.vocab, 7), o);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("--speculative-num-draft-tokens 9"), std::string::npos);
  o.num_draft_tokens = 4;
  o.simulate_accept_length = 5;
  st = plain.engine->enable_speculative(std::make_unique<FakeDraft>(DraftKind::kOracle, f.vocab, 7),
                                        o);
  EXPECT_NE(st.message().find("--speculative-simulate-accept-length 5"), std::string::npos);
  // A runner without hidden-state capture cannot feed a draft.
  auto e = make_engine(f);
  o.simulate_accept_length = 0;
  st = e->enable_speculative(std::make_unique<FakeDraft>(DraftKind::kOracle, f.vocab, 7), o);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace m3::testing
